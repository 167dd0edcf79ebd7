/* wbuf.c - the isolated write buffer of prefetch mode.
 *
 * The last wbuf_bytes of the DRAM pool hold a circular log of admitted
 * objects, in admission order (KV writes are append-only, so a log fits).
 * chm_wbuf_write() reserves log space under the lock or reports the object
 * skipped when there is none -- it never waits for the SSD. A flusher thread
 * writes admitted entries to the backing targets in order, in batches, each
 * batch followed by fdatasync of every target; it runs when no SSD read is in
 * flight, and regardless of reads once the log is fuller than the high-water
 * mark or a flush barrier waits.
 *
 * Entry states (fw_spec): FREE -> ADMITTED -> FLUSHING -> DURABLE -> FREE;
 * a failed batch returns its entries FLUSHING -> ADMITTED (retried, never
 * reported durable). A skipped write never occupies an entry.
 *
 * Reclamation: an SSD read that started before an entry became durable may
 * have fetched the old bytes and relies on the entry's overlay when it
 * completes. Reads therefore register in the current epoch; a batch that
 * becomes durable is stamped with the epoch, the epoch advances, and an entry
 * is reclaimed only once no read from its epoch or earlier is in flight.
 *
 * Cost (fw_spec/cost.yaml): an admitted write pays the host->DRAM link
 * (the caller is paced to it); a skip pays nothing; a batch pays the SSD
 * write of each entry, in the background.
 *
 * Virtual time (clock=virtual): there is no flusher thread. The flusher is
 * a process on the simulated clock, run by chm_wbuf_vt_advance() whenever
 * the clock moves (pacing, chm_advance_clock, a write): a batch starts once
 * the previous one is done, its first entry has arrived and (unless the log
 * is above the high-water mark or a barrier waits) the modeled SSD read
 * pipe is idle; it is charged to the timing model at that start and becomes
 * durable when the model completes it. So the buffer fills when modeled
 * writes outpace the modeled SSD, idle time drains it, and the same calls
 * give the same skips and times on every run.
 *
 * No payload (ghost backend): nothing is copied into the log, the overlay
 * has nothing to lay over, and a write costs O(1) whatever its size.
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
#include "states.h"
#include "wbuf.h"

#define EPOCHS 64               /* in-flight read counters, a ring */
#define BATCH_BYTES (16u << 20) /* largest flush batch */
#define BATCH_ENTRIES 64
#define RETRY_NS 10000000ull   /* back-off after a failed batch */
#define IDLE_NS 100000000ull   /* flusher re-check period */
#define PRESSURE_NS 1000000ull /* re-check period while reads are busy */

struct wb_entry {
	uint64_t addr, len;
	uint64_t off; /* offset in the log region */
	uint64_t pad; /* log bytes skipped before off (wrap) */
	uint64_t seq;
	uint64_t durable_epoch;
	uint64_t adm_ns; /* device clock when the data was in the buffer */
	int state;       /* enum chm_wbuf_state */
	bool copying;    /* space reserved, data not yet copied in */
};

struct chm_wbuf {
	char *base;
	uint64_t size;
	uint64_t head_off, tail_off, used; /* log bytes */
	uint64_t *st_used; /* &dev->st.wbuf_used_bytes: used, for lock-free readers */
	struct wb_entry *ents;
	uint32_t cap, head, count; /* entry ring */
	uint64_t next_seq;         /* seq of the next reservation */
	uint64_t admitted_max;     /* highest fully admitted seq */
	uint64_t error_gen;        /* bumped on every failed batch */
	uint32_t barriers;         /* chm_flush callers waiting */
	bool flushing;
	uint64_t batch_mark; /* bumped at batch start and end */
	uint64_t epoch, lo_epoch;
	uint32_t inflight[EPOCHS];
	uint32_t reads_inflight;
	uint32_t log_pins;         /* slots behind the log: nothing is reclaimed */
	uint64_t durable_model_ns; /* modeled time of the last durable batch */
	pthread_cond_t cond;       /* wakes the flusher */
	pthread_t thread;
	bool thread_started;
	bool stop;
	/* virtual time: the flusher as a process on the simulated clock */
	bool vt;
	uint64_t vt_free_ns; /* the flusher can start its next batch from here */
	uint64_t vt_done_ns; /* the batch in flight completes (flushing) */
	uint32_t vt_n;       /* entries of that batch */
	bool vt_running;     /* inside the virtual flusher (no re-entry) */
	int vt_err;          /* -errno of the batch in flight, at its completion */
	struct wb_entry *vt_batch[BATCH_ENTRIES];
};

