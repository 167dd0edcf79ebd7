/* test_regress_handle_wrap.c - handles carried a 24-bit generation: with one
 * request record (slots=1, refill_queue=0) the 2^24th reuse of the record
 * issued the very token released at the start, so that stale token released
 * the new owner's prefetch (chm.h promises handles are "never reused").
 *
 * Part 1 cycles the record through the public API and checks the first token
 * is never issued again and stays -ESTALE: 2^16 times here, and 2^24 + 2
 * times (a full cycle of the old generation, ~30 s) in
 * test_regress_handle_wrap_full.c, the slow tier. Part 2 uses the
 * test-only hook chm_staging_test_set_generation() to start a record a few
 * generations before its last one and checks the boundary: the record is
 * retired instead of wrapping, every token of it stays -ESTALE, and a device
 * whose only record is retired refuses prefetches with -ENOSPC. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "chm.h"
#include "check.h"
#include "dev.h"
#include "staging.h"

static chm_dev *open_small(const char *refill_queue)
{
	struct chm_config c;
	cfg_init(&c, "backend", "ghost", "capacity", "1G", "dram", "1M", "wbuf", "64K", "slot_size",
	         "4K", "slots", "1", "refill_queue", refill_queue);
	chm_dev *dev = NULL;
	int rc = chm_dev_open(&c, &dev);
	CHECK_RC(rc, 0);
	if (rc)
		exit(check_summary());
	return dev;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

/* Part 1: cycles of one record, public API only. HANDLE_WRAP_FULL (the
 * slow tier's plain build) runs a full cycle of the old 24-bit generation;
 * otherwise the same path runs 2^16 cycles. */
#ifndef HANDLE_WRAP_FULL
#define HANDLE_WRAP_FULL 0
#endif
static void full_cycle(void)
{
	chm_dev *dev = open_small("0");
	struct chm_view v;
	chm_handle h0, h;
	CHECK_RC(chm_prefetch_object(dev, 0, 4096, 0, &h0), 0);
	CHECK_RC(chm_prefetch_release(dev, h0), 0);
	const uint64_t cycles = HANDLE_WRAP_FULL ? (1ull << 24) + 2 : (1ull << 16);
	uint64_t reissued = 0, bad = 0;
	for (uint64_t i = 0; i < cycles; i++) {
		int rc = chm_prefetch_object(dev, 0, 4096, 0, &h);
		if (rc) {
			CHECK_RC(rc, 0);
			break;
		}
		if (h == h0) {
			reissued++;
			/* the stale token must not release the new owner's prefetch */
			CHECK_RC(chm_prefetch_release(dev, h0), -ESTALE);
		}
		rc = chm_prefetch_release(dev, h);
		if (rc) {
			bad++;
			CHECK_RC(rc, 0);
			break;
		}
	}
	CHECK(reissued == 0, "the released token %#llx was issued again %llu times in %llu cycles",
	      (unsigned long long)h0, (unsigned long long)reissued, (unsigned long long)cycles);
	CHECK_RC(chm_prefetch_wait(dev, h0, 0, &v), -ESTALE);
	CHECK_RC(chm_prefetch_release(dev, h0), -ESTALE);
	printf("full cycle: %llu prefetch/release cycles of one record, first token reissued "
	       "%llu times\n",
	       (unsigned long long)cycles, (unsigned long long)reissued);
	chm_dev_close(dev);
	(void)bad;
}

