/* staging.c - the staging window: fixed-depth slots, a bounded FIFO refill
 * queue and the issue-wait-release API.
 *
 * The window is slot_count slots of slot_stride bytes of the memory the mode
 * hands over: the front of the DRAM pool in prefetch mode, host view
 * buffers in lru mode (slot_stride = slot_size rounded up to 4 KiB, plus 4 KiB so that an
 * unaligned object still fits after its fill is widened to 4 KiB sectors).
 * A request record (chm_req) exists for every issued, unreleased prefetch; it
 * is either QUEUED (waiting for a slot in its session's FIFO; session.c
 * serves the sessions round-robin) or SLOTTED. Handles name a request record
 * by index and generation, so a recycled record never answers to an old
 * handle; the record names its session, and a handle is used only through
 * it.
 *
 * Locking: dev->lock guards every field here and is held for state changes
 * only. A read hit pins its slot (pins > 0), copies with the lock dropped and
 * unpins; a pinned slot is neither freed nor patched: released, it goes
 * DRAINING and the last unpin frees it; a write admitted over a pinned READY
 * slot marks it behind, and the last unpin re-overlays the log on it. Each
 * request record has its own condition variable, so a completion, release
 * or unpin wakes only that request's waiters. How a fill is done is the
 * mode's (dev->mode's fill hooks: backend reads in prefetch mode, a read
 * through the cache in lru mode); it is submitted after the lock is dropped
 * (a backend may complete inline and its done() takes the lock): fills
 * started under the lock are chained on a start list and submitted by
 * chm_staging_submit(). The prefetch API's argument checks and the call gate
 * are device.c's; this file sits below the modes and calls only the write
 * buffer, the I/O mapping and the clock.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "counters.h"
#include "dev.h"
#include "errdetail.h"
#include "iomap.h"
#include "mode.h"
#include "resident.h"
#include "session.h"
#include "staging.h"
#include "states.h"
#include "wbuf.h"

/* Handle layout (fw_spec/README.md 4.1): the device tag in bits 63..48, then
 * the request record's generation, then its index in the low idx_bits, the
 * fewest bits that hold nreqs itself (so index nreqs is always malformed).
 * A small device thus gets a wide generation: 47 bits with one record. */
#define HANDLE_TAG_SHIFT 48
#define HANDLE_LOW_MASK ((UINT64_C(1) << HANDLE_TAG_SHIFT) - 1)

static chm_handle handle_make(const struct chm_dev *dev, uint32_t idx, uint64_t gen)
{
	return ((uint64_t)dev->tag << HANDLE_TAG_SHIFT) | (gen << dev->handle_idx_bits) | idx;
}

/* Returns the request named by h, -EINVAL (foreign/malformed) or -ESTALE. */
static int handle_lookup(struct chm_dev *dev, chm_handle h, struct chm_req **out)
{
	uint64_t low = h & HANDLE_LOW_MASK;
	uint32_t idx = (uint32_t)(low & ((UINT64_C(1) << dev->handle_idx_bits) - 1));
	uint64_t gen = low >> dev->handle_idx_bits;
	if ((uint16_t)(h >> HANDLE_TAG_SHIFT) != dev->tag || idx >= dev->nreqs)
		return chm_detail(-EINVAL, "handle %#llx is not one of this device's (%s)",
		                  (unsigned long long)h,
		                  (uint16_t)(h >> HANDLE_TAG_SHIFT) != dev->tag
		                          ? "another device tag"
		                          : "no such request");
	struct chm_req *r = &dev->reqs[idx];
	if (r->state == CHM_REQ_FREE || r->gen != gen)
		return chm_detail(-ESTALE, "handle %#llx was released (or never issued)",
		                  (unsigned long long)h);
	*out = r;
	return 0;
}

/* ---- slot state transitions (legal moves only, fw_spec/staging.yaml) ---- */

static void slot_set(struct chm_dev *dev, struct chm_slot *s, int to)
{
	/* atomic: chm_staging_stats reads the counts without the lock */
	chm_ctr32_add(&dev->slot_count_by_state[s->state], -1);
	CHM_TRANSITION(chm_slot_transitions, s->state, to);
	chm_ctr32_add(&dev->slot_count_by_state[to], 1);
}

static void staged_link(struct chm_dev *dev, struct chm_slot *s)
{
	int32_t i = (int32_t)(s - dev->slots);
	s->sprev = -1;
	s->snext = dev->staged_head;
	if (dev->staged_head >= 0)
		dev->slots[dev->staged_head].sprev = i;
	dev->staged_head = i;
}

