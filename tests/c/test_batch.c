/* test_batch.c - batched prefetch, release and write: a status per element,
 * the same as the one-object call would give it, in order; bad arrays are
 * refused whole; four threads run batches at once (built under TSan too). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "chm.h"

#define NT 4
#define ROUNDS 400

static chm_dev *dev;
static atomic_uint bad;

static void ghost_open(const char *slots, const char *queue)
{
	struct chm_config c;
	cfg_init(&c, "backend", "ghost", "capacity", "1G", "dram", "1M", "wbuf", "256K",
	         "slot_size", "4K", "slots", slots, "refill_queue", queue);
	int rc = chm_dev_open(&c, &dev);
	CHECK_RC(rc, 0);
	if (rc)
		exit(check_summary());
}

static void test_statuses(void)
{
	ghost_open("8", "4");
	enum {
		N = 16
	};
	uint64_t addrs[N], lens[N];
	chm_handle hs[N];
	int32_t res[N];
	for (unsigned i = 0; i < N; i++) {
		addrs[i] = (uint64_t)i * 4096;
		lens[i] = 4096;
	}
	lens[3] = 0;           /* -EINVAL, and the rest go on */
	addrs[5] = 1ull << 40; /* beyond capacity */
	CHECK_RC(chm_prefetch_objects(dev, N, addrs, lens, 0, hs, res), 12);
	for (unsigned i = 0; i < N; i++) {
		int want = i == 3 || i == 5 ? -EINVAL : i < 15 ? 0 : -EAGAIN;
		/* 14 valid: 8 take slots, 4 queue, then the queue is full */
		if (i == 14)
			want = -EAGAIN;
		CHECK(res[i] == want, "element %u: %d (%s), want %d", i, res[i],
		      chm_strerror(res[i]), want);
	}
	struct chm_stats st;
	chm_stats(dev, &st);
	CHECK(st.prefetch_issued == 12 && st.prefetch_queued == 4 && st.prefetch_rejected == 2,
	      "issued %llu queued %llu rejected %llu", (unsigned long long)st.prefetch_issued,
	      (unsigned long long)st.prefetch_queued, (unsigned long long)st.prefetch_rejected);
	/* the views are there (ghost fills complete at once) */
	struct chm_view v;
	CHECK_RC(chm_prefetch_wait(dev, hs[0], 0, &v), 0);
	CHECK(v.dev_addr == 0 && v.len == 4096, "view %llu+%llu", (unsigned long long)v.dev_addr,
	      (unsigned long long)v.len);
	/* release all that succeeded, one twice: -ESTALE at its place */
	chm_handle rel[13];
	int32_t rres[13];
	unsigned k = 0;
	for (unsigned i = 0; i < N; i++)
		if (res[i] == 0)
			rel[k++] = hs[i];
	rel[k++] = hs[0];
	CHECK_RC(chm_prefetch_release_many(dev, k, rel, rres), 12);
	for (unsigned i = 0; i < k; i++)
		CHECK(rres[i] == (i == k - 1 ? -ESTALE : 0), "release %u: %d", i, rres[i]);
	chm_stats(dev, &st);
	CHECK(st.slots_free == 8 && st.queue_len == 0, "free %u queue %u", st.slots_free,
	      st.queue_len);
	/* whole-call refusals */
	CHECK_RC(chm_prefetch_objects(dev, N, NULL, lens, 0, hs, res), -EINVAL);
	CHECK_RC(chm_prefetch_objects(dev, CHM_BATCH_MAX + 1, addrs, lens, 0, hs, res), -EINVAL);
	CHECK_RC(chm_prefetch_release_many(dev, 1, NULL, rres), -EINVAL);
	CHECK_RC(chm_prefetch_objects(NULL, 1, addrs, lens, 0, hs, res), -EINVAL);
	CHECK_RC(chm_prefetch_objects(dev, 0, addrs, lens, 0, hs, res), 0);
	/* a flag no call knows: every element -EINVAL */
	CHECK_RC(chm_prefetch_objects(dev, 2, addrs, lens, 0x80, hs, res), 0);
	CHECK(res[0] == -EINVAL && res[1] == -EINVAL, "%d %d", res[0], res[1]);
	/* NOQUEUE: with slots full the rest is -EAGAIN, nothing queued */
	for (unsigned i = 0; i < N; i++)
		lens[i] = 4096, addrs[i] = (uint64_t)i * 4096;
	CHECK_RC(chm_prefetch_objects(dev, 10, addrs, lens, CHM_PF_NOQUEUE, hs, res), 8);
	CHECK(res[8] == -EAGAIN && res[9] == -EAGAIN, "%d %d", res[8], res[9]);
	CHECK_RC(chm_prefetch_release_many(dev, 8, hs, rres), 8);
	/* writes */
	static char a[4096] __attribute__((aligned(4096))), b[1 << 20];
	const void *bufs[4] = {a, a + 1, b, a};
	uint64_t waddr[4] = {0, 4096, 8192, 100}, wlen[4] = {4096, 512, sizeof(b), 512};
	int32_t wres[4];
	CHECK_RC(chm_write_objects(dev, 4, waddr, bufs, wlen, 0, wres), 2);
	CHECK(wres[0] == 0, "write 0: %d", wres[0]);
	CHECK(wres[1] == 0, "write 1: %d", wres[1]);
	CHECK(wres[2] == -EINVAL, "1 MiB into a 256 KiB buffer (never admissible): %d", wres[2]);
	CHECK(wres[3] == -EINVAL, "unaligned write: %d", wres[3]);
	CHECK_RC(chm_write_objects(dev, 1, waddr, NULL, wlen, 0, wres), -EINVAL);
	chm_dev_close(dev);
}

