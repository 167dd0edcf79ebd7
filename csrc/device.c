/* device.c - device lifecycle, address mapping, the read path, stats. */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/loop.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dev.h"
#include "states.h"

int chm_version(void)
{
	return CHM_VERSION_MAJOR * 10000 + CHM_VERSION_MINOR * 100 + CHM_VERSION_PATCH;
}

const char *chm_strerror(int err)
{
	switch (-err) {
	case 0: return "success";
	case EINVAL: return "invalid argument";
	case ENOENT: return "no such object or option";
	case EAGAIN: return "queue full";
	case ENOSPC: return "no capacity";
	case EBUSY: return "in use";
	case ETIMEDOUT: return "timed out";
	case EIO: return "backing I/O error";
	case ESTALE: return "stale handle (released or never issued)";
	case ECANCELED: return "device closing";
	case ENOMEM: return "out of host memory";
	case EOPNOTSUPP: return "not supported in this mode or on this host";
	default: return strerror(-err);
	}
}

_Noreturn void chm_illegal_transition(const char *table, int from, int to, const char *file,
                                      int line)
{
	fprintf(stderr, "chm: illegal transition %d -> %d in %s at %s:%d\n", from, to, table, file,
	        line);
	abort();
}

/* ---- clock ---- */

uint64_t chm_mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t chm_now_ns(struct chm_dev *dev)
{
	if (dev->cfg.clock == CHM_CLOCK_VIRTUAL)
		return chm_vclock_now(dev);
	return chm_mono_ns() - dev->t0_ns;
}

void chm_pace(struct chm_dev *dev, uint64_t done_ns)
{
	if (dev->cfg.clock == CHM_CLOCK_VIRTUAL) {
		chm_vclock_raise(dev, done_ns);
		chm_wbuf_vt_advance(dev); /* what the flusher did meanwhile */
		return;
	}
	if (!dev->timing.enabled)
		return;
	uint64_t now = chm_now_ns(dev);
	if (now > done_ns) {
		dev->st.pacing_late++;
		dev->st.pacing_late_ns += now - done_ns;
		return;
	}
	uint64_t until = dev->t0_ns + done_ns;
	struct timespec ts = {.tv_sec = (time_t)(until / 1000000000ull),
	                      .tv_nsec = (long)(until % 1000000000ull)};
	pthread_mutex_unlock(&dev->lock);
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
	pthread_mutex_lock(&dev->lock);
}

int chm_enter(struct chm_dev *dev)
{
	if (dev->closing)
		return -ECANCELED;
	dev->active_calls++;
	return 0;
}

void chm_leave(struct chm_dev *dev)
{
	if (--dev->active_calls == 0 && dev->closing)
		pthread_cond_broadcast(&dev->idle_cond);
}

/* ---- address mapping ---- */

unsigned chm_map_max_ios(const struct chm_config *cfg, uint64_t len)
{
	uint64_t n;
	if (cfg->n_targets <= 1) {
		/* contiguous: max_io pieces, one more for an unaligned start */
		n = len / cfg->max_io + 2;
	} else {
		/* every stripe touched (one more at each end) splits into
		 * max_io pieces from wherever the range enters it */
		uint64_t per_stripe = (cfg->stripe_unit + cfg->max_io - 1) / cfg->max_io;
		n = (len / cfg->stripe_unit + 2) * per_stripe;
	}
	return n > UINT32_MAX ? UINT32_MAX : (unsigned)n;
}

int chm_map_ios(struct chm_dev *dev, int op, uint64_t addr, uint64_t len, char *buf,
                struct chm_io *ios, unsigned max)
{
	const struct chm_config *c = &dev->cfg;
	uint64_t n = c->n_targets ? c->n_targets : 1;
	unsigned k = 0;
	while (len) {
		uint64_t chunk, toff;
		int t;
		if (n == 1) {
			t = 0;
			toff = addr;
			chunk = len < c->max_io ? len : c->max_io;
		} else {
			uint64_t stripe = addr / c->stripe_unit, in = addr % c->stripe_unit;
			t = (int)(stripe % n);
			toff = (stripe / n) * c->stripe_unit + in;
			chunk = c->stripe_unit - in;
			if (chunk > len)
				chunk = len;
			if (chunk > c->max_io)
				chunk = c->max_io;
		}
		if (k == max)
			return -EINVAL;
		struct chm_io *io = &ios[k++];
		io->op = op;
		io->target = t;
		io->offset = toff;
		io->buf = buf;
		io->len = (uint32_t)chunk;
		io->res = 0;
		io->model_done_ns = 0;
		io->next = NULL;
		addr += chunk;
		buf += chunk;
		len -= chunk;
	}
	return (int)k;
}