static struct wb_entry *ent(struct chm_wbuf *w, uint32_t i)
{
	return &w->ents[(w->head + i) % w->cap];
}

static void ent_set(struct wb_entry *e, int to)
{
	CHM_TRANSITION(chm_wbuf_transitions, e->state, to);
}

/* Lowest epoch that may still have reads in flight. */
static uint64_t oldest_read_epoch(struct chm_wbuf *w)
{
	while (w->lo_epoch < w->epoch && w->inflight[w->lo_epoch % EPOCHS] == 0)
		w->lo_epoch++;
	return w->inflight[w->lo_epoch % EPOCHS] ? w->lo_epoch : w->epoch + 1;
}

static void reclaim(struct chm_wbuf *w)
{
	if (w->log_pins)
		return; /* a slot behind the log still needs every entry */
	uint64_t oldest = oldest_read_epoch(w);
	while (w->count) {
		struct wb_entry *e = ent(w, 0);
		if (e->state != CHM_WB_DURABLE || e->durable_epoch >= oldest)
			break;
		ent_set(e, CHM_WB_FREE);
		w->used -= e->len + e->pad;
		w->head_off = e->off + e->len;
		w->head = (w->head + 1) % w->cap;
		w->count--;
	}
	if (!w->count)
		w->head_off = w->tail_off = w->used = 0;
	chm_ctr_set(w->st_used, w->used);
}

/* Reserves len contiguous log bytes; false when they are not there. */
static bool log_alloc(struct chm_wbuf *w, uint64_t len, uint64_t *off, uint64_t *pad)
{
	if (w->count == w->cap || len > w->size)
		return false;
	if (!w->count) {
		*off = 0;
		*pad = 0;
		return true;
	}
	if (w->tail_off > w->head_off || (w->tail_off == w->head_off && w->used == 0)) {
		if (w->size - w->tail_off >= len) {
			*off = w->tail_off;
			*pad = 0;
			return true;
		}
		if (w->head_off >= len) { /* wrap; the tail end is padding */
			*off = 0;
			*pad = w->size - w->tail_off;
			return true;
		}
		return false;
	}
	if (w->head_off - w->tail_off >= len) {
		*off = w->tail_off;
		*pad = 0;
		return true;
	}
	return false;
}

int chm_wbuf_reserve(struct chm_dev *dev, uint64_t addr, const void *buf, uint64_t len,
                     struct wb_entry **out)
{
	struct chm_wbuf *w = dev->wbuf;
	uint64_t off, pad;
	pthread_mutex_lock(&dev->lock);
	if (len > w->size) {
		/* never admissible: a configuration error, not a skip */
		pthread_mutex_unlock(&dev->lock);
		return chm_detail(
		        -EINVAL,
		        "write: len %llu is larger than the write buffer (wbuf %llu), so it "
		        "can never be admitted; raise wbuf, or set object_size",
		        (unsigned long long)len, (unsigned long long)w->size);
	}
	chm_wbuf_vt_advance(dev); /* the flushes the model has finished by now */
	if (!log_alloc(w, len, &off, &pad)) {
		reclaim(w);
		if (!log_alloc(w, len, &off, &pad)) {
			/* the skip: a distinct outcome, nothing changed */
			chm_ctr_add(&dev->st.wr_skipped, 1);
			chm_ctr_add(&dev->st.wr_skipped_bytes, len);
			pthread_mutex_unlock(&dev->lock);
			return CHM_WRITE_SKIPPED;
		}
	}
	struct wb_entry *e = &w->ents[(w->head + w->count) % w->cap];
	memset(e, 0, sizeof(*e));
	e->state = CHM_WB_FREE;
	e->addr = addr;
	e->len = len;
	e->off = off;
	e->pad = pad;
	e->seq = ++w->next_seq;
	e->copying = true;
	w->count++;
	w->used += len + pad;
	chm_ctr_set(w->st_used, w->used);
	w->tail_off = off + len;
	pthread_mutex_unlock(&dev->lock);

