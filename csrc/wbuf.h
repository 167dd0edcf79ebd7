/* wbuf.h - the isolated write buffer of prefetch mode (wbuf.c). */
#ifndef CHM_WBUF_H
#define CHM_WBUF_H

#include <stdint.h>

#include "chm.h"

struct chm_dev;
struct chm_read_tok;
struct wb_entry;

/* The region is the last wbuf_bytes of the pool. Calls without "lock held"
 * take dev->lock themselves. */
int chm_wbuf_init(struct chm_dev *dev);  /* starts the flusher */
void chm_wbuf_fini(struct chm_dev *dev); /* flushes (best effort), stops */
/* Reserves log space for [addr, addr+len) and copies buf into it (without
 * the lock; nothing is copied without a payload, on ghost); never waits for
 * the SSD. Returns 0 with *e set, CHM_WRITE_SKIPPED (counted; nothing
 * changed), or -EINVAL for an object larger than the whole buffer. The
 * object stays invisible to reads and to the flusher until
 * chm_wbuf_admit(e). */
int chm_wbuf_reserve(struct chm_dev *dev, uint64_t addr, const void *buf, uint64_t len,
                     struct wb_entry **e);
/* Admits a reserved object (ADMITTED, counted) and wakes the flusher. Lock
 * held: the caller brings staged copies up to date in the same section.
 * Returns the modeled time its bytes were in the buffer (the host->DRAM
 * link done), which the writer is paced to. */
uint64_t chm_wbuf_admit(struct chm_dev *dev, struct wb_entry *e);
int chm_wbuf_flush(struct chm_dev *dev, uint64_t timeout_ns);
/* Virtual time: runs the flusher up to the device clock (completes the
 * batches the model has finished by then, starts those due). Lock held;
 * a no-op in real time. Installed as the device's clock hook. */
void chm_wbuf_vt_advance(struct chm_dev *dev);
/* Overlays buffered data on [addr,addr+len) in buf, oldest first. Lock held. */
void chm_wbuf_overlay(struct chm_dev *dev, uint64_t addr, void *buf, uint64_t len);

/* One copy of an overlay: len bytes of the log at src go to device address
 * addr. */
struct chm_wbuf_seg {
	uint64_t addr;
	const char *src;
	uint64_t len;
};
/* The overlay of [addr, addr+len) as copies to make, oldest first, so that
 * they can be made without the lock: writes up to max of them into seg
 * and returns how many there are, or -1 when there are more than max (max 0:
 * whether there are any). The sources stay valid while the caller holds a
 * log pin (chm_wbuf_pin_log). Lock held; 0 without a write buffer. */
int chm_wbuf_overlay_segs(struct chm_dev *dev, uint64_t addr, uint64_t len,
                          struct chm_wbuf_seg *seg, int max);
/* Read-side bookkeeping: an SSD read in flight keeps buffered entries that
 * became durable after it started from being reclaimed (it may have read the
 * old bytes and needs the overlay), and tells the flusher reads are busy.
 * Lock held; no-ops when the device has no write buffer. */
void chm_wbuf_read_begin(struct chm_dev *dev, struct chm_read_tok *tok);
/* end_ns: when the read is done on the device clock (the later of the
 * clock and the model's completion); a read that overlapped a flush batch
 * adds end_ns - its begin to read_wait_flush_ns, device time in both clocks. */
void chm_wbuf_read_end(struct chm_dev *dev, const struct chm_read_tok *tok, uint64_t end_ns);
/* A log pin keeps every entry from reclaim (a slot that is behind the log
 * needs them for its re-overlay). Lock held. */
void chm_wbuf_pin_log(struct chm_dev *dev);
void chm_wbuf_unpin_log(struct chm_dev *dev);
void chm_wbuf_stats(struct chm_dev *dev, struct chm_stats *out); /* no lock */

#endif /* CHM_WBUF_H */