static void staged_unlink(struct chm_dev *dev, struct chm_slot *s)
{
	if (s->sprev >= 0)
		dev->slots[s->sprev].snext = s->snext;
	else
		dev->staged_head = s->snext;
	if (s->snext >= 0)
		dev->slots[s->snext].sprev = s->sprev;
	s->sprev = s->snext = -1;
}

/* Free request records form a FIFO: the least recently freed is reused
 * first. A record whose generation is the last one the handle can carry is
 * retired instead (FREE, but never on the free list again), so no handle is
 * ever issued twice: a device issues at least 2^47 handles before its first
 * record retires (2^(48 - idx_bits) generations of each of nreqs records). */
static void req_free(struct chm_dev *dev, struct chm_req *r)
{
	uint32_t ri = (uint32_t)(r - dev->reqs) + 1;
	r->state = CHM_REQ_FREE;
	r->slot = -1;
	r->fnext = 0;
	dev->reqs_live--;
	if (r->gen == dev->handle_gen_last) {
		dev->reqs_retired++;
		return;
	}
	r->gen++;
	if (dev->req_free_tail)
		dev->reqs[dev->req_free_tail - 1].fnext = ri;
	else
		dev->req_free_head = ri;
	dev->req_free_tail = ri;
}

static struct chm_req *req_alloc(struct chm_dev *dev)
{
	if (!dev->req_free_head)
		return NULL;
	struct chm_req *r = &dev->reqs[dev->req_free_head - 1];
	dev->req_free_head = r->fnext;
	if (!dev->req_free_head)
		dev->req_free_tail = 0;
	r->fnext = 0;
	dev->reqs_live++;
	return r;
}

int chm_staging_test_set_generation(struct chm_dev *dev, uint32_t idx, uint64_t gen)
{
	int rc = 0;
	pthread_mutex_lock(&dev->lock);
	if (!dev->reqs || idx >= dev->nreqs || gen == 0 || gen > dev->handle_gen_last)
		rc = -EINVAL;
	else if (dev->reqs[idx].state != CHM_REQ_FREE)
		rc = -EBUSY;
	else
		dev->reqs[idx].gen = gen;
	pthread_mutex_unlock(&dev->lock);
	return rc;
}

uint64_t chm_staging_last_generation(struct chm_dev *dev)
{
	return dev->handle_gen_last;
}

/* FREE -> FILLING for request r; chains the slot on *start for submission. */
static void fill_start(struct chm_dev *dev, struct chm_req *r, uint32_t *start)
{
	uint32_t si = dev->slot_free_head - 1;
	struct chm_slot *s = &dev->slots[si];
	dev->slot_free_head = s->fnext;
	s->fnext = 0;
	slot_set(dev, s, CHM_SLOT_FILLING);
	chm_sess_charge(dev, s, r->sess);
	r->state = CHM_REQ_SLOTTED;
	r->slot = (int32_t)si;
	s->req = (int32_t)(r - dev->reqs);
	s->addr = r->addr;
	s->len = r->len;
	s->fill_start = CHM_ALIGN_DOWN(r->addr, CHM_FILL_ALIGN);
	uint64_t end = CHM_ALIGN_UP(r->addr + r->len, CHM_FILL_ALIGN);
	if (end > dev->cfg.capacity)
		end = dev->cfg.capacity; /* capacity is a multiple of 4 KiB */
	s->fill_len = end - s->fill_start;
	s->err = 0;
	s->link_credit = 0;
	s->stale = false;
	s->behind = false;
	s->repatch = false;
	s->pins = 0;
	s->fill_bytes = 0;
	s->issue_ns = chm_now_ns(dev);
	if (s->issue_ns > r->issue_ns) /* it waited in the refill queue (device time) */
		chm_ctr_add(&dev->st.refill_queue_wait_ns, s->issue_ns - r->issue_ns);
	unsigned n = dev->mode->fill_start(dev, s);
	s->nios = n;
	s->ios_pending = n;
	uint64_t ready = s->issue_ns;
	for (unsigned i = 0; i < n; i++) {
		struct chm_io *io = &s->ios[i];
		io->done = chm_staging_fill_io_done;
		io->ctx = s;
		if (io->model_done_ns > ready)
			ready = io->model_done_ns;
		s->ioptrs[i] = io;
	}
	s->ready_ns = ready;
	s->start_next = *start;
	*start = si + 1;
}

/* Hands free slots to queued requests, round-robin across sessions. */
static void queue_kick(struct chm_dev *dev, uint32_t *start)
{
	struct chm_req *r;
	while (dev->slot_free_head && (r = chm_sess_dequeue(dev)))
		fill_start(dev, r, start);
}

static void req_wake(struct chm_dev *dev, int32_t ri)
{
	if (ri >= 0)
		pthread_cond_broadcast(&dev->reqs[ri].cond);
}