/* ---- synchronous transfers through the backend ---- */

struct sync_wait {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned pending;
	int err;
	uint64_t bytes;
	uint64_t model_done_ns; /* latest modeled completion (fault delays included) */
};

static void sync_io_done(struct chm_io *io)
{
	struct sync_wait *w = io->ctx;
	pthread_mutex_lock(&w->lock);
	if (io->res < 0 && !w->err)
		w->err = io->res;
	else if (io->res >= 0 && (uint64_t)io->res != io->len && io->op != CHM_IO_SYNC && !w->err)
		w->err = -EIO;
	if (io->res > 0)
		w->bytes += (uint64_t)io->res;
	if (io->model_done_ns > w->model_done_ns)
		w->model_done_ns = io->model_done_ns;
	if (--w->pending == 0)
		pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

/* Runs n ios to completion; *done_ns gets their latest modeled completion. */
static int run_ios(struct chm_dev *dev, struct chm_io *ios, unsigned n, uint64_t *bytes,
                   uint64_t *done_ns)
{
	struct sync_wait w = {.pending = n};
	struct chm_io **ptrs = malloc(n * sizeof(*ptrs));
	if (!ptrs)
		return -ENOMEM;
	pthread_mutex_init(&w.lock, NULL);
	pthread_cond_init(&w.cond, NULL);
	for (unsigned i = 0; i < n; i++) {
		ios[i].done = sync_io_done;
		ios[i].ctx = &w;
		ptrs[i] = &ios[i];
	}
	int rc = dev->be_ops->submit(dev->be, ptrs, n);
	pthread_mutex_lock(&w.lock);
	if (rc < 0)
		w.pending = 0;
	while (w.pending)
		pthread_cond_wait(&w.cond, &w.lock);
	pthread_mutex_unlock(&w.lock);
	pthread_mutex_destroy(&w.lock);
	pthread_cond_destroy(&w.cond);
	free(ptrs);
	if (bytes)
		*bytes = w.bytes;
	if (done_ns)
		*done_ns = w.model_done_ns;
	return rc < 0 ? rc : w.err;
}

int chm_ssd_rw_data(struct chm_dev *dev, int op, uint64_t addr, void *buf, uint64_t len,
                    uint64_t model_ns, uint64_t *done_ns)
{
	const uint64_t round_max = 32ull << 20;
	unsigned max = chm_map_max_ios(&dev->cfg, len < round_max ? len : round_max);
	struct chm_io *ios = calloc(max, sizeof(*ios));
	if (!ios)
		return -ENOMEM;
	char *p = buf;
	uint64_t moved, done, latest = model_ns;
	int rc = 0;
	while (len && !rc) {
		uint64_t round = len < round_max ? len : round_max;
		int n = chm_map_ios(dev, op, addr, round, p, ios, max);
		if (n < 0) {
			rc = n;
			break;
		}
		for (int i = 0; i < n; i++)
			ios[i].model_done_ns = model_ns;
		rc = run_ios(dev, ios, (unsigned)n, &moved, &done);
		pthread_mutex_lock(&dev->lock);
		if (op == CHM_IO_READ)
			dev->st.bytes_read_ssd += moved;
		else
			dev->st.bytes_written_ssd += moved;
		pthread_mutex_unlock(&dev->lock);
		latest = done > latest ? done : latest;
		addr += round;
		p += round;
		len -= round;
	}
	free(ios);
	if (done_ns)
		*done_ns = latest;
	return rc;
}

int chm_ssd_rw_sync(struct chm_dev *dev, int op, uint64_t addr, void *buf, uint64_t len,
                    uint64_t *done_ns)
{
	uint64_t model = chm_timing_ssd_object(&dev->timing, op == CHM_IO_WRITE, chm_now_ns(dev),
	                                       len, dev->cfg.max_io);
	return chm_ssd_rw_data(dev, op, addr, buf, len, model, done_ns);
}

/* fdatasync every target through the backend. */
int chm_ssd_sync_all(struct chm_dev *dev)
{
	struct chm_io ios[CHM_MAX_TARGETS];
	unsigned n = dev->cfg.n_targets ? dev->cfg.n_targets : 1;
	for (unsigned i = 0; i < n; i++) {
		memset(&ios[i], 0, sizeof(ios[i]));
		ios[i].op = CHM_IO_SYNC;
		ios[i].target = (int)i;
	}
	return run_ios(dev, ios, n, NULL, NULL);
}

/* ---- open / close ---- */

static uint64_t target_need(const struct chm_config *c, unsigned i)
{
	uint64_t stripes = c->capacity / c->stripe_unit;
	uint64_t n = c->n_targets;
	uint64_t mine = stripes / n + (i < stripes % n ? 1 : 0);
	return mine * c->stripe_unit;
}

/* A one-line reason for a failed open, returned as rc. */
static int open_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));
static int open_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return rc;
}

