/* test_regress_close_inflight.c - close while a staging fill is still in
 * flight on the pread backend (held back by a SLOW fault). Close tears the
 * write buffer down (free, then dev->wbuf = NULL without the device lock)
 * before the backend drains, while the fill's completion reads dev->wbuf
 * (read_end, overlay) under the lock: a race with a use-after-free window.
 * The plain build only checks that close returns; the TSan build reports
 * the race (halt_on_error makes it a failure). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chm.h"
#include "check.h"

int main(void)
{
	struct scratch sc;
	if (!scratch_make(&sc))
		return 77;
	struct chm_config c;
	cfg_init(&c, "backend", "pread", "targets", sc.path, "capacity", "16M", "dram", "2M",
	         "wbuf", "512K", "slot_size", "64K", "slots", "4");
	chm_dev *dev;
	int status = scratch_open(&sc, &c, &dev, "no O_DIRECT in /tmp");
	if (status)
		return status;
	/* every backend I/O completes 300 ms late: the fill is in flight at close */
	CHECK_RC(chm_fault_inject(dev, CHM_FAULT_SLOW, 0, 300ull * 1000 * 1000), 0);
	chm_handle h;
	CHECK_RC(chm_prefetch_object(dev, 0, 64 << 10, 0, &h), 0);
	struct chm_stats st;
	chm_stats(dev, &st);
	CHECK(st.slots_filling == 1, "fill in flight before close (filling=%u)", st.slots_filling);
	chm_dev_close(dev);
	printf("close with a fill in flight returned\n");
	scratch_remove(&sc);
	return check_summary();
}