/* A behind slot that is freed leaves that condition. Lock held. */
static void slot_drop_behind(struct chm_dev *dev, struct chm_slot *s)
{
	if (!s->behind)
		return;
	s->behind = false;
	chm_ctr32_add(&dev->slots_behind, -1);
	chm_wbuf_unpin_log(dev);
}

#define CATCH_UP_SEGS 32 /* log entries copied per catch-up round, unlocked */

/* Brings behind slot s up to date with the write-buffer log (W10) without
 * the device lock: the caller holds the only pin of s (so it is neither
 * freed nor refilled), hits skip it and wait waits while it is behind, and
 * the log is pinned (nothing moves or is reclaimed), so the copies run
 * unlocked. A write admitted over it meanwhile sets repatch: the whole
 * range is laid over again, oldest entry first, so that an older write
 * never ends on top of a newer one. A slot released meanwhile (DRAINING)
 * is not worth finishing. More overlapping entries than CATCH_UP_SEGS are
 * laid over under the lock. Lock held on entry and exit. */
static void slot_catch_up_copy(struct chm_dev *dev, struct chm_slot *s)
{
	struct chm_wbuf_seg seg[CATCH_UP_SEGS];
	do {
		s->repatch = false;
		if (s->state == CHM_SLOT_DRAINING)
			break;
		int n = chm_wbuf_overlay_segs(dev, s->fill_start, s->fill_len, seg, CATCH_UP_SEGS);
		if (n < 0) {
			chm_wbuf_overlay(dev, s->fill_start, s->buf, s->fill_len);
			continue;
		}
		if (n == 0)
			continue;
		pthread_mutex_unlock(&dev->lock);
		for (int i = 0; i < n; i++)
			memcpy(s->buf + (seg[i].addr - s->fill_start), seg[i].src, seg[i].len);
		pthread_mutex_lock(&dev->lock);
	} while (s->repatch);
	s->behind = false;
	chm_ctr32_add(&dev->slots_behind, -1);
	chm_wbuf_unpin_log(dev);
	req_wake(dev, s->req);
}

/* Marks READY slot s behind (hits skip it, wait waits) with a log pin. */
static void slot_behind(struct chm_dev *dev, struct chm_slot *s)
{
	s->behind = true;
	chm_ctr32_add(&dev->slots_behind, 1);
	chm_wbuf_pin_log(dev);
}

/* Drops a pin of s. The last pin of a behind slot brings it up to date
 * first (slot_catch_up_copy, lock dropped around the copies); the last pin
 * of a DRAINING slot frees it (fills it starts are chained on *start).
 * Lock held on entry and exit. */
static void slot_unpin(struct chm_dev *dev, struct chm_slot *s, uint32_t *start)
{
	if (s->pins == 1 && s->behind && s->state != CHM_SLOT_DRAINING)
		slot_catch_up_copy(dev, s); /* the writes it missed */
	if (--s->pins == 0 && s->state == CHM_SLOT_DRAINING) {
		slot_set(dev, s, CHM_SLOT_FREE); /* unpin_last */
		slot_drop_behind(dev, s);
		s->fnext = dev->slot_free_head;
		dev->slot_free_head = (uint32_t)(s - dev->slots) + 1;
		queue_kick(dev, start);
	}
}

/* A slot becomes FREE (from any state via the event that fits). */
static void slot_free(struct chm_dev *dev, struct chm_slot *s, uint32_t *start)
{
	if (s->state == CHM_SLOT_READY || s->state == CHM_SLOT_HELD)
		staged_unlink(dev, s);
	slot_drop_behind(dev, s);
	slot_set(dev, s, CHM_SLOT_FREE);
	chm_sess_uncharge(dev, s);
	s->req = -1;
	s->fnext = dev->slot_free_head;
	dev->slot_free_head = (uint32_t)(s - dev->slots) + 1;
	queue_kick(dev, start);
}

static void lat_record(struct chm_dev *dev, uint64_t ns)
{
	uint64_t us = ns / 1000;
	unsigned b = 0;
	while (us > 1 && b < CHM_HIST_BUCKETS - 1) {
		us >>= 1;
		b++;
	}
	chm_ctr_add(&dev->st.refill_lat_hist[b], 1);
	chm_ctr_add(&dev->st.refill_lat_count, 1);
	chm_ctr_add(&dev->st.refill_lat_sum_ns, ns);
}

