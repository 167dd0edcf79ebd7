/* device.c - the top of the C core: every API call of include/chm.h that is
 * not a configuration call. It validates arguments, enters the device (the
 * call gate, gate.c) and dispatches through the mode table (mode.h) to
 * prefetch, lru or direct mode; opening and closing run the layers below in
 * order (targets, pool, backend, mode) and undo them in reverse. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "clock.h"
#include "counters.h"
#include "dev.h"
#include "errdetail.h"
#include "gate.h"
#include "mode.h"
#include "resident.h"
#include "session.h"
#include "staging.h"
#include "targets.h"

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
	case ENOSPC: return "no space left (backing filesystem, target size or handles)";
	case EBUSY: return "in use";
	case ETIMEDOUT: return "timed out";
	case EIO: return "backing I/O error";
	case EACCES: return "permission denied";
	case ESTALE: return "stale handle (released or never issued)";
	case ECANCELED: return "device closing";
	case ENOMEM: return "out of host memory";
	case EOPNOTSUPP: return "not supported in this mode or on this host";
	default: return strerror(-err);
	}
}

/* ---- open / close ---- */

/* The mode table, by enum chm_mode (config validation keeps cfg.mode in it). */
static const struct chm_mode_ops *const modes[] = {
        [CHM_MODE_PREFETCH] = &chm_mode_prefetch_ops,
        [CHM_MODE_LRU] = &chm_mode_lru_ops,
        [CHM_MODE_DIRECT] = &chm_mode_direct_ops,
};

int chm_dev_open(const struct chm_config *cfg, chm_dev **out)
{
	return chm_dev_open_err(cfg, out, NULL, 0);
}

int chm_dev_open_err(const struct chm_config *cfg, chm_dev **out, char *err, size_t errlen)
{
	chm_detail_clear();
	if (err && errlen)
		err[0] = '\0';
	if (!cfg || !out)
		return chm_detail_to(err, errlen, -EINVAL, "cfg or out is NULL");
	int rc = chm_config_validate(cfg, err, errlen);
	if (rc)
		return rc;
	struct chm_target_undo undo[CHM_MAX_TARGETS] = {0};
	struct chm_ident ids[CHM_MAX_TARGETS];
	struct chm_dev *dev = calloc(1, sizeof(*dev));
	if (!dev)
		return chm_detail_to(err, errlen, -ENOMEM, "no host memory for the device");
	dev->cfg = *cfg;
	chm_config_derive(&dev->cfg);
	dev->mode = modes[dev->cfg.mode];
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
	pthread_mutex_init(&dev->gate_lock, NULL);
	pthread_cond_init(&dev->idle_cond, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&dev->faults.lock, NULL);

	if (dev->cfg.backend != CHM_BACKEND_GHOST) {
		for (unsigned i = 0; i < dev->cfg.n_targets; i++) {
			rc = chm_target_open(dev, i, &undo[i], err, errlen);
			if (rc)
				goto err_targets;
		}
		rc = chm_targets_check_distinct(dev, ids, err, errlen);
		if (rc)
			goto err_targets;
	}
	uint64_t pb = dev->mode->uses_pool ? dev->cfg.dram_bytes : 0;
	if (pb) {
		rc = chm_pool_check_not_target(dev, ids, -1, err, errlen);
		if (rc)
			goto err_targets;
		rc = chm_pool_create_bg(&dev->pool, &dev->cfg, pb);
		if (rc) {
			static const char *const kinds[] = {"anon", "hugetlb", "memfd", "file"};
			chm_detail_to(err, errlen, rc, "pool=%s of %llu bytes%s%s: %s",
			              kinds[dev->cfg.pool_kind], (unsigned long long)pb,
			              dev->cfg.pool_kind == CHM_POOL_FILE ? " at " : "",
			              dev->cfg.pool_kind == CHM_POOL_FILE ? dev->cfg.pool_path : "",
			              strerror(-rc));
			goto err_targets;
		}
		/* again on the open pool: the path may have changed meanwhile */
		rc = chm_pool_check_not_target(dev, ids, dev->pool.fd, err, errlen);
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
		chm_detail_to(err, errlen, rc, "backend %s: %s", dev->be_ops->name,
		              chm_strerror(rc));
		goto err_pool;
	}
	rc = dev->mode->init(dev);
	if (rc)
		goto err_backend;
	*out = dev;
	return 0;

err_backend:
	dev->be_ops->shutdown(dev->be);
err_pool:
	if (pb)
		chm_pool_destroy(&dev->pool);
err_targets:
	chm_targets_undo(dev, undo);
	for (unsigned i = 0; i < CHM_MAX_TARGETS; i++)
		if (dev->fds[i] >= 0)
			close(dev->fds[i]);
	pthread_mutex_destroy(&dev->faults.lock);
	pthread_cond_destroy(&dev->idle_cond);
	pthread_mutex_destroy(&dev->gate_lock);
	pthread_cond_destroy(&dev->cond);
	pthread_mutex_destroy(&dev->lock);
	free(dev);
	if (err && errlen && !err[0])
		chm_detail_to(err, errlen, rc, "%s", chm_strerror(rc));
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
	chm_gate_close(dev);
	if (dev->mode->cancel)
		dev->mode->cancel(dev);
	pthread_mutex_unlock(&dev->lock);
	chm_gate_drain(dev);

	dev->mode->stop(dev);
	/* in-flight fills drain here; their done() still takes the lock */
	dev->be_ops->shutdown(dev->be);
	dev->be = NULL;
	pthread_mutex_lock(&dev->lock);
	/* from here on every call answers -ECANCELED without touching what
	 * is freed below; only the struct and its lock stay until close */
	dev->shut = true;
	pthread_mutex_unlock(&dev->lock);
	dev->mode->fini(dev);
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
	pthread_mutex_destroy(&dev->gate_lock);
	pthread_cond_destroy(&dev->cond);
	pthread_mutex_destroy(&dev->lock);
	free(dev);
}

