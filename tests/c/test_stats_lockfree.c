/* test_stats_lockfree.c - chm_stats() never waits for the device lock.
 *
 * For each mode (prefetch, lru, direct) on the ghost backend: after some
 * traffic, the main thread holds dev->lock (as a hit or an lru read copying
 * 16 MiB would) and a second thread calls chm_stats(); it must return within
 * BOUND_MS while the lock is still held. With a chm_stats() that takes the
 * lock this fails (the call only returns after the lock is dropped).
 * Then, with the device quiet, the relations between fields hold: the slot
 * states add up to slots_total, hits + misses = reads, valid lines fit in the
 * cache, dirty lines are valid ones. Last, a poller calls chm_stats() while a
 * reader runs: counters never go backwards (each field is exact on its own).
 * Built under TSan too, where a counter written without an atomic is a report.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "chm.h"
#include "dev.h"

#define BOUND_MS 500
#define MB (1ull << 20)

static atomic_bool stats_done;
static atomic_int stats_rc;
static struct chm_stats held_st;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *stats_main(void *arg)
{
	atomic_store(&stats_rc, chm_stats(arg, &held_st));
	atomic_store(&stats_done, true);
	return NULL;
}

static int open_mode(const char *mode, chm_dev **dev)
{
	struct chm_config c;
	cfg_init(&c, "backend", "ghost", "clock", "virtual", "mode", mode, "capacity", "1G", "dram",
	         "32M", "wbuf", strcmp(mode, "prefetch") ? "0" : "4M", "lru_line", "1M",
	         "slot_size", "1M", "slots", "4");
	return chm_dev_open(&c, dev);
}

/* Some reads, prefetches and writes, then nothing in flight. */
static void traffic(chm_dev *dev, const char *mode, uint8_t *buf)
{
	for (uint64_t i = 0; i < 48; i++)
		CHECK_RC(chm_read(dev, (i % 40) * MB, buf, MB), 0);
	if (!strcmp(mode, "direct"))
		return;
	for (uint64_t i = 0; i < 3; i++) {
		chm_handle h;
		CHECK_RC(chm_prefetch_object(dev, (100 + i) * MB, MB, 0, &h), 0);
		struct chm_view v;
		CHECK_RC(chm_prefetch_wait(dev, h, UINT64_MAX, &v), 0);
		CHECK_RC(chm_read(dev, (100 + i) * MB, buf, MB), 0);
		CHECK_RC(chm_prefetch_release(dev, h), 0);
	}
	memset(buf, 0x33, MB);
	for (uint64_t i = 0; i < 4; i++) {
		int rc = chm_write_object(dev, (200 + i) * MB, buf, MB, 0);
		CHECK(rc == 0 || rc == CHM_WRITE_SKIPPED, "write: %d", rc);
	}
	CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
}

static void relations(const char *mode, const struct chm_stats *s)
{
	uint64_t states = (uint64_t)s->slots_free + s->slots_filling + s->slots_ready +
	                  s->slots_held + s->slots_failed;
	CHECK(states == s->slots_total, "%s: slot states %llu, total %u", mode,
	      (unsigned long long)states, s->slots_total);
	CHECK(s->read_hits + s->read_misses >= 48, "%s: hits %llu misses %llu", mode,
	      (unsigned long long)s->read_hits, (unsigned long long)s->read_misses);
	CHECK(s->queue_len == 0, "%s: queue_len %u", mode, s->queue_len);
	CHECK(s->wbuf_used_bytes <= s->wbuf_bytes, "%s: wbuf used %llu of %llu", mode,
	      (unsigned long long)s->wbuf_used_bytes, (unsigned long long)s->wbuf_bytes);
	if (!strcmp(mode, "lru")) {
		CHECK(s->lru_lines_total > 0 && s->lru_lines_valid <= s->lru_lines_total,
		      "lru: valid %llu of %llu", (unsigned long long)s->lru_lines_valid,
		      (unsigned long long)s->lru_lines_total);
		CHECK(s->lru_lines_valid > 0, "lru: no valid line after reads");
		CHECK(s->lru_lines_dirty <= s->lru_lines_valid, "lru: dirty %llu valid %llu",
		      (unsigned long long)s->lru_lines_dirty,
		      (unsigned long long)s->lru_lines_valid);
		CHECK(s->lru_lines_dirty == 0, "lru: dirty %llu after flush",
		      (unsigned long long)s->lru_lines_dirty);
		CHECK(s->lru_hits > 0 && s->lru_misses > 0, "lru: hits %llu misses %llu",
		      (unsigned long long)s->lru_hits, (unsigned long long)s->lru_misses);
	}
	if (!strcmp(mode, "prefetch")) {
		CHECK(s->prefetch_issued == 3 && s->prefetch_completed == 3 &&
		              s->prefetch_released == 3,
		      "prefetch: issued %llu completed %llu released %llu",
		      (unsigned long long)s->prefetch_issued,
		      (unsigned long long)s->prefetch_completed,
		      (unsigned long long)s->prefetch_released);
		CHECK(s->slots_free == s->slots_total, "prefetch: %u of %u slots free",
		      s->slots_free, s->slots_total);
		CHECK(s->wbuf_bytes > 0, "prefetch: no wbuf_bytes");
	}
}