void chm_staging_fill_io_done(struct chm_io *io)
{
	struct chm_slot *s = io->ctx;
	struct chm_dev *dev = s->dev;
	uint32_t start = 0;
	pthread_mutex_lock(&dev->lock);
	if (io->res < 0)
		s->err = s->err ? s->err : io->res;
	else if ((uint64_t)io->res != io->len)
		s->err = s->err ? s->err : -EIO; /* short transfer */
	if (io->res > 0)
		s->fill_bytes += (uint64_t)io->res;
	if (io->model_done_ns > s->ready_ns) /* a fault delayed it in the model */
		s->ready_ns = io->model_done_ns;
	if (--s->ios_pending == 0) {
		uint64_t now = chm_now_ns(dev);
		dev->mode->fill_end(dev, s);
		/* on the device clock: the fill is done when both the I/O and the
		 * model are (in virtual time the I/O is done before the clock moves) */
		lat_record(dev, (now > s->ready_ns ? now : s->ready_ns) - s->issue_ns);
		if (dev->cfg.clock == CHM_CLOCK_REAL && dev->timing.enabled && now > s->ready_ns) {
			chm_ctr_add(&dev->st.pacing_late, 1);
			chm_ctr_add(&dev->st.pacing_late_ns, now - s->ready_ns);
		}
		if (s->req < 0) {
			slot_set(dev, s, CHM_SLOT_FREE); /* fill_done_orphan */
			chm_sess_uncharge(dev, s);
			s->fnext = dev->slot_free_head;
			dev->slot_free_head = (uint32_t)(s - dev->slots) + 1;
			/* counted once, as cancelled, at release */
			queue_kick(dev, &start);
		} else if (s->err) {
			slot_set(dev, s, CHM_SLOT_FAILED);
			chm_ctr_add(&dev->st.prefetch_failed, 1);
		} else {
			slot_set(dev, s, CHM_SLOT_READY);
			staged_link(dev, s);
			chm_ctr_add(&dev->st.prefetch_completed, 1);
			if (chm_wbuf_overlay_segs(dev, s->fill_start, s->fill_len, NULL, 0)) {
				/* buffered writes over the fill: READY but behind, laid
				 * over here with the lock dropped around the copies */
				slot_behind(dev, s);
				s->pins++;
				slot_unpin(dev, s, &start);
			}
		}
		req_wake(dev, s->req);
	}
	pthread_mutex_unlock(&dev->lock);
	if (start)
		chm_staging_submit(dev, start);
}

void chm_staging_submit(struct chm_dev *dev, uint32_t head)
{
	while (head) {
		struct chm_slot *s = &dev->slots[head - 1];
		/* read the link before submitting: a ghost fill completes inline
		 * and the slot may be freed and re-chained before submit returns */
		uint32_t next = s->start_next;
		uint32_t n = s->nios;
		int rc = dev->mode->fill_submit(dev, s);
		if (rc < 0) {
			/* no done() will run for any of them: fail the fill */
			for (uint32_t i = 0; i < n; i++) {
				s->ioptrs[i]->res = rc;
				chm_staging_fill_io_done(s->ioptrs[i]);
			}
		}
		head = next;
	}
}

static uint64_t slot_stride(const struct chm_config *c)
{
	return CHM_ALIGN_UP(c->slot_bytes, CHM_FILL_ALIGN) + CHM_FILL_ALIGN;
}

uint64_t chm_staging_mem_bytes(const struct chm_config *cfg)
{
	return (uint64_t)cfg->slot_count * slot_stride(cfg);
}