int chm_dev_lost(chm_dev *dev, uint64_t *writes, uint64_t *bytes)
{
	chm_detail_clear();
	if (!dev || !writes || !bytes)
		return chm_detail(-EINVAL, "dev_lost: NULL %s",
		                  !dev      ? "dev"
		                  : !writes ? "writes"
		                            : "bytes");
	pthread_mutex_lock(&dev->lock);
	uint64_t nw = dev->lost_writes, nb = dev->lost_bytes;
	int e = dev->lost_err, t = dev->lost_target;
	pthread_mutex_unlock(&dev->lock);
	*writes = nw;
	*bytes = nb;
	if (!nw)
		return 0;
	unsigned n = dev->cfg.n_targets;
	if (!e || t < 0 || (unsigned)t >= n)
		t = n == 1 ? 0 : -1; /* no failure recorded: name the target if one */
	const char *path = t >= 0 ? dev->cfg.targets[t] : "the backing targets";
	bool full = e == -ENOSPC || e == -EDQUOT;
	int rc = chm_detail(full ? -ENOSPC : -EIO,
	                    "close: %llu bytes in %llu writes to %s were written but never flushed "
	                    "and are lost: %s",
	                    (unsigned long long)nb, (unsigned long long)nw, path,
	                    e == -EDQUOT ? "disk quota exceeded"
	                    : full       ? "no space left on its filesystem"
	                    : e          ? strerror(-e)
	                                 : "the backing write failed");
	return t >= 0 ? chm_detail_path(path, rc) : rc;
}

int chm_dev_config(chm_dev *dev, struct chm_config *out)
{
	chm_detail_clear();
	if (!dev || !out)
		return chm_detail(-EINVAL, "dev_config: NULL %s", !dev ? "dev" : "out");
	*out = dev->cfg;
	return 0;
}

static bool dev_shut(chm_dev *dev)
{
	pthread_mutex_lock(&dev->lock);
	bool shut = dev->shut;
	pthread_mutex_unlock(&dev->lock);
	return shut;
}