/* chm_stats from another thread while this one holds dev->lock. */
static void under_lock(chm_dev *dev, const char *mode)
{
	struct chm_dev *d = (struct chm_dev *)dev;
	atomic_store(&stats_done, false);
	pthread_mutex_lock(&d->lock);
	pthread_t t;
	pthread_create(&t, NULL, stats_main, dev);
	uint64_t t0 = now_ns(), waited = 0;
	while (!atomic_load(&stats_done) && (waited = now_ns() - t0) < BOUND_MS * 1000000ull) {
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	bool returned = atomic_load(&stats_done);
	pthread_mutex_unlock(&d->lock);
	pthread_join(t, NULL);
	CHECK(returned, "%s: chm_stats still waiting after %llu ms with dev->lock held", mode,
	      (unsigned long long)(waited / 1000000));
	CHECK_RC(atomic_load(&stats_rc), 0);
	printf("  %s: chm_stats returned with dev->lock held: %s\n", mode, returned ? "yes" : "no");
}

/* A poller against a reader: counters never go backwards. */
static atomic_bool stop;
static void *reader_main(void *arg)
{
	uint8_t *buf = malloc(MB);
	for (uint64_t i = 0; !atomic_load(&stop); i++)
		chm_read(arg, (i % 64) * MB, buf, MB);
	free(buf);
	return NULL;
}

static void monotonic(chm_dev *dev, const char *mode)
{
	atomic_store(&stop, false);
	pthread_t t;
	pthread_create(&t, NULL, reader_main, dev);
	struct chm_stats a, b;
	chm_stats(dev, &a);
	unsigned back = 0;
	for (int i = 0; i < 2000; i++) {
		chm_stats(dev, &b);
		back += b.read_hits < a.read_hits || b.read_misses < a.read_misses ||
		        b.bytes_read_ssd < a.bytes_read_ssd || b.lru_hits < a.lru_hits ||
		        b.lru_misses < a.lru_misses || b.clock_now_ns < a.clock_now_ns;
		back += b.lru_lines_valid > b.lru_lines_total;
		a = b;
	}
	atomic_store(&stop, true);
	pthread_join(t, NULL);
	CHECK(back == 0, "%s: %u snapshots went backwards or out of range", mode, back);
}

int main(void)
{
	static const char *const modes[] = {"prefetch", "lru", "direct"};
	uint8_t *buf = malloc(MB);
	for (unsigned m = 0; m < 3; m++) {
		chm_dev *dev;
		int rc = open_mode(modes[m], &dev);
		CHECK(rc == 0, "%s open: %s", modes[m], chm_strerror(rc));
		if (rc)
			continue;
		traffic(dev, modes[m], buf);
		struct chm_stats s;
		CHECK_RC(chm_stats(dev, &s), 0);
		relations(modes[m], &s);
		under_lock(dev, modes[m]);
		/* what came back under the lock is the quiet device's numbers */
		CHECK(held_st.read_hits == s.read_hits &&
		              held_st.lru_lines_valid == s.lru_lines_valid &&
		              held_st.slots_free == s.slots_free,
		      "%s: stats under the lock differ from the quiet device's", modes[m]);
		monotonic(dev, modes[m]);
		chm_dev_close(dev);
	}
	free(buf);
	return check_summary();
}