static void *worker(void *arg)
{
	unsigned id = (unsigned)(uintptr_t)arg;
	enum {
		B = 6
	};
	uint64_t addrs[B], lens[B];
	chm_handle hs[B];
	int32_t res[B], rres[B];
	for (unsigned r = 0; r < ROUNDS; r++) {
		for (unsigned i = 0; i < B; i++) {
			addrs[i] = ((uint64_t)id * 1000 + r * B + i) * 4096;
			lens[i] = 1 + (r + i) % 4096;
		}
		int ok = chm_prefetch_objects(dev, B, addrs, lens, 0, hs, res);
		if (ok < 0)
			atomic_fetch_add(&bad, 1);
		chm_handle live[B];
		unsigned n = 0;
		for (unsigned i = 0; i < B; i++) {
			if (res[i] == 0) {
				struct chm_view v;
				if (chm_prefetch_wait(dev, hs[i], 10ull * 1000000000ull, &v) ||
				    v.dev_addr != addrs[i] || v.len != lens[i])
					atomic_fetch_add(&bad, 1);
				live[n++] = hs[i];
			} else if (res[i] != -EAGAIN) {
				atomic_fetch_add(&bad, 1);
			}
		}
		if (chm_prefetch_release_many(dev, n, live, rres) != (int)n)
			atomic_fetch_add(&bad, 1);
	}
	return NULL;
}

static void test_threads(void)
{
	ghost_open("16", "8");
	pthread_t t[NT];
	for (unsigned i = 0; i < NT; i++)
		pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
	for (unsigned i = 0; i < NT; i++)
		pthread_join(t[i], NULL);
	struct chm_stats st;
	chm_stats(dev, &st);
	printf("%u threads x %u batches: issued %llu (queued %llu, rejected %llu), "
	       "%u bad\n",
	       NT, ROUNDS, (unsigned long long)st.prefetch_issued,
	       (unsigned long long)st.prefetch_queued, (unsigned long long)st.prefetch_rejected,
	       atomic_load(&bad));
	CHECK(atomic_load(&bad) == 0, "%u bad results", atomic_load(&bad));
	CHECK(st.slots_free == st.slots_total && st.queue_len == 0, "free %u of %u, queue %u",
	      st.slots_free, st.slots_total, st.queue_len);
	CHECK(st.prefetch_issued == st.prefetch_released, "issued %llu released %llu",
	      (unsigned long long)st.prefetch_issued, (unsigned long long)st.prefetch_released);
	chm_dev_close(dev);
}

int main(void)
{
	test_statuses();
	test_threads();
	return check_summary();
}
