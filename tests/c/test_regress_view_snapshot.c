/* test_regress_view_snapshot.c - a held view is a snapshot (W11).
 *
 * A writer thread keeps rewriting a 64 KiB block, every 8-byte word of it
 * holding the write's version number, while the main thread holds a view of
 * a prefetch of the block and scans it again and again. Admitting a write
 * used to re-copy every overlapping write-buffer entry, oldest first, into
 * the staged slot while the scan read it without a lock, so a scan saw
 * versions thousands of writes older than one admitted before the scan
 * began. Checks, per view: every scan sees one version in every word, the
 * same one in every scan, no older than the newest version admitted before
 * wait returned; and the writer's own chm_read of the block always returns
 * the version it just wrote (read-your-writes with a held view of it). */
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

#define BLK (64u << 10)
#define WORDS (BLK / 8)
#define VIEWS 40
#define SCANS 200

static chm_dev *dev;
static atomic_uint_fast64_t admitted; /* newest admitted version */
static atomic_bool stop;
static uint64_t rw_bad, rw_reads, writes_admitted;
static uint64_t rw_bad_ver, rw_bad_got;

static void *writer_main(void *arg)
{
	(void)arg;
	uint64_t *buf, *back;
	if (posix_memalign((void **)&buf, 4096, BLK) || posix_memalign((void **)&back, 4096, BLK))
		abort();
	for (uint64_t v = 1; !atomic_load(&stop); v++) {
		for (unsigned i = 0; i < WORDS; i++)
			buf[i] = v;
		int rc = chm_write_object(dev, 0, buf, BLK, 0);
		if (rc == CHM_WRITE_SKIPPED)
			continue;
		if (rc) {
			fprintf(stderr, "write: %s\n", chm_strerror(rc));
			abort();
		}
		atomic_store(&admitted, v);
		writes_admitted++;
		if (v % 16 == 0) {
			/* read-your-writes: the newest admitted bytes, view or not */
			rw_reads++;
			if (chm_read(dev, 0, back, BLK))
				abort();
			for (unsigned i = 0; i < WORDS; i++) {
				if (back[i] != v) {
					if (!rw_bad++) {
						rw_bad_ver = v;
						rw_bad_got = back[i];
					}
					break;
				}
			}
		}
	}
	free(buf);
	free(back);
	return NULL;
}

int main(void)
{
	struct scratch sc;
	if (!scratch_make(&sc))
		return 77;
	struct chm_config c;
	cfg_init(&c, "backend", "pread", "targets", sc.path, "capacity", "16M", "dram", "4M",
	         "wbuf", "2M", "slot_size", "64K", "slots", "4");
	int status = scratch_open(&sc, &c, &dev, "no O_DIRECT in /tmp");
	if (status)
		return status;

	pthread_t w;
	pthread_create(&w, NULL, writer_main, NULL);
	while (atomic_load(&admitted) < 64)
		sched_yield();

	uint64_t torn = 0, changed = 0, older = 0, regressed = 0, max_back = 0, scans = 0;
	for (unsigned k = 0; k < VIEWS; k++) {
		chm_handle h;
		struct chm_view v;
		CHECK_RC(chm_prefetch_object(dev, 0, BLK, 0, &h), 0);
		uint64_t before = atomic_load(&admitted);
		CHECK_RC(chm_prefetch_wait(dev, h, 10ull * 1000000000ull, &v), 0);
		const volatile uint64_t *p = (const volatile uint64_t *)v.data;
		uint64_t first = p[0], prev_max = 0;
		if (first < before)
			older++;
		for (unsigned s = 0; s < SCANS; s++, scans++) {
			uint64_t lo = UINT64_MAX, hi = 0;
			for (unsigned i = 0; i < WORDS; i++) {
				uint64_t x = p[i];
				lo = x < lo ? x : lo;
				hi = x > hi ? x : hi;
			}
			if (lo != hi)
				torn++;
			if (lo != first || hi != first)
				changed++;
			if (lo < prev_max) {
				regressed++;
				if (prev_max - lo > max_back)
					max_back = prev_max - lo;
			}
			prev_max = hi > prev_max ? hi : prev_max;
		}
		CHECK_RC(chm_prefetch_release(dev, h), 0);
	}
	atomic_store(&stop, true);
	pthread_join(w, NULL);

	printf("%u views, %llu scans, %llu writes admitted: %llu scans torn, %llu changed "
	       "under the view, %llu went back in time (by up to %llu versions), %llu views "
	       "older than a write admitted before wait; read-your-writes %llu/%llu bad\n",
	       VIEWS, (unsigned long long)scans, (unsigned long long)writes_admitted,
	       (unsigned long long)torn, (unsigned long long)changed, (unsigned long long)regressed,
	       (unsigned long long)max_back, (unsigned long long)older, (unsigned long long)rw_bad,
	       (unsigned long long)rw_reads);
	CHECK(writes_admitted > 100, "the writer barely ran");
	CHECK(regressed == 0, "%llu scans saw older versions than an earlier scan",
	      (unsigned long long)regressed);
	CHECK(torn == 0, "%llu scans mixed versions", (unsigned long long)torn);
	CHECK(changed == 0, "%llu scans differ from the view's first scan",
	      (unsigned long long)changed);
	CHECK(older == 0, "%llu views older than a write admitted before wait",
	      (unsigned long long)older);
	CHECK(rw_bad == 0, "chm_read after writing version %llu returned %llu",
	      (unsigned long long)rw_bad_ver, (unsigned long long)rw_bad_got);
	chm_dev_close(dev);
	scratch_remove(&sc);
	return check_summary();
}
