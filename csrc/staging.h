/* staging.h - the staging window (staging.c): slots, the refill queue and
 * issue-wait-release, shared by the modes that have one (prefetch, lru). */
#ifndef CHM_STAGING_H
#define CHM_STAGING_H

#include <stdbool.h>
#include <stdint.h>

#include "chm.h"

struct chm_dev;
struct chm_io;

/* Sets up cfg.slot_count slots over mem (slot_count * slot stride bytes,
 * CHM_FILL_ALIGN-aligned): the pool, or lru mode's view buffers. Fills go
 * through dev->mode's fill hooks. Returns 0 or -ENOMEM. */
int chm_staging_init(struct chm_dev *dev, char *mem);
void chm_staging_fini(struct chm_dev *dev);
/* Bytes of memory chm_staging_init needs for cfg. */
uint64_t chm_staging_mem_bytes(const struct chm_config *cfg);

/* The prefetch API in session sess, inside the device (entered); take
 * dev->lock. Contracts as chm_session_prefetch / _wait / _release, except
 * that an element whose results[i] is already non-zero is left alone (the
 * caller checked it) and that prefetch refuses len > slot_bytes itself. */
int chm_staging_prefetch(struct chm_dev *dev, chm_session sess, uint32_t n, const uint64_t *addrs,
                         const uint64_t *lens, uint32_t flags, chm_handle *handles,
                         int32_t *results);
int chm_staging_wait(struct chm_dev *dev, chm_session sess, chm_handle h, uint64_t timeout_ns,
                     struct chm_view *view);
int chm_staging_release(struct chm_dev *dev, chm_session sess, uint32_t n,
                        const chm_handle *handles, int32_t *results);
/* Releases live request r as chm_prefetch_release does (session close).
 * Fills it starts are chained on *start. Lock held. */
struct chm_req;
void chm_staging_release_req(struct chm_dev *dev, struct chm_req *r, uint32_t *start);

/* Copies [addr,addr+len) from a READY/HELD slot covering it that is not
 * stale or behind; true on hit. Called with the lock held; the slot is
 * pinned and the copy made with the lock dropped, so the caller looks at
 * device state again afterwards. Fills started by the unpin (a DRAINING slot
 * freed) are chained on *start for chm_staging_submit.
 * *link_bytes is what the copy costs on the host link: a view handed out by
 * wait already paid for one pass over its object, which reads consume. */
bool chm_staging_read_hit(struct chm_dev *dev, uint64_t addr, void *buf, uint64_t len,
                          uint64_t *link_bytes, uint32_t *start);

/* Brings staged copies that overlap a newly admitted write of
 * [addr, addr+len) up to date (W10) without touching a held view (W11).
 * Lock held; dropped around the copies (pinned slots, no hits on them).
 * Fills started by slots freed meanwhile are chained on *start. */
void chm_staging_patch(struct chm_dev *dev, uint64_t addr, uint64_t len, uint32_t *start);

/* The done() of every fill I/O: a mode whose fill_submit does the work
 * itself sets io->res and calls it. Takes dev->lock. */
void chm_staging_fill_io_done(struct chm_io *io);

/* Cancels queued requests and wakes every waiter (close). Lock held. */
void chm_staging_cancel_all(struct chm_dev *dev);
/* Submits fills started under the lock; call with the lock NOT held.
 * head is the start list (slot index+1) returned by the locked section. */
void chm_staging_submit(struct chm_dev *dev, uint32_t head);
/* Slot, queue and window fields of *out. Lock held. */
void chm_staging_stats(struct chm_dev *dev, struct chm_stats *out);

/* Test-only hooks (tests/c/test_regress_handle_wrap.c), not part of the API:
 * set the generation of FREE request record idx to gen (1..last), so a test
 * reaches the last generation without 2^47 prefetches; returns 0, -EINVAL or
 * -EBUSY (record in use). Take dev->lock themselves. */
int chm_staging_test_set_generation(struct chm_dev *dev, uint32_t idx, uint64_t gen);
uint64_t chm_staging_last_generation(struct chm_dev *dev);

#endif /* CHM_STAGING_H */