int chm_staging_init(struct chm_dev *dev, char *mem)
{
	struct chm_config *c = &dev->cfg;
	dev->nslots = c->slot_count;
	dev->slot_stride = slot_stride(c);
	dev->nreqs = dev->nslots + c->refill_queue;
	dev->handle_idx_bits = 1;
	while (dev->nreqs >> dev->handle_idx_bits)
		dev->handle_idx_bits++;
	dev->handle_gen_last = (UINT64_C(1) << (HANDLE_TAG_SHIFT - dev->handle_idx_bits)) - 1;
	dev->max_ios = chm_map_max_ios(c, dev->slot_stride);
	dev->staged_head = -1;
	dev->slots = calloc(dev->nslots, sizeof(*dev->slots));
	if (!dev->slots)
		goto err_slots;
	dev->reqs = calloc(dev->nreqs, sizeof(*dev->reqs));
	if (!dev->reqs)
		goto err_reqs;
	struct chm_io *ios = calloc((size_t)dev->nslots * dev->max_ios, sizeof(*ios));
	if (!ios)
		goto err_ios;
	struct chm_io **ptrs = calloc((size_t)dev->nslots * dev->max_ios, sizeof(*ptrs));
	if (!ptrs)
		goto err_ptrs;
	for (uint32_t i = 0; i < dev->nslots; i++) {
		struct chm_slot *s = &dev->slots[i];
		s->dev = dev;
		s->state = CHM_SLOT_FREE;
		s->req = -1;
		s->sess = -1;
		s->sprev = s->snext = -1;
		s->buf = mem + (uint64_t)i * dev->slot_stride;
		s->ios = &ios[(size_t)i * dev->max_ios];
		s->ioptrs = &ptrs[(size_t)i * dev->max_ios];
		s->fnext = i + 1 < dev->nslots ? i + 2 : 0;
	}
	dev->slot_free_head = dev->nslots ? 1 : 0;
	chm_ctr32_add(&dev->slot_count_by_state[CHM_SLOT_FREE], (int32_t)dev->nslots);
	pthread_condattr_t rca;
	pthread_condattr_init(&rca);
	pthread_condattr_setclock(&rca, CLOCK_MONOTONIC);
	for (uint32_t i = 0; i < dev->nreqs; i++) {
		pthread_cond_init(&dev->reqs[i].cond, &rca);
		dev->reqs[i].gen = 1;
		dev->reqs[i].slot = -1;
		dev->reqs[i].fnext = i + 1 < dev->nreqs ? i + 2 : 0;
	}
	pthread_condattr_destroy(&rca);
	dev->req_free_head = dev->nreqs ? 1 : 0;
	dev->req_free_tail = dev->nreqs;
	if (chm_sess_init(dev))
		goto err_sess;
	return 0;

err_sess:
	for (uint32_t i = 0; i < dev->nreqs; i++)
		pthread_cond_destroy(&dev->reqs[i].cond);
	free(ptrs);
err_ptrs:
	free(ios);
err_ios:
	free(dev->reqs);
	dev->reqs = NULL;
err_reqs:
	free(dev->slots);
	dev->slots = NULL;
err_slots:
	return -ENOMEM;
}

void chm_staging_fini(struct chm_dev *dev)
{
	if (dev->slots) {
		free(dev->slots[0].ios);
		free(dev->slots[0].ioptrs);
	}
	for (uint32_t i = 0; dev->reqs && i < dev->nreqs; i++)
		pthread_cond_destroy(&dev->reqs[i].cond);
	chm_sess_fini(dev);
	free(dev->slots);
	free(dev->reqs);
	dev->slots = NULL;
	dev->reqs = NULL;
}

void chm_staging_cancel_all(struct chm_dev *dev)
{
	struct chm_req *r;
	while ((r = chm_sess_dequeue(dev))) {
		chm_ctr_add(&dev->st.prefetch_cancelled, 1);
		req_free(dev, r);
	}
	for (uint32_t i = 0; i < dev->nreqs; i++)
		pthread_cond_broadcast(&dev->reqs[i].cond);
}

bool chm_staging_read_hit(struct chm_dev *dev, uint64_t addr, void *buf, uint64_t len,
                          uint64_t *link_bytes, uint32_t *start)
{
	struct chm_slot *s = NULL;
	for (int32_t i = dev->staged_head; i >= 0; i = dev->slots[i].snext) {
		struct chm_slot *c = &dev->slots[i];
		/* staged in memory but not yet by the model: not a hit */
		if (dev->timing.enabled && c->ready_ns > chm_now_ns(dev))
			continue;
		/* a held snapshot older than an admitted write, or a copy a
		 * write could not patch yet: read around it */
		if (c->stale || c->behind)
			continue;
		if (addr >= c->fill_start && addr + len <= c->fill_start + c->fill_len) {
			s = c;
			break;
		}
	}
	if (!s)
		return false;
	uint64_t paid = len < s->link_credit ? len : s->link_credit;
	s->link_credit -= paid;
	*link_bytes = len - paid;
	s->pins++;
	pthread_mutex_unlock(&dev->lock);
	/* pinned: not refilled, freed or patched while this copies */
	memcpy(buf, s->buf + (addr - s->fill_start), len);
	pthread_mutex_lock(&dev->lock);
	slot_unpin(dev, s, start);
	return true;
}

/* Brings staged copies that overlap a newly admitted object up to date
 * (W10) without touching a held view (W11). A READY slot is marked behind
 * (no hits, wait waits) and re-overlaid from the log by the last holder of
 * a pin on it (slot_catch_up_copy, copies without the lock): by the caller
 * itself when no hit is copying from it, else by the last of those hits.
 * One that is behind already is caught up again (repatch). A HELD slot is
 * read through its view without the lock: its bytes stay as wait handed
 * them out, and the slot is marked stale so that chm_read of its range goes
 * to the SSD with the write-buffer overlay (read-your-writes) instead. Lock
 * held; dropped around the copies. */
