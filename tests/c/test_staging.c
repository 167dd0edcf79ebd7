/* test_staging.c - issue/wait/release, the refill queue, handles, hits and
 * misses, close with outstanding handles; on ghost, pread and uring. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chm.h"
#include "check.h"

static uint8_t pattern(uint64_t addr)
{
	return (uint8_t)(addr * 2654435761u >> 13);
}

static void test_ghost_queue_and_handles(void)
{
	struct chm_config c;
	chm_dev *dev, *other;
	cfg_init(&c, "backend", "ghost", "capacity", "1G", "slot_size", "4K", "slots", "4",
	         "refill_queue", "4", "dram", "1M", "wbuf", "64K");
	CHECK_RC(chm_dev_open(&c, &dev), 0);
	CHECK_RC(chm_dev_open(&c, &other), 0);
	chm_handle h[9], oh;
	struct chm_view v;
	for (int i = 0; i < 8; i++)
		CHECK_RC(chm_prefetch_object(dev, (uint64_t)i * 4096, 4096, 0, &h[i]), 0);
	CHECK_RC(chm_prefetch_object(dev, 0, 4096, 0, &h[8]), -EAGAIN);
	CHECK_RC(chm_prefetch_object(dev, 0, 4096, CHM_PF_NOQUEUE, &h[8]), -EAGAIN);
	struct chm_stats st;
	chm_stats(dev, &st);
	CHECK(st.slots_ready == 4 && st.queue_len == 4 && st.prefetch_queued == 4);
	CHECK(st.prefetch_rejected == 2);
	/* queued: not staged yet */
	CHECK_RC(chm_prefetch_wait(dev, h[4], 0, &v), -ETIMEDOUT);
	/* FIFO: releasing slot 0 starts h[4], not h[5] */
	CHECK_RC(chm_prefetch_wait(dev, h[0], 0, &v), 0);
	CHECK(v.len == 4096 && v.dev_addr == 0);
	CHECK_RC(chm_prefetch_release(dev, h[0]), 0);
	CHECK_RC(chm_prefetch_wait(dev, h[4], 0, &v), 0);
	CHECK_RC(chm_prefetch_wait(dev, h[5], 0, &v), -ETIMEDOUT);
	/* stale, double release, foreign, malformed */
	CHECK_RC(chm_prefetch_release(dev, h[0]), -ESTALE);
	CHECK_RC(chm_prefetch_wait(dev, h[0], 0, &v), -ESTALE);
	CHECK_RC(chm_prefetch_object(other, 0, 4096, 0, &oh), 0);
	CHECK_RC(chm_prefetch_release(dev, oh), -EINVAL);
	CHECK_RC(chm_prefetch_wait(dev, oh, 0, &v), -EINVAL);
	CHECK_RC(chm_prefetch_release(dev, 0), -EINVAL);
	/* the index is the low bits, as few as hold nreqs (8: 4 bits); all ones
	 * is always beyond the last record */
	CHECK_RC(chm_prefetch_release(dev, h[1] | 0xF), -EINVAL); /* index */
	CHECK_RC(chm_prefetch_release(dev, h[1] | 0xFFFFFF), -EINVAL);
	CHECK_RC(chm_prefetch_release(dev, h[1] + (1ull << 24)), -ESTALE); /* generation */
	/* bad arguments */
	CHECK_RC(chm_prefetch_object(dev, 0, 0, 0, &oh), -EINVAL);
	CHECK_RC(chm_prefetch_object(dev, 0, 4097, 0, &oh), -EINVAL);
	CHECK_RC(chm_prefetch_object(dev, (1ull << 30) - 4096, 8192, 0, &oh), -EINVAL);
	CHECK_RC(chm_prefetch_object(dev, UINT64_MAX - 10, 100, 0, &oh), -EINVAL);
	CHECK_RC(chm_prefetch_object(dev, 0, 4096, 0x80, &oh), -EINVAL);
	CHECK_RC(chm_prefetch_object(dev, 0, 4096, 0, NULL), -EINVAL);
	CHECK_RC(chm_prefetch_wait(dev, h[1], 0, NULL), -EINVAL);
	/* release a queued one: h[5] leaves the queue, h[6] is next */
	CHECK_RC(chm_prefetch_release(dev, h[5]), 0);
	CHECK_RC(chm_prefetch_release(dev, h[1]), 0);
	CHECK_RC(chm_prefetch_wait(dev, h[6], 0, &v), 0);
	chm_stats(dev, &st);
	CHECK(st.slots_free + st.slots_filling + st.slots_ready + st.slots_held + st.slots_failed ==
	      st.slots_total);
	CHECK(st.window_bytes == 4ull * (4096 + 4096));
	chm_dev_close(other);
	/* close with outstanding handles (held, ready, queued) */
	chm_dev_close(dev);
	chm_dev_close(NULL);
	printf("ok ghost: queue FIFO, EAGAIN, stale/foreign handles, bad args, close\n");
}

struct waiter {
	chm_dev *dev;
	chm_handle h;
	int rc;
};

static void *wait_forever(void *arg)
{
	struct waiter *w = arg;
	struct chm_view v;
	w->rc = chm_prefetch_wait(w->dev, w->h, UINT64_MAX, &v);
	return NULL;
}

