/* test_regress_lru_view_offset.c - chm_view.pool_offset is "the offset of
 * data[0] in the DRAM pool" (what a daemon client maps through the pool
 * memfd). In lru mode the view lives in a separate host mapping, and
 * pool_offset is the difference of two unrelated pointers. Checks, on a
 * memfd pool, that pool_offset either names bytes inside the pool that
 * hold the object or is UINT64_MAX ("not in the pool"; the header would
 * have to say so). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "chm.h"
#include "check.h"

int main(void)
{
	struct scratch sc;
	if (!scratch_make(&sc))
		return 77;
	struct chm_config c;
	cfg_init(&c, "backend", "pread", "targets", sc.path, "mode", "lru", "pool", "memfd",
	         "capacity", "16M", "dram", "1M", "lru_line", "64K", "slot_size", "4K", "slots",
	         "4");
	chm_dev *dev;
	int status = scratch_open(&sc, &c, &dev, "no O_DIRECT or memfd here");
	if (status)
		return status;
	static char pat[4096] __attribute__((aligned(4096)));
	memset(pat, 0x5a, sizeof(pat));
	CHECK_RC(chm_write_object(dev, 8192, pat, sizeof(pat), 0), 0);
	chm_handle h;
	struct chm_view v;
	CHECK_RC(chm_prefetch_object(dev, 8192, 4096, 0, &h), 0);
	CHECK_RC(chm_prefetch_wait(dev, h, UINT64_MAX, &v), 0);
	struct chm_stats st;
	chm_stats(dev, &st);
	int fd = chm_dev_pool_fd(dev);
	CHECK(fd >= 0, "memfd pool fd %d", fd);
	CHECK(memcmp(v.data, pat, 4096) == 0, "view data is the object");
	if (v.pool_offset == UINT64_MAX) {
		printf("lru mode: view says it is not in the pool (UINT64_MAX): fine\n");
		goto out;
	}
	CHECK(v.pool_offset <= st.pool_bytes && v.len <= st.pool_bytes - v.pool_offset,
	      "lru view pool_offset %#llx + len %llu is outside the %llu-byte pool",
	      (unsigned long long)v.pool_offset, (unsigned long long)v.len,
	      (unsigned long long)st.pool_bytes);
	if (fd >= 0 && v.pool_offset <= st.pool_bytes && v.len <= st.pool_bytes - v.pool_offset) {
		char *p = mmap(NULL, st.pool_bytes, PROT_READ, MAP_SHARED, fd, 0);
		CHECK(p != MAP_FAILED);
		if (p != MAP_FAILED) {
			CHECK(memcmp(p + v.pool_offset, pat, 4096) == 0,
			      "pool bytes at pool_offset are not the object");
			munmap(p, st.pool_bytes);
		}
	}
out:
	CHECK_RC(chm_prefetch_release(dev, h), 0);
	chm_dev_close(dev);
	scratch_remove(&sc);
	printf("lru mode: view pool_offset checked against the memfd pool\n");
	return check_summary();
}