int chm_dev_pool_fd(chm_dev *dev)
{
	chm_detail_clear();
	if (!dev)
		return chm_detail(-EINVAL, "pool_fd: NULL dev");
	if (dev_shut(dev))
		return chm_detail(-ECANCELED, "pool_fd: the device was shut down");
	if (dev->pool.kind != CHM_POOL_MEMFD || dev->pool.fd < 0 || !dev->pool.base)
		return chm_detail(-ENOENT,
		                  "pool_fd: the DRAM pool is not a memfd (pool=memfd shares one)");
	return dev->pool.fd;
}

/* ---- data path ---- */

static int check_range(const struct chm_dev *dev, const char *what, uint64_t addr, uint64_t len)
{
	if (len == 0)
		return chm_detail(-EINVAL, "%s: len is 0", what);
	if (addr >= dev->cfg.capacity || len > dev->cfg.capacity - addr)
		return chm_detail(-EINVAL, "%s: [%#llx, +%llu) is beyond the capacity (%llu bytes)",
		                  what, (unsigned long long)addr, (unsigned long long)len,
		                  (unsigned long long)dev->cfg.capacity);
	return 0;
}

int chm_read(chm_dev *dev, uint64_t addr, void *buf, uint64_t len)
{
	chm_detail_clear();
	if (!dev || !buf)
		return chm_detail(-EINVAL, "read: NULL %s", !dev ? "dev" : "buf");
	int rc = check_range(dev, "read", addr, len);
	if (rc)
		return rc;
	rc = chm_enter(dev);
	if (rc)
		return rc;
	rc = dev->mode->read(dev, addr, buf, len);
	chm_leave(dev);
	return rc;
}

int chm_write_object(chm_dev *dev, uint64_t addr, const void *buf, uint64_t len, uint32_t flags)
{
	chm_detail_clear();
	if (!dev || (!buf && !chm_nodata(dev)))
		return chm_detail(-EINVAL, "write: NULL %s",
		                  !dev ? "dev" : "buf (only the ghost backend takes no payload)");
	if (flags)
		return chm_detail(-EINVAL, "write: unknown flags %#x (none are defined)", flags);
	int rc = check_range(dev, "write", addr, len);
	if (rc)
		return rc;
	const char *unit =
	        dev->write_align == CHM_IO_ALIGN ? "CHM_IO_ALIGN" : "a target's block size";
	if (addr % dev->write_align)
		return chm_detail(-EINVAL, "write: addr %#llx is not a multiple of %u (%s)",
		                  (unsigned long long)addr, dev->write_align, unit);
	if (len % dev->write_align)
		return chm_detail(-EINVAL, "write: len %llu is not a multiple of %u (%s)",
		                  (unsigned long long)len, dev->write_align, unit);
	rc = chm_enter(dev);
	if (rc)
		return rc;
	rc = dev->mode->write(dev, addr, buf, len);
	chm_leave(dev);
	return rc;
}

int chm_write_objects(chm_dev *dev, uint32_t n, const uint64_t *addrs, const void *const *bufs,
                      const uint64_t *lens, uint32_t flags, int32_t *results)
{
	chm_detail_clear();
	if (!dev || !addrs || !bufs || !lens || !results)
		return chm_detail(-EINVAL, "write_objects: a NULL argument");
	if (n > CHM_BATCH_MAX)
		return chm_detail(-EINVAL, "write_objects: n %u is above CHM_BATCH_MAX (%d)", n,
		                  CHM_BATCH_MAX);
	int ok = 0;
	for (uint32_t i = 0; i < n; i++) {
		results[i] = chm_write_object(dev, addrs[i], bufs[i], lens[i], flags);
		ok += results[i] == 0;
	}
	chm_detail_clear(); /* an element's reason is not the call's */
	return ok;
}

int chm_flush(chm_dev *dev, uint64_t timeout_ns)
{
	chm_detail_clear();
	if (!dev)
		return chm_detail(-EINVAL, "flush: NULL dev");
	int rc = chm_enter(dev);
	if (rc)
		return rc;
	rc = dev->mode->flush(dev, timeout_ns);
	chm_leave(dev);
	return rc;
}

