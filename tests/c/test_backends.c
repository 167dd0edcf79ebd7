/* test_backends.c - the uring, pread and ghost backends against real files.
 *
 * Builds a minimal struct chm_dev by hand (two O_DIRECT temp files, an
 * anonymous pool) and, per backend: writes a pattern, syncs, reads it back
 * (pool and bounce buffers); rejects malformed ios; chains submissions from
 * done(); runs 2 x 1000 concurrent ios through a small queue depth; injects
 * faults; reads past the end of a target; submits from threads that exit at
 * once; shuts down with I/O in flight. For uring it also checks the
 * registration (fdinfo), that pool ios really use the registered buffer, and
 * through a pipe target the in-flight cap, short-read resubmission and EOF.
 *
 * Usage: test_backends [uring] [uring-sqpoll] [pread] [ghost]   (default: all)
 * Exit 0 pass, 1 fail, 77 every selected backend skipped.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "dev.h"

#define MiB (1024u * 1024u)
#define TARGETS 2
#define TARGET_BYTES (64ull * MiB) /* sparse file size */
#define DATA_BYTES (16u * MiB)     /* written and verified per target */
#define MAX_IO (1u * MiB)
#define QD 8u
#define POOL_BYTES (96ull * MiB) /* [0,32M) source, [32M,64M) readback, [64M,96M) random reads */
#define NCONC 1000u              /* ios per concurrent submitter */
#define CONC_MAX_LEN (32u * 1024u)
#define CHAIN_LEN 50u
#define WAIT_S 60

static int failures;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			failures++;                                                                \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                       \
			fprintf(stderr, __VA_ARGS__);                                              \
			fputc('\n', stderr);                                                       \
		}                                                                                  \
	} while (0)

/* ---- completions ---- */

