/* test_regress_lru_torn_view.c - an lru-mode view is old bytes or new
 * bytes, never a mix (fw_spec L9).
 *
 * A writer thread keeps rewriting a 64 KiB block (16 lines of 4 KiB; the
 * cache holds 12, so every access misses and drops the lock for I/O), every
 * 8-byte word of it holding the write's version. The main thread prefetches
 * the block, waits and checks that the view holds one version in every word;
 * its chm_read of the block must be whole versions too. The hint fill and a
 * read went through the cache in batches of lines with the device lock
 * dropped between them, so a write could land in the middle and the view
 * mixed versions across lines. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chm.h"
#include "check.h"

#define BLK (64u << 10)
#define WORDS (BLK / 8)
#define ROUNDS 400

static chm_dev *dev;
static atomic_uint_fast64_t written; /* newest completed write's version */
static atomic_bool stop;

static void *writer_main(void *arg)
{
	(void)arg;
	uint64_t *buf;
	if (posix_memalign((void **)&buf, 4096, BLK))
		abort();
	for (uint64_t v = 1; !atomic_load(&stop); v++) {
		for (unsigned i = 0; i < WORDS; i++)
			buf[i] = v;
		int rc = chm_write_object(dev, 0, buf, BLK, 0);
		if (rc) {
			fprintf(stderr, "write: %s\n", chm_strerror(rc));
			abort();
		}
		atomic_store(&written, v);
	}
	free(buf);
	return NULL;
}

/* Versions in p: lowest and highest. */
static void span(const uint64_t *p, uint64_t *lo, uint64_t *hi)
{
	*lo = UINT64_MAX;
	*hi = 0;
	for (unsigned i = 0; i < WORDS; i++) {
		*lo = p[i] < *lo ? p[i] : *lo;
		*hi = p[i] > *hi ? p[i] : *hi;
	}
}

int main(void)
{
	struct scratch sc;
	if (!scratch_make(&sc))
		return 77;
	struct chm_config c;
	cfg_init(&c, "backend", "pread", "mode", "lru", "targets", sc.path, "capacity", "16M",
	         "dram", "48K", "lru_line", "4K", "slot_size", "64K", "slots", "2");
	int status = scratch_open(&sc, &c, &dev, "no O_DIRECT in /tmp");
	if (status)
		return status;

	uint64_t *rd;
	if (posix_memalign((void **)&rd, 4096, BLK))
		abort();
	pthread_t w;
	pthread_create(&w, NULL, writer_main, NULL);
	while (atomic_load(&written) < 2)
		sched_yield();

	unsigned torn_views = 0, torn_reads = 0, older = 0;
	uint64_t worst_lo = 0, worst_hi = 0;
	for (unsigned k = 0; k < ROUNDS; k++) {
		chm_handle h;
		struct chm_view v;
		uint64_t before = atomic_load(&written);
		CHECK_RC(chm_prefetch_object(dev, 0, BLK, 0, &h), 0);
		CHECK_RC(chm_prefetch_wait(dev, h, 10ull * 1000000000ull, &v), 0);
		uint64_t lo, hi;
		span(v.data, &lo, &hi);
		if (lo != hi) {
			if (!torn_views++) {
				worst_lo = lo;
				worst_hi = hi;
			}
		}
		if (lo < before)
			older++; /* a write completed before prefetch is missing */
		CHECK_RC(chm_prefetch_release(dev, h), 0);
		CHECK_RC(chm_read(dev, 0, rd, BLK), 0);
		span(rd, &lo, &hi);
		if (lo != hi)
			torn_reads++;
	}
	atomic_store(&stop, true);
	pthread_join(w, NULL);
	printf("%u views, %llu writes: %u torn views (first: versions %llu..%llu), %u torn "
	       "reads, %u views older than a completed write\n",
	       ROUNDS, (unsigned long long)atomic_load(&written), torn_views,
	       (unsigned long long)worst_lo, (unsigned long long)worst_hi, torn_reads, older);
	CHECK(atomic_load(&written) > 50, "the writer barely ran");
	CHECK(torn_views == 0, "%u views mixed versions across lines", torn_views);
	CHECK(torn_reads == 0, "%u reads mixed versions across lines", torn_reads);
	CHECK(older == 0, "%u views older than a write that completed before prefetch", older);
	free(rd);
	chm_dev_close(dev);
	scratch_remove(&sc);
	return check_summary();
}
