/* test_wbuf.c - the write buffer: admit or skip (never stall), the log
 * wrapping around many times, newest bytes winning, read-your-writes through
 * misses and fills, the flush barrier (timeout, durability), space returning
 * after flushes. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chm.h"
#include "check.h"

#define CAP (16u << 20)
#define WBUF (256u << 10)

static uint8_t *shadow; /* what the device must hold */

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)((i * 131 + seed * 7919) >> 3);
}

static int same_as_shadow(chm_dev *dev, uint64_t addr, uint64_t len)
{
	uint8_t *got = malloc(len);
	int rc = chm_read(dev, addr, got, len);
	int ok = rc == 0 && memcmp(got, shadow + addr, len) == 0;
	free(got);
	return ok;
}

static void run(const char *backend, const char *path)
{
	struct chm_config c;
	cfg_init(&c, "backend", backend, "targets", path, "capacity", "16M", "dram", "1M", "wbuf",
	         "256K", "slot_size", "64K");
	chm_dev *dev;
	int rc = chm_dev_open(&c, &dev);
	if (rc == -EOPNOTSUPP) {
		printf("skip %s: not available here\n", backend);
		return;
	}
	CHECK_RC(rc, 0);
	if (rc)
		return;
	struct chm_stats st;
	uint8_t *buf = malloc(WBUF + 4096);

	/* 1. larger than the whole buffer: never admissible, a configuration
	 * error (-EINVAL), not a skip; nothing changes */
	fill(buf, WBUF + 4096, 1);
	CHECK_RC(chm_write_object(dev, 0, buf, WBUF + 4096, 0), -EINVAL);
	CHECK(same_as_shadow(dev, 0, WBUF + 4096), "a refused write changed the device");

	/* 2. a slow SSD: the buffer fills, later writes are skipped at once,
	 * the barrier times out, and nothing skipped is visible */
	CHECK_RC(chm_fault_inject(dev, CHM_FAULT_SLOW, 0, 200ull * 1000 * 1000), 0);
	unsigned admitted = 0, skipped = 0;
	for (unsigned i = 0; i < 16; i++) {
		uint64_t a = (uint64_t)i * 65536;
		fill(buf, 65536, 100 + i);
		int w = chm_write_object(dev, a, buf, 65536, 0);
		CHECK(w == 0 || w == CHM_WRITE_SKIPPED);
		if (w == 0) {
			memcpy(shadow + a, buf, 65536);
			admitted++;
		} else {
			skipped++;
		}
	}
	CHECK(skipped > 0 && admitted > 0 && admitted <= WBUF / 65536, "admitted %u skipped %u",
	      admitted, skipped);
	CHECK_RC(chm_flush(dev, 1000 * 1000), -ETIMEDOUT);
	CHECK(same_as_shadow(dev, 0, 16 * 65536), "read-your-writes with skips");
	CHECK_RC(chm_fault_inject(dev, CHM_FAULT_NONE, 0, 0), 0);
	CHECK_RC(chm_flush(dev, 10ull * 1000000000), 0);

	/* 3. the log wraps around many times; odd sizes; overlaps: newest wins */
	unsigned seed = 7;
	for (unsigned i = 0; i < 400; i++) {
		uint64_t len = 512u * (1 + rand_r(&seed) % 96);
		uint64_t a =
		        512u * (rand_r(&seed) % ((CAP - len) / 512 / 8)); /* low 2 MiB: overlaps */
		fill(buf, len, 1000 + i);
		int w = chm_write_object(dev, a, buf, len, 0);
		if (w == 0)
			memcpy(shadow + a, buf, len);
		if (i % 50 == 49) {
			CHECK(same_as_shadow(dev, 0, 2u << 20), "after %u writes", i + 1);
			/* a fill of a written range sees the newest bytes too */
			chm_handle h;
			struct chm_view v;
			CHECK_RC(chm_prefetch_object(dev, a, 65536, 0, &h), 0);
			CHECK_RC(chm_prefetch_wait(dev, h, 10ull * 1000000000, &v), 0);
			CHECK(memcmp(v.data, shadow + a, 65536) == 0, "staged copy after %u writes",
			      i);
			CHECK_RC(chm_prefetch_release(dev, h), 0);
		}
		if (i % 100 == 99)
			CHECK_RC(chm_flush(dev, 10ull * 1000000000), 0);
	}
	CHECK_RC(chm_flush(dev, 10ull * 1000000000), 0);
	chm_stats(dev, &st);
	CHECK(st.wr_admitted + st.wr_skipped == 16 + 400);
	CHECK(st.wr_flushed_bytes == st.wr_admitted_bytes, "flushed %llu admitted %llu",
	      (unsigned long long)st.wr_flushed_bytes, (unsigned long long)st.wr_admitted_bytes);
	CHECK(st.wbuf_bytes == WBUF && st.wbuf_used_bytes == 0, "used %llu after flush",
	      (unsigned long long)st.wbuf_used_bytes);
	CHECK(st.flush_batches >= 1);
	printf("ok %s: skip when full, barrier timeout, %llu admitted / %llu skipped over a "
	       "wrapping log, newest bytes win, space returns\n",
	       backend, (unsigned long long)st.wr_admitted, (unsigned long long)st.wr_skipped);
	chm_dev_close(dev);

	/* 4. durable: the file itself holds the device's bytes */
	int fd = open(path, O_RDONLY);
	uint8_t *disk = malloc(2u << 20);
	CHECK(pread(fd, disk, 2u << 20, 0) == (ssize_t)(2u << 20));
	CHECK(memcmp(disk, shadow, 2u << 20) == 0, "backing file differs after close");
	close(fd);
	free(disk);
	free(buf);
}

int main(void)
{
	const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/var/tmp";
	const char *backends[] = {"pread", "uring"};
	for (unsigned b = 0; b < 2; b++) {
		char path[512];
		snprintf(path, sizeof(path), "%s/chm-test-wbuf-%d-%u.img", dir, (int)getpid(), b);
		shadow = malloc(CAP);
		fill(shadow, CAP, 424242);
		FILE *f = fopen(path, "w");
		if (!f || fwrite(shadow, 1, CAP, f) != CAP) {
			perror(path);
			return 1;
		}
		fclose(f);
		run(backends[b], path);
		unlink(path);
		free(shadow);
	}
	return check_summary();
}
