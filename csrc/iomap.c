/* iomap.c - the I/O layer under every mode: address mapping (a device
 * range split over striped targets into backend I/Os of at most max_io) and
 * synchronous transfers through the backend (submit, wait for every done(),
 * charge the timing model, count the bytes). Blocks the caller; takes
 * dev->lock only for the timing model and the byte counters. Calls nothing
 * above it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "clock.h"
#include "counters.h"
#include "dev.h"
#include "errdetail.h"
#include "iomap.h"

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
};

static void sync_io_done(struct chm_io *io)
{
	struct sync_wait *w = io->ctx;
	pthread_mutex_lock(&w->lock);
	if (--w->pending == 0)
		pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

int chm_ios_run(struct chm_dev *dev, struct chm_io *ios, struct chm_io **ptrs, unsigned n,
                uint64_t *bytes, uint64_t *done_ns)
{
	struct sync_wait w = {.pending = n};
	uint64_t moved = 0, latest = 0;
	int err = 0;
	if (!n)
		goto out;
	pthread_mutex_init(&w.lock, NULL);
	pthread_cond_init(&w.cond, NULL);
	for (unsigned i = 0; i < n; i++) {
		ios[i].done = sync_io_done;
		ios[i].ctx = &w;
		ios[i].res = 0;
		ptrs[i] = &ios[i];
	}
	int rc = dev->be_ops->submit(dev->be, ptrs, n);
	pthread_mutex_lock(&w.lock);
	if (rc < 0) {
		/* no done() runs for any of them */
		for (unsigned i = 0; i < n; i++)
			ios[i].res = rc;
		w.pending = 0;
	}
	while (w.pending)
		pthread_cond_wait(&w.cond, &w.lock);
	pthread_mutex_unlock(&w.lock);
	pthread_mutex_destroy(&w.lock);
	pthread_cond_destroy(&w.cond);
	for (unsigned i = 0; i < n; i++) {
		const struct chm_io *io = &ios[i];
		if (io->res < 0 && io->op != CHM_IO_READ) {
			atomic_store(&dev->backing_err, io->res);
			atomic_store(&dev->backing_err_target, io->target);
		}
		if (io->res < 0 && !err)
			err = io->res;
		else if (io->res >= 0 && (uint64_t)io->res != io->len && io->op != CHM_IO_SYNC &&
		         !err)
			err = -EIO; /* short transfer */
		if (io->res > 0)
			moved += (uint64_t)io->res;
		if (io->model_done_ns > latest)
			latest = io->model_done_ns;
	}
out:
	if (bytes)
		*bytes = moved;
	if (done_ns)
		*done_ns = latest;
	return err;
}

int chm_ssd_rw_data(struct chm_dev *dev, int op, uint64_t addr, void *buf, uint64_t len,
                    uint64_t model_ns, uint64_t *done_ns)
{
	const uint64_t round_max = 32ull << 20;
	unsigned max = chm_map_max_ios(&dev->cfg, len < round_max ? len : round_max);
	struct chm_io *ios = calloc(max, sizeof(*ios));
	struct chm_io **ptrs = calloc(max, sizeof(*ptrs));
	if (!ios || !ptrs) {
		free(ios);
		free(ptrs);
		return -ENOMEM;
	}
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
		rc = chm_ios_run(dev, ios, ptrs, (unsigned)n, &moved, &done);
		pthread_mutex_lock(&dev->lock);
		if (op == CHM_IO_READ)
			chm_ctr_add(&dev->st.bytes_read_ssd, moved);
		else
			chm_ctr_add(&dev->st.bytes_written_ssd, moved);
		pthread_mutex_unlock(&dev->lock);
		latest = done > latest ? done : latest;
		addr += round;
		p += round;
		len -= round;
	}
	free(ptrs);
	free(ios);
	if (done_ns)
		*done_ns = latest;
	return rc;
}

int chm_ssd_rw_sync(struct chm_dev *dev, int op, uint64_t addr, void *buf, uint64_t len,
                    uint64_t *done_ns)
{
	/* the whole transfer, once, as one object (fw_spec/cost.yaml) */
	uint64_t model = chm_timing_ssd_object(&dev->timing, op == CHM_IO_WRITE, chm_now_ns(dev),
	                                       len, dev->cfg.max_io);
	return chm_ssd_rw_data(dev, op, addr, buf, len, model, done_ns);
}

/* fdatasync every target through the backend. */
int chm_ssd_sync_all(struct chm_dev *dev)
{
	struct chm_io ios[CHM_MAX_TARGETS];
	struct chm_io *ptrs[CHM_MAX_TARGETS];
	unsigned n = dev->cfg.n_targets ? dev->cfg.n_targets : 1;
	for (unsigned i = 0; i < n; i++) {
		memset(&ios[i], 0, sizeof(ios[i]));
		ios[i].op = CHM_IO_SYNC;
		ios[i].target = (int)i;
	}
	return chm_ios_run(dev, ios, ptrs, n, NULL, NULL);
}

int chm_backing_error(struct chm_dev *dev, const char *call)
{
	int e = atomic_load(&dev->backing_err);
	int t = atomic_load(&dev->backing_err_target);
	unsigned n = dev->cfg.n_targets;
	if (!e || t < 0 || (unsigned)t >= n)
		return -EIO;
	const char *path = dev->cfg.targets[t];
	if (e == -ENOSPC || e == -EDQUOT) {
		struct statvfs sv;
		unsigned long long avail = 0;
		bool known = fstatvfs(dev->fds[t], &sv) == 0;
		if (known)
			avail = (unsigned long long)sv.f_bavail * sv.f_frsize;
		char free_text[64];
		if (known)
			snprintf(free_text, sizeof(free_text), "%llu bytes free", avail);
		else
			snprintf(free_text, sizeof(free_text), "free space unknown");
		return chm_detail_path(
		        path, chm_detail(-ENOSPC,
		                         "%s: target %d: %s: %s on its filesystem (%s); the data "
		                         "stays buffered: free space and flush again",
		                         call, t, path,
		                         e == -EDQUOT ? "disk quota exceeded" : "no space left",
		                         free_text));
	}
	return chm_detail_path(path, chm_detail(-EIO, "%s: target %d: %s: backing write failed: %s",
	                                        call, t, path, strerror(-e)));
}