	/* the entry is reserved and invisible until admitted: copy unlocked */
	if (buf && !chm_nodata(dev))
		memcpy(w->base + off, buf, len);
	/* the host->DRAM link; e is invisible until admitted, so no lock */
	e->adm_ns = chm_timing_host_in(&dev->timing, chm_now_ns(dev), len);
	*out = e;
	return 0;
}

uint64_t chm_wbuf_admit(struct chm_dev *dev, struct wb_entry *e)
{
	struct chm_wbuf *w = dev->wbuf;
	e->copying = false;
	ent_set(e, CHM_WB_ADMITTED);
	if (e->seq > w->admitted_max)
		w->admitted_max = e->seq;
	chm_ctr_add(&dev->st.wr_admitted, 1);
	chm_ctr_add(&dev->st.wr_admitted_bytes, e->len);
	pthread_cond_signal(&w->cond);
	return e->adm_ns;
}

void chm_wbuf_overlay(struct chm_dev *dev, uint64_t addr, void *buf, uint64_t len)
{
	struct chm_wbuf *w = dev->wbuf;
	if (!w || chm_nodata(dev))
		return; /* no payload in the log */
	for (uint32_t i = 0; i < w->count; i++) {
		struct wb_entry *e = ent(w, i);
		if (e->copying)
			continue;
		uint64_t a = addr > e->addr ? addr : e->addr;
		uint64_t b = addr + len < e->addr + e->len ? addr + len : e->addr + e->len;
		if (a < b)
			memcpy((char *)buf + (a - addr), w->base + e->off + (a - e->addr), b - a);
	}
}

int chm_wbuf_overlay_segs(struct chm_dev *dev, uint64_t addr, uint64_t len,
                          struct chm_wbuf_seg *seg, int max)
{
	struct chm_wbuf *w = dev->wbuf;
	int n = 0;
	if (!w || chm_nodata(dev))
		return 0; /* no payload in the log */
	for (uint32_t i = 0; i < w->count; i++) {
		struct wb_entry *e = ent(w, i);
		if (e->copying)
			continue;
		uint64_t a = addr > e->addr ? addr : e->addr;
		uint64_t b = addr + len < e->addr + e->len ? addr + len : e->addr + e->len;
		if (a >= b)
			continue;
		if (n == max)
			return -1;
		seg[n++] = (struct chm_wbuf_seg){a, w->base + e->off + (a - e->addr), b - a};
	}
	return n;
}

void chm_wbuf_pin_log(struct chm_dev *dev)
{
	if (dev->wbuf)
		dev->wbuf->log_pins++;
}

void chm_wbuf_unpin_log(struct chm_dev *dev)
{
	struct chm_wbuf *w = dev->wbuf;
	if (w && --w->log_pins == 0 && w->count)
		pthread_cond_signal(&w->cond); /* reclaim can go on */
}

void chm_wbuf_read_begin(struct chm_dev *dev, struct chm_read_tok *tok)
{
	struct chm_wbuf *w = dev->wbuf;
	tok->begin_ns = chm_now_ns(dev);
	if (!w)
		return;
	tok->epoch = w->epoch;
	tok->batch_mark = w->batch_mark;
	w->inflight[w->epoch % EPOCHS]++;
	w->reads_inflight++;
}

