/* mode_direct.c - direct mode, the lower bound: no DRAM, every read and
 * write goes to the SSD (docs/design.md §3). Also the SSD read of any range that
 * prefetch mode uses for a miss (chm_direct_read): through an aligned bounce
 * buffer, with the write-buffer overlay on top when the device has one.
 * No device lock is held for I/O or copies (the overlay is copied from the
 * pinned log with the lock dropped); dev->lock is taken only for the
 * write-buffer read bookkeeping and for pacing. Cost (fw_spec/cost.yaml):
 * a read pays the SSD read of the widened range as one object, then the
 * link; a write the link, then the SSD write. On ghost nothing is copied.
 * Calls only downwards
 * (write buffer, iomap, clock).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "counters.h"
#include "dev.h"
#include "iomap.h"
#include "mode.h"
#include "mode_direct.h"
#include "wbuf.h"

#define CHUNK_MAX (8ull << 20) /* bytes per bounce round */
#define OVERLAY_SEGS 32        /* write-buffer entries copied unlocked per round */

/* The write buffer's data over the caller's buffer (read your writes),
 * copied with the lock dropped while the log is pinned; more than
 * OVERLAY_SEGS overlapping entries are copied under the lock. Lock held on
 * entry and exit. */
static void overlay_unlocked(struct chm_dev *dev, uint64_t addr, char *out, uint64_t len)
{
	struct chm_wbuf_seg seg[OVERLAY_SEGS];
	int n = chm_wbuf_overlay_segs(dev, addr, len, seg, OVERLAY_SEGS);
	if (n < 0) {
		chm_wbuf_overlay(dev, addr, out, len);
		return;
	}
	if (n == 0)
		return;
	chm_wbuf_pin_log(dev);
	pthread_mutex_unlock(&dev->lock);
	for (int i = 0; i < n; i++)
		memcpy(out + (seg[i].addr - addr), seg[i].src, seg[i].len);
	pthread_mutex_lock(&dev->lock);
	chm_wbuf_unpin_log(dev);
}

/* A miss without a payload (ghost): the SSD read of the whole widened
 * range as one object, then the link; the faults a ghost read would see; no
 * copy. */
static int read_nodata(struct chm_dev *dev, uint64_t addr, uint64_t len)
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
		chm_ctr_add(&dev->st.bytes_read_ssd, a1 - a0);
		chm_pace(dev, chm_timing_host(&dev->timing, done + delay, len));
	}
	pthread_mutex_unlock(&dev->lock);
	return rc;
}

int chm_direct_read(struct chm_dev *dev, uint64_t addr, void *buf, uint64_t len)
{
	if (chm_nodata(dev))
		return read_nodata(dev, addr, len);
	uint64_t bounce_len = CHUNK_MAX + 2 * CHM_FILL_ALIGN;
	char *out = buf;
	void *bounce;
	if (posix_memalign(&bounce, CHM_FILL_ALIGN, bounce_len))
		return -ENOMEM;
	int rc = 0;
	/* the model: the whole widened range as one object at the start, then
	 * the link after it (store and forward), whatever the copy's chunks */
	uint64_t r0 = CHM_ALIGN_DOWN(addr, CHM_FILL_ALIGN);
	uint64_t r1 = CHM_ALIGN_UP(addr + len, CHM_FILL_ALIGN);
	if (r1 > dev->cfg.capacity)
		r1 = dev->cfg.capacity;
	uint64_t total = len;
	uint64_t model =
	        chm_timing_ssd_object(&dev->timing, 0, chm_now_ns(dev), r1 - r0, dev->cfg.max_io);
	while (len) {
		uint64_t n = len < CHUNK_MAX ? len : CHUNK_MAX;
		uint64_t a0 = CHM_ALIGN_DOWN(addr, CHM_FILL_ALIGN);
		uint64_t a1 = CHM_ALIGN_UP(addr + n, CHM_FILL_ALIGN);
		if (a1 > dev->cfg.capacity)
			a1 = dev->cfg.capacity;
		struct chm_read_tok tok;
		uint64_t done = model;
		pthread_mutex_lock(&dev->lock);
		chm_wbuf_read_begin(dev, &tok);
		pthread_mutex_unlock(&dev->lock);
		rc = chm_ssd_rw_data(dev, CHM_IO_READ, a0, bounce, a1 - a0, model, &done);
		if (!rc) /* the caller's buffer: no lock needed for the bulk copy */
			memcpy(out, (char *)bounce + (addr - a0), n);
		pthread_mutex_lock(&dev->lock);
		uint64_t now = chm_now_ns(dev);
		chm_wbuf_read_end(dev, &tok, now > done ? now : done);
		if (!rc)
			overlay_unlocked(dev, addr, out, n);
		pthread_mutex_unlock(&dev->lock);
		if (rc)
			break;
		model = done > model ? done : model; /* a fault's delay shows */
		addr += n;
		out += n;
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

static int direct_read(struct chm_dev *dev, uint64_t addr, void *buf, uint64_t len)
{
	pthread_mutex_lock(&dev->lock);
	chm_ctr_add(&dev->st.read_misses, 1);
	pthread_mutex_unlock(&dev->lock);
	return chm_direct_read(dev, addr, buf, len);
}

/* Write-through of an aligned range: the host->device link, then the SSD
 * write of the whole object (store and forward), blocking. */
static int direct_write(struct chm_dev *dev, uint64_t addr, const void *buf, uint64_t len)
{
	uint64_t in_done = chm_timing_host_in(&dev->timing, chm_now_ns(dev), len);
	uint64_t model = chm_timing_ssd_object(&dev->timing, 1, in_done, len, dev->cfg.max_io);
	uint64_t done;
	int rc = 0;
	if (chm_nodata(dev)) { /* no payload: nothing to copy or move */
		uint64_t delay;
		rc = chm_ghost_pieces(dev, CHM_IO_WRITE, len, dev->cfg.max_io, &delay);
		pthread_mutex_lock(&dev->lock);
		if (!rc)
			chm_ctr_add(&dev->st.bytes_written_ssd, len);
		chm_pace(dev, model + delay);
		pthread_mutex_unlock(&dev->lock);
		return rc;
	}
	void *bounce;
	if (posix_memalign(&bounce, CHM_FILL_ALIGN, CHUNK_MAX))
		return -ENOMEM;
	const char *p = buf;
	while (len && !rc) {
		uint64_t n = len < CHUNK_MAX ? len : CHUNK_MAX;
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
	if (rc == -ENOSPC || rc == -EDQUOT) /* name the file and its free space */
		rc = chm_backing_error(dev, "write");
	return rc;
}

static int direct_flush(struct chm_dev *dev, uint64_t timeout_ns)
{
	(void)timeout_ns;
	return chm_ssd_sync_all(dev); /* writes were synchronous */
}

static int direct_init(struct chm_dev *dev)
{
	(void)dev;
	return 0;
}

static void direct_nothing(struct chm_dev *dev)
{
	(void)dev;
}

static void direct_stats(struct chm_dev *dev, struct chm_stats *out)
{
	(void)dev;
	(void)out;
}

const struct chm_mode_ops chm_mode_direct_ops = {
        .name = "direct",
        .uses_pool = false,
        .staging = false,
        .init = direct_init,
        .stop = direct_nothing,
        .fini = direct_nothing,
        .read = direct_read,
        .write = direct_write,
        .flush = direct_flush,
        .stats = direct_stats,
};
