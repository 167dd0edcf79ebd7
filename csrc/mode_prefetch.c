/* mode_prefetch.c - prefetch mode (HyMCache, docs/design.md §3): a staging
 * window of slots filled from the SSD on the serving runtime's request,
 * reads of staged ranges served from DRAM, reads of anything else from the
 * SSD without polluting DRAM, and writes isolated in the write buffer
 * (admitted or skipped, never stalled). The slot bookkeeping is staging.c,
 * the log is wbuf.c; this file is what ties them into a mode: the fill hooks
 * (map the fill onto backend I/O, register it with the write buffer, lay
 * buffered writes over it when it lands) and the read/write/flush calls.
 * Locking is the lower files': dev->lock for state changes only, copies
 * without it. Calls only downwards.
 */
#include <errno.h>
#include <pthread.h>

#include "clock.h"
#include "counters.h"
#include "dev.h"
#include "iomap.h"
#include "mode.h"
#include "mode_direct.h"
#include "resident.h"
#include "staging.h"
#include "wbuf.h"

static unsigned prefetch_fill_start(struct chm_dev *dev, struct chm_slot *s)
{
	/* max_ios is sized from the slot stride at init: mapping cannot fail */
	int n = chm_map_ios(dev, CHM_IO_READ, s->fill_start, s->fill_len, s->buf, s->ios,
	                    dev->max_ios);
	chm_wbuf_read_begin(dev, &s->rtok);
	/* the SSD read of the widened object, charged once (cost.yaml) */
	uint64_t ready =
	        chm_timing_ssd_object(&dev->timing, 0, s->issue_ns, s->fill_len, dev->cfg.max_io);
	for (int i = 0; i < n; i++)
		s->ios[i].model_done_ns = ready;
	return (unsigned)n;
}

static int prefetch_fill_submit(struct chm_dev *dev, struct chm_slot *s)
{
	return dev->be_ops->submit(dev->be, s->ioptrs, s->nios);
}

/* The fill's writes-it-missed are laid over by staging.c once it is READY
 * (behind, without the lock): the log is pinned by then, so ending the read
 * registration here keeps every entry it needs. */
static void prefetch_fill_end(struct chm_dev *dev, struct chm_slot *s)
{
	uint64_t now = chm_now_ns(dev);
	chm_wbuf_read_end(dev, &s->rtok, now > s->ready_ns ? now : s->ready_ns);
	chm_ctr_add(&dev->st.bytes_read_ssd, s->fill_bytes);
}

static int prefetch_read(struct chm_dev *dev, uint64_t addr, void *buf, uint64_t len)
{
	uint64_t link_bytes;
	uint32_t start = 0;
	pthread_mutex_lock(&dev->lock);
	if (chm_staging_read_hit(dev, addr, buf, len, &link_bytes, &start)) {
		chm_ctr_add(&dev->st.read_hits, 1);
		chm_ctr_add(&dev->st.bytes_from_dram, len);
		if (link_bytes)
			chm_pace(dev, chm_timing_host(&dev->timing, chm_now_ns(dev), link_bytes));
		pthread_mutex_unlock(&dev->lock);
		if (start)
			chm_staging_submit(dev, start);
		return 0;
	}
	chm_ctr_add(&dev->st.read_misses, 1);
	pthread_mutex_unlock(&dev->lock);
	return chm_direct_read(dev, addr, buf, len);
}

static int prefetch_write(struct chm_dev *dev, uint64_t addr, const void *buf, uint64_t len)
{
	struct wb_entry *e;
	uint32_t start = 0;
	int rc = chm_wbuf_reserve(dev, addr, buf, len, &e);
	if (rc)
		return rc; /* skipped */
	pthread_mutex_lock(&dev->lock);
	/* visible to reads, and staged copies marked behind, in one step (W10) */
	uint64_t in_done = chm_wbuf_admit(dev, e);
	chm_staging_patch(dev, addr, len, &start);
	chm_pace(dev, in_done); /* the host->DRAM transfer (may drop the lock) */
	pthread_mutex_unlock(&dev->lock);
	if (start)
		chm_staging_submit(dev, start);
	return 0;
}

static int prefetch_flush(struct chm_dev *dev, uint64_t timeout_ns)
{
	return chm_wbuf_flush(dev, timeout_ns);
}

static void prefetch_stats(struct chm_dev *dev, struct chm_stats *out)
{
	chm_staging_stats(dev, out);
	chm_wbuf_stats(dev, out);
}

static int prefetch_init(struct chm_dev *dev)
{
	int rc = chm_wbuf_init(dev);
	if (rc)
		return rc;
	/* the window is the front of the pool, the resident region right
	 * after it, the log the pool's last wbuf_bytes */
	rc = chm_staging_init(dev, dev->pool.base);
	if (rc)
		goto err_staging;
	rc = chm_resident_init(dev,
	                       (char *)dev->pool.base + (uint64_t)dev->nslots * dev->slot_stride,
	                       chm_resident_count(&dev->cfg, dev->slot_stride));
	if (rc)
		goto err_resident;
	if (dev->cfg.clock == CHM_CLOCK_VIRTUAL)
		dev->clock_hook = chm_wbuf_vt_advance; /* the flusher runs on the clock */
	return 0;

err_resident:
	chm_staging_fini(dev);
err_staging:
	chm_wbuf_fini(dev);
	return rc;
}

static void prefetch_stop(struct chm_dev *dev)
{
	chm_wbuf_fini(dev);
}

static void prefetch_fini(struct chm_dev *dev)
{
	chm_resident_fini(dev);
	chm_staging_fini(dev);
}

const struct chm_mode_ops chm_mode_prefetch_ops = {
        .name = "prefetch",
        .uses_pool = true,
        .staging = true,
        .init = prefetch_init,
        .cancel = chm_staging_cancel_all,
        .stop = prefetch_stop,
        .fini = prefetch_fini,
        .read = prefetch_read,
        .write = prefetch_write,
        .flush = prefetch_flush,
        .stats = prefetch_stats,
        .fill_start = prefetch_fill_start,
        .fill_submit = prefetch_fill_submit,
        .fill_end = prefetch_fill_end,
};