void chm_staging_patch(struct chm_dev *dev, uint64_t addr, uint64_t len, uint32_t *start)
{
	uint32_t mine = 0; /* slots to catch up here (index+1, via catch_next) */
	for (int32_t i = dev->staged_head; i >= 0; i = dev->slots[i].snext) {
		struct chm_slot *s = &dev->slots[i];
		uint64_t a = addr > s->fill_start ? addr : s->fill_start;
		uint64_t b = addr + len < s->fill_start + s->fill_len ? addr + len
		                                                      : s->fill_start + s->fill_len;
		if (a >= b)
			continue;
		if (s->state == CHM_SLOT_HELD) {
			s->stale = true;
		} else if (s->behind) {
			s->repatch = true;
		} else {
			slot_behind(dev, s);
			if (!s->pins) {
				s->pins++; /* ours, for the catch-up below */
				s->catch_next = mine;
				mine = (uint32_t)i + 1;
			}
		}
	}
	while (mine) {
		struct chm_slot *s = &dev->slots[mine - 1];
		mine = s->catch_next;
		slot_unpin(dev, s, start);
	}
	chm_resident_patch(dev, addr, len);
}

/* ---- the API ---- */

/* One prefetch with valid arguments in session si, inside the device
 * (lock held). */
static int prefetch_locked(struct chm_dev *dev, uint32_t si, uint64_t addr, uint64_t len,
                           uint32_t flags, chm_handle *h, uint32_t *start)
{
	/* a resident hit needs a request record, not a slot or a queue place */
	int32_t ei = chm_resident_hit(dev, addr, len);
	if (ei >= 0) {
		struct chm_req *r = req_alloc(dev);
		if (!r) {
			chm_resident_unhold(dev, ei);
			dev->st.prefetch_rejected++;
			return dev->reqs_live ? -EAGAIN : -ENOSPC;
		}
		r->addr = addr;
		r->len = len;
		r->sess = (uint16_t)si;
		r->flags = 0;
		r->issue_ns = chm_now_ns(dev);
		r->state = CHM_REQ_RESIDENT;
		r->slot = ei;
		dev->st.prefetch_issued++;
		dev->st.prefetch_completed++;
		*h = handle_make(dev, (uint32_t)(r - dev->reqs), r->gen);
		return 0;
	}
	bool full = !dev->slot_free_head &&
	            ((flags & CHM_PF_NOQUEUE) || dev->q_len >= dev->cfg.refill_queue);
	int rc = full ? chm_detail(-EAGAIN, "prefetch: %s",
	                           flags & CHM_PF_NOQUEUE
	                                   ? "no free slot (CHM_PF_NOQUEUE)"
	                                   : "the refill queue is full (refill_queue)")
	              : chm_sess_admit(dev, si); /* its quota, with its own reason */
	if (rc) {
		chm_ctr_add(&dev->st.prefetch_rejected, 1);
		return rc;
	}
	/* nreqs = slots + queue, so a record is free here unless some retired
	 * (after 2^47 handles or more): then -EAGAIN while a release can still
	 * free one, -ENOSPC once every record is retired */
	struct chm_req *r = req_alloc(dev);
	if (!r) {
		chm_ctr_add(&dev->st.prefetch_rejected, 1);
		return chm_detail(
		        dev->reqs_live ? -EAGAIN : -ENOSPC,
		        "prefetch: every free request record is retired (reopen the device)");
	}
	r->addr = addr;
	r->len = len;
	r->sess = (uint16_t)si;
	r->flags = (flags & CHM_PF_RETAIN) ? CHM_REQF_RETAIN : 0;
	r->issue_ns = chm_now_ns(dev);
	chm_ctr_add(&dev->st.prefetch_issued, 1);
	if (dev->slot_free_head) {
		fill_start(dev, r, start);
	} else {
		r->state = CHM_REQ_QUEUED;
		chm_sess_enqueue(dev, r);
		chm_ctr_add(&dev->st.prefetch_queued, 1);
	}
	*h = handle_make(dev, (uint32_t)(r - dev->reqs), r->gen);
	return 0;
}

int chm_staging_prefetch(struct chm_dev *dev, chm_session sess, uint32_t n, const uint64_t *addrs,
                         const uint64_t *lens, uint32_t flags, chm_handle *handles,
                         int32_t *results)
{
	uint32_t start = 0, si;
	int ok = 0;
	pthread_mutex_lock(&dev->lock);
	int rc = chm_sess_lookup(dev, sess, &si);
	if (rc) {
		pthread_mutex_unlock(&dev->lock);
		return rc;
	}
	for (uint32_t i = 0; i < n; i++) {
		int r = results[i];
		if (!r && lens[i] > dev->cfg.slot_bytes)
			r = chm_detail(-EINVAL,
			               "prefetch: len %llu is larger than a slot (slot_size %llu)",
			               (unsigned long long)lens[i],
			               (unsigned long long)dev->cfg.slot_bytes);
		if (!r)
			r = prefetch_locked(dev, si, addrs[i], lens[i], flags, &handles[i], &start);
		results[i] = r;
		ok += r == 0;
	}
	pthread_mutex_unlock(&dev->lock);
	if (start)
		chm_staging_submit(dev, start);
	return ok;
}

