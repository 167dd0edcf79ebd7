/* test_sessions.c - device sessions: bad tokens, another session's handle,
 * close releases (also a fill still in flight, whose completion must not
 * touch a later session), the quota, and round-robin grants with two
 * sessions where one floods the refill queue. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "chm.h"

#define KiB 1024ull

static chm_dev *ghost_open(const char *slots, const char *queue)
{
	struct chm_config c;
	chm_dev *dev = NULL;
	cfg_init(&c, "backend", "ghost", "capacity", "1G", "dram", "1M", "wbuf", "256K",
	         "slot_size", "4K", "slots", slots, "refill_queue", queue);
	int rc = chm_dev_open(&c, &dev);
	CHECK_RC(rc, 0);
	if (rc)
		exit(check_summary());
	return dev;
}

static int pf1(chm_dev *dev, chm_session s, uint64_t addr, chm_handle *h)
{
	uint64_t len = 4 * KiB;
	int32_t res = 1;
	int n = chm_session_prefetch(dev, s, 1, &addr, &len, 0, h, &res);
	return n < 0 ? n : res;
}

static int rel1(chm_dev *dev, chm_session s, chm_handle h)
{
	int32_t res = 1;
	int n = chm_session_release(dev, s, 1, &h, &res);
	return n < 0 ? n : res;
}

static int ready(chm_dev *dev, chm_session s, chm_handle h)
{
	struct chm_view v;
	return chm_session_wait(dev, s, h, 0, &v);
}

static struct chm_stats stats(chm_dev *dev)
{
	struct chm_stats st;
	CHECK_RC(chm_stats(dev, &st), 0);
	return st;
}

static void test_tokens(void)
{
	chm_dev *dev = ghost_open("4", "4");
	chm_session s, t;
	CHECK_RC(chm_session_open(NULL, 1, &s), -EINVAL);
	CHECK_RC(chm_session_open(dev, 0, &s), -EINVAL);
	CHECK_RC(chm_session_open(dev, 1, NULL), -EINVAL);
	CHECK_RC(chm_session_open(dev, 4, &s), 0);
	CHECK(s != CHM_SESSION_DEFAULT, "an opened session is not the default one");
	CHECK_RC(chm_session_close(dev, CHM_SESSION_DEFAULT), -EINVAL);
	CHECK_RC(chm_session_close(dev, s ^ (1ull << 48)), -EINVAL); /* foreign tag */
	CHECK_RC(chm_session_close(dev, s | 0xffff), -EINVAL);       /* index out of range */
	CHECK_RC(chm_session_close(NULL, s), -EINVAL);
	chm_handle h;
	CHECK_RC(pf1(dev, s ^ (1ull << 48), 0, &h), -EINVAL);
	CHECK_RC(chm_session_close(dev, s), 0);
	CHECK_RC(chm_session_close(dev, s), -ESTALE);
	CHECK_RC(pf1(dev, s, 0, &h), -ESTALE);
	CHECK_RC(rel1(dev, s, 1), -ESTALE);
	CHECK_RC(ready(dev, s, 1), -ESTALE);
	/* the record is reused with a new generation: the old token stays dead */
	CHECK_RC(chm_session_open(dev, 4, &t), 0);
	CHECK(t != s && (t & 0xffff) == (s & 0xffff), "reused record %#llx vs %#llx",
	      (unsigned long long)t, (unsigned long long)s);
	CHECK_RC(pf1(dev, s, 0, &h), -ESTALE);
	CHECK_RC(chm_session_close(dev, t), 0);
	/* the table holds CHM_SESSION_MAX sessions */
	static chm_session all[CHM_SESSION_MAX];
	int opened = 0;
	for (int i = 0; i < CHM_SESSION_MAX; i++)
		opened += chm_session_open(dev, 1, &all[i]) == 0;
	CHECK(opened == CHM_SESSION_MAX, "opened %d", opened);
	CHECK_RC(chm_session_open(dev, 1, &t), -ENOSPC);
	CHECK_RC(chm_session_close(dev, all[7]), 0);
	CHECK_RC(chm_session_open(dev, 1, &all[7]), 0);
	for (int i = 0; i < CHM_SESSION_MAX; i++)
		CHECK_RC(chm_session_close(dev, all[i]), 0);
	/* batch arguments refused whole */
	int32_t res[2];
	uint64_t a[2] = {0, 4096}, l[2] = {4096, 4096};
	chm_handle hs[2];
	CHECK_RC(
	        chm_session_prefetch(dev, CHM_SESSION_DEFAULT, CHM_BATCH_MAX + 1, a, l, 0, hs, res),
	        -EINVAL);
	CHECK_RC(chm_session_prefetch(dev, CHM_SESSION_DEFAULT, 2, NULL, l, 0, hs, res), -EINVAL);
	CHECK_RC(chm_session_release(dev, CHM_SESSION_DEFAULT, 2, hs, NULL), -EINVAL);
	chm_dev_close(dev);
}