void chm_wbuf_read_end(struct chm_dev *dev, const struct chm_read_tok *tok, uint64_t end_ns)
{
	struct chm_wbuf *w = dev->wbuf;
	if (!w)
		return;
	w->inflight[tok->epoch % EPOCHS]--;
	w->reads_inflight--;
	/* device time, so virtual time counts the model's wait, not the host's */
	if ((w->flushing || w->batch_mark != tok->batch_mark) && end_ns > tok->begin_ns)
		chm_ctr_add(&dev->st.read_wait_flush_ns, end_ns - tok->begin_ns);
	if (w->reads_inflight == 0 && w->count)
		pthread_cond_signal(&w->cond);
}

/* Highest seq such that every entry up to it is durable (or reclaimed). */
static uint64_t durable_upto(struct chm_wbuf *w)
{
	for (uint32_t i = 0; i < w->count; i++) {
		struct wb_entry *e = ent(w, i);
		if (e->state != CHM_WB_DURABLE)
			return e->seq - 1;
	}
	return w->next_seq;
}

static void timed_wait(pthread_cond_t *c, pthread_mutex_t *m, uint64_t ns)
{
	struct timespec ts = chm_ns_to_timespec(chm_mono_ns() + ns);
	pthread_cond_timedwait(c, m, &ts);
}

/* Picks the next batch: admitted entries in order, stopping at the first
 * entry that is not admitted yet. Returns the count (from index *first). */
static uint32_t pick_batch(struct chm_wbuf *w, uint32_t *first)
{
	uint32_t i = 0, n = 0;
	uint64_t bytes = 0;
	while (i < w->count && ent(w, i)->state == CHM_WB_DURABLE)
		i++;
	*first = i;
	for (; i < w->count && n < BATCH_ENTRIES; i++, n++) {
		struct wb_entry *e = ent(w, i);
		if (e->copying || e->state != CHM_WB_ADMITTED)
			break;
		if (n && bytes + e->len > BATCH_BYTES)
			break;
		bytes += e->len;
	}
	return n;
}

/* ---- virtual time ---- */

static bool forced_now(struct chm_dev *dev, struct chm_wbuf *w)
{
	return w->barriers || w->used * 100 >= w->size * dev->cfg.flush_high_water_pct;
}

/* The batch in flight is done in the model: DURABLE (or back to ADMITTED
 * on an injected error, retried after RETRY_NS of simulated time). */
static void vt_complete(struct chm_dev *dev, struct chm_wbuf *w, int rc)
{
	uint64_t bytes = 0;

	w->flushing = false;
	w->batch_mark++;
	for (uint32_t i = 0; i < w->vt_n; i++) {
		struct wb_entry *e = w->vt_batch[i];
		bytes += e->len;
		if (rc) {
			ent_set(e, CHM_WB_ADMITTED); /* flush_error: retried */
		} else {
			ent_set(e, CHM_WB_DURABLE);
			e->durable_epoch = w->epoch;
		}
	}
	w->vt_n = 0;
	if (rc) {
		w->error_gen++;
		w->vt_free_ns = w->vt_done_ns + RETRY_NS;
	} else {
		if (w->vt_done_ns > w->durable_model_ns)
			w->durable_model_ns = w->vt_done_ns;
		chm_ctr_add(&dev->st.wr_flushed_bytes, bytes);
		chm_ctr_add(&dev->st.bytes_written_ssd, bytes);
		chm_ctr_add(&dev->st.flush_batches, 1);
		if (w->inflight[(w->epoch + 1) % EPOCHS] == 0)
			w->epoch++;
		w->vt_free_ns = w->vt_done_ns;
	}
	reclaim(w);
	pthread_cond_broadcast(&dev->cond);
}

/*
 * Runs the virtual flusher up to `now`: completes the batch in flight if
 * the model is done with it, starts the next when it is due. force treats
 * every batch as forced (a barrier). Returns the simulated time of its next
 * event (UINT64_MAX: nothing to do). Lock held.
 */