/* What the open path did to target i, so a failed open can undo it. */
struct target_undo {
	bool created;        /* the file did not exist: remove it */
	bool grown;          /* the file was extended: truncate it back */
	uint64_t orig_bytes; /* its size before */
	dev_t st_dev;        /* identity, checked before undoing anything */
	ino_t st_ino;
};

/* Opens target i O_DIRECT (block devices exclusively). A missing regular file
 * is created (mode 0600, sparse) and a short one extended only with
 * cfg.create; otherwise -ENOENT / -ENOSPC naming the path and the sizes. */
static int open_target(struct chm_dev *dev, unsigned i, struct target_undo *undo, char *err,
                       size_t errlen)
{
	const struct chm_config *c = &dev->cfg;
	const char *path = c->targets[i];
	uint64_t need = target_need(c, i);
	struct stat st;
	int flags = O_RDWR | O_DIRECT | O_CLOEXEC;
	if (stat(path, &st) < 0) {
		int e = errno;
		if (e != ENOENT)
			return open_fail(err, errlen, -e, "target %u: %s: %s", i, path,
			                 strerror(e));
		if (!c->create)
			return open_fail(
			        err, errlen, -ENOENT,
			        "target %u: %s does not exist (create=1 creates it, sparse, "
			        "at %llu bytes)",
			        i, path, (unsigned long long)need);
		flags |= O_CREAT | O_EXCL; /* so we know the file is ours to remove */
	} else if (S_ISBLK(st.st_mode)) {
		flags |= O_EXCL; /* a mounted or otherwise claimed drive: -EBUSY */
	} else if (!S_ISREG(st.st_mode)) {
		return open_fail(err, errlen, -EINVAL,
		                 "target %u: %s is neither a regular file nor a block device", i,
		                 path);
	}
	int fd = open(path, flags, 0600);
	if (fd < 0) {
		int e = errno;
		if (e == EINVAL)
			return open_fail(err, errlen, -EOPNOTSUPP,
			                 "target %u: %s: no O_DIRECT on its filesystem", i, path);
		if (e == EBUSY)
			return open_fail(err, errlen, -EBUSY,
			                 "target %u: %s is in use (mounted, or opened exclusively "
			                 "elsewhere)",
			                 i, path);
		return open_fail(err, errlen, -e, "target %u: %s: %s", i, path, strerror(e));
	}
	undo->created = flags & O_CREAT;
	if (fstat(fd, &st) < 0)
		goto err_errno;
	undo->st_dev = st.st_dev;
	undo->st_ino = st.st_ino;
	uint64_t have;
	if (S_ISBLK(st.st_mode)) {
		if (ioctl(fd, BLKGETSIZE64, &have) < 0)
			goto err_errno;
		int lbs = 0;
		if (ioctl(fd, BLKSSZGET, &lbs) < 0)
			goto err_errno;
		if (lbs > 4096) { /* staging fills are widened to 4 KiB only */
			close(fd);
			return open_fail(err, errlen, -EOPNOTSUPP,
			                 "target %u: %s has %d-byte logical blocks (at most 4096)",
			                 i, path, lbs);
		}
		if ((uint32_t)lbs > dev->write_align)
			dev->write_align = (uint32_t)lbs;
		if (have < need) {
			close(fd);
			return open_fail(
			        err, errlen, -ENOSPC,
			        "target %u: %s has %llu bytes, its share of capacity needs "
			        "%llu",
			        i, path, (unsigned long long)have, (unsigned long long)need);
		}
	} else {
		have = (uint64_t)st.st_size;
		if (have < need) {
			if (!c->create) {
				close(fd);
				return open_fail(
				        err, errlen, -ENOSPC,
				        "target %u: %s is %llu bytes, smaller than its share "
				        "of capacity (%llu bytes); create=1 extends it",
				        i, path, (unsigned long long)have,
				        (unsigned long long)need);
			}
			if (ftruncate(fd, (off_t)need) < 0) /* sparse */
				goto err_errno;
			undo->grown = !undo->created;
			undo->orig_bytes = have;
			have = need;
		}
	}
	dev->fds[i] = fd;
	dev->target_bytes[i] = have;
	return 0;
err_errno:;
	int e = errno;
	close(fd);
	if (undo->created)
		unlink(path);
	undo->created = false;
	return open_fail(err, errlen, -e, "target %u: %s: %s", i, path, strerror(e));
}

/* Undoes what open_target did to the targets of a failed open: removes the
 * files it created and truncates back the ones it extended, and only those
 * (the path must still name the same file). */