static void test_foreign_handle(void)
{
	chm_dev *dev = ghost_open("4", "4");
	chm_session a, b;
	CHECK_RC(chm_session_open(dev, 8, &a), 0);
	CHECK_RC(chm_session_open(dev, 8, &b), 0);
	chm_handle ha, hd;
	CHECK_RC(pf1(dev, a, 0, &ha), 0);
	CHECK_RC(chm_prefetch_object(dev, 4096, 4096, 0, &hd), 0);
	struct chm_view v;
	/* another session's live handle: -EINVAL, and it stays live */
	CHECK_RC(ready(dev, b, ha), -EINVAL);
	CHECK_RC(rel1(dev, b, ha), -EINVAL);
	CHECK_RC(chm_prefetch_wait(dev, ha, 0, &v), -EINVAL);
	CHECK_RC(chm_prefetch_release(dev, ha), -EINVAL);
	CHECK_RC(ready(dev, a, hd), -EINVAL);
	CHECK_RC(rel1(dev, a, hd), -EINVAL);
	CHECK_RC(ready(dev, CHM_SESSION_DEFAULT, hd), 0);
	CHECK_RC(ready(dev, a, ha), 0);
	/* in a batch: per element */
	chm_handle mix[3] = {ha, hd, ha};
	int32_t res[3];
	CHECK_RC(chm_session_release(dev, b, 3, mix, res), 0);
	CHECK(res[0] == -EINVAL && res[1] == -EINVAL && res[2] == -EINVAL, "%d %d %d", res[0],
	      res[1], res[2]);
	CHECK_RC(chm_session_release(dev, a, 3, mix, res), 1);
	CHECK(res[0] == 0 && res[1] == -EINVAL && res[2] == -ESTALE, "%d %d %d", res[0], res[1],
	      res[2]);
	/* a released handle is stale from every session (the record is free) */
	CHECK_RC(rel1(dev, b, ha), -ESTALE);
	CHECK_RC(chm_prefetch_release(dev, hd), 0);
	struct chm_stats st = stats(dev);
	CHECK(st.slots_free == st.slots_total, "%u of %u slots free", st.slots_free,
	      st.slots_total);
	chm_session_close(dev, a);
	chm_session_close(dev, b);
	chm_dev_close(dev);
}

struct waiter {
	chm_dev *dev;
	chm_session s;
	chm_handle h;
	int rc;
};

static void *wait_main(void *arg)
{
	struct waiter *w = arg;
	struct chm_view v;
	w->rc = chm_session_wait(w->dev, w->s, w->h, 10ull * 1000 * 1000 * 1000, &v);
	return NULL;
}

