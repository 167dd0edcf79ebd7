/* test_batch_stress.c - batched prefetch/wait/release across sessions from
 * many threads at once (pread backend: fills complete on worker threads),
 * with sessions closed under pending fills and waiters, and handles used
 * from the wrong session, and one session flooding the refill queue. Built plain, under ASan/UBSan and under TSan. At
 * the end every slot is free, the queue empty and the counters balance. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "chm.h"

#define NT 4 /* batch threads; thread 0 uses the default session */
#define ROUNDS 150
#define BATCH 8
#define OBJ 4096u
#define CAP (16u << 20)

static chm_dev *dev;
static atomic_uint bad;
static _Atomic chm_handle published[NT]; /* a live-ish handle per thread */
static _Atomic chm_session published_sess[NT];
static atomic_ulong foreign_tries, closes, closed_released;

#define BAD(...)                                                                                   \
	do {                                                                                       \
		fprintf(stderr, __VA_ARGS__);                                                      \
		fprintf(stderr, "\n");                                                             \
		atomic_fetch_add(&bad, 1);                                                         \
	} while (0)

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void *batch_main(void *arg)
{
	unsigned me = (unsigned)(uintptr_t)arg;
	uint64_t seed = 0x9e3779b97f4a7c15ull * (me + 1);
	chm_session s = CHM_SESSION_DEFAULT;
	if (me && chm_session_open(dev, 12, &s)) {
		BAD("thread %u: session_open failed", me);
		return NULL;
	}
	atomic_store(&published_sess[me], s);
	for (unsigned r = 0; r < ROUNDS; r++) {
		uint64_t addrs[BATCH], lens[BATCH];
		chm_handle hs[BATCH];
		int32_t res[BATCH];
		for (unsigned i = 0; i < BATCH; i++) {
			addrs[i] = (rnd(&seed) % (CAP / OBJ)) * OBJ + (rnd(&seed) % 2) * 100;
			lens[i] = 1 + rnd(&seed) % (OBJ - 200);
		}
		int n = chm_session_prefetch(dev, s, BATCH, addrs, lens, 0, hs, res);
		if (n < 0) {
			BAD("thread %u: batch %d", me, n);
			break;
		}
		for (unsigned i = 0; i < BATCH; i++) {
			if (res[i] == -EAGAIN)
				continue; /* quota or queue: fine under load */
			if (res[i]) {
				BAD("thread %u: element %u: %d", me, i, res[i]);
				continue;
			}
			atomic_store(&published[me], hs[i]);
			struct chm_view v;
			int w = chm_session_wait(dev, s, hs[i], 5ull * 1000 * 1000 * 1000, &v);
			if (w)
				BAD("thread %u: wait %d", me, w);
			else if (v.dev_addr != addrs[i] || v.len != lens[i])
				BAD("thread %u: view %llu+%llu for %llu+%llu", me,
				    (unsigned long long)v.dev_addr, (unsigned long long)v.len,
				    (unsigned long long)addrs[i], (unsigned long long)lens[i]);
		}
		/* someone else's handle, through my session: never released here */
		unsigned other = (me + 1 + (unsigned)(rnd(&seed) % (NT - 1))) % NT;
		chm_handle oh = atomic_load(&published[other]);
		if (oh && atomic_load(&published_sess[other]) != s) {
			int32_t ores;
			int on = chm_session_release(dev, s, 1, &oh, &ores);
			atomic_fetch_add(&foreign_tries, 1);
			if (on != 0 || (ores != -EINVAL && ores != -ESTALE))
				BAD("thread %u: foreign release %d/%d", me, on, ores);
		}
		chm_handle rel[BATCH];
		unsigned k = 0;
		for (unsigned i = 0; i < BATCH; i++)
			if (!res[i])
				rel[k++] = hs[i];
		int32_t rres[BATCH];
		int got = chm_session_release(dev, s, k, rel, rres);
		if (got != (int)k)
			BAD("thread %u: released %d of %u", me, got, k);
	}
	atomic_store(&published[me], 0);
	if (me) {
		atomic_store(&published_sess[me], CHM_SESSION_DEFAULT);
		int c = chm_session_close(dev, s);
		if (c != 0)
			BAD("thread %u: close of an empty session gave %d", me, c);
	}
	return NULL;
}

/* A session that floods the queue: batches of 2 * BATCH, each element
 * waited on and released before the next (so it never holds a slot while
 * its own request waits in the queue). */
static void *flood_main(void *arg)
{
	(void)arg;
	chm_session s;
	if (chm_session_open(dev, 4 * BATCH, &s)) {
		BAD("flooder: open");
		return NULL;
	}
	uint64_t seed = 777;
	for (unsigned r = 0; r < ROUNDS; r++) {
		uint64_t addrs[2 * BATCH], lens[2 * BATCH];
		chm_handle hs[2 * BATCH];
		int32_t res[2 * BATCH];
		for (unsigned i = 0; i < 2 * BATCH; i++) {
			addrs[i] = (rnd(&seed) % (CAP / OBJ)) * OBJ;
			lens[i] = OBJ;
		}
		if (chm_session_prefetch(dev, s, 2 * BATCH, addrs, lens, 0, hs, res) < 0) {
			BAD("flooder: batch");
			break;
		}
		for (unsigned i = 0; i < 2 * BATCH; i++) {
			if (res[i])
				continue;
			struct chm_view v;
			int w = chm_session_wait(dev, s, hs[i], 5ull * 1000 * 1000 * 1000, &v);
			int32_t rr;
			if (w || chm_session_release(dev, s, 1, &hs[i], &rr) != 1)
				BAD("flooder: wait %d or release", w);
		}
	}
	if (chm_session_close(dev, s) != 0)
		BAD("flooder: close of an empty session");
	return NULL;
}