static void undo_targets(struct chm_dev *dev, const struct target_undo *undo)
{
	for (unsigned i = 0; i < dev->cfg.n_targets; i++) {
		struct stat st;
		const char *path = dev->cfg.targets[i];
		if (!undo[i].created && !undo[i].grown)
			continue;
		if (stat(path, &st) < 0 || st.st_dev != undo[i].st_dev ||
		    st.st_ino != undo[i].st_ino)
			continue;
		if (undo[i].created)
			unlink(path);
		else if (dev->fds[i] >= 0 && ftruncate(dev->fds[i], (off_t)undo[i].orig_bytes))
			continue; /* best effort */
	}
}

/* The identities of an open target or pool file: device and inode of a
 * regular file, the device number of a block device and, for a loop device,
 * its backing file. Two objects overlap when any identities match. (A
 * partition of a target drive needs no check here: the kernel refuses the
 * second exclusive open of overlapping block devices with -EBUSY, and a
 * mounted filesystem claims its drive the same way.) */
struct ident {
	int n;
	struct {
		bool blk;
		dev_t dev;
		ino_t ino;
	} id[2];
};

static int ident_of(int fd, const char *path, struct ident *out)
{
	struct stat st;
	if (fd >= 0 ? fstat(fd, &st) : stat(path, &st))
		return -errno;
	out->n = 1;
	if (S_ISBLK(st.st_mode)) {
		out->id[0].blk = true;
		out->id[0].dev = st.st_rdev;
		out->id[0].ino = 0;
		struct loop_info64 li;
		if (fd >= 0 && ioctl(fd, LOOP_GET_STATUS64, &li) == 0) {
			out->id[1].blk = false;
			out->id[1].dev = (dev_t)li.lo_device;
			out->id[1].ino = (ino_t)li.lo_inode;
			out->n = 2;
		}
	} else {
		out->id[0].blk = false;
		out->id[0].dev = st.st_dev;
		out->id[0].ino = st.st_ino;
	}
	return 0;
}

static bool ident_overlap(const struct ident *a, const struct ident *b)
{
	for (int i = 0; i < a->n; i++)
		for (int j = 0; j < b->n; j++)
			if (a->id[i].blk == b->id[j].blk && a->id[i].dev == b->id[j].dev &&
			    a->id[i].ino == b->id[j].ino)
				return true;
	return false;
}

/* Two targets that are the same file (a path listed twice, a hard link, a
 * symlink, a loop device over the other) would share offsets and overwrite
 * each other's stripes. */
static int check_distinct_targets(struct chm_dev *dev, struct ident *ids, char *err, size_t errlen)
{
	for (unsigned i = 0; i < dev->cfg.n_targets; i++) {
		int rc = ident_of(dev->fds[i], NULL, &ids[i]);
		if (rc)
			return open_fail(err, errlen, rc, "target %u: %s: %s", i,
			                 dev->cfg.targets[i], strerror(-rc));
		for (unsigned j = 0; j < i; j++)
			if (ident_overlap(&ids[i], &ids[j]))
				return open_fail(err, errlen, -EINVAL,
				                 "targets %u (%s) and %u (%s) are the same file or "
				                 "device",
				                 j, dev->cfg.targets[j], i, dev->cfg.targets[i]);
	}
	return 0;
}

/* A pool=file pool that is (or is backed by) a target would have the DRAM
 * contents and the SSD contents overwrite each other. fd < 0: check the
 * path (following symlinks) before the pool is opened; else the open pool. */
static int check_pool_not_target(struct chm_dev *dev, const struct ident *ids, int fd, char *err,
                                 size_t errlen)
{
	if (dev->cfg.pool_kind != CHM_POOL_FILE || dev->cfg.backend == CHM_BACKEND_GHOST)
		return 0;
	struct ident pool;
	if (ident_of(fd, dev->cfg.pool_path, &pool))
		return 0; /* missing: the pool's own open reports it */
	for (unsigned i = 0; i < dev->cfg.n_targets; i++)
		if (ident_overlap(&pool, &ids[i]))
			return open_fail(
			        err, errlen, -EINVAL,
			        "pool_path %s is target %u (%s), or backs it: the DRAM pool "
			        "and the SSD would overwrite each other",
			        dev->cfg.pool_path, i, dev->cfg.targets[i]);
	return 0;
}

static uint64_t pool_bytes_needed(const struct chm_config *c)
{
	if (c->mode == CHM_MODE_DIRECT)
		return 0;
	return c->dram_bytes;
}

int chm_dev_open(const struct chm_config *cfg, chm_dev **out)
{
	return chm_dev_open_err(cfg, out, NULL, 0);
}