static void test_close_releases(void)
{
	chm_dev *dev = ghost_open("2", "4");
	chm_session a;
	CHECK_RC(chm_session_open(dev, 16, &a), 0);
	chm_handle h[5];
	for (unsigned i = 0; i < 5; i++)
		CHECK_RC(pf1(dev, a, i * 4096, &h[i]), 0);
	/* two slots (one HELD, one READY), three queued; a default-session
	 * handle queued behind them is not touched by the close */
	CHECK_RC(ready(dev, a, h[0]), 0);
	chm_handle hd;
	CHECK_RC(chm_prefetch_object(dev, 0, 4096, 0, &hd), 0);
	struct chm_stats st = stats(dev);
	CHECK(st.queue_len == 4 && st.slots_free == 0, "queue %u free %u", st.queue_len,
	      st.slots_free);
	/* a waiter blocked on a queued handle wakes with -ESTALE */
	struct waiter w = {dev, a, h[4], 1};
	pthread_t t;
	pthread_create(&t, NULL, wait_main, &w);
	struct timespec ts = {0, 50 * 1000 * 1000};
	nanosleep(&ts, NULL);
	uint64_t rel0 = st.prefetch_released, fills0 = st.refill_lat_count;
	CHECK_RC(chm_session_close(dev, a), 5);
	pthread_join(t, NULL);
	CHECK(w.rc == -ESTALE, "waiter got %d (%s)", w.rc, chm_strerror(w.rc));
	st = stats(dev);
	CHECK(st.prefetch_released == rel0 + 5, "released %llu",
	      (unsigned long long)(st.prefetch_released - rel0));
	/* no fill was started for a's own queued requests on the way: the one
	 * fill is the default session's */
	CHECK(st.refill_lat_count == fills0 + 1, "%llu fills during close",
	      (unsigned long long)(st.refill_lat_count - fills0));
	/* the default session's queued request got a slot */
	CHECK(st.queue_len == 0 && st.slots_free == 1, "queue %u free %u", st.queue_len,
	      st.slots_free);
	CHECK_RC(chm_prefetch_wait(dev, hd, 0, &(struct chm_view){0}), 0);
	CHECK_RC(chm_prefetch_release(dev, hd), 0);
	for (unsigned i = 0; i < 5; i++)
		CHECK_RC(chm_prefetch_release(dev, h[i]), -ESTALE);
	chm_dev_close(dev);
}

/* Fills that are still in flight when their session closes (a slow pread
 * backend): the slot is freed when the fill completes, and its completion
 * does not uncharge the next session opened in the same record. */
static void test_close_mid_fill(void)
{
	struct scratch sc;
	if (!scratch_make(&sc)) {
		printf("skip mid-fill: no scratch directory\n");
		return;
	}
	struct chm_config c;
	cfg_init(&c, "backend", "pread", "capacity", "16M", "dram", "1M", "wbuf", "256K",
	         "slot_size", "4K", "slots", "4", "refill_queue", "4", "targets", sc.path);
	chm_dev *dev;
	if (scratch_open(&sc, &c, &dev, "no O_DIRECT in /tmp"))
		return;
	const uint64_t slow = 300ull * 1000 * 1000;
	CHECK_RC(chm_fault_inject(dev, CHM_FAULT_SLOW, 0, slow), 0);
	chm_session a, b;
	CHECK_RC(chm_session_open(dev, 2, &a), 0);
	chm_handle h1, h2, hb, hb2;
	CHECK_RC(pf1(dev, a, 0, &h1), 0);
	CHECK_RC(pf1(dev, a, 4096, &h2), 0);
	/* released while filling: still charged to a until its fill completes */
	CHECK_RC(rel1(dev, a, h1), 0);
	CHECK_RC(pf1(dev, a, 8192, &hb), -EAGAIN);
	struct chm_stats st = stats(dev);
	CHECK(st.slots_filling == 2, "%u filling", st.slots_filling);
	CHECK_RC(chm_session_close(dev, a), 1);
	/* the same record, a new session of quota 1: not charged for a's fills */
	CHECK_RC(chm_session_open(dev, 1, &b), 0);
	CHECK((b & 0xffff) == (a & 0xffff), "record reused");
	CHECK_RC(pf1(dev, b, 8192, &hb), 0);
	CHECK_RC(pf1(dev, b, 12288, &hb2), -EAGAIN);
	struct chm_view v;
	CHECK_RC(chm_session_wait(dev, b, hb, 5ull * 1000 * 1000 * 1000, &v), 0);
	/* a's two orphaned fills have completed by now (same delay, earlier) */
	st = stats(dev);
	for (int i = 0; i < 100 && st.slots_filling; i++) {
		nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
		st = stats(dev);
	}
	CHECK(st.slots_filling == 0 && st.slots_free == 3 && st.slots_held == 1,
	      "filling %u free %u held %u", st.slots_filling, st.slots_free, st.slots_held);
	/* and they did not uncharge b: its quota still holds */
	CHECK_RC(pf1(dev, b, 12288, &hb2), -EAGAIN);
	CHECK_RC(rel1(dev, b, hb), 0);
	CHECK_RC(pf1(dev, b, 12288, &hb2), 0);
	CHECK_RC(chm_session_close(dev, b), 1);
	chm_fault_inject(dev, CHM_FAULT_NONE, 0, 0);
	chm_dev_close(dev);
	scratch_remove(&sc);
}

