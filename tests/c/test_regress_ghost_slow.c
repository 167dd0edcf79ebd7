/* test_regress_ghost_slow.c - CHM_FAULT_SLOW "delays every backend I/O by arg
 * ns"; the ghost backend models that by moving io->model_done_ns, but the
 * core computes a fill's ready time before submit and never reads
 * model_done_ns back (nor do synchronous reads), so in virtual time a slow
 * drive is exactly as fast as a healthy one. Checks that with SLOW armed a
 * prefetch wait and a miss read each advance the virtual clock by at least
 * the delay. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "chm.h"
#include "check.h"

int main(void)
{
	const uint64_t slow = 5000000; /* 5 ms */
	struct chm_config c;
	cfg_init(&c, "backend", "ghost", "clock", "virtual", "capacity", "1G", "dram", "1M", "wbuf",
	         "64K", "slot_size", "4K", "slots", "4", "timing", "gen5-tlc-200g");
	chm_dev *dev;
	CHECK_RC(chm_dev_open(&c, &dev), 0);
	struct chm_stats st;
	chm_stats(dev, &st);
	uint64_t t0 = st.clock_now_ns;
	CHECK_RC(chm_fault_inject(dev, CHM_FAULT_SLOW, 0, slow), 0);
	chm_handle h;
	struct chm_view v;
	CHECK_RC(chm_prefetch_object(dev, 0, 4096, 0, &h), 0);
	CHECK_RC(chm_prefetch_wait(dev, h, UINT64_MAX, &v), 0);
	chm_stats(dev, &st);
	CHECK(st.clock_now_ns - t0 >= slow,
	      "prefetch wait with SLOW %llu ns armed advanced the virtual clock by %llu ns",
	      (unsigned long long)slow, (unsigned long long)(st.clock_now_ns - t0));
	CHECK_RC(chm_prefetch_release(dev, h), 0);
	t0 = st.clock_now_ns;
	static char buf[4096];
	CHECK_RC(chm_read(dev, 1 << 20, buf, sizeof(buf)), 0);
	chm_stats(dev, &st);
	CHECK(st.clock_now_ns - t0 >= slow,
	      "miss read with SLOW %llu ns armed advanced the virtual clock by %llu ns",
	      (unsigned long long)slow, (unsigned long long)(st.clock_now_ns - t0));
	chm_dev_close(dev);
	printf("ghost + virtual clock: SLOW fault visible to prefetch wait and miss read checked\n");
	return check_summary();
}