/* ---- prefetch: issue - wait - release ---- */

/* What every mode refuses alike (no lock needed: the configuration is fixed
 * at open); a mode without a staging window then refuses the call. */
static int prefetch_args(const struct chm_dev *dev, uint64_t addr, uint64_t len, uint32_t flags)
{
	if (len == 0)
		return chm_detail(-EINVAL, "prefetch: len is 0");
	if (flags & ~(uint32_t)(CHM_PF_NOQUEUE | CHM_PF_RETAIN))
		return chm_detail(-EINVAL, "prefetch: unknown flags %#x", flags);
	if (addr >= dev->cfg.capacity || len > dev->cfg.capacity - addr)
		return chm_detail(-EINVAL,
		                  "prefetch: [%#llx, +%llu) is beyond the capacity (%llu bytes)",
		                  (unsigned long long)addr, (unsigned long long)len,
		                  (unsigned long long)dev->cfg.capacity);
	if (!dev->mode->staging)
		return chm_detail(-EOPNOTSUPP, "prefetch: mode=%s has no staging window",
		                  chm_enum_name(CHM_ENUM_MODE, dev->cfg.mode));
	return 0;
}

int chm_prefetch_check(const struct chm_dev *dev, uint64_t addr, uint64_t len, uint32_t flags)
{
	return prefetch_args(dev, addr, len, flags);
}

int chm_prefetch_object(chm_dev *dev, uint64_t addr, uint64_t len, uint32_t flags, chm_handle *h)
{
	chm_detail_clear();
	if (!dev || !h)
		return chm_detail(-EINVAL, "prefetch: NULL %s", !dev ? "dev" : "h");
	int32_t rc = prefetch_args(dev, addr, len, flags);
	if (rc)
		return rc;
	rc = chm_enter(dev);
	if (rc)
		return rc;
	chm_staging_prefetch(dev, CHM_SESSION_DEFAULT, 1, &addr, &len, flags, h, &rc);
	chm_leave(dev);
	return rc;
}

int chm_prefetch_objects(chm_dev *dev, uint32_t n, const uint64_t *addrs, const uint64_t *lens,
                         uint32_t flags, chm_handle *handles, int32_t *results)
{
	chm_detail_clear();
	if (!dev || !addrs || !lens || !handles || !results)
		return chm_detail(-EINVAL, "prefetch_objects: a NULL argument");
	if (n > CHM_BATCH_MAX)
		return chm_detail(-EINVAL, "prefetch_objects: n %u is above CHM_BATCH_MAX (%d)", n,
		                  CHM_BATCH_MAX);
	int rc = chm_enter(dev);
	int ok = 0;
	for (uint32_t i = 0; i < n; i++) {
		results[i] = rc ? rc : prefetch_args(dev, addrs[i], lens[i], flags);
		ok += results[i] == 0;
	}
	if (rc)
		return 0;
	if (ok)
		ok = chm_staging_prefetch(dev, CHM_SESSION_DEFAULT, n, addrs, lens, flags, handles,
		                          results);
	chm_leave(dev);
	chm_detail_clear(); /* an element's reason is not the call's */
	return ok;
}

int chm_prefetch_wait(chm_dev *dev, chm_handle h, uint64_t timeout_ns, struct chm_view *view)
{
	chm_detail_clear();
	if (!dev || !view)
		return chm_detail(-EINVAL, "wait: NULL %s", !dev ? "dev" : "view");
	int rc = chm_enter(dev);
	if (rc)
		return rc;
	/* without a window no handle was ever issued */
	rc = dev->mode->staging ? chm_staging_wait(dev, CHM_SESSION_DEFAULT, h, timeout_ns, view)
	                        : chm_detail(-EINVAL, "wait: handle %#llx: mode=direct issues none",
	                                     (unsigned long long)h);
	chm_leave(dev);
	return rc;
}

