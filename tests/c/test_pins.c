/* test_pins.c - hits copy from pinned slots with the device lock dropped.
 *
 * Three threads on one 256 KiB object: a reader keeps reading it with
 * chm_read (hits from whichever slot stages it), a cycler keeps prefetching
 * it, waiting (sometimes not) and releasing, so a slot is often released
 * while a hit copies from it (READY/HELD -> DRAINING -> FREE at the last
 * unpin), and a writer keeps rewriting it with versions (a write admitted over
 * a READY slot, or over a fill as it lands, marks the slot behind, and the
 * holder of its last pin -- the writer, the fill completion or the last hit
 * -- re-overlays it with the lock dropped, S18). Every
 * read must be one whole version, never older than the newest version
 * admitted before the read began; views likewise at their wait; no slot or
 * request is leaked. Also prints chm_stats latency while 16 MiB hits copy
 * (tools/bench/lock_latency.py holds the targets).
 * Built under TSan too, where a copy racing a refill, a patch or a catch-up
 * is a report. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chm.h"
#include "check.h"

#define OBJ (256u << 10)
#define WORDS (OBJ / 8)
#define SECONDS 2

static chm_dev *dev;
static atomic_uint_fast64_t admitted;
static atomic_bool stop;
static atomic_uint bad_reads, bad_views, reads, cycles, drains_seen;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static bool whole(const uint64_t *p, uint64_t at_least)
{
	for (unsigned i = 0; i < WORDS; i++)
		if (p[i] != p[0])
			return false;
	return p[0] >= at_least;
}

static void *reader_main(void *arg)
{
	(void)arg;
	uint64_t *buf = malloc(OBJ);
	while (!atomic_load(&stop)) {
		uint64_t before = atomic_load(&admitted);
		if (chm_read(dev, 0, buf, OBJ) || !whole(buf, before))
			atomic_fetch_add(&bad_reads, 1);
		atomic_fetch_add(&reads, 1);
	}
	free(buf);
	return NULL;
}

static void *cycler_main(void *arg)
{
	(void)arg;
	for (unsigned k = 0; !atomic_load(&stop); k++) {
		chm_handle h;
		int rc = chm_prefetch_object(dev, 0, OBJ, 0, &h);
		if (rc == -EAGAIN)
			continue;
		if (rc) {
			atomic_fetch_add(&bad_views, 1);
			continue;
		}
		if (k % 3) {
			struct chm_view v;
			uint64_t before = atomic_load(&admitted);
			if (chm_prefetch_wait(dev, h, 10ull * 1000000000ull, &v) ||
			    !whole(v.data, before))
				atomic_fetch_add(&bad_views, 1);
		} else {
			/* READY, no view: released at once, maybe under a copy */
			struct chm_stats st;
			chm_stats(dev, &st);
		}
		struct chm_stats st;
		chm_stats(dev, &st);
		if (st.slots_held > 1)
			atomic_fetch_add(&drains_seen, 1); /* one HELD + a DRAINING */
		if (chm_prefetch_release(dev, h))
			atomic_fetch_add(&bad_views, 1);
		atomic_fetch_add(&cycles, 1);
	}
	return NULL;
}

static void *writer_main(void *arg)
{
	(void)arg;
	uint64_t *buf;
	if (posix_memalign((void **)&buf, 4096, OBJ))
		abort();
	for (uint64_t v = 1; !atomic_load(&stop); v++) {
		for (unsigned i = 0; i < WORDS; i++)
			buf[i] = v;
		int rc = chm_write_object(dev, 0, buf, OBJ, 0);
		if (rc == 0)
			atomic_store(&admitted, v);
		else if (rc != CHM_WRITE_SKIPPED)
			abort();
		struct timespec ts = {0, 200000};
		nanosleep(&ts, NULL);
	}
	free(buf);
	return NULL;
}