static uint64_t vt_run(struct chm_dev *dev, struct chm_wbuf *w, uint64_t now, bool force, int *err)
{
	for (;;) {
		if (w->flushing) {
			if (w->vt_done_ns > now)
				return w->vt_done_ns;
			vt_complete(dev, w, *err);
			*err = 0;
			continue;
		}
		reclaim(w);
		uint32_t first, n = pick_batch(w, &first);
		if (!n)
			return UINT64_MAX;
		struct wb_entry *e0 = ent(w, first);
		uint64_t start = w->vt_free_ns > e0->adm_ns ? w->vt_free_ns : e0->adm_ns;
		if (!force && !forced_now(dev, w)) {
			/* reads first: wait until the modeled read pipe is idle */
			uint64_t rb = chm_timing_read_busy_until(&dev->timing);
			if (rb > start)
				start = rb;
		}
		if (start > now)
			return start;
		uint64_t done = start;
		int rc = 0;
		for (uint32_t i = 0; i < n; i++) {
			struct wb_entry *e = ent(w, first + i);
			uint64_t d, delay;
			ent_set(e, CHM_WB_FLUSHING);
			w->vt_batch[i] = e;
			d = chm_timing_ssd_object(&dev->timing, 1, start, e->len, dev->cfg.max_io);
			int r = chm_ghost_pieces(dev, CHM_IO_WRITE, e->len, dev->cfg.max_io,
			                         &delay);
			if (r && !rc)
				rc = r;
			d += delay;
			done = d > done ? d : done;
		}
		w->vt_n = n;
		w->vt_done_ns = done;
		w->flushing = true;
		w->batch_mark++;
		*err = rc;
	}
}

void chm_wbuf_vt_advance(struct chm_dev *dev)
{
	struct chm_wbuf *w = dev->wbuf;
	if (!w || !w->vt || w->vt_running)
		return;
	w->vt_running = true;
	vt_run(dev, w, chm_vclock_now(dev), false, &w->vt_err);
	w->vt_running = false;
}

static void *flusher_main(void *arg)
{
	struct chm_dev *dev = arg;
	struct chm_wbuf *w = dev->wbuf;
	pthread_mutex_lock(&dev->lock);
	struct wb_entry *batch[BATCH_ENTRIES];
	while (!w->stop) {
		reclaim(w);
		uint32_t first, n = pick_batch(w, &first);
		if (!n) {
			timed_wait(&w->cond, &dev->lock, IDLE_NS);
			continue;
		}
		bool forced =
		        w->barriers || w->used * 100 >= w->size * dev->cfg.flush_high_water_pct;
		if (w->reads_inflight && !forced) {
			/* reads first: wait for the read queue to drain */
			timed_wait(&w->cond, &dev->lock, PRESSURE_NS);
			continue;
		}
		uint64_t bytes = 0;
		for (uint32_t i = 0; i < n; i++) {
			/* pointers, not ring positions: the head moves on reclaim */
			batch[i] = ent(w, first + i);
			ent_set(batch[i], CHM_WB_FLUSHING);
			bytes += batch[i]->len;
		}
		w->flushing = true;
		w->batch_mark++;
		pthread_mutex_unlock(&dev->lock);

		/* entries in FLUSHING are neither moved nor reclaimed: safe to
		 * read their descriptors and data without the lock */
		int rc = 0;
		uint64_t done = 0, t;
		for (uint32_t i = 0; i < n && !rc; i++) {
			struct wb_entry *e = batch[i];
			rc = chm_ssd_rw_sync(dev, CHM_IO_WRITE, e->addr, w->base + e->off, e->len,
			                     &t);
			done = t > done ? t : done;
		}
		if (!rc)
			rc = chm_ssd_sync_all(dev);

		pthread_mutex_lock(&dev->lock);
		/* the write occupies the modeled SSD channels (reads queue behind
		 * it there); in real time durability is not reported before the
		 * model allows. The virtual clock is the readers': a background
		 * flush does not move it, a barrier that waits for it does. */
		if (dev->cfg.clock == CHM_CLOCK_REAL)
			chm_pace(dev, done);
		if (done > w->durable_model_ns)
			w->durable_model_ns = done;
		w->flushing = false;
		w->batch_mark++;
		for (uint32_t i = 0; i < n; i++) {
			struct wb_entry *e = batch[i];
			if (rc) {
				ent_set(e, CHM_WB_ADMITTED); /* flush_error: retried */
			} else {
				ent_set(e, CHM_WB_DURABLE);
				e->durable_epoch = w->epoch;
			}
		}
		if (rc) {
			w->error_gen++;
		} else {
			chm_ctr_add(&dev->st.wr_flushed_bytes, bytes);
			chm_ctr_add(&dev->st.flush_batches, 1);
			/* a new epoch; never reuse a counter slot still in use */
			if (w->inflight[(w->epoch + 1) % EPOCHS] == 0)
				w->epoch++;
		}
		reclaim(w);
		pthread_cond_broadcast(&dev->cond);
		if (rc)
			timed_wait(&w->cond, &dev->lock, RETRY_NS);
	}
	pthread_mutex_unlock(&dev->lock);
	return NULL;
}