int chm_prefetch_release_many(chm_dev *dev, uint32_t n, const chm_handle *handles, int32_t *results)
{
	chm_detail_clear();
	if (!dev || !handles || !results)
		return chm_detail(-EINVAL, "release_many: a NULL argument");
	if (n > CHM_BATCH_MAX)
		return chm_detail(-EINVAL, "release_many: n %u is above CHM_BATCH_MAX (%d)", n,
		                  CHM_BATCH_MAX);
	/* release works while closing too (it only returns resources) */
	if (dev->mode->staging) {
		int ok = chm_staging_release(dev, CHM_SESSION_DEFAULT, n, handles, results);
		if (n != 1)
			chm_detail_clear(); /* an element's reason is not the call's */
		return ok;
	}
	int rc = dev_shut(dev) ? -ECANCELED : -EINVAL;
	for (uint32_t i = 0; i < n; i++)
		results[i] = rc;
	return 0;
}

int chm_prefetch_release(chm_dev *dev, chm_handle h)
{
	chm_detail_clear();
	if (!dev)
		return chm_detail(-EINVAL, "release: NULL dev");
	int32_t rc;
	chm_prefetch_release_many(dev, 1, &h, &rc);
	return rc;
}

int chm_resident_evict(chm_dev *dev, uint64_t addr, uint64_t len)
{
	chm_detail_clear();
	if (!dev)
		return chm_detail(-EINVAL, "resident_evict: NULL dev");
	int rc = check_range(dev, "resident_evict", addr, len);
	if (rc)
		return rc;
	rc = chm_enter(dev);
	if (rc)
		return rc;
	pthread_mutex_lock(&dev->lock);
	rc = chm_resident_evict_range(dev, addr, len);
	pthread_mutex_unlock(&dev->lock);
	chm_leave(dev);
	return rc;
}

/* ---- stats ---- */

int chm_stats(chm_dev *dev, struct chm_stats *out)
{
	chm_detail_clear();
	if (!dev || !out)
		return chm_detail(-EINVAL, "stats: NULL %s", !dev ? "dev" : "out");
	/* no lock: every field of dev->st is written with relaxed atomics
	 * (counters.h) and copied here word by word with atomic loads; the
	 * mode's hook reads only atomics too. A stats call never waits. */
	_Static_assert(sizeof(struct chm_stats) % 8 == 0, "copied in 8-byte words");
	chm_ctr_copy(out, &dev->st, sizeof(*out));
	out->clock_now_ns = chm_now_ns(dev); /* every duration counter is device ns already */
	out->pool_bytes = dev->pool.base ? dev->pool.bytes : 0;
	out->pool_kind = dev->cfg.pool_kind;
	out->pool_numa_node = dev->pool.numa_node;
	out->pool_hugepages = __atomic_load_n(&dev->pool.hugepages, __ATOMIC_RELAXED);
	out->backend = dev->cfg.backend;
	out->mode = dev->cfg.mode;
	dev->mode->stats(dev, out);
	return 0;
}

/* ---- the device clock ---- */

int chm_clock_ns(chm_dev *dev, uint64_t *now_ns)
{
	chm_detail_clear();
	if (!dev || !now_ns)
		return chm_detail(-EINVAL, "clock_ns: NULL %s", !dev ? "dev" : "now_ns");
	*now_ns = chm_now_ns(dev); /* lock-free in both clocks */
	return 0;
}

int chm_advance_clock(chm_dev *dev, uint64_t t_ns)
{
	chm_detail_clear();
	if (!dev)
		return chm_detail(-EINVAL, "advance_clock: NULL dev");
	if (dev->cfg.clock != CHM_CLOCK_VIRTUAL)
		return chm_detail(-EOPNOTSUPP,
		                  "advance_clock: clock=real follows the wall clock; only "
		                  "clock=virtual can be advanced");
	int rc = chm_enter(dev);
	if (rc)
		return rc;
	pthread_mutex_lock(&dev->lock);
	chm_pace(dev, t_ns); /* raises the clock and runs the hook (the flusher) */
	pthread_mutex_unlock(&dev->lock);
	chm_leave(dev);
	return 0;
}
