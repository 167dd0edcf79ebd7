/* device.c - device lifecycle (open, shutdown, close), API entry and exit
 * accounting, the read and write paths of each mode, and stats. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "clock.h"
#include "dev.h"
#include "iomap.h"
#include "states.h"
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

/* ---- open / close ---- */

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
		return chm_open_fail(err, errlen, -EINVAL, "cfg or out is NULL");
	int rc = chm_config_validate(cfg, err, errlen);
	if (rc)
		return rc;
	struct chm_target_undo undo[CHM_MAX_TARGETS] = {0};
	struct chm_ident ids[CHM_MAX_TARGETS];
	struct chm_dev *dev = calloc(1, sizeof(*dev));
	if (!dev)
		return chm_open_fail(err, errlen, -ENOMEM, "no host memory for the device");
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
			rc = chm_target_open(dev, i, &undo[i], err, errlen);
			if (rc)
				goto err_targets;
		}
		rc = chm_targets_check_distinct(dev, ids, err, errlen);
		if (rc)
			goto err_targets;
	}
	uint64_t pb = pool_bytes_needed(&dev->cfg);
	if (pb) {
		rc = chm_pool_check_not_target(dev, ids, -1, err, errlen);
		if (rc)
			goto err_targets;
		rc = chm_pool_create(&dev->pool, &dev->cfg, pb);
		if (rc) {
			static const char *const kinds[] = {"anon", "hugetlb", "memfd", "file"};
			chm_open_fail(err, errlen, rc, "pool=%s of %llu bytes%s%s: %s",
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
		chm_open_fail(err, errlen, rc, "backend %s: %s", dev->be_ops->name,
		              chm_strerror(rc));
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
	chm_targets_undo(dev, undo);
	for (unsigned i = 0; i < CHM_MAX_TARGETS; i++)
		if (dev->fds[i] >= 0)
			close(dev->fds[i]);
	pthread_mutex_destroy(&dev->faults.lock);
	pthread_cond_destroy(&dev->idle_cond);
	pthread_cond_destroy(&dev->cond);
	pthread_mutex_destroy(&dev->lock);
	free(dev);
	if (err && errlen && !err[0])
		chm_open_fail(err, errlen, rc, "%s", chm_strerror(rc));
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

/* SSD read of an arbitrary range through an aligned bounce buffer. */
static int read_miss(struct chm_dev *dev, uint64_t addr, char *buf, uint64_t len)
{
	const uint64_t chunk_max = 8u << 20;
	uint64_t bounce_len = chunk_max + 2 * CHM_FILL_ALIGN;
	void *bounce;
	if (posix_memalign(&bounce, CHM_FILL_ALIGN, bounce_len))
		return -ENOMEM;
	int rc = 0;
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
		rc = chm_ssd_rw_sync(dev, CHM_IO_READ, a0, bounce, a1 - a0, &done);
		if (!rc) /* the caller's buffer: no lock needed for the bulk copy */
			memcpy(buf, (char *)bounce + (addr - a0), n);
		pthread_mutex_lock(&dev->lock);
		chm_wbuf_read_end(dev, &tok);
		if (!rc) {
			chm_wbuf_overlay(dev, addr, buf, n);
			chm_pace(dev, done);
		}
		pthread_mutex_unlock(&dev->lock);
		if (rc)
			break;
		addr += n;
		buf += n;
		len -= n;
	}
	free(bounce);
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

/* Write-through of an aligned range (direct mode). */
static int write_through(struct chm_dev *dev, uint64_t addr, const void *buf, uint64_t len)
{
	const uint64_t chunk_max = 8u << 20;
	void *bounce;
	if (posix_memalign(&bounce, CHM_FILL_ALIGN, chunk_max))
		return -ENOMEM;
	int rc = 0;
	const char *p = buf;
	while (len && !rc) {
		uint64_t n = len < chunk_max ? len : chunk_max;
		memcpy(bounce, p, n);
		uint64_t done;
		rc = chm_ssd_rw_sync(dev, CHM_IO_WRITE, addr, bounce, n, &done);
		pthread_mutex_lock(&dev->lock);
		chm_pace(dev, done);
		pthread_mutex_unlock(&dev->lock);
		addr += n;
		p += n;
		len -= n;
	}
	free(bounce);
	return rc;
}

int chm_write_object(chm_dev *dev, uint64_t addr, const void *buf, uint64_t len, uint32_t flags)
{
	if (!dev || !buf || flags)
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