/* Virtual time: the barrier runs the flusher forced, moving the clock to
 * each batch's modeled completion, until everything admitted before it is
 * durable. An injected error ends it with -EIO (the entries stay admitted).
 * Lock held. */
static int vt_flush(struct chm_dev *dev, struct chm_wbuf *w)
{
	uint64_t target = w->admitted_max, err0 = w->error_gen;
	int rc = 0;

	w->vt_running = true;
	w->barriers++;
	while (durable_upto(w) < target) {
		uint64_t next = vt_run(dev, w, chm_vclock_now(dev), true, &w->vt_err);
		if (w->error_gen != err0) {
			rc = chm_backing_error(dev, "flush");
			break;
		}
		if (durable_upto(w) >= target)
			break;
		if (next == UINT64_MAX) { /* nothing admitted left: cannot happen */
			rc = -EIO;
			break;
		}
		chm_vclock_raise(dev, next);
	}
	w->barriers--;
	if (!rc)
		reclaim(w);
	w->vt_running = false;
	return rc;
}

int chm_wbuf_flush(struct chm_dev *dev, uint64_t timeout_ns)
{
	struct chm_wbuf *w = dev->wbuf;
	if (w->vt) {
		pthread_mutex_lock(&dev->lock);
		int rc = vt_flush(dev, w);
		pthread_mutex_unlock(&dev->lock);
		return rc;
	}
	uint64_t start = chm_mono_ns();
	uint64_t deadline = timeout_ns > UINT64_MAX - start ? UINT64_MAX : start + timeout_ns;
	int rc = 0;
	pthread_mutex_lock(&dev->lock);
	uint64_t target = w->admitted_max, err0 = w->error_gen;
	w->barriers++;
	pthread_cond_signal(&w->cond);
	while (durable_upto(w) < target) {
		if (w->error_gen != err0) {
			rc = chm_backing_error(dev, "flush");
			break;
		}
		if (dev->closing && w->stop) {
			rc = -ECANCELED;
			break;
		}
		uint64_t now = chm_mono_ns();
		if (now >= deadline) {
			rc = -ETIMEDOUT;
			break;
		}
		if (deadline == UINT64_MAX) {
			pthread_cond_wait(&dev->cond, &dev->lock);
		} else {
			struct timespec ts = chm_ns_to_timespec(deadline);
			pthread_cond_timedwait(&dev->cond, &dev->lock, &ts);
		}
	}
	w->barriers--;
	/* the batch may have turned durable while a read of its epoch was in
	 * flight; that read has ended by now, so give the space back here
	 * rather than whenever the flusher next wakes */
	if (!rc)
		reclaim(w);
	if (!rc && dev->cfg.clock == CHM_CLOCK_VIRTUAL)
		chm_pace(dev, w->durable_model_ns);
	pthread_mutex_unlock(&dev->lock);
	return rc;
}

void chm_wbuf_stats(struct chm_dev *dev, struct chm_stats *out)
{
	/* wbuf_bytes and wbuf_used_bytes are kept in dev->st (copied by
	 * chm_stats): nothing to read here, and dev->wbuf is not touched */
	(void)dev;
	(void)out;
}