struct tio {
	struct chm_io io;
	int calls;   /* done() calls, atomic */
	void *owner; /* chain this io belongs to */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond;
static uint64_t g_done;

static void count_done(void)
{
	pthread_mutex_lock(&g_lock);
	g_done++;
	pthread_cond_broadcast(&g_cond);
	pthread_mutex_unlock(&g_lock);
}

static void tio_done(struct chm_io *io)
{
	struct tio *t = io->ctx;

	__atomic_add_fetch(&t->calls, 1, __ATOMIC_SEQ_CST);
	count_done();
}

static uint64_t done_count(void)
{
	uint64_t n;

	pthread_mutex_lock(&g_lock);
	n = g_done;
	pthread_mutex_unlock(&g_lock);
	return n;
}

/* Waits until `target` completions were counted; a timeout is fatal since
 * ios still in flight point into memory we would free. */
static void wait_done(uint64_t target, const char *what)
{
	struct timespec dl;
	int ret = 0;

	clock_gettime(CLOCK_MONOTONIC, &dl);
	dl.tv_sec += WAIT_S;
	pthread_mutex_lock(&g_lock);
	while (g_done < target && ret != ETIMEDOUT)
		ret = pthread_cond_timedwait(&g_cond, &g_lock, &dl);
	if (g_done < target) {
		fprintf(stderr, "FAIL %s: %llu of %llu completions after %d s\n", what,
		        (unsigned long long)g_done, (unsigned long long)target, WAIT_S);
		exit(1);
	}
	pthread_mutex_unlock(&g_lock);
}

static void tio_set(struct tio *t, int op, int target, uint64_t off, void *buf, uint32_t len)
{
	memset(t, 0, sizeof(*t));
	t->io.op = op;
	t->io.target = target;
	t->io.offset = off;
	t->io.buf = buf;
	t->io.len = len;
	t->io.res = 12345; /* the backend must overwrite it */
	t->io.done = tio_done;
	t->io.ctx = t;
}

static void *alloc_aligned(size_t bytes)
{
	void *p;

	if (posix_memalign(&p, 4096, bytes)) {
		fprintf(stderr, "FAIL: out of memory\n");
		exit(1);
	}
	return p;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- data pattern ---- */

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t pat(int target, uint64_t off, uint32_t gen)
{
	return mix(((uint64_t)target << 60) ^ ((uint64_t)gen << 44) ^ (off / 8));
}

static void fill_pat(void *buf, int target, uint64_t off, uint64_t len, uint32_t gen)
{
	uint64_t *w = buf;

	for (uint64_t i = 0; i < len / 8; i++)
		w[i] = pat(target, off + 8 * i, gen);
}

/* Returns the offset of the first wrong byte, or -1. */
static int64_t check_pat(const void *buf, int target, uint64_t off, uint64_t len, uint32_t gen)
{
	const uint64_t *w = buf;

	for (uint64_t i = 0; i < len / 8; i++)
		if (w[i] != pat(target, off + 8 * i, gen))
			return (int64_t)(8 * i);
	return -1;
}

/* ---- the test device ---- */

struct env {
	const char *name;
	const struct chm_backend_ops *ops;
	struct chm_dev *dev;
	struct chm_backend *be;
	bool moves_data; /* false for ghost */
	char *bounce;    /* CONC_MAX_LEN * NCONC bytes outside the pool */
};

static const char *tmpdir(void)
{
	const char *d = getenv("TMPDIR");

	return d && *d ? d : "/tmp";
}

/* Returns an O_DIRECT fd of an unlinked sparse file of TARGET_BYTES. */
static int open_target(void)
{
	char path[1100];
	int fd, dfd;

	snprintf(path, sizeof(path), "%s/chm-test-backends-XXXXXX", tmpdir());
	fd = mkstemp(path);
	if (fd < 0)
		return -errno;
	dfd = open(path, O_RDWR | O_DIRECT);
	if (dfd < 0)
		dfd = -errno;
	unlink(path);
	if (dfd >= 0 && ftruncate(dfd, (off_t)TARGET_BYTES)) {
		close(dfd);
		dfd = -errno;
	}
	close(fd);
	return dfd;
}

static void dev_free(struct chm_dev *dev)
{
	for (unsigned t = 0; t < dev->cfg.n_targets; t++)
		if (dev->fds[t] >= 0)
			close(dev->fds[t]);
	if (dev->pool.base)
		munmap(dev->pool.base, dev->pool.bytes);
	pthread_mutex_destroy(&dev->faults.lock);
	free(dev);
}

static int dev_new(unsigned qd, bool sqpoll, struct chm_dev **out)
{
	struct chm_dev *dev = calloc(1, sizeof(*dev));
	int ret;

	if (!dev)
		return -ENOMEM;
	for (unsigned t = 0; t < CHM_MAX_TARGETS; t++)
		dev->fds[t] = -1;
	dev->cfg.n_targets = TARGETS;
	dev->cfg.queue_depth = qd;
	dev->cfg.sqpoll = sqpoll;
	dev->cfg.max_io = MAX_IO;
	pthread_mutex_init(&dev->faults.lock, NULL);
	dev->pool.fd = -1;
	dev->pool.numa_node = -1;
	dev->pool.base =
	        mmap(NULL, POOL_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (dev->pool.base == MAP_FAILED) {
		dev->pool.base = NULL;
		ret = -errno;
		goto err;
	}
	dev->pool.bytes = POOL_BYTES;
	for (unsigned t = 0; t < TARGETS; t++) {
		ret = open_target();
		if (ret < 0)
			goto err;
		dev->fds[t] = ret;
		dev->target_bytes[t] = TARGET_BYTES;
	}
	*out = dev;
	return 0;
err:
	dev_free(dev);
	return ret;
}

static char *pool_at(struct env *e, uint64_t off)
{
	return (char *)e->dev->pool.base + off;
}

static int submit_tios(struct env *e, struct tio *ts, unsigned n)
{
	struct chm_io *ios[64];
	unsigned i, k;
	int ret;

	for (i = 0; i < n; i += k) {
		k = n - i < 64 ? n - i : 64;
		for (unsigned j = 0; j < k; j++)
			ios[j] = &ts[i + j].io;
		ret = e->ops->submit(e->be, ios, k);
		if (ret)
			return ret;
	}
	return 0;
}

/* Submits n ios and waits for them. */
static int run_tios(struct env *e, struct tio *ts, unsigned n, const char *what)
{
	uint64_t base = done_count();
	int ret = submit_tios(e, ts, n);

	if (ret)
		return ret;
	wait_done(base + n, what);
	return 0;
}

static unsigned bad_calls(const struct tio *ts, unsigned n)
{
	unsigned bad = 0;

	for (unsigned i = 0; i < n; i++)
		bad += __atomic_load_n(&ts[i].calls, __ATOMIC_SEQ_CST) != 1;
	return bad;
}

/* ---- io_uring introspection through /proc/self/fdinfo ---- */

struct ring_info {
	bool found;
	long sq_tail, sq_thread, user_files, user_bufs;
	long bufs_listed, bufs_empty; /* the per-buffer lines (when listed) */
};

static struct ring_info ring_info(void)
{
	struct ring_info ri = {.sq_thread = -1};
	char path[300], link[300], line[256];
	struct dirent *de;
	DIR *d = opendir("/proc/self/fd");
	FILE *f;
	ssize_t n;

	if (!d)
		return ri;
	while ((de = readdir(d))) {
		snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		if (strcmp(link, "anon_inode:[io_uring]"))
			continue;
		snprintf(path, sizeof(path), "/proc/self/fdinfo/%s", de->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		ri.found = true;
		bool in_bufs = false; /* in the lines after UserBufs: */
		while (fgets(line, sizeof(line), f)) {
			sscanf(line, "SqTail: %ld", &ri.sq_tail);
			sscanf(line, "SqThread: %ld", &ri.sq_thread);
			sscanf(line, "UserFiles: %ld", &ri.user_files);
			unsigned idx;
			char what[16];
			if (sscanf(line, "UserBufs: %ld", &ri.user_bufs) == 1) {
				in_bufs = true;
			} else if (in_bufs && sscanf(line, " %u: %15s", &idx, what) == 2) {
				ri.bufs_listed++;
				ri.bufs_empty += strcmp(what, "<none>") == 0;
			} else {
				in_bufs = false;
			}
		}
		fclose(f);
		break;
	}
	closedir(d);
	return ri;
}

/* ---- phases ---- */

/* Writes DATA_BYTES of pattern to each target, syncs, reads it back. */
static void phase_rw(struct env *e)
{
	unsigned per = DATA_BYTES / MAX_IO, n = TARGETS * per;
	struct tio *ts = calloc(n, sizeof(*ts));
	char *src = pool_at(e, 0), *dst = pool_at(e, 32 * MiB), *b = e->bounce;
	struct tio one[TARGETS];
	int64_t bad;
	int ret;

	for (unsigned t = 0; t < TARGETS; t++)
		fill_pat(src + t * DATA_BYTES, (int)t, 0, DATA_BYTES, 1);
	memset(dst, 0xAA, TARGETS * DATA_BYTES);

	for (unsigned i = 0; i < n; i++)
		tio_set(&ts[i], CHM_IO_WRITE, (int)(i / per), (uint64_t)(i % per) * MAX_IO,
		        src + (uint64_t)i * MAX_IO, MAX_IO);
	ret = run_tios(e, ts, n, "write");
	CHECK(!ret, "%s: write submit %d", e->name, ret);
	CHECK(!bad_calls(ts, n), "%s: write done() not exactly once", e->name);
	for (unsigned i = 0; i < n; i++)
		CHECK(ts[i].io.res == (int32_t)MAX_IO, "%s: write %u res %d", e->name, i,
		      ts[i].io.res);

	for (unsigned t = 0; t < TARGETS; t++)
		tio_set(&one[t], CHM_IO_SYNC, (int)t, 0, NULL, 0);
	ret = run_tios(e, one, TARGETS, "sync");
	CHECK(!ret, "%s: sync submit %d", e->name, ret);
	for (unsigned t = 0; t < TARGETS; t++)
		CHECK(one[t].io.res == 0 && one[t].calls == 1, "%s: sync res %d calls %d", e->name,
		      one[t].io.res, one[t].calls);

	for (unsigned i = 0; i < n; i++)
		tio_set(&ts[i], CHM_IO_READ, (int)(i / per), (uint64_t)(i % per) * MAX_IO,
		        dst + (uint64_t)i * MAX_IO, MAX_IO);
	ret = run_tios(e, ts, n, "read");
	CHECK(!ret, "%s: read submit %d", e->name, ret);
	CHECK(!bad_calls(ts, n), "%s: read done() not exactly once", e->name);
	for (unsigned i = 0; i < n; i++)
		CHECK(ts[i].io.res == (int32_t)MAX_IO, "%s: read %u res %d", e->name, i,
		      ts[i].io.res);
	if (e->moves_data) {
		for (unsigned t = 0; t < TARGETS; t++) {
			bad = check_pat(dst + t * DATA_BYTES, (int)t, 0, DATA_BYTES, 1);
			CHECK(bad < 0, "%s: target %u readback differs at %lld", e->name, t,
			      (long long)bad);
		}
	} else {
		CHECK(dst[0] == (char)0xAA && dst[TARGETS * DATA_BYTES - 1] == (char)0xAA,
		      "%s: a ghost read moved data", e->name);
	}

	/* Bounce buffers (outside the pool): overwrite 8 KiB of target 1 at
	 * 5 MiB + 4 KiB with generation 2, read 1 MiB around it back. */
	fill_pat(b, 1, 5 * MiB + 4096, 8192, 2);
	tio_set(&one[0], CHM_IO_WRITE, 1, 5 * MiB + 4096, b, 8192);
	ret = run_tios(e, one, 1, "bounce write");
	CHECK(!ret && one[0].io.res == 8192, "%s: bounce write %d res %d", e->name, ret,
	      one[0].io.res);
	memset(b, 0, MAX_IO);
	tio_set(&one[0], CHM_IO_READ, 1, 5 * MiB, b, MAX_IO);
	ret = run_tios(e, one, 1, "bounce read");
	CHECK(!ret && one[0].io.res == (int32_t)MAX_IO, "%s: bounce read %d res %d", e->name, ret,
	      one[0].io.res);
	if (e->moves_data) {
		CHECK(check_pat(b, 1, 5 * MiB, 4096, 1) < 0 &&
		              check_pat(b + 4096, 1, 5 * MiB + 4096, 8192, 2) < 0 &&
		              check_pat(b + 12288, 1, 5 * MiB + 12288, MAX_IO - 12288, 1) < 0,
		      "%s: bounce readback differs", e->name);
		/* restore generation 1 there for later phases */
		fill_pat(b, 1, 5 * MiB + 4096, 8192, 1);
		tio_set(&one[0], CHM_IO_WRITE, 1, 5 * MiB + 4096, b, 8192);
		run_tios(e, one, 1, "bounce restore");
	}
	free(ts);
	printf("ok   %s: write %u x 1 MiB over %d targets, datasync, read back: %s\n", e->name, n,
	       TARGETS,
	       e->moves_data ? "data equal (pool and bounce buffers)"
	                     : "full lengths, buffers untouched");
}

static void phase_invalid(struct env *e)
{
	struct tio t[2];
	struct chm_io *ios[2] = {&t[0].io, &t[1].io};
	char *buf = pool_at(e, 32 * MiB);
	struct {
		int op, target;
		uint64_t off;
		uint32_t len;
		unsigned buf_off;
		const char *what;
	} bad[] = {
	        {CHM_IO_READ, 0, 0, 0, 0, "zero length"},
	        {CHM_IO_READ, 0, 100, 4096, 0, "unaligned offset"},
	        {CHM_IO_READ, 0, 0, 1000, 0, "unaligned length"},
	        {CHM_IO_READ, 0, 0, 4096, 8, "unaligned buffer"},
	        {CHM_IO_WRITE, TARGETS, 0, 4096, 0, "target out of range"},
	        {CHM_IO_READ, -1, 0, 4096, 0, "negative target"},
	        {7, 0, 0, 4096, 0, "unknown op"},
	        {CHM_IO_READ, 0, 0, 2 * MAX_IO, 0, "longer than max_io"},
	};
	uint64_t base = done_count();
	int ret;

	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		/* a good io first: the batch must be refused as a whole */
		tio_set(&t[0], CHM_IO_READ, 0, 0, buf, 4096);
		tio_set(&t[1], bad[i].op, bad[i].target, bad[i].off, buf + bad[i].buf_off,
		        bad[i].len);
		ret = e->ops->submit(e->be, ios, 2);
		CHECK(ret == -EINVAL, "%s: %s: submit returned %d, want -EINVAL", e->name,
		      bad[i].what, ret);
	}
	tio_set(&t[0], CHM_IO_READ, 0, 0, buf, 4096);
	t[0].io.done = NULL;
	ret = e->ops->submit(e->be, ios, 1);
	CHECK(ret == -EINVAL, "%s: NULL done(): submit returned %d", e->name, ret);
	ret = e->ops->submit(e->be, ios, 0);
	CHECK(ret == 0, "%s: empty submit returned %d", e->name, ret);
	usleep(20000);
	CHECK(done_count() == base, "%s: a refused io got a done() call", e->name);
	printf("ok   %s: malformed ios refused with -EINVAL, no done() for the batch\n", e->name);
}

/* done() submits the next link: proves no backend lock is held in done(). */
struct chain {
	struct env *e;
	struct tio t[CHAIN_LEN];
	unsigned next;
	int err;
};

static void chain_done(struct chm_io *io)
{
	struct tio *t = io->ctx;
	struct chain *c = t->owner;
	struct chm_io *nio;
	int ret;

	__atomic_add_fetch(&t->calls, 1, __ATOMIC_SEQ_CST);
	if (c->next < CHAIN_LEN) {
		nio = &c->t[c->next++].io;
		ret = c->e->ops->submit(c->e->be, &nio, 1);
		if (ret)
			c->err = ret;
	}
	count_done();
}

static void phase_chain(struct env *e)
{
	struct chain *c = calloc(1, sizeof(*c));
	struct chm_io *first;
	uint64_t base = done_count();
	int ret;

	c->e = e;
	for (unsigned i = 0; i < CHAIN_LEN; i++) {
		tio_set(&c->t[i], CHM_IO_READ, (int)(i % TARGETS), (uint64_t)i * 8192,
		        pool_at(e, 64 * MiB + (uint64_t)i * 8192), 8192);
		c->t[i].io.done = chain_done;
		c->t[i].owner = c;
	}
	c->next = 1;
	first = &c->t[0].io;
	ret = e->ops->submit(e->be, &first, 1);
	CHECK(!ret, "%s: chain submit %d", e->name, ret);
	wait_done(base + CHAIN_LEN, "chain");
	CHECK(!c->err, "%s: submit from done() failed %d", e->name, c->err);
	CHECK(!bad_calls(c->t, CHAIN_LEN), "%s: chain done() not exactly once", e->name);
	for (unsigned i = 0; i < CHAIN_LEN; i++)
		CHECK(c->t[i].io.res == 8192, "%s: chain %u res %d", e->name, i, c->t[i].io.res);
	free(c);
	printf("ok   %s: %u ios each submitted from the previous one's done()\n", e->name,
	       CHAIN_LEN);
}

struct conc {
	struct env *e;
	struct tio *t;
	char *area; /* NCONC * CONC_MAX_LEN bytes */
	unsigned seed;
	int err;
};

static uint32_t rnd(unsigned *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

static void *conc_thread(void *arg)
{
	struct conc *c = arg;
	unsigned i = 0, k;
	int ret;

	for (unsigned j = 0; j < NCONC; j++) {
		uint32_t len = (1 + rnd(&c->seed) % (CONC_MAX_LEN / 512)) * 512;
		uint64_t off = (rnd(&c->seed) % ((DATA_BYTES - len) / 512)) * 512;

		tio_set(&c->t[j], CHM_IO_READ, (int)(rnd(&c->seed) % TARGETS), off,
		        c->area + (uint64_t)j * CONC_MAX_LEN, len);
	}
	while (i < NCONC) {
		k = 1 + rnd(&c->seed) % 16;
		if (k > NCONC - i)
			k = NCONC - i;
		ret = submit_tios(c->e, c->t + i, k);
		if (ret) {
			c->err = ret;
			break;
		}
		i += k;
	}
	return NULL;
}

static void phase_concurrent(struct env *e)
{
	struct conc c[2] = {
	        {.e = e, .area = pool_at(e, 64 * MiB), .seed = 12345},
	        {.e = e, .area = e->bounce, .seed = 67890},
	};
	pthread_t th[2];
	uint64_t base = done_count();
	unsigned badres = 0, baddata = 0;

	for (int i = 0; i < 2; i++) {
		c[i].t = calloc(NCONC, sizeof(struct tio));
		pthread_create(&th[i], NULL, conc_thread, &c[i]);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	CHECK(!c[0].err && !c[1].err, "%s: concurrent submit %d %d", e->name, c[0].err, c[1].err);
	if (c[0].err || c[1].err)
		exit(1);
	wait_done(base + 2 * NCONC, "concurrent");
	usleep(20000);
	CHECK(done_count() == base + 2 * NCONC, "%s: %llu completions for %u ios", e->name,
	      (unsigned long long)(done_count() - base), 2 * NCONC);
	for (int i = 0; i < 2; i++) {
		CHECK(!bad_calls(c[i].t, NCONC), "%s: concurrent done() not exactly once", e->name);
		for (unsigned j = 0; j < NCONC; j++) {
			struct chm_io *io = &c[i].t[j].io;

			badres += io->res != (int32_t)io->len;
			if (e->moves_data)
				baddata +=
				        check_pat(io->buf, io->target, io->offset, io->len, 1) >= 0;
		}
		free(c[i].t);
	}
	CHECK(!badres, "%s: %u concurrent ios with a wrong res", e->name, badres);
	CHECK(!baddata, "%s: %u concurrent reads returned wrong data", e->name, baddata);
	printf("ok   %s: 2 threads x %u random reads (512 B..32 KiB) at queue depth %u:"
	       " each done once%s\n",
	       e->name, NCONC, QD, e->moves_data ? ", data right" : "");
}

/* One io at a time; returns its res. */
static int32_t one_io(struct env *e, int op, uint64_t off, uint32_t len, uint64_t *model_ns)
{
	struct tio t;
	int ret;

	tio_set(&t, op, 0, off, pool_at(e, op == CHM_IO_READ ? 64 * MiB : 0), len);
	ret = run_tios(e, &t, 1, "one io");
	CHECK(!ret && t.calls == 1, "%s: one io submit %d calls %d", e->name, ret, t.calls);
	if (model_ns)
		*model_ns = t.io.model_done_ns;
	return t.io.res;
}

static void phase_faults(struct env *e)
{
	struct chm_dev *dev = e->dev;
	const uint64_t slow_ns = 50000000u; /* 50 ms */
	struct tio t[QD];
	uint64_t t0, el, model;
	int32_t r[6];

	CHECK(chm_fault_inject(dev, 5, 1, 0) == -EINVAL, "kind 5 accepted");
	CHECK(chm_fault_inject(dev, -1, 1, 0) == -EINVAL, "kind -1 accepted");
	CHECK(chm_fault_inject(dev, CHM_FAULT_EIO_READ, 0, 0) == -EINVAL, "nth 0 accepted");
	CHECK(chm_fault_inject(dev, CHM_FAULT_SHORT_READ, 0, 0) == -EINVAL, "nth 0 accepted");
	CHECK(chm_fault_inject(NULL, CHM_FAULT_NONE, 0, 0) == -EINVAL, "NULL dev accepted");

	CHECK(!chm_fault_inject(dev, CHM_FAULT_EIO_READ, 3, 0), "arm EIO_READ");
	for (int i = 0; i < 4; i++)
		r[i] = one_io(e, CHM_IO_READ, 4096 * (uint64_t)i, 4096, NULL);
	CHECK(r[0] == 4096 && r[1] == 4096 && r[2] == -EIO && r[3] == 4096,
	      "%s: EIO_READ nth=3 gave %d %d %d %d", e->name, r[0], r[1], r[2], r[3]);

	/* writes and syncs do not count toward a read fault, reads not toward a write fault */
	CHECK(!chm_fault_inject(dev, CHM_FAULT_EIO_WRITE, 2, 0), "arm EIO_WRITE");
	r[0] = one_io(e, CHM_IO_READ, 0, 4096, NULL);
	r[1] = one_io(e, CHM_IO_WRITE, 0, 4096, NULL);
	r[2] = one_io(e, CHM_IO_SYNC, 0, 0, NULL);
	r[3] = one_io(e, CHM_IO_READ, 0, 4096, NULL);
	r[4] = one_io(e, CHM_IO_WRITE, 0, 4096, NULL);
	r[5] = one_io(e, CHM_IO_WRITE, 0, 4096, NULL);
	CHECK(r[0] == 4096 && r[1] == 4096 && r[2] == 0 && r[3] == 4096 && r[4] == -EIO &&
	              r[5] == 4096,
	      "%s: EIO_WRITE nth=2 gave %d %d %d %d %d %d", e->name, r[0], r[1], r[2], r[3], r[4],
	      r[5]);

	CHECK(!chm_fault_inject(dev, CHM_FAULT_SHORT_READ, 1, 0), "arm SHORT_READ");
	r[0] = one_io(e, CHM_IO_READ, 0, 8192, NULL);
	r[1] = one_io(e, CHM_IO_READ, 0, 8192, NULL);
	CHECK(r[0] == 4096 && r[1] == 8192, "%s: SHORT_READ nth=1 gave %d %d", e->name, r[0], r[1]);

	CHECK(!chm_fault_inject(dev, CHM_FAULT_EIO_READ, 1, 0), "arm EIO_READ");
	CHECK(!chm_fault_inject(dev, CHM_FAULT_NONE, 0, 0), "disarm");
	r[0] = one_io(e, CHM_IO_READ, 0, 4096, NULL);
	CHECK(r[0] == 4096, "%s: read after disarm gave %d", e->name, r[0]);

	CHECK(!chm_fault_inject(dev, CHM_FAULT_SLOW, 0, slow_ns), "arm SLOW");
	t0 = mono_ns();
	r[0] = one_io(e, CHM_IO_READ, 0, 4096, &model);
	el = mono_ns() - t0;
	CHECK(r[0] == 4096, "%s: slow read gave %d", e->name, r[0]);
	if (e->moves_data) {
		CHECK(el >= slow_ns, "%s: SLOW read took %llu ns < %llu", e->name,
		      (unsigned long long)el, (unsigned long long)slow_ns);
		/* QD ios completing together are late together, not one after another */
		for (unsigned i = 0; i < QD; i++)
			tio_set(&t[i], CHM_IO_READ, (int)(i % TARGETS), (uint64_t)i * 4096,
			        pool_at(e, 64 * MiB + (uint64_t)i * 4096), 4096);
		t0 = mono_ns();
		CHECK(!run_tios(e, t, QD, "slow batch"), "%s: slow batch submit", e->name);
		el = mono_ns() - t0;
		CHECK(el >= slow_ns && el < QD * slow_ns * 3 / 4, "%s: %u SLOW reads took %llu ms",
		      e->name, QD, (unsigned long long)(el / 1000000));
	} else {
		CHECK(model == slow_ns && el < slow_ns, "%s: ghost SLOW model %llu wall %llu",
		      e->name, (unsigned long long)model, (unsigned long long)el);
	}
	CHECK(!chm_fault_inject(dev, CHM_FAULT_NONE, 0, 0), "disarm");
	printf("ok   %s: faults: nth read -EIO, nth write -EIO, short read, disarm, slow\n",
	       e->name);
}

/* Shutdown with ios queued and in flight completes each exactly once. */
static void phase_shutdown_inflight(struct env *e, bool slow)
{
	const unsigned n = 500;
	struct tio *ts = calloc(n, sizeof(*ts));
	uint64_t base = done_count();
	int ret;

	ret = e->ops->init(e->dev, &e->be);
	CHECK(!ret, "%s: re-init %d", e->name, ret);
	if (ret)
		exit(1);
	if (slow)
		chm_fault_inject(e->dev, CHM_FAULT_SLOW, 0, 1000000);
	for (unsigned i = 0; i < n; i++)
		tio_set(&ts[i], i % 5 ? CHM_IO_READ : CHM_IO_WRITE, (int)(i % TARGETS),
		        (uint64_t)(i % 256) * 65536 + 32 * MiB,
		        pool_at(e, 64 * MiB + (uint64_t)(i % 256) * 65536), 65536);
	ret = submit_tios(e, ts, n);
	CHECK(!ret, "%s: submit before shutdown %d", e->name, ret);
	e->ops->shutdown(e->be);
	e->be = NULL;
	chm_fault_inject(e->dev, CHM_FAULT_NONE, 0, 0);
	CHECK(done_count() == base + n, "%s: %llu of %u done() calls when shutdown returned",
	      e->name, (unsigned long long)(done_count() - base), n);
	CHECK(!bad_calls(ts, n), "%s: shutdown: done() not exactly once", e->name);
	for (unsigned i = 0; i < n; i++)
		CHECK(ts[i].io.res == 65536, "%s: shutdown io %u res %d", e->name, i, ts[i].io.res);
	free(ts);
	printf("ok   %s: shutdown with %u ios queued/in flight%s: each done once before it returned\n",
	       e->name, n, slow ? " (1 ms SLOW)" : "");
}

/* uring only: registration as seen by the kernel. The pool is registered
 * whole, or (where the kernel takes a sparse table) in 16 MiB pieces by a
 * thread of the backend's own after init returns: wait until every piece
 * is filled in. */
static void phase_uring_fdinfo(struct env *e)
{
	struct ring_info ri = ring_info();
	long pieces = (long)((e->dev->pool.bytes + (16 * MiB) - 1) / (16 * MiB));
	/* (fdinfo shows nothing while the registration holds the ring's lock) */
	for (int i = 0; i < 1000 && ri.found &&
	                (!ri.user_bufs || ri.bufs_listed != ri.user_bufs || ri.bufs_empty);
	     i++) { /* up to 10 s */
		usleep(10000);
		ri = ring_info();
	}

	CHECK(ri.found, "%s: no io_uring fd found", e->name);
	CHECK(ri.user_files == TARGETS, "%s: %ld fixed files, want %d", e->name, ri.user_files,
	      TARGETS);
	CHECK(ri.user_bufs == 1 || ri.user_bufs == pieces,
	      "%s: %ld registered buffers, want 1 (whole) or %ld (pieces)", e->name, ri.user_bufs,
	      pieces);
	CHECK(ri.bufs_listed == ri.user_bufs && ri.bufs_empty == 0,
	      "%s: %ld of %ld buffers listed, %ld still empty", e->name, ri.bufs_listed,
	      ri.user_bufs, ri.bufs_empty);
	if (e->dev->cfg.sqpoll)
		CHECK(ri.sq_thread > 0, "%s: no SQPOLL thread", e->name);
	else
		CHECK(ri.sq_thread <= 0, "%s: SQPOLL thread without sqpoll", e->name);
	printf("ok   %s: fdinfo: %ld fixed files, %ld registered buffer(s), SqThread %ld\n",
	       e->name, ri.user_files, ri.user_bufs, ri.sq_thread);
}

/* uring only: a pipe as target 0 blocks reads at will. Checks the in-flight
 * cap, resubmission of a short read, and a 0-byte read (EOF) as -EIO. */
static void phase_uring_pipe(const struct chm_backend_ops *ops, const char *name, bool sqpoll)
{
	const unsigned n = 3 * QD;
	struct chm_dev *dev = calloc(1, sizeof(*dev));
	struct chm_backend *be;
	struct env e = {.name = name, .ops = ops, .dev = dev};
	struct tio *ts = calloc(n + 1, sizeof(*ts));
	char *bufs = alloc_aligned((size_t)(n + 1) * 512);
	char chunk[512];
	struct ring_info ri;
	uint64_t base = done_count();
	unsigned seen[3 * QD] = {0}, bad = 0;
	int p[2], ret;

	CHECK(!pipe(p), "pipe");
	dev->cfg.n_targets = 1;
	dev->cfg.queue_depth = QD;
	dev->cfg.sqpoll = sqpoll;
	dev->cfg.max_io = MAX_IO;
	dev->fds[0] = p[0];
	pthread_mutex_init(&dev->faults.lock, NULL);
	ret = ops->init(dev, &be);
	CHECK(!ret, "%s: pipe init %d", name, ret);
	if (ret)
		exit(1);
	e.be = be;

	for (unsigned i = 0; i < n; i++)
		tio_set(&ts[i], CHM_IO_READ, 0, 0, bufs + i * 512, 512);
	CHECK(!submit_tios(&e, ts, n), "%s: pipe submit", name);
	usleep(50000);
	ri = ring_info();
	CHECK(ri.sq_tail == QD, "%s: %ld SQEs handed to the kernel for %u ios, cap %u", name,
	      ri.sq_tail, n, QD);
	CHECK(done_count() == base, "%s: a pipe read completed without data", name);

	for (unsigned i = 0; i < n; i++) {
		memset(chunk, (int)i + 1, sizeof(chunk));
		CHECK(write(p[1], chunk, sizeof(chunk)) == sizeof(chunk), "pipe write");
	}
	wait_done(base + n, "pipe reads");
	CHECK(!bad_calls(ts, n), "%s: pipe done() not exactly once", name);
	for (unsigned i = 0; i < n; i++) {
		unsigned char v = (unsigned char)bufs[i * 512];

		bad += ts[i].io.res != 512;
		for (unsigned j = 1; j < 512; j++)
			bad += (unsigned char)bufs[i * 512 + j] != v;
		if (v >= 1 && v <= n)
			seen[v - 1]++;
	}
	for (unsigned i = 0; i < n; i++)
		bad += seen[i] != 1;
	CHECK(!bad, "%s: pipe reads: %u wrong results/chunks", name, bad);

	/* short read: half a chunk arrives, the io must stay pending, then finish */
	tio_set(&ts[n], CHM_IO_READ, 0, 0, bufs + n * 512, 512);
	base = done_count();
	CHECK(!submit_tios(&e, &ts[n], 1), "%s: pipe submit", name);
	memset(chunk, 0x5a, sizeof(chunk));
	CHECK(write(p[1], chunk, 256) == 256, "pipe write");
	usleep(50000);
	CHECK(done_count() == base, "%s: a 256-byte short read completed a 512-byte io", name);
	CHECK(write(p[1], chunk, 256) == 256, "pipe write");
	wait_done(base + 1, "short read");
	CHECK(ts[n].io.res == 512 && ts[n].calls == 1, "%s: short read resubmitted: res %d", name,
	      ts[n].io.res);

	/* EOF */
	tio_set(&ts[n], CHM_IO_READ, 0, 0, bufs + n * 512, 512);
	base = done_count();
	CHECK(!submit_tios(&e, &ts[n], 1), "%s: pipe submit", name);
	close(p[1]);
	wait_done(base + 1, "eof read");
	CHECK(ts[n].io.res == -EIO, "%s: 0-byte read gave %d, want -EIO", name, ts[n].io.res);

	ops->shutdown(be);
	close(p[0]);
	pthread_mutex_destroy(&dev->faults.lock);
	free(bufs);
	free(ts);
	free(dev);
	printf("ok   %s: pipe target: %u ios, %u in flight (fdinfo SqTail), short read"
	       " resubmitted, EOF -> -EIO\n",
	       name, n, QD);
}

/* Reads that run past the end of a target come back short, then empty:
 * the io fails with -EIO instead of returning a short count. */
static void phase_eof(struct env *e)
{
	int32_t r0 = one_io(e, CHM_IO_READ, TARGET_BYTES - 4096, 8192, NULL);
	int32_t r1 = one_io(e, CHM_IO_READ, TARGET_BYTES, 4096, NULL);

	CHECK(r0 == -EIO && r1 == -EIO, "%s: reads across/after EOF gave %d %d, want -EIO", e->name,
	      r0, r1);
	printf("ok   %s: a read across the end of a target and one past it fail -EIO\n", e->name);
}

/* Threads that submit and exit at once, writing into holes of the sparse
 * files (work the kernel may hand to its async workers, which belong to the
 * submitting thread): every io must still complete with its full length. */
struct quitter {
	struct env *e;
	struct tio *t;
	unsigned n;
	int err;
};

static void *quitter_thread(void *arg)
{
	struct quitter *q = arg;

	q->err = submit_tios(q->e, q->t, q->n);
	return NULL;
}

static void phase_quitters(struct env *e, uint64_t region)
{
	const unsigned nth = 8, per = 32;
	struct quitter q[8];
	pthread_t th[8];
	struct tio *ts = calloc(nth * per, sizeof(*ts));
	uint64_t base = done_count();
	unsigned bad = 0;

	for (unsigned i = 0; i < nth * per; i++)
		tio_set(&ts[i], CHM_IO_WRITE, (int)(i % TARGETS),
		        region + (uint64_t)(i / TARGETS) * 65536,
		        pool_at(e, (uint64_t)(i % 64) * 65536), 65536);
	for (unsigned i = 0; i < nth; i++) {
		q[i] = (struct quitter){.e = e, .t = ts + i * per, .n = per};
		pthread_create(&th[i], NULL, quitter_thread, &q[i]);
	}
	for (unsigned i = 0; i < nth; i++) {
		pthread_join(th[i], NULL);
		CHECK(!q[i].err, "%s: quitter submit %d", e->name, q[i].err);
	}
	wait_done(base + nth * per, "quitters");
	CHECK(!bad_calls(ts, nth * per), "%s: quitters: done() not exactly once", e->name);
	for (unsigned i = 0; i < nth * per; i++)
		bad += ts[i].io.res != 65536;
	CHECK(!bad, "%s: %u of %u writes from exited threads failed (first res %d)", e->name, bad,
	      nth * per, ts[0].io.res);
	free(ts);
	printf("ok   %s: %u threads submitted %u writes into holes and exited: all complete\n",
	       e->name, nth, nth * per);
}

/* uring only, last: a read into the pool must use the registered (pinned)
 * pages. After MADV_DONTNEED the process maps fresh zero pages there while
 * the ring keeps the old ones, so a fixed read is invisible to us and a
 * plain one (bounce buffer) is not. This spoils the region for the ring. */
static void phase_uring_fixed(struct env *e)
{
	char *dst = pool_at(e, 32 * MiB);
	struct tio t[2];
	int ret;

	ret = madvise(dst, MAX_IO, MADV_DONTNEED);
	CHECK(!ret, "madvise");
	tio_set(&t[0], CHM_IO_READ, 0, 0, dst, MAX_IO);
	tio_set(&t[1], CHM_IO_READ, 0, 0, e->bounce, MAX_IO);
	memset(e->bounce, 0, MAX_IO);
	CHECK(!run_tios(e, t, 2, "fixed read"), "%s: fixed read submit", e->name);
	CHECK(t[0].io.res == (int32_t)MAX_IO && t[1].io.res == (int32_t)MAX_IO,
	      "%s: fixed read res %d %d", e->name, t[0].io.res, t[1].io.res);
	CHECK(dst[0] == 0 && dst[MAX_IO - 1] == 0 && check_pat(dst, 0, 0, 8, 1) >= 0,
	      "%s: a read into the pool did not go through the registered buffer", e->name);
	CHECK(check_pat(e->bounce, 0, 0, MAX_IO, 1) < 0,
	      "%s: a read into a bounce buffer got wrong data", e->name);
	printf("ok   %s: pool reads use the registered buffer, bounce reads do not\n", e->name);
}

/* ghost only: a device without targets (virtual time) still has target 0,
 * and no buffer is ever touched. */
static void phase_ghost_no_targets(const struct chm_backend_ops *ops)
{
	struct chm_dev *dev = calloc(1, sizeof(*dev));
	struct env e = {.name = "ghost", .ops = ops, .dev = dev};
	struct tio t;
	int ret;

	pthread_mutex_init(&dev->faults.lock, NULL);
	ret = ops->init(dev, &e.be);
	CHECK(!ret, "ghost: init without targets %d", ret);
	if (ret)
		exit(1);
	tio_set(&t, CHM_IO_READ, 0, 1ull << 40, NULL, 1u << 20);
	ret = run_tios(&e, &t, 1, "ghost no targets");
	CHECK(!ret && t.io.res == 1 << 20, "ghost: target 0 without targets: %d res %d", ret,
	      t.io.res);
	tio_set(&t, CHM_IO_READ, 1, 0, NULL, 4096);
	ret = submit_tios(&e, &t, 1);
	CHECK(ret == -EINVAL, "ghost: target 1 without targets: %d", ret);
	ops->shutdown(e.be);
	pthread_mutex_destroy(&dev->faults.lock);
	free(dev);
	printf("ok   ghost: a device without targets serves target 0 (1 MiB at 1 TiB), refuses 1\n");
}

/* ---- driver ---- */

/* Returns 0 ran, 77 skipped. */
static int run_backend(const char *name)
{
	struct env e = {.name = name, .moves_data = true};
	bool sqpoll = false, uring = false;
	int ret;

	if (!strcmp(name, "uring") || !strcmp(name, "uring-sqpoll")) {
		e.ops = &chm_backend_uring_ops;
		uring = true;
		sqpoll = !strcmp(name, "uring-sqpoll");
	} else if (!strcmp(name, "pread")) {
		e.ops = &chm_backend_pread_ops;
	} else if (!strcmp(name, "ghost")) {
		e.ops = &chm_backend_ghost_ops;
		e.moves_data = false;
	} else {
		fprintf(stderr, "unknown backend %s\n", name);
		exit(2);
	}

	ret = dev_new(QD, sqpoll, &e.dev);
	if (ret) {
		printf("SKIP %s: cannot open O_DIRECT temp files in %s: %s\n", name, tmpdir(),
		       strerror(-ret));
		return 77;
	}
	ret = e.ops->init(e.dev, &e.be);
	if (ret == -EOPNOTSUPP || (sqpoll && ret == -EPERM)) {
		printf("SKIP %s: %s\n", name,
		       ret == -EPERM ? "SQPOLL not permitted" : "io_uring not available");
		dev_free(e.dev);
		return 77;
	}
	CHECK(!ret, "%s: init %d", name, ret);
	if (ret)
		exit(1);
	CHECK(!strcmp(e.ops->name, uring ? "uring" : name), "ops name %s", e.ops->name);
	e.bounce = alloc_aligned((size_t)NCONC * CONC_MAX_LEN);

	if (uring)
		phase_uring_fdinfo(&e);
	phase_rw(&e);
	phase_invalid(&e);
	phase_chain(&e);
	phase_concurrent(&e);
	phase_faults(&e);
	if (e.moves_data)
		phase_eof(&e);
	phase_quitters(&e, 32 * MiB);
	if (uring)
		phase_uring_fixed(&e);
	e.ops->shutdown(e.be);
	e.be = NULL;
	phase_shutdown_inflight(&e, false);
	phase_shutdown_inflight(&e, true);
	if (uring)
		phase_uring_pipe(e.ops, name, sqpoll);
	if (!e.moves_data)
		phase_ghost_no_targets(e.ops);

	free(e.bounce);
	dev_free(e.dev);
	return 0;
}

int main(int argc, char **argv)
{
	static const char *all[] = {"uring", "uring-sqpoll", "pread", "ghost"};
	const char **names = argc > 1 ? (const char **)argv + 1 : all;
	int n = argc > 1 ? argc - 1 : 4, ran = 0;
	pthread_condattr_t ca;

	alarm(600); /* a deadlock fails the test instead of hanging it */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g_cond, &ca);

	for (int i = 0; i < n; i++)
		ran += run_backend(names[i]) == 0;

	if (failures) {
		printf("FAIL: %d check(s) failed\n", failures);
		return 1;
	}
	if (!ran) {
		printf("SKIP: no backend could run\n");
		return 77;
	}
	printf("PASS: %d backend configuration(s)\n", ran);
	return 0;
}