int chm_dev_open_err(const struct chm_config *cfg, chm_dev **out, char *err, size_t errlen)
{
	if (err && errlen)
		err[0] = '\0';
	if (!cfg || !out)
		return open_fail(err, errlen, -EINVAL, "cfg or out is NULL");
	int rc = chm_config_validate(cfg, err, errlen);
	if (rc)
		return rc;
	struct target_undo undo[CHM_MAX_TARGETS] = {0};
	struct ident ids[CHM_MAX_TARGETS];
	struct chm_dev *dev = calloc(1, sizeof(*dev));
	if (!dev)
		return open_fail(err, errlen, -ENOMEM, "no host memory for the device");
	dev->cfg = *cfg;
	chm_config_derive(&dev->cfg);
	while (!dev->tag) {
		if (getrandom(&dev->tag, sizeof(dev->tag), 0) != sizeof(dev->tag))
			dev->tag = (uint16_t)(chm_mono_ns() ^ (uintptr_t)dev);
	}
	for (unsigned i = 0; i < CHM_MAX_TARGETS; i++)
		dev->fds[i] = -1;
	dev->write_align = CHM_IO_ALIGN;
	dev->t0_ns = chm_mono_ns();
	chm_timing_init(&dev->timing, &dev->cfg.timing);

	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_mutex_init(&dev->lock, NULL);
	pthread_cond_init(&dev->cond, &ca);
	pthread_cond_init(&dev->idle_cond, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&dev->faults.lock, NULL);

	if (dev->cfg.backend != CHM_BACKEND_GHOST) {
		for (unsigned i = 0; i < dev->cfg.n_targets; i++) {
			rc = open_target(dev, i, &undo[i], err, errlen);
			if (rc)
				goto err_targets;
		}
		rc = check_distinct_targets(dev, ids, err, errlen);
		if (rc)
			goto err_targets;
	}
	uint64_t pb = pool_bytes_needed(&dev->cfg);
	if (pb) {
		rc = check_pool_not_target(dev, ids, -1, err, errlen);
		if (rc)
			goto err_targets;
		rc = chm_pool_create(&dev->pool, &dev->cfg, pb);
		if (rc) {
			static const char *const kinds[] = {"anon", "hugetlb", "memfd", "file"};
			open_fail(err, errlen, rc, "pool=%s of %llu bytes%s%s: %s",
			          kinds[dev->cfg.pool_kind], (unsigned long long)pb,
			          dev->cfg.pool_kind == CHM_POOL_FILE ? " at " : "",
			          dev->cfg.pool_kind == CHM_POOL_FILE ? dev->cfg.pool_path : "",
			          strerror(-rc));
			goto err_targets;
		}
		/* again on the open pool: the path may have changed meanwhile */
		rc = check_pool_not_target(dev, ids, dev->pool.fd, err, errlen);
		if (rc)
			goto err_pool;
	} else {
		dev->pool.fd = -1;
		dev->pool.numa_node = -1;
	}
	switch (dev->cfg.backend) {
	case CHM_BACKEND_URING: dev->be_ops = &chm_backend_uring_ops; break;
	case CHM_BACKEND_PREAD: dev->be_ops = &chm_backend_pread_ops; break;
	default: dev->be_ops = &chm_backend_ghost_ops; break;
	}
	rc = dev->be_ops->init(dev, &dev->be);
	if (rc) {
		open_fail(err, errlen, rc, "backend %s: %s", dev->be_ops->name, chm_strerror(rc));
		goto err_pool;
	}
	if (dev->cfg.mode == CHM_MODE_PREFETCH) {
		dev->staging_off = 0;
		rc = chm_wbuf_init(dev);
		if (rc)
			goto err_backend;
	} else if (dev->cfg.mode == CHM_MODE_LRU) {
		rc = chm_lru_init(dev);
		if (rc)
			goto err_backend;
	}
	if (dev->cfg.mode != CHM_MODE_DIRECT) {
		rc = chm_staging_init(dev);
		if (rc)
			goto err_cache;
	}
	*out = dev;
	return 0;

err_cache:
	if (dev->wbuf)
		chm_wbuf_fini(dev);
	if (dev->lru)
		chm_lru_fini(dev);
err_backend:
	dev->be_ops->shutdown(dev->be);
err_pool:
	if (pb)
		chm_pool_destroy(&dev->pool);
err_targets:
	undo_targets(dev, undo);
	for (unsigned i = 0; i < CHM_MAX_TARGETS; i++)
		if (dev->fds[i] >= 0)
			close(dev->fds[i]);
	pthread_mutex_destroy(&dev->faults.lock);
	pthread_cond_destroy(&dev->idle_cond);
	pthread_cond_destroy(&dev->cond);
	pthread_mutex_destroy(&dev->lock);
	free(dev);
	if (err && errlen && !err[0])
		open_fail(err, errlen, rc, "%s", chm_strerror(rc));
	return rc;
}