/* The view crosses the host link once, when it is handed out; that pass is
 * credited to later reads of the slot. Lock held; the pacing sleep drops it,
 * so the caller looks the handle up again. */
static void host_transfer(struct chm_dev *dev, struct chm_slot *s, uint64_t len)
{
	s->link_credit = len;
	if (dev->timing.enabled)
		chm_pace(dev, chm_timing_host(&dev->timing, chm_now_ns(dev), len));
}

/* The handle h of session si (-EINVAL when another session's). */
static int handle_lookup_in(struct chm_dev *dev, uint32_t si, chm_handle h, struct chm_req **out)
{
	int rc = handle_lookup(dev, h, out);
	if (!rc && (*out)->sess != si)
		rc = chm_detail(-EINVAL, "handle %#llx belongs to another session",
		                (unsigned long long)h);
	return rc;
}

int chm_staging_wait(struct chm_dev *dev, chm_session sess, chm_handle h, uint64_t timeout_ns,
                     struct chm_view *view)
{
	struct chm_req *r;
	uint32_t si;
	pthread_mutex_lock(&dev->lock);
	int rc = chm_sess_lookup(dev, sess, &si);
	if (rc)
		goto out_unlock;
	uint64_t start_mono = chm_mono_ns();
	uint64_t deadline =
	        timeout_ns > UINT64_MAX - start_mono ? UINT64_MAX : start_mono + timeout_ns;
	for (;;) {
		if (dev->closing) {
			rc = -ECANCELED;
			goto out_unlock;
		}
		rc = handle_lookup_in(dev, si, h, &r);
		if (rc)
			goto out_unlock;
		if (r->state == CHM_REQ_RESIDENT) {
			if (!(r->flags & CHM_REQF_PAID)) { /* staged already: the link only */
				r->flags |= CHM_REQF_PAID;
				if (dev->timing.enabled)
					chm_pace(dev, chm_timing_host(&dev->timing, chm_now_ns(dev),
					                              r->len));
			}
			break;
		}
		struct chm_slot *s = r->state == CHM_REQ_SLOTTED ? &dev->slots[r->slot] : NULL;
		if (s && s->state == CHM_SLOT_FAILED) {
			rc = chm_detail(-EIO,
			                "wait: the fill of handle %#llx failed (backing I/O); "
			                "release it",
			                (unsigned long long)h);
			goto out_unlock;
		}
		if (s && s->state == CHM_SLOT_HELD)
			break;
		uint64_t until = deadline; /* how long to sleep, if at all */
		/* behind: the last unpin brings it up to date, then wakes us */
		if (s && s->state == CHM_SLOT_READY && !s->behind) {
			if (dev->cfg.clock == CHM_CLOCK_VIRTUAL) {
				chm_pace(dev, s->ready_ns); /* virtual: never drops the lock */
				slot_set(dev, s, CHM_SLOT_HELD);
				host_transfer(dev, s, r->len);
				break;
			}
			/* staged; the timing model may say it is not there yet */
			uint64_t ready_mono = chm_dev_to_mono_ns(dev, s->ready_ns);
			if (!dev->timing.enabled || chm_mono_ns() >= ready_mono) {
				slot_set(dev, s, CHM_SLOT_HELD);
				host_transfer(dev, s, r->len);
				break;
			}
			if (ready_mono < until)
				until = ready_mono;
		}
		if (timeout_ns == 0 || chm_mono_ns() >= deadline) {
			rc = chm_detail(
			        -ETIMEDOUT, "wait: handle %#llx not staged within %llu ns (%s)",
			        (unsigned long long)h, (unsigned long long)timeout_ns,
			        r->state == CHM_REQ_QUEUED ? "queued for a slot" : "filling");
			goto out_unlock;
		}
		if (until == UINT64_MAX) {
			pthread_cond_wait(&r->cond, &dev->lock);
		} else {
			struct timespec ts = chm_ns_to_timespec(until);
			pthread_cond_timedwait(&r->cond, &dev->lock, &ts);
		}
	}
	/* pacing may have dropped the lock: the handle could be gone */
	rc = handle_lookup_in(dev, si, h, &r);
	if (rc)
		goto out_unlock;
	if (r->state == CHM_REQ_RESIDENT) {
		view->data = chm_resident_data(dev, r->slot, r->addr);
	} else {
		struct chm_slot *s = &dev->slots[r->slot];
		view->data = s->buf + (r->addr - s->fill_start);
	}
	view->len = r->len;
	view->dev_addr = r->addr;
	/* lru-mode views are host copies, outside the pool */
	char *pool = dev->pool.base;
	bool in_pool =
	        pool && (char *)view->data >= pool && (char *)view->data < pool + dev->pool.bytes;
	view->pool_offset = in_pool ? (uint64_t)((char *)view->data - pool) : UINT64_MAX;
	rc = 0;
out_unlock:
	pthread_mutex_unlock(&dev->lock);
	return rc;
}

