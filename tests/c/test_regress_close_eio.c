/* test_regress_close_eio.c - close flushes the write buffer "best effort"
 * (chm_wbuf_fini gives it 10 s), but the flush barrier returns -EIO on the
 * first failed batch and close then stops the flusher at once: one transient
 * write error at close drops every write behind it, although the flusher
 * would have retried the batch 10 ms later. A SLOW fault holds the flusher
 * inside an earlier batch so the transient EIO lands deterministically while
 * close is flushing. Checks that every admitted write is on the SSD after
 * close (reopened in direct mode). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chm.h"
#include "check.h"

#define LEN 65536

int main(void)
{
	struct scratch sc;
	if (!scratch_make(&sc))
		return 77;
	struct chm_config c;
	cfg_init(&c, "backend", "pread", "targets", sc.path, "capacity", "16M", "dram", "4M",
	         "wbuf", "2M", "slot_size", "64K", "slots", "4");
	chm_dev *dev;
	int status = scratch_open(&sc, &c, &dev, "no O_DIRECT in /tmp");
	if (status)
		return status;
	static char e1[LEN] __attribute__((aligned(4096)));
	static char e2[LEN] __attribute__((aligned(4096)));
	static char e3[LEN] __attribute__((aligned(4096)));
	memset(e1, 0x01, LEN);
	memset(e2, 0x02, LEN);
	memset(e3, 0x03, LEN);
	/* the flusher's batch of e1 completes 300 ms late */
	CHECK_RC(chm_fault_inject(dev, CHM_FAULT_SLOW, 0, 300ull * 1000 * 1000), 0);
	CHECK_RC(chm_write_object(dev, 0, e1, LEN, 0), 0);
	usleep(20000);
	/* admitted behind it; then one transient write error for the next write */
	CHECK_RC(chm_write_object(dev, 1 * LEN, e2, LEN, 0), 0);
	CHECK_RC(chm_write_object(dev, 2 * LEN, e3, LEN, 0), 0);
	CHECK_RC(chm_fault_inject(dev, CHM_FAULT_EIO_WRITE, 1, 0), 0);
	chm_dev_close(dev); /* best-effort flush: the one EIO should be retried */

	cfg_set(&c, "mode", "direct");
	CHECK_RC(chm_dev_open(&c, &dev), 0);
	static char got[LEN];
	const char *want[3] = {e1, e2, e3};
	for (int i = 0; i < 3; i++) {
		memset(got, 0, LEN);
		CHECK_RC(chm_read(dev, (uint64_t)i * LEN, got, LEN), 0);
		CHECK(memcmp(got, want[i], LEN) == 0,
		      "write %d (admitted before close) reads back 0x%02x, not 0x%02x", i + 1,
		      (unsigned char)got[0], (unsigned char)want[i][0]);
	}
	chm_dev_close(dev);
	scratch_remove(&sc);
	printf("close after one transient write error: every admitted write durable checked\n");
	return check_summary();
}