void chm_dev_shutdown(chm_dev *dev)
{
	if (!dev)
		return;
	pthread_mutex_lock(&dev->lock);
	if (dev->shut) {
		pthread_mutex_unlock(&dev->lock);
		return;
	}
	dev->closing = true;
	if (dev->slots)
		chm_staging_cancel_all(dev);
	pthread_cond_broadcast(&dev->cond);
	while (dev->active_calls)
		pthread_cond_wait(&dev->idle_cond, &dev->lock);
	pthread_mutex_unlock(&dev->lock);

	if (dev->lq)
		chm_staging_stop_fillers(dev);
	if (dev->wbuf)
		chm_wbuf_fini(dev);
	if (dev->lru)
		chm_lru_fini(dev);
	/* in-flight fills drain here; their done() still takes the lock */
	dev->be_ops->shutdown(dev->be);
	dev->be = NULL;
	pthread_mutex_lock(&dev->lock);
	/* from here on every call answers -ECANCELED without touching what
	 * is freed below; only the struct and its lock stay until close */
	dev->shut = true;
	pthread_mutex_unlock(&dev->lock);
	if (dev->slots)
		chm_staging_fini(dev);
	if (dev->pool.base)
		chm_pool_destroy(&dev->pool);
	dev->pool.base = NULL;
	for (unsigned i = 0; i < CHM_MAX_TARGETS; i++) {
		if (dev->fds[i] >= 0)
			close(dev->fds[i]);
		dev->fds[i] = -1;
	}
}

void chm_dev_close(chm_dev *dev)
{
	if (!dev)
		return;
	chm_dev_shutdown(dev);
	pthread_mutex_destroy(&dev->faults.lock);
	pthread_cond_destroy(&dev->idle_cond);
	pthread_cond_destroy(&dev->cond);
	pthread_mutex_destroy(&dev->lock);
	free(dev);
}

int chm_dev_config(chm_dev *dev, struct chm_config *out)
{
	if (!dev || !out)
		return -EINVAL;
	*out = dev->cfg;
	return 0;
}

int chm_dev_pool_fd(chm_dev *dev)
{
	if (!dev)
		return -EINVAL;
	pthread_mutex_lock(&dev->lock);
	bool shut = dev->shut;
	pthread_mutex_unlock(&dev->lock);
	if (shut)
		return -ECANCELED;
	if (dev->pool.kind != CHM_POOL_MEMFD || dev->pool.fd < 0 || !dev->pool.base)
		return -ENOENT;
	return dev->pool.fd;
}

/* ---- data path ---- */

static int check_range(const struct chm_dev *dev, uint64_t addr, uint64_t len)
{
	if (len == 0 || addr >= dev->cfg.capacity || len > dev->cfg.capacity - addr)
		return -EINVAL;
	return 0;
}

/* A miss without a payload (ghost): the SSD read of the whole widened
 * range as one object, then the link, the faults a ghost read would see, no
 * copy. */
static int read_miss_nodata(struct chm_dev *dev, uint64_t addr, uint64_t len)
{
	uint64_t a0 = CHM_ALIGN_DOWN(addr, CHM_FILL_ALIGN);
	uint64_t a1 = CHM_ALIGN_UP(addr + len, CHM_FILL_ALIGN);
	uint64_t delay, done;
	if (a1 > dev->cfg.capacity)
		a1 = dev->cfg.capacity;
	done = chm_timing_ssd_object(&dev->timing, 0, chm_now_ns(dev), a1 - a0, dev->cfg.max_io);
	int rc = chm_ghost_pieces(dev, CHM_IO_READ, a1 - a0, dev->cfg.max_io, &delay);
	pthread_mutex_lock(&dev->lock);
	if (!rc) {
		dev->st.bytes_read_ssd += a1 - a0;
		chm_pace(dev, chm_timing_host(&dev->timing, done + delay, len));
	}
	pthread_mutex_unlock(&dev->lock);
	return rc;
}

/* SSD read of an arbitrary range through an aligned bounce buffer. The
 * model charges the whole widened range as one object at the start and the
 * link after it (store and forward), whatever the chunks of the copy. */