int chm_wbuf_init(struct chm_dev *dev)
{
	struct chm_wbuf *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	uint64_t off = CHM_ALIGN_UP(dev->pool.bytes - dev->cfg.wbuf_bytes, CHM_FILL_ALIGN);
	w->base = (char *)dev->pool.base + off;
	w->size = dev->cfg.wbuf_bytes > dev->pool.bytes - off ? dev->pool.bytes - off
	                                                      : dev->cfg.wbuf_bytes;
	w->st_used = &dev->st.wbuf_used_bytes;
	chm_ctr_set(&dev->st.wbuf_bytes, w->size);
	uint64_t cap = w->size / 4096;
	w->cap = cap < 64 ? 64 : cap > (1u << 20) ? (1u << 20) : (uint32_t)cap;
	w->ents = calloc(w->cap, sizeof(*w->ents));
	if (!w->ents)
		goto err_ents;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&w->cond, &ca);
	pthread_condattr_destroy(&ca);
	dev->wbuf = w;
	w->vt = dev->cfg.clock == CHM_CLOCK_VIRTUAL;
	if (w->vt)
		return 0; /* the flusher runs on the simulated clock, no thread */
	int rc = pthread_create(&w->thread, NULL, flusher_main, dev);
	if (rc)
		goto err_thread;
	w->thread_started = true;
	return 0;

err_thread:
	dev->wbuf = NULL;
	pthread_cond_destroy(&w->cond);
	free(w->ents);
err_ents:
	free(w);
	return -ENOMEM;
}

/* A flush that failed on the backing (I/O error, or no space left): its
 * batches stay admitted and are retried. */
static bool flush_failed(int rc)
{
	return rc == -EIO || rc == -ENOSPC;
}

void chm_wbuf_fini(struct chm_dev *dev)
{
	struct chm_wbuf *w = dev->wbuf;
	if (!w)
		return;
	/* best effort: everything admitted goes to the SSD before close. A
	 * failed batch is retried by the flusher; keep asking until the budget
	 * is spent, so one transient error does not drop the writes behind it */
	const uint64_t budget = 10ull * 1000000000ull;
	uint64_t start = chm_mono_ns();
	for (int tries = 0; w->vt && tries < 8; tries++) /* simulated retries */
		if (!flush_failed(chm_wbuf_flush(dev, UINT64_MAX)))
			break;
	/* between real-time tries, back off (1 ms doubling to 250 ms): a full
	 * disk fails each flush at once, and asking again without a pause
	 * would spin a core for the whole budget */
	uint64_t pause = 1000000ull;
	for (; !w->vt;) {
		uint64_t spent = chm_mono_ns() - start;
		if (spent >= budget || !flush_failed(chm_wbuf_flush(dev, budget - spent)))
			break;
		spent = chm_mono_ns() - start;
		if (spent >= budget)
			break;
		chm_sleep_ns(pause < budget - spent ? pause : budget - spent);
		pause = pause * 2 < 250000000ull ? pause * 2 : 250000000ull;
	}
	pthread_mutex_lock(&dev->lock);
	dev->clock_hook = NULL; /* the virtual flusher goes with the buffer */
	w->stop = true;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&dev->lock);
	if (w->thread_started)
		pthread_join(w->thread, NULL);
	/* fills still in flight look at dev->wbuf under the lock */
	pthread_mutex_lock(&dev->lock);
	/* whatever is still not durable is dropped here: count it, so that
	 * close can report the loss (chm_dev_lost) */
	for (uint32_t i = 0; i < w->count; i++) {
		struct wb_entry *e = ent(w, i);
		if (e->state == CHM_WB_ADMITTED || e->state == CHM_WB_FLUSHING)
			chm_dev_note_lost(dev, 1, e->len);
	}
	dev->wbuf = NULL;
	pthread_mutex_unlock(&dev->lock);
	pthread_cond_destroy(&w->cond);
	free(w->ents);
	free(w);
}