/* Part 2: the last generations of one record, then past them. */
static void boundary_one_record(void)
{
	chm_dev *dev = open_small("0");
	struct chm_view v;
	struct chm_stats st;
	chm_handle first, h[3];
	uint64_t last = chm_staging_last_generation(dev);
	/* one record: index 0 in 1 bit, a 47-bit generation */
	CHECK(last == (1ull << 47) - 1, "last generation %#llx", (unsigned long long)last);
	CHECK_RC(chm_prefetch_object(dev, 0, 4096, 0, &first), 0);
	CHECK((first & ((1ull << 48) - 1)) == (1ull << 1),
	      "first handle %#llx: generation 1, index 0", (unsigned long long)first);
	CHECK_RC(chm_prefetch_release(dev, first), 0);
	CHECK_RC(chm_staging_test_set_generation(dev, 0, last - 2), 0);
	for (int i = 0; i < 3; i++) {
		CHECK_RC(chm_prefetch_object(dev, 0, 4096, 0, &h[i]), 0);
		CHECK((h[i] & ((1ull << 48) - 1)) >> 1 == last - 2 + (uint64_t)i,
		      "handle %d carries generation %#llx", i, (unsigned long long)(h[i] >> 1));
		CHECK_RC(chm_prefetch_wait(dev, h[i], 0, &v), 0);
		CHECK_RC(chm_prefetch_release(dev, h[i]), 0);
	}
	/* the record is retired: no generation after the last, no wrap to 0 or 1 */
	chm_handle again;
	CHECK_RC(chm_prefetch_object(dev, 0, 4096, 0, &again), -ENOSPC);
	chm_stats(dev, &st);
	CHECK(st.prefetch_rejected == 1 && st.slots_free == 1);
	chm_handle tag = first & ~((1ull << 48) - 1);
	chm_handle stale[] = {first, h[0], h[1], h[2], tag | (0ull << 1), tag | (1ull << 1)};
	for (unsigned i = 0; i < sizeof(stale) / sizeof(stale[0]); i++) {
		CHECK_RC(chm_prefetch_wait(dev, stale[i], 0, &v), -ESTALE);
		CHECK_RC(chm_prefetch_release(dev, stale[i]), -ESTALE);
	}
	chm_dev_close(dev);
}

/* Part 2b: one of two records retires; the other goes on. */
static void boundary_two_records(void)
{
	chm_dev *dev = open_small("1");
	struct chm_view v;
	chm_handle a, b, c, d;
	uint64_t last = chm_staging_last_generation(dev);
	CHECK(last == (1ull << 46) - 1, "last generation %#llx", (unsigned long long)last);
	CHECK_RC(chm_staging_test_set_generation(dev, 0, last), 0);
	CHECK_RC(chm_staging_test_set_generation(dev, 2, 1), -EINVAL);
	CHECK_RC(chm_staging_test_set_generation(dev, 0, last + 1), -EINVAL);
	CHECK_RC(chm_prefetch_object(dev, 0, 4096, 0, &a), 0); /* record 0, last generation */
	CHECK_RC(chm_staging_test_set_generation(dev, 0, 1), -EBUSY);
	CHECK_RC(chm_prefetch_release(dev, a), 0);             /* retires record 0 */
	CHECK_RC(chm_prefetch_object(dev, 0, 4096, 0, &b), 0); /* record 1 */
	/* the queue has room but no record is free: a release will free one */
	CHECK_RC(chm_prefetch_object(dev, 0, 4096, 0, &c), -EAGAIN);
	CHECK_RC(chm_prefetch_release(dev, b), 0);
	CHECK_RC(chm_prefetch_object(dev, 0, 4096, 0, &d), 0);
	CHECK(d != a && d != b, "a retired or released token was issued again");
	CHECK_RC(chm_prefetch_wait(dev, d, 0, &v), 0);
	CHECK_RC(chm_prefetch_release(dev, a), -ESTALE);
	CHECK_RC(chm_prefetch_release(dev, b), -ESTALE);
	CHECK_RC(chm_prefetch_release(dev, d), 0);
	chm_dev_close(dev);
}

int main(void)
{
	if (HANDLE_WRAP_FULL && SANITIZED) { /* 10-20 times slower: the plain build does it */
		printf("SKIP: the full cycle runs in the plain build\n");
		return 77;
	}
	full_cycle();
	boundary_one_record();
	boundary_two_records();
	return check_summary();
}