struct shared {
	chm_session s;
	chm_handle h[BATCH];
	int32_t res[BATCH];
	atomic_int stage; /* 1: issued, 2: waiters done */
};

static void *waiter_main(void *arg)
{
	struct shared *sh = arg;
	while (atomic_load(&sh->stage) < 1)
		;
	for (unsigned i = 0; i < BATCH; i++) {
		if (sh->res[i])
			continue;
		struct chm_view v;
		int w = chm_session_wait(dev, sh->s, sh->h[i], 5ull * 1000 * 1000 * 1000, &v);
		if (w != 0 && w != -ESTALE)
			BAD("waiter: %d", w);
	}
	return NULL;
}

/* Opens a session, issues a batch, and closes the session while another
 * thread waits on its handles and fills may still be in flight. */
static void *closer_main(void *arg)
{
	(void)arg;
	uint64_t seed = 12345;
	for (unsigned r = 0; r < ROUNDS / 2; r++) {
		struct shared sh = {0};
		if (chm_session_open(dev, BATCH, &sh.s)) {
			BAD("closer: open");
			return NULL;
		}
		uint64_t addrs[BATCH], lens[BATCH];
		for (unsigned i = 0; i < BATCH; i++) {
			addrs[i] = (rnd(&seed) % (CAP / OBJ)) * OBJ;
			lens[i] = OBJ;
		}
		int n = chm_session_prefetch(dev, sh.s, BATCH, addrs, lens, 0, sh.h, sh.res);
		pthread_t w;
		pthread_create(&w, NULL, waiter_main, &sh);
		atomic_store(&sh.stage, 1);
		if (r % 2)
			sched_yield();
		int c = chm_session_close(dev, sh.s);
		atomic_fetch_add(&closes, 1);
		if (c != n)
			BAD("closer: close released %d of %d", c, n);
		else
			atomic_fetch_add(&closed_released, (unsigned long)c);
		pthread_join(w, NULL);
		int32_t res1;
		if (n > 0 && chm_session_release(dev, sh.s, 1, &sh.h[0], &res1) != -ESTALE)
			BAD("closer: release in a closed session");
	}
	return NULL;
}

int main(void)
{
	struct scratch sc;
	if (!scratch_make(&sc)) {
		printf("SKIP: no scratch directory under /tmp\n");
		return 77;
	}
	struct chm_config c;
	cfg_init(&c, "backend", "pread", "capacity", "16M", "dram", "4M", "wbuf", "256K",
	         "slot_size", "4K");
	/* NT * BATCH held by the batch threads plus the closer's BATCH: every
	 * thread waits holding the views of its batch, so fewer slots could
	 * deadlock the workload itself (each waiting on a slot another holds);
	 * the closer's orphaned fills still make requests queue */
	cfg_set(&c, "slots", "40");
	cfg_set(&c, "refill_queue", "32");
	cfg_set(&c, "targets", sc.path);
	int rc = scratch_open(&sc, &c, &dev, "no O_DIRECT in /tmp");
	if (rc)
		return rc;
	pthread_t t[NT], cl, fl;
	for (unsigned i = 0; i < NT; i++)
		pthread_create(&t[i], NULL, batch_main, (void *)(uintptr_t)i);
	pthread_create(&cl, NULL, closer_main, NULL);
	pthread_create(&fl, NULL, flood_main, NULL);
	for (unsigned i = 0; i < NT; i++)
		pthread_join(t[i], NULL);
	pthread_join(cl, NULL);
	pthread_join(fl, NULL);
	CHECK(atomic_load(&bad) == 0, "%u bad outcomes", atomic_load(&bad));
	/* orphaned fills of closed sessions complete on the workers */
	struct chm_stats st;
	for (int i = 0; i < 500; i++) {
		chm_stats(dev, &st);
		if (!st.slots_filling)
			break;
		nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
	}
	CHECK(st.slots_free == st.slots_total && st.queue_len == 0, "free %u of %u, queue %u",
	      st.slots_free, st.slots_total, st.queue_len);
	CHECK(st.prefetch_issued ==
	              st.prefetch_completed + st.prefetch_failed + st.prefetch_cancelled,
	      "S15: issued %llu completed %llu failed %llu cancelled %llu",
	      (unsigned long long)st.prefetch_issued, (unsigned long long)st.prefetch_completed,
	      (unsigned long long)st.prefetch_failed, (unsigned long long)st.prefetch_cancelled);
	CHECK(atomic_load(&foreign_tries) > 0, "no foreign release was tried");
	/* every session record is free again: CHM_SESSION_MAX opens succeed */
	static chm_session all[CHM_SESSION_MAX];
	int opened = 0;
	for (int i = 0; i < CHM_SESSION_MAX; i++)
		opened += chm_session_open(dev, 1, &all[i]) == 0;
	CHECK(opened == CHM_SESSION_MAX, "%d sessions open after the run", opened);
	printf("%u threads x %u batches + %lu session closes (%lu handles released by close), "
	       "%lu foreign releases refused; issued %llu, queued %llu, rejected %llu\n",
	       NT, ROUNDS, atomic_load(&closes), atomic_load(&closed_released),
	       atomic_load(&foreign_tries), (unsigned long long)st.prefetch_issued,
	       (unsigned long long)st.prefetch_queued, (unsigned long long)st.prefetch_rejected);
	chm_dev_close(dev);
	scratch_remove(&sc);
	return check_summary();
}