/* One release in session si (lock held). */
static int release_locked(struct chm_dev *dev, uint32_t si, chm_handle h, uint32_t *start)
{
	struct chm_req *r;
	/* release works while closing too (it only returns resources), but not
	 * after shutdown freed the request table */
	int rc = dev->shut ? -ECANCELED : handle_lookup_in(dev, si, h, &r);
	if (!rc)
		chm_staging_release_req(dev, r, start);
	return rc;
}

void chm_staging_release_req(struct chm_dev *dev, struct chm_req *r, uint32_t *start)
{
	chm_ctr_add(&dev->st.prefetch_released, 1);
	if (r->state == CHM_REQ_QUEUED) {
		chm_sess_unqueue(dev, r);
		chm_ctr_add(&dev->st.prefetch_cancelled, 1);
	} else if (r->state == CHM_REQ_RESIDENT) {
		chm_resident_unhold(dev, r->slot);
	} else {
		struct chm_slot *s = &dev->slots[r->slot];
		if (s->state == CHM_SLOT_FILLING) {
			s->req = -1; /* orphan: freed by fill_io_done */
			chm_ctr_add(&dev->st.prefetch_cancelled, 1);
		} else if (s->pins) {
			if (r->flags & CHM_REQF_RETAIN)
				chm_resident_retain(dev, s); /* refused: pinned */
			/* hits still copy from it: the last unpin frees it */
			staged_unlink(dev, s);
			slot_set(dev, s, CHM_SLOT_DRAINING); /* release_pinned */
			chm_sess_uncharge(dev, s);
			s->req = -1;
		} else {
			if ((r->flags & CHM_REQF_RETAIN) &&
			    (s->state == CHM_SLOT_READY || s->state == CHM_SLOT_HELD))
				chm_resident_retain(dev, s);
			slot_free(dev, s, start);
		}
	}
	req_free(dev, r);
	pthread_cond_broadcast(&r->cond);
}

int chm_staging_release(struct chm_dev *dev, chm_session sess, uint32_t n,
                        const chm_handle *handles, int32_t *results)
{
	uint32_t start = 0, si = 0;
	int ok = 0;
	pthread_mutex_lock(&dev->lock);
	/* after shutdown the session table is gone: every element is
	 * -ECANCELED, whatever the session */
	int rc = dev->shut ? 0 : chm_sess_lookup(dev, sess, &si);
	if (rc) {
		pthread_mutex_unlock(&dev->lock);
		return rc;
	}
	for (uint32_t i = 0; i < n; i++) {
		results[i] = release_locked(dev, si, handles[i], &start);
		ok += results[i] == 0;
	}
	pthread_mutex_unlock(&dev->lock);
	if (start)
		chm_staging_submit(dev, start);
	return ok;
}

void chm_staging_stats(struct chm_dev *dev, struct chm_stats *out)
{
	out->slots_total = dev->nslots;
	const uint32_t *n = dev->slot_count_by_state;
	out->slots_free = chm_ctr32_get(&n[CHM_SLOT_FREE]);
	out->slots_filling = chm_ctr32_get(&n[CHM_SLOT_FILLING]);
	out->slots_ready = chm_ctr32_get(&n[CHM_SLOT_READY]);
	out->slots_held = chm_ctr32_get(&n[CHM_SLOT_HELD]) + chm_ctr32_get(&n[CHM_SLOT_DRAINING]);
	out->slots_failed = chm_ctr32_get(&n[CHM_SLOT_FAILED]);
	out->slots_catching_up = chm_ctr32_get(&dev->slots_behind);
	out->queue_len = chm_ctr32_get(&dev->q_len);
	out->queue_cap = dev->cfg.refill_queue;
	out->slot_bytes = dev->cfg.slot_bytes;
	out->window_bytes = (uint64_t)dev->nslots * dev->slot_stride;
}