static void test_backend(const char *backend, const char *dir)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/chm-test-staging-%d-%s.img", dir, (int)getpid(), backend);
	const uint64_t cap = 64ull << 20;
	int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0644);
	CHECK(fd >= 0);
	uint8_t *pat = malloc(cap);
	for (uint64_t i = 0; i < cap; i++)
		pat[i] = pattern(i);
	CHECK(pwrite(fd, pat, cap, 0) == (ssize_t)cap);
	close(fd);

	struct chm_config c;
	chm_dev *dev;
	cfg_init(&c, "backend", backend, "targets", path, "capacity", "64M", "slot_size", "4M",
	         "dram", "40M", "wbuf", "4M");
	int rc = chm_dev_open(&c, &dev);
	if (rc == -EOPNOTSUPP) {
		printf("skip %s: not available on this host\n", backend);
		free(pat);
		return;
	}
	CHECK_RC(rc, 0);
	if (rc) {
		free(pat);
		return;
	}
	struct chm_view v;
	chm_handle h, h2;
	/* an unaligned object */
	uint64_t a = 1234567, n = 3 * 1000 * 1000 + 7;
	CHECK_RC(chm_prefetch_object(dev, a, n, 0, &h), 0);
	CHECK_RC(chm_prefetch_wait(dev, h, 5000000000ull, &v), 0);
	CHECK(v.len == n && memcmp(v.data, pat + a, n) == 0);
	/* a hit inside the staged object, a miss outside */
	uint8_t *buf = malloc(1 << 20);
	CHECK_RC(chm_read(dev, a + 100, buf, 1 << 20), 0);
	CHECK(memcmp(buf, pat + a + 100, 1 << 20) == 0);
	CHECK_RC(chm_read(dev, 50000001, buf, 777), 0);
	CHECK(memcmp(buf, pat + 50000001, 777) == 0);
	struct chm_stats st;
	chm_stats(dev, &st);
	CHECK(st.read_hits == 1 && st.read_misses == 1);
	CHECK(st.bytes_from_dram == 1 << 20);
	CHECK(st.prefetch_completed == 1 && st.slots_held == 1);
	CHECK_RC(chm_prefetch_release(dev, h), 0);
	/* after release the range is a miss again */
	CHECK_RC(chm_read(dev, a + 100, buf, 4096), 0);
	chm_stats(dev, &st);
	CHECK(st.read_misses == 2);
	CHECK_RC(chm_read(dev, cap - 10, buf, 11), -EINVAL);
	CHECK_RC(chm_read(dev, 0, NULL, 11), -EINVAL);
	/* every object of the file through the window, 8 in flight */
	uint64_t obj = 4ull << 20;
	chm_handle hs[16];
	for (uint64_t i = 0; i < cap / obj; i++)
		CHECK_RC(chm_prefetch_object(dev, i * obj, obj, 0, &hs[i]), 0);
	for (uint64_t i = 0; i < cap / obj; i++) {
		CHECK_RC(chm_prefetch_wait(dev, hs[i], 5000000000ull, &v), 0);
		CHECK(memcmp(v.data, pat + i * obj, obj) == 0);
		CHECK_RC(chm_prefetch_release(dev, hs[i]), 0);
	}
	/* write path: admitted data is visible before and after flush */
	memset(buf, 0xab, 8192);
	CHECK_RC(chm_write_object(dev, 8192, buf, 8192, 0), 0);
	CHECK_RC(chm_write_object(dev, 8191, buf, 8192, 0), -EINVAL);
	uint8_t *rb = malloc(16384);
	CHECK_RC(chm_read(dev, 4096, rb, 16384), 0);
	CHECK(memcmp(rb, pat + 4096, 4096) == 0);
	CHECK(rb[4096] == 0xab && rb[4096 + 8191] == 0xab);
	CHECK(memcmp(rb + 12288, pat + 16384, 4096) == 0);
	CHECK_RC(chm_prefetch_object(dev, 0, 65536, 0, &h2), 0);
	CHECK_RC(chm_prefetch_wait(dev, h2, 5000000000ull, &v), 0);
	CHECK(((const uint8_t *)v.data)[8192] == 0xab);
	CHECK_RC(chm_prefetch_release(dev, h2), 0);
	CHECK_RC(chm_flush(dev, 5000000000ull), 0);
	chm_stats(dev, &st);
	CHECK(st.wr_admitted == 1 && st.wr_flushed_bytes == 8192 && st.flush_batches >= 1);
	/* an object bigger than the whole write buffer is refused (-EINVAL, a
	 * configuration error), not admitted */
	uint8_t *big = calloc(1, 5 << 20);
	CHECK_RC(chm_write_object(dev, 0, big, 5 << 20, 0), -EINVAL);
	CHECK_RC(chm_read(dev, 0, rb, 4096), 0);
	CHECK(memcmp(rb, pat, 4096) == 0); /* a refused write changes nothing */
	free(big);
	/* a waiter blocked at close returns -ECANCELED */
	cfg_set(&c, "slots", "1");
	chm_dev_close(dev);
	fd = open(path, O_RDONLY);
	CHECK(pread(fd, rb, 8192, 8192) == 8192 && rb[0] == 0xab && rb[8191] == 0xab);
	close(fd);
	CHECK_RC(chm_dev_open(&c, &dev), 0);
	CHECK_RC(chm_prefetch_object(dev, 0, obj, 0, &hs[0]), 0);
	CHECK_RC(chm_prefetch_object(dev, obj, obj, 0, &hs[1]), 0);
	struct waiter w = {.dev = dev, .h = hs[1], .rc = 1};
	pthread_t t;
	pthread_create(&t, NULL, wait_forever, &w);
	usleep(100000);
	chm_dev_close(dev);
	pthread_join(t, NULL);
	CHECK_RC(w.rc, -ECANCELED);
	free(rb);
	free(buf);
	free(pat);
	unlink(path);
	printf("ok %s: data, hits/misses, queue, writes, flush, skip, close cancels waiters\n",
	       backend);
}

int main(void)
{
	const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/var/tmp";
	test_ghost_queue_and_handles();
	test_backend("pread", dir);
	test_backend("uring", dir);
	return check_summary();
}