static int read_miss(struct chm_dev *dev, uint64_t addr, char *buf, uint64_t len)
{
	if (chm_nodata(dev))
		return read_miss_nodata(dev, addr, len);
	const uint64_t chunk_max = 8u << 20;
	uint64_t bounce_len = chunk_max + 2 * CHM_FILL_ALIGN;
	void *bounce;
	if (posix_memalign(&bounce, CHM_FILL_ALIGN, bounce_len))
		return -ENOMEM;
	int rc = 0;
	uint64_t r0 = CHM_ALIGN_DOWN(addr, CHM_FILL_ALIGN),
	         r1 = CHM_ALIGN_UP(addr + len, CHM_FILL_ALIGN);
	if (r1 > dev->cfg.capacity)
		r1 = dev->cfg.capacity;
	uint64_t total = len;
	uint64_t model =
	        chm_timing_ssd_object(&dev->timing, 0, chm_now_ns(dev), r1 - r0, dev->cfg.max_io);
	while (len) {
		uint64_t n = len < chunk_max ? len : chunk_max;
		uint64_t a0 = CHM_ALIGN_DOWN(addr, CHM_FILL_ALIGN);
		uint64_t a1 = CHM_ALIGN_UP(addr + n, CHM_FILL_ALIGN);
		if (a1 > dev->cfg.capacity)
			a1 = dev->cfg.capacity;
		struct chm_read_tok tok;
		uint64_t done;
		pthread_mutex_lock(&dev->lock);
		chm_wbuf_read_begin(dev, &tok);
		pthread_mutex_unlock(&dev->lock);
		rc = chm_ssd_rw_data(dev, CHM_IO_READ, a0, bounce, a1 - a0, model, &done);
		if (!rc) /* the caller's buffer: no lock needed for the bulk copy */
			memcpy(buf, (char *)bounce + (addr - a0), n);
		pthread_mutex_lock(&dev->lock);
		chm_wbuf_read_end(dev, &tok);
		if (!rc)
			chm_wbuf_overlay(dev, addr, buf, n);
		pthread_mutex_unlock(&dev->lock);
		if (rc)
			break;
		/* a fault's delay (done past the charge) shows in the model */
		model = done > model ? done : model;
		addr += n;
		buf += n;
		len -= n;
	}
	free(bounce);
	if (!rc) {
		pthread_mutex_lock(&dev->lock);
		chm_pace(dev, chm_timing_host(&dev->timing, model, total));
		pthread_mutex_unlock(&dev->lock);
	}
	return rc;
}

int chm_read(chm_dev *dev, uint64_t addr, void *buf, uint64_t len)
{
	if (!dev || !buf)
		return -EINVAL;
	int rc = check_range(dev, addr, len);
	if (rc)
		return rc;
	pthread_mutex_lock(&dev->lock);
	rc = chm_enter(dev);
	if (rc)
		goto out_unlock;
	uint64_t link_bytes;
	uint32_t start = 0;
	if (dev->cfg.mode == CHM_MODE_PREFETCH &&
	    chm_staging_read_hit(dev, addr, buf, len, &link_bytes, &start)) {
		dev->st.read_hits++;
		dev->st.bytes_from_dram += len;
		if (link_bytes)
			chm_pace(dev, chm_timing_host(&dev->timing, chm_now_ns(dev), link_bytes));
		chm_leave(dev);
		pthread_mutex_unlock(&dev->lock);
		if (start)
			chm_staging_submit(dev, start);
		return 0;
	}
	pthread_mutex_unlock(&dev->lock);
	if (dev->cfg.mode == CHM_MODE_LRU) {
		rc = chm_lru_read(dev, addr, buf, len);
	} else {
		pthread_mutex_lock(&dev->lock);
		dev->st.read_misses++;
		pthread_mutex_unlock(&dev->lock);
		rc = read_miss(dev, addr, buf, len);
	}
	pthread_mutex_lock(&dev->lock);
	chm_leave(dev);
out_unlock:
	pthread_mutex_unlock(&dev->lock);
	return rc;
}

/* Write-through of an aligned range (direct mode): the host->device link,
 * then the SSD write of the whole object (store and forward), blocking. */
static int write_through(struct chm_dev *dev, uint64_t addr, const void *buf, uint64_t len)
{
	uint64_t in_done = chm_timing_host_in(&dev->timing, chm_now_ns(dev), len);
	uint64_t model = chm_timing_ssd_object(&dev->timing, 1, in_done, len, dev->cfg.max_io),
	         done;
	int rc = 0;
	if (chm_nodata(dev)) { /* no payload: nothing to copy or move */
		uint64_t delay;
		rc = chm_ghost_pieces(dev, CHM_IO_WRITE, len, dev->cfg.max_io, &delay);
		pthread_mutex_lock(&dev->lock);
		if (!rc)
			dev->st.bytes_written_ssd += len;
		chm_pace(dev, model + delay);
		pthread_mutex_unlock(&dev->lock);
		return rc;
	}
	const uint64_t chunk_max = 8u << 20;
	void *bounce;
	if (posix_memalign(&bounce, CHM_FILL_ALIGN, chunk_max))
		return -ENOMEM;
	const char *p = buf;
	while (len && !rc) {
		uint64_t n = len < chunk_max ? len : chunk_max;
		memcpy(bounce, p, n);
		rc = chm_ssd_rw_data(dev, CHM_IO_WRITE, addr, bounce, n, model, &done);
		model = done > model ? done : model;
		addr += n;
		p += n;
		len -= n;
	}
	free(bounce);
	pthread_mutex_lock(&dev->lock);
	chm_pace(dev, model);
	pthread_mutex_unlock(&dev->lock);
	return rc;
}