static void test_quota(void)
{
	chm_dev *dev = ghost_open("2", "8");
	chm_session q;
	CHECK_RC(chm_session_open(dev, 3, &q), 0);
	uint64_t a[5], l[5];
	chm_handle hs[5];
	int32_t res[5];
	for (unsigned i = 0; i < 5; i++) {
		a[i] = i * 4096;
		l[i] = 4096;
	}
	/* 2 slots + 1 queued = 3 = the quota; the rest -EAGAIN */
	uint64_t rej0 = stats(dev).prefetch_rejected;
	CHECK_RC(chm_session_prefetch(dev, q, 5, a, l, 0, hs, res), 3);
	CHECK(res[0] == 0 && res[1] == 0 && res[2] == 0 && res[3] == -EAGAIN && res[4] == -EAGAIN,
	      "%d %d %d %d %d", res[0], res[1], res[2], res[3], res[4]);
	CHECK(stats(dev).prefetch_rejected == rej0 + 2, "rejected counted");
	/* the default session is not limited by q's quota */
	chm_handle hd;
	CHECK_RC(chm_prefetch_object(dev, 0, 4096, 0, &hd), 0);
	/* releasing a queued one gives one back; releasing a slotted one too */
	CHECK_RC(rel1(dev, q, hs[2]), 0);
	CHECK_RC(pf1(dev, q, 0, &hs[2]), 0);
	CHECK_RC(pf1(dev, q, 0, &hs[3]), -EAGAIN);
	CHECK_RC(rel1(dev, q, hs[0]), 0);
	CHECK_RC(pf1(dev, q, 0, &hs[0]), 0);
	CHECK_RC(chm_session_close(dev, q), 3);
	CHECK_RC(chm_prefetch_release(dev, hd), 0);
	struct chm_stats st = stats(dev);
	CHECK(st.slots_free == 2 && st.queue_len == 0, "free %u queue %u", st.slots_free,
	      st.queue_len);
	chm_dev_close(dev);
}

/* One slot: every grant is observable. The flooder F holds it and queues 8,
 * then O queues 2: F entered the ring first, so grants go F, O, F, O, then
 * the rest of F. */