/* chm_stats while another thread copies 16 MiB hits (latency printed). */
static void *big_reader_main(void *arg)
{
	char *buf = arg;
	while (!atomic_load(&stop))
		if (chm_read(dev, 0, buf, 16u << 20))
			abort();
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static int stats_under_copies(void)
{
	struct scratch sc;
	if (!scratch_make(&sc))
		return 77;
	struct chm_config c;
	cfg_init(&c, "backend", "pread", "targets", sc.path, "capacity", "64M", "dram", "40M",
	         "wbuf", "4M", "slot_size", "16M", "slots", "2");
	int status = scratch_open(&sc, &c, &dev, "no O_DIRECT in /tmp");
	if (status)
		return status;
	chm_handle h;
	struct chm_view v;
	CHECK_RC(chm_prefetch_object(dev, 0, 16u << 20, 0, &h), 0);
	CHECK_RC(chm_prefetch_wait(dev, h, 10ull * 1000000000ull, &v), 0);
	char *big = malloc(16u << 20);
	atomic_store(&stop, false);
	pthread_t t;
	pthread_create(&t, NULL, big_reader_main, big);
	enum {
		N = 2000
	};
	static uint64_t lat[N];
	for (unsigned i = 0; i < N; i++) {
		struct chm_stats st;
		uint64_t t0 = now_ns();
		chm_stats(dev, &st);
		lat[i] = now_ns() - t0;
		struct timespec ts = {0, 20000};
		nanosleep(&ts, NULL);
	}
	/* a loaded host may not have scheduled the copier much yet: let it do
	 * a few copies (bounded) so the check below is about the device */
	for (unsigned i = 0; i < 1000; i++) {
		struct chm_stats st;
		chm_stats(dev, &st);
		if (st.read_hits > 2)
			break;
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
	atomic_store(&stop, true);
	pthread_join(t, NULL);
	qsort(lat, N, sizeof(lat[0]), cmp_u64);
	struct chm_stats st;
	chm_stats(dev, &st);
	printf("chm_stats while 16 MiB hits copy (%llu of them): p50 %.1f us, p99 %.1f us\n",
	       (unsigned long long)st.read_hits, lat[N / 2] / 1e3, lat[N * 99 / 100] / 1e3);
	CHECK(st.read_hits > 2, "the copying thread barely ran (%llu hits)",
	      (unsigned long long)st.read_hits);
	CHECK_RC(chm_prefetch_release(dev, h), 0);
	free(big);
	chm_dev_close(dev);
	scratch_remove(&sc);
	return 0;
}

int main(void)
{
	struct scratch sc;
	if (!scratch_make(&sc))
		return 77;
	struct chm_config c;
	cfg_init(&c, "backend", "pread", "targets", sc.path, "capacity", "16M", "dram", "8M",
	         "wbuf", "4M", "slot_size", "256K", "slots", "4", "refill_queue", "2");
	int status = scratch_open(&sc, &c, &dev, "no O_DIRECT in /tmp");
	if (status)
		return status;

	pthread_t r, cy, w;
	pthread_create(&w, NULL, writer_main, NULL);
	while (atomic_load(&admitted) == 0)
		sched_yield();
	pthread_create(&r, NULL, reader_main, NULL);
	pthread_create(&cy, NULL, cycler_main, NULL);
	struct timespec ts = {SECONDS, 0};
	nanosleep(&ts, NULL);
	/* a loaded host (or TSan) may have run the threads little: give them
	 * up to 30 s more to reach the counts the checks below need */
	for (int i = 0; i < 300 && (atomic_load(&reads) <= 50 || atomic_load(&cycles) <= 50); i++) {
		struct timespec tenth = {0, 100000000};
		nanosleep(&tenth, NULL);
	}
	atomic_store(&stop, true);
	pthread_join(r, NULL);
	pthread_join(cy, NULL);
	pthread_join(w, NULL);

	/* a prefetch released while FILLING leaves an orphan fill that frees
	 * its slot when its I/O lands: give the last one a bounded moment */
	struct chm_stats st;
	for (int i = 0; i < 2000; i++) {
		CHECK_RC(chm_stats(dev, &st), 0);
		if (st.slots_free == st.slots_total)
			break;
		struct timespec ms = {0, 1000000};
		nanosleep(&ms, NULL);
	}
	printf("%u reads (%llu hits), %u prefetch cycles, %llu writes admitted, %u times a "
	       "released slot still drained: %u bad reads, %u bad views\n",
	       atomic_load(&reads), (unsigned long long)st.read_hits, atomic_load(&cycles),
	       (unsigned long long)st.wr_admitted, atomic_load(&drains_seen),
	       atomic_load(&bad_reads), atomic_load(&bad_views));
	CHECK(atomic_load(&reads) > 50 && atomic_load(&cycles) > 50, "the threads barely ran");
	CHECK(st.read_hits > 0, "no read was a hit");
	CHECK(atomic_load(&bad_reads) == 0, "%u reads torn or older than an admitted write",
	      atomic_load(&bad_reads));
	CHECK(atomic_load(&bad_views) == 0, "%u bad views or calls", atomic_load(&bad_views));
	CHECK(st.slots_free == st.slots_total, "%u of %u slots free after every release",
	      st.slots_free, st.slots_total);
	CHECK(st.prefetch_issued == st.prefetch_released, "issued %llu, released %llu",
	      (unsigned long long)st.prefetch_issued, (unsigned long long)st.prefetch_released);
	chm_dev_close(dev);
	scratch_remove(&sc);
	int s2 = stats_under_copies();
	if (s2 && s2 != 77)
		return s2;
	return check_summary();
}