int chm_write_object(chm_dev *dev, uint64_t addr, const void *buf, uint64_t len, uint32_t flags)
{
	if (!dev || flags || (!buf && !chm_nodata(dev)))
		return -EINVAL;
	int rc = check_range(dev, addr, len);
	if (rc)
		return rc;
	if (addr % dev->write_align || len % dev->write_align)
		return -EINVAL;
	pthread_mutex_lock(&dev->lock);
	rc = chm_enter(dev);
	pthread_mutex_unlock(&dev->lock);
	if (rc)
		return rc;
	if (dev->cfg.mode == CHM_MODE_PREFETCH)
		rc = chm_wbuf_write(dev, addr, buf, len);
	else if (dev->cfg.mode == CHM_MODE_LRU)
		rc = chm_lru_write(dev, addr, buf, len);
	else
		rc = write_through(dev, addr, buf, len);
	pthread_mutex_lock(&dev->lock);
	chm_leave(dev);
	pthread_mutex_unlock(&dev->lock);
	return rc;
}

int chm_write_objects(chm_dev *dev, uint32_t n, const uint64_t *addrs, const void *const *bufs,
                      const uint64_t *lens, uint32_t flags, int32_t *results)
{
	if (!dev || !addrs || !bufs || !lens || !results || n > CHM_BATCH_MAX)
		return -EINVAL;
	int ok = 0;
	for (uint32_t i = 0; i < n; i++) {
		results[i] = chm_write_object(dev, addrs[i], bufs[i], lens[i], flags);
		ok += results[i] == 0;
	}
	return ok;
}

int chm_flush(chm_dev *dev, uint64_t timeout_ns)
{
	if (!dev)
		return -EINVAL;
	pthread_mutex_lock(&dev->lock);
	int rc = chm_enter(dev);
	pthread_mutex_unlock(&dev->lock);
	if (rc)
		return rc;
	if (dev->cfg.mode == CHM_MODE_PREFETCH)
		rc = chm_wbuf_flush(dev, timeout_ns);
	else if (dev->cfg.mode == CHM_MODE_LRU)
		rc = chm_lru_flush(dev, timeout_ns);
	else
		rc = chm_ssd_sync_all(dev); /* writes were synchronous */
	pthread_mutex_lock(&dev->lock);
	chm_leave(dev);
	pthread_mutex_unlock(&dev->lock);
	return rc;
}

int chm_stats(chm_dev *dev, struct chm_stats *out)
{
	if (!dev || !out)
		return -EINVAL;
	pthread_mutex_lock(&dev->lock);
	*out = dev->st;
	out->slots_total = dev->nslots;
	out->slots_free = dev->slot_count_by_state[CHM_SLOT_FREE];
	out->slots_filling = dev->slot_count_by_state[CHM_SLOT_FILLING];
	out->slots_ready = dev->slot_count_by_state[CHM_SLOT_READY];
	out->slots_held = dev->slot_count_by_state[CHM_SLOT_HELD] +
	                  dev->slot_count_by_state[CHM_SLOT_DRAINING];
	out->slots_failed = dev->slot_count_by_state[CHM_SLOT_FAILED];
	out->queue_len = dev->q_len;
	out->queue_cap = dev->cfg.mode != CHM_MODE_DIRECT ? dev->cfg.refill_queue : 0;
	out->slot_bytes = dev->cfg.mode != CHM_MODE_DIRECT ? dev->cfg.slot_bytes : 0;
	out->window_bytes = (uint64_t)dev->nslots * dev->slot_stride;
	out->clock_now_ns = chm_now_ns(dev);
	out->pool_bytes = dev->pool.base ? dev->pool.bytes : 0;
	out->pool_kind = dev->cfg.pool_kind;
	out->pool_numa_node = dev->pool.numa_node;
	out->pool_hugepages = dev->pool.hugepages;
	out->backend = dev->cfg.backend;
	out->mode = dev->cfg.mode;
	chm_wbuf_stats(dev, out);
	if (dev->lru)
		chm_lru_stats(dev, out);
	pthread_mutex_unlock(&dev->lock);
	return 0;
}