static void test_round_robin(void)
{
	chm_dev *dev = ghost_open("1", "16");
	chm_session f, o;
	CHECK_RC(chm_session_open(dev, 64, &f), 0);
	CHECK_RC(chm_session_open(dev, 64, &o), 0);
	chm_handle hf[9], ho[2];
	for (unsigned i = 0; i < 9; i++)
		CHECK_RC(pf1(dev, f, i * 4096, &hf[i]), 0);
	for (unsigned i = 0; i < 2; i++)
		CHECK_RC(pf1(dev, o, (100 + i) * 4096, &ho[i]), 0);
	CHECK_RC(ready(dev, f, hf[0]), 0);
	/* release the slot's holder, see whose request got it, repeat */
	unsigned nf = 1, no = 0, g = 0;
	chm_handle cur = hf[0];
	chm_session cur_s = f;
	char got[16] = {0};
	for (; g < 10; g++) {
		CHECK_RC(rel1(dev, cur_s, cur), 0);
		if (nf < 9 && ready(dev, f, hf[nf]) == 0) {
			got[g] = 'F';
			cur = hf[nf++];
			cur_s = f;
		} else if (no < 2 && ready(dev, o, ho[no]) == 0) {
			got[g] = 'O';
			cur = ho[no++];
			cur_s = o;
		} else {
			break;
		}
	}
	CHECK(g == 10 && strcmp(got, "FOFOFFFFFF") == 0, "grants after the first: %s", got);
	CHECK_RC(rel1(dev, cur_s, cur), 0);
	/* a flooding default session is served round-robin with o as well */
	chm_handle hd[6], h2;
	for (unsigned i = 0; i < 6; i++)
		CHECK_RC(chm_prefetch_object(dev, i * 4096, 4096, 0, &hd[i]), 0);
	CHECK_RC(pf1(dev, o, 0, &h2), 0);
	CHECK_RC(chm_prefetch_release(dev, hd[0]), 0);
	CHECK_RC(chm_prefetch_wait(dev, hd[1], 0, &(struct chm_view){0}), 0);
	CHECK_RC(chm_prefetch_release(dev, hd[1]), 0);
	CHECK_RC(ready(dev, o, h2), 0); /* second grant: o's, ahead of hd[2..5] */
	CHECK_RC(chm_prefetch_wait(dev, hd[2], 0, &(struct chm_view){0}), -ETIMEDOUT);
	CHECK_RC(chm_session_close(dev, o), 1);
	CHECK_RC(chm_session_close(dev, f), 0);
	for (unsigned i = 2; i < 6; i++)
		CHECK_RC(chm_prefetch_release(dev, hd[i]), 0);
	struct chm_stats st = stats(dev);
	CHECK(st.slots_free == 1 && st.queue_len == 0, "free %u queue %u", st.slots_free,
	      st.queue_len);
	chm_dev_close(dev);
}

/* After shutdown every session call is -ECANCELED; a session left open at
 * close is freed with the device (ASan sees no leak). */
static void test_shutdown(void)
{
	chm_dev *dev = ghost_open("2", "2");
	chm_session s;
	chm_handle h;
	CHECK_RC(chm_session_open(dev, 4, &s), 0);
	CHECK_RC(pf1(dev, s, 0, &h), 0);
	chm_dev_shutdown(dev);
	CHECK_RC(chm_session_open(dev, 4, &s), -ECANCELED);
	CHECK_RC(pf1(dev, s, 0, &h), -ECANCELED);
	CHECK_RC(rel1(dev, s, h), -ECANCELED);
	CHECK_RC(ready(dev, s, h), -ECANCELED);
	CHECK_RC(chm_session_close(dev, s), -ECANCELED);
	chm_dev_close(dev);
}

/* Direct mode has no staging window, so no sessions. */
static void test_direct_mode(void)
{
	struct chm_config c;
	chm_dev *dev = NULL;
	cfg_init(&c, "backend", "ghost", "capacity", "1G", "mode", "direct");
	CHECK_RC(chm_dev_open(&c, &dev), 0);
	if (!dev)
		return;
	chm_session s;
	chm_handle h;
	CHECK_RC(chm_session_open(dev, 4, &s), -EOPNOTSUPP);
	CHECK_RC(pf1(dev, CHM_SESSION_DEFAULT, 0, &h), -EOPNOTSUPP);
	CHECK_RC(pf1(dev, 0x1234000000010001ull, 0, &h), -EINVAL);
	CHECK_RC(ready(dev, CHM_SESSION_DEFAULT, 1), -EINVAL);
	CHECK_RC(chm_session_close(dev, 0x1234000000010001ull), -EINVAL);
	chm_dev_close(dev);
}

int main(void)
{
	test_tokens();
	test_foreign_handle();
	test_close_releases();
	test_close_mid_fill();
	test_quota();
	test_round_robin();
	test_shutdown();
	test_direct_mode();
	return check_summary();
}
