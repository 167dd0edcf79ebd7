/* lru.c - lru mode: the whole DRAM pool as one transparent LRU cache of
 * lru_line_bytes lines, the commercial CMM-H baseline (docs/design.md §3).
 *
 * Line i lives at pool.base + i * line. A line that names a device address
 * is in the hash table (line address -> line) and on the recency list (MRU
 * first); a line that names nothing is INVALID on the free stack. A line
 * that is DIRTY or WRITING_BACK is also on the unclean FIFO, ordered by the
 * sequence number of its oldest unflushed write: the write-back thread takes
 * DIRTY lines from its head (eager write-back, loss protection) and a flush
 * waits until its head is younger than the flush.
 *
 * Misses of one call are filled as one batch: under dev->lock every missing
 * line gets a victim (free lines first, then strictly from the LRU tail),
 * the victims are marked busy, the lock is dropped, and the victims'
 * write-backs and the fills go to the backend in one submission, write-backs
 * first, so that they compete with the reads as in the device modelled. A
 * clean victim is evicted and re-keyed to its new address at once and filled
 * in place. A dirty victim keeps its old address (busy, WRITING_BACK) until
 * its write-back has landed, because a re-read of that address must not see
 * the SSD's stale copy; meanwhile its new address sits on the pending list
 * and its fill lands in a bounce buffer, copied into the line only once the
 * write-back succeeded. If the write-back fails, the victim goes back to
 * DIRTY (retried by the write-back thread, never dropped): a read is then
 * served from the bounce buffer without caching, a write retries the line.
 *
 * Whoever touches a busy line, a pending address or (to write it) a line
 * under write-back waits on dev->cond. A caller never waits while it holds
 * busy lines of its own, so batches cannot wait on each other. A write to a
 * line under write-back waits for the write-back to complete instead of
 * changing bytes under the I/O, so every write-back writes one consistent
 * image of its line and WRITING_BACK -> DIRTY only happens on an I/O error.
 *
 * Whole accesses (L7): a read or write drops the lock between batches and
 * around each batch's I/O, so on its own a read could return some lines
 * from before and some from after a concurrent write. Every access
 * therefore holds its byte range for its whole duration: an access waits at
 * entry, holding nothing, until no earlier access with an overlapping range
 * is left in which one of the two writes (readers share, a writer is
 * alone, first come first served). Each read, and each prefetch hint fill
 * made of one, is then all old or all new bytes of any write.
 *
 * No payload (ghost backend): lines, bounce buffers and hint views hold no
 * bytes; nothing is copied into or out of them, so the cache costs no host
 * memory beyond its line table, and a write may come without a buffer.
 *
 * Cost (fw_spec/cost.yaml): a read pays its missing lines' SSD reads
 * (behind any dirty victims' write-backs), then the host link once for the
 * whole access; a write pays the host->DRAM link; a prefetch hint's fill
 * pays the SSD but not the link (its wait does, once).
 *
 * In virtual time (clock=virtual) there is no write-back thread: the
 * write-back runs inline at the end of each write and flush, charging the
 * timing model without pacing the caller, so that a trace replays the same
 * way every time and its write-back still occupies the SSD channels that
 * reads need.
 *
 * Host cost per line (what bounds a virtual-time replay): one lookup, where
 * the slot after the previous line's is tried before the hash table (lines
 * brought in together sit in consecutive slots), one recency move and one
 * mapped io. The timing model is charged once per batch
 * (chm_timing_ssd_ios), the counters are published once per batch, and an
 * access takes its fill and io arrays from an idle list instead of
 * allocating them.
 *
 * Counters: lru_hits / lru_misses count line lookups of reads and writes; a
 * whole-line write that misses allocates without reading the SSD. A miss
 * that reads a line evicted earlier is an LRU-induced refill.
 *
 * Prefetch hints: the mode has a staging window (staging.c) so the prefetch
 * API works, but its slots are host view buffers outside the pool, and a
 * fill is one job for a filler thread that reads the object through the
 * cache (a hint fills the cache; nothing is pinned in it). The fillers and
 * their queue are this file's (struct chm_lru), and so is the mode table
 * chm_mode_lru_ops.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "clock.h"
#include "counters.h"
#include "dev.h"
#include "iomap.h"
#include "lru.h"
#include "lru_index.h"
#include "mode.h"
#include "staging.h"
#include "states.h"

#define FILL_BATCH_LINES 1024u    /* lines per fill batch at most */
#define BATCH_BYTES (64ull << 20) /* bytes per batch at most (>= 1 line) */
#define WB_BATCH_LINES 64u        /* lines per eager write-back batch */
#define WB_RETRY_NS 10000000ull   /* back-off after a failed write-back */
#define WRITE_RETRIES 3           /* victim write-back failures per write */

/* One missing line of a batch. */
struct lru_fill {
	struct lru_line *line;
	uint64_t addr, len;         /* the line brought in */
	uint64_t old_addr, old_len; /* dirty victim: what is written back */
	bool dirty_victim;
	bool fetch;                  /* read from the SSD (else a whole-line write) */
	uint64_t off, cnt;           /* the caller's bytes within the line */
	uint64_t buf_off;            /* and their offset in the caller's buffer */
	char *dst;                   /* where the fill lands */
	unsigned wb0, nwb, rd0, nrd; /* its ios in the batch */
	int wb_err, rd_err;
	struct lru_fill *pnext; /* pending list */
};

/* What one access needs per batch, sized for a full batch and kept for the
 * next access when it is done, so that an access allocates nothing. */
struct lru_scratch {
	struct lru_fill *fills;
	struct chm_io *ios;
	struct chm_io **ptrs;
	struct lru_scratch *next; /* idle list */
};

/* The byte range of an access in progress or waiting to start (L7). */
struct lru_range {
	uint64_t a, b; /* [a, b) */
	bool write;
	struct lru_range *prev, *next; /* arrival order */
};

struct chm_lru {
	struct chm_dev *dev;
	struct lru_range *rhead, *rtail; /* accesses, oldest first */
	struct chm_lru_index ix;         /* lines: lru_index.c */
	char *base;                      /* line i at base + i * ix.line */
	struct lru_fill *pending;
	unsigned ios_per_line;
	unsigned batch_lines;        /* derived: lines per fill batch */
	struct lru_scratch *scratch; /* idle scratch sets, for the next access */

	uint64_t wb_errors;        /* failed write-backs (lines) */
	uint64_t wb_model_done_ns; /* the model's end of the latest eager write-back */

	pthread_t thread;
	bool thread_started;
	bool stop;
	bool wb_active;         /* virtual time: a caller is running write-back */
	pthread_cond_t wb_cond; /* work for the write-back thread */
	unsigned wb_max;        /* lines per write-back batch */
	struct lru_line **wb_lines;
	unsigned *wb_nios;
	struct chm_io *wb_ios;
	struct chm_io **wb_ptrs;

	/* prefetch hints: view buffers and the filler threads' queue */
	void *view_mem;
	uint64_t view_mem_bytes;
	uint32_t *lq; /* ring of slot indices to fill */
	uint32_t lq_head, lq_len;
	pthread_cond_t lq_cond;
	pthread_t lq_threads[4];
	unsigned lq_nthreads;
	bool lq_stop;
};

/* ---- lines ---- */

static inline char *line_buf(const struct chm_lru *c, const struct lru_line *l)
{
	return c->base + (uint64_t)chm_lru_index_of(&c->ix, l) * c->ix.line;
}

/* Bytes of the line at addr (the last line may be cut by the capacity). */
static inline uint64_t line_len(const struct chm_lru *c, uint64_t addr)
{
	uint64_t left = c->dev->cfg.capacity - addr;
	return left < c->ix.line ? left : c->ix.line;
}

static bool pending_has(const struct chm_lru *c, uint64_t addr)
{
	for (const struct lru_fill *f = c->pending; f; f = f->pnext)
		if (f->addr == addr)
			return true;
	return false;
}

static void pending_remove(struct chm_lru *c, struct lru_fill *f)
{
	struct lru_fill **p = &c->pending;
	while (*p != f)
		p = &(*p)->pnext;
	*p = f->pnext;
	f->pnext = NULL;
}

/* ---- batches of I/O ---- */

/* First error among ios[i0, i0+n): -errno, -EIO for a short transfer. */
static int ios_err(const struct chm_io *ios, unsigned i0, unsigned n)
{
	for (unsigned i = i0; i < i0 + n; i++) {
		if (ios[i].res < 0)
			return ios[i].res;
		if (ios[i].op != CHM_IO_SYNC && (uint32_t)ios[i].res != ios[i].len)
			return -EIO;
	}
	return 0;
}

/* Maps one transfer of a line into ios[k..]. The caller charges the timing
 * model for a whole batch at once (chm_timing_ssd_ios, in ios order).
 * Returns the number of ios. */
static unsigned map_line(struct chm_dev *dev, int op, uint64_t addr, uint64_t len, char *buf,
                         struct chm_io *ios)
{
	struct chm_lru *c = dev->lru;
	/* ios_per_line is chm_map_max_ios() of a whole line: cannot overflow */
	int n = chm_map_ios(dev, op, addr, len, buf, ios, c->ios_per_line);
	return n > 0 ? (unsigned)n : 0;
}

/* ---- the read / write path ---- */

struct access {
	uint64_t addr, len;
	char *rbuf;       /* read: destination */
	const char *wbuf; /* write: source */
	struct lru_fill *fills;
	struct chm_io *ios;
	struct chm_io **ptrs;
	char *bounce; /* fills behind dirty victims */
	unsigned bounce_lines;
	bool write;        /* a write (wbuf may be NULL: no payload) */
	bool nodata;       /* ghost: lines hold no bytes, nothing is copied */
	bool hint;         /* a prefetch hint's fill: no link, and in virtual
	                    * time no pacing (done_max records the model) */
	uint64_t done_max; /* latest modeled completion of the access's I/O */
	bool all_hit;
	int write_retries;
	/* line counters of the batch being planned, added to dev->st in one
	 * go (plan_counts) before the lock is dropped */
	uint64_t hits, misses, refills, dirty_evictions;
	/* and the bytes settle() moved, published once per batch */
	uint64_t read_bytes, writeback_bytes;
};

/* Publishes the line counters plan_batch gathered. Lock held. */
static void plan_counts(struct chm_dev *dev, struct access *a)
{
	if (a->hits)
		chm_ctr_add(&dev->st.lru_hits, a->hits);
	if (a->misses)
		chm_ctr_add(&dev->st.lru_misses, a->misses);
	if (a->refills)
		chm_ctr_add(&dev->st.lru_refills, a->refills);
	if (a->dirty_evictions)
		chm_ctr_add(&dev->st.lru_dirty_evictions, a->dirty_evictions);
	a->hits = a->misses = a->refills = a->dirty_evictions = 0;
}

/* Applies the caller's bytes of one present, usable line. Lock held. */
static void access_hit(struct chm_lru *c, struct access *a, struct lru_line *l, uint64_t off,
                       uint64_t cnt, uint64_t buf_off)
{
	if (a->write) {
		if (!a->nodata)
			memcpy(line_buf(c, l) + off, a->wbuf + buf_off, cnt);
		if (l->state == CHM_LINE_CLEAN)
			chm_lru_index_dirty(&c->ix, l);
	} else if (!a->nodata) {
		memcpy(a->rbuf + buf_off, line_buf(c, l) + off, cnt);
	}
	chm_lru_index_touch(&c->ix, l);
	a->hits++;
}

/* The hashed line of line address la, or NULL. near is the line of the
 * line address before la in this walk (or NULL): a run of lines brought in
 * together sits in consecutive slots, so the slot after near is tried
 * before the hash table. A hashed line that names la is the only one. */
static inline struct lru_line *lookup_near(struct chm_lru *c, const struct lru_line *near,
                                           uint64_t la)
{
	if (near) {
		uint32_t i = chm_lru_index_of(&c->ix, near) + 1;
		if (i < c->ix.nlines && c->ix.lines[i].hashed && c->ix.lines[i].addr == la)
			return &c->ix.lines[i];
	}
	return chm_lru_index_lookup(&c->ix, la);
}

/*
 * Walks lines from *cur: serves hits now, picks victims for misses into
 * a->fills. Stops at the end of the range, a full batch, a line someone
 * else is working on (waits for it when the batch is still empty) or when
 * a dirty victim needs more bounce space than there is (*grow). Lock held.
 * Returns the number of fills.
 */
static unsigned plan_batch(struct chm_dev *dev, struct access *a, uint64_t *cur, bool *grow)
{
	struct chm_lru *c = dev->lru;
	bool write = a->write;
	uint64_t end = a->addr + a->len;
	unsigned n = 0, nbounce = 0;
	struct lru_line *near = NULL; /* the line of the previous line address */

	*grow = false;
	while (*cur < end && n < c->batch_lines) {
		uint64_t la = *cur & ~(c->ix.line - 1), ll = line_len(c, la);
		uint64_t off = *cur - la;
		uint64_t cnt = (end < la + ll ? end : la + ll) - *cur;
		struct lru_line *l = lookup_near(c, near, la);
		bool blocked = l ? l->busy || (write && l->state == CHM_LINE_WRITING_BACK)
		                 : pending_has(c, la);
		if (blocked) {
			if (n)
				break;
			plan_counts(dev, a);
			pthread_cond_wait(&dev->cond, &dev->lock);
			near = NULL;
			continue;
		}
		if (l) {
			access_hit(c, a, l, off, cnt, *cur - a->addr);
			*cur += cnt;
			near = l;
			continue;
		}
		struct lru_line *v = chm_lru_index_victim(&c->ix);
		if (!v) {
			if (n)
				break;
			plan_counts(dev, a);
			pthread_cond_wait(&dev->cond, &dev->lock);
			near = NULL;
			continue;
		}
		bool fetch = !(write && off == 0 && cnt == ll);
		bool dirty = v->state == CHM_LINE_DIRTY;
		if (dirty && fetch && !a->nodata && nbounce == a->bounce_lines) {
			*grow = true;
			break;
		}
		a->all_hit = false;
		a->misses++;
		if (fetch && chm_lru_index_test_clear_evicted(&c->ix, la))
			a->refills++;
		near = v; /* (a dirty victim keeps its old address for now) */
		if (!dirty) {
			if (v->state == CHM_LINE_CLEAN)
				chm_lru_index_evict(&c->ix, v);
			else
				chm_lru_index_free_pop(&c->ix); /* v was its top */
			chm_lru_index_bind(&c->ix, v, la);
			if (!fetch) {
				/* whole-line write, clean or free victim: no I/O */
				if (!a->nodata)
					memcpy(line_buf(c, v), a->wbuf + (*cur - a->addr), cnt);
				chm_lru_index_dirty(&c->ix, v);
				*cur += cnt;
				continue;
			}
		}
		struct lru_fill *f = &a->fills[n++];
		/* every field, without a memset (rep stos costs more than
		 * the stores at one fill per line) */
		f->line = v;
		f->addr = la;
		f->len = ll;
		f->old_addr = f->old_len = 0;
		f->dirty_victim = false;
		f->fetch = fetch;
		f->off = off;
		f->cnt = cnt;
		f->buf_off = *cur - a->addr;
		f->dst = NULL;
		f->wb0 = f->nwb = f->rd0 = f->nrd = 0;
		f->wb_err = f->rd_err = 0;
		f->pnext = NULL;
		v->busy = true;
		if (dirty) {
			f->dirty_victim = true;
			f->old_addr = v->addr;
			f->old_len = line_len(c, v->addr);
			chm_lru_index_set(&c->ix, v, CHM_LINE_WRITING_BACK);
			a->dirty_evictions++;
			f->pnext = c->pending;
			c->pending = f;
			if (fetch) /* no payload: the ghost fill lands nowhere */
				f->dst = a->nodata ? line_buf(c, v)
				                   : a->bounce + (uint64_t)nbounce++ * c->ix.line;
		} else {
			f->dst = line_buf(c, v);
		}
		*cur += cnt;
	}
	plan_counts(dev, a);
	return n;
}

/* Settles fill f after its I/O: states, data, counters. Lock held.
 * Returns 0, -errno (a fill failed) or 1 (write: redo this line). */
static int settle(struct chm_dev *dev, struct access *a, struct lru_fill *f)
{
	struct chm_lru *c = dev->lru;
	struct lru_line *v = f->line;
	bool write = a->write;

	if (f->fetch && !f->rd_err)
		a->read_bytes += f->len;
	if (f->dirty_victim) {
		pending_remove(c, f);
		v->busy = false;
		if (f->wb_err) {
			chm_lru_index_set(&c->ix, v,
			                  CHM_LINE_DIRTY); /* stays on the FIFO, retried */
			c->wb_errors++;
			if (write)
				return 1;
			if (f->rd_err)
				return f->rd_err;
			if (!a->nodata) /* uncached */
				memcpy(a->rbuf + f->buf_off, f->dst + f->off, f->cnt);
			return 0;
		}
		chm_lru_index_set(&c->ix, v, CHM_LINE_CLEAN);
		chm_lru_index_fifo_remove(&c->ix, v);
		a->writeback_bytes += f->old_len;
		chm_lru_index_evict(&c->ix, v);
		if (f->fetch && f->rd_err) {
			chm_lru_index_free_push(&c->ix, v);
			return f->rd_err;
		}
		chm_lru_index_bind(&c->ix, v, f->addr);
		/* a fetched line was copied in from the bounce buffer already */
	} else {
		v->busy = false;
		if (f->rd_err) {
			chm_lru_index_unbind(&c->ix, v);
			return f->rd_err;
		}
	}
	if (f->fetch)
		chm_lru_index_set(&c->ix, v, CHM_LINE_CLEAN);
	if (write) {
		if (!a->nodata)
			memcpy(line_buf(c, v) + f->off, a->wbuf + f->buf_off, f->cnt);
		chm_lru_index_dirty(&c->ix, v);
	} else if (!a->nodata) {
		memcpy(a->rbuf + f->buf_off, line_buf(c, v) + f->off, f->cnt);
	}
	return 0;
}

/* Runs the I/O of n planned fills and settles them. Called with the lock
 * held; drops it around the I/O. Returns 0, -errno, or 1 with *redo set to
 * the lowest address a write must go over again. */
static int run_batch(struct chm_dev *dev, struct access *a, unsigned n, uint64_t *redo)
{
	struct chm_lru *c = dev->lru;
	uint64_t now = chm_now_ns(dev), done;
	unsigned k = 0;
	bool again = false;
	int err = 0;

	for (unsigned i = 0; i < n; i++) { /* write-backs first, */
		struct lru_fill *f = &a->fills[i];
		if (!f->dirty_victim)
			continue;
		f->wb0 = k;
		f->nwb = map_line(dev, CHM_IO_WRITE, f->old_addr, f->old_len, line_buf(c, f->line),
		                  a->ios + k);
		k += f->nwb;
	}
	for (unsigned i = 0; i < n; i++) { /* then the fills, in one queue */
		struct lru_fill *f = &a->fills[i];
		if (!f->fetch)
			continue;
		f->rd0 = k;
		f->nrd = map_line(dev, CHM_IO_READ, f->addr, f->len, f->dst, a->ios + k);
		k += f->nrd;
	}
	done = chm_timing_ssd_ios(&dev->timing, now, a->ios, k);
	unsigned nwb_total = 0;
	for (unsigned i = 0; i < n; i++)
		nwb_total += a->fills[i].dirty_victim ? a->fills[i].nwb : 0;
	/* a read behind write-back I/O: its own dirty victims', or an eager
	 * write-back the model has not finished when the batch starts */
	bool behind_wb = !a->write && (nwb_total || c->wb_model_done_ns > now);
	pthread_mutex_unlock(&dev->lock);

	chm_ios_run(dev, a->ios, a->ptrs, k, NULL, NULL);
	/* device time: the batch's end on the device clock (the model's
	 * completion, or the clock if the host was later) minus its start */
	uint64_t end = chm_now_ns(dev);
	end = end > done ? end : done;
	uint64_t stalled = behind_wb ? end - now : 0;
	for (unsigned i = 0; i < n; i++) {
		struct lru_fill *f = &a->fills[i];
		f->wb_err = f->dirty_victim ? ios_err(a->ios, f->wb0, f->nwb) : 0;
		f->rd_err = f->fetch ? ios_err(a->ios, f->rd0, f->nrd) : 0;
		/* the line is busy and its old image is on the SSD now */
		if (f->dirty_victim && f->fetch && !f->wb_err && !f->rd_err && !a->nodata)
			memcpy(line_buf(c, f->line), f->dst, f->len);
	}

	pthread_mutex_lock(&dev->lock);
	/* a read that had to push dirty victims out first waited behind them */
	chm_ctr_add(&dev->st.read_wait_flush_ns, stalled);
	if (done > a->done_max)
		a->done_max = done;
	if (!(a->hint && dev->cfg.clock == CHM_CLOCK_VIRTUAL))
		chm_pace(dev, done);
	a->read_bytes = a->writeback_bytes = 0;
	for (unsigned i = 0; i < n; i++) {
		struct lru_fill *f = &a->fills[i];
		int r = settle(dev, a, f);
		if (r == 1 && (!again || f->addr + f->off < *redo)) {
			*redo = f->addr + f->off;
			again = true;
		} else if (r < 0 && !err) {
			err = r;
		}
	}
	if (a->read_bytes)
		chm_ctr_add(&dev->st.bytes_read_ssd, a->read_bytes);
	if (a->writeback_bytes) {
		chm_ctr_add(&dev->st.lru_writeback_bytes, a->writeback_bytes);
		chm_ctr_add(&dev->st.bytes_written_ssd, a->writeback_bytes);
	}
	pthread_cond_broadcast(&dev->cond);
	return err ? err : again;
}

static unsigned wb_drain_inline(struct chm_lru *c);

static void scratch_free(struct lru_scratch *sc)
{
	free(sc->ptrs);
	free(sc->ios);
	free(sc->fills);
	free(sc);
}

/* An idle scratch set, or a new one (NULL: no memory). Lock held. */
static struct lru_scratch *scratch_get(struct chm_lru *c)
{
	struct lru_scratch *sc = c->scratch;
	if (sc) {
		c->scratch = sc->next;
		return sc;
	}
	size_t nios = (size_t)c->batch_lines * 2 * c->ios_per_line;
	sc = calloc(1, sizeof(*sc));
	if (!sc)
		return NULL;
	sc->fills = calloc(c->batch_lines, sizeof(*sc->fills));
	sc->ios = calloc(nios, sizeof(*sc->ios));
	sc->ptrs = calloc(nios, sizeof(*sc->ptrs));
	if (!sc->fills || !sc->ios || !sc->ptrs) {
		scratch_free(sc);
		return NULL;
	}
	return sc;
}

/* Back on the idle list for the next access. Lock held. */
static void scratch_put(struct chm_lru *c, struct lru_scratch *sc)
{
	sc->next = c->scratch;
	c->scratch = sc;
}

static bool range_conflicts(const struct lru_range *x, const struct lru_range *y)
{
	return (x->write || y->write) && x->a < y->b && y->a < x->b;
}

/* Queues r and waits until no earlier access conflicts with it. The caller
 * holds nothing else, and an access waits only for earlier ones, so these
 * waits form no cycle. Lock held. */
static void range_enter(struct chm_dev *dev, struct lru_range *r)
{
	struct chm_lru *c = dev->lru;
	r->next = NULL;
	r->prev = c->rtail;
	if (c->rtail)
		c->rtail->next = r;
	else
		c->rhead = r;
	c->rtail = r;
	for (;;) {
		const struct lru_range *e = r->prev;
		while (e && !range_conflicts(e, r))
			e = e->prev;
		if (!e)
			return;
		pthread_cond_wait(&dev->cond, &dev->lock);
	}
}

static void range_leave(struct chm_dev *dev, struct lru_range *r)
{
	struct chm_lru *c = dev->lru;
	if (r->prev)
		r->prev->next = r->next;
	else
		c->rhead = r->next;
	if (r->next)
		r->next->prev = r->prev;
	else
		c->rtail = r->prev;
	pthread_cond_broadcast(&dev->cond);
}

static int access_range(struct chm_dev *dev, uint64_t addr, char *rbuf, const char *wbuf,
                        uint64_t len, bool write, bool hint, uint64_t *done_ns)
{
	struct chm_lru *c = dev->lru;
	struct access a = {.addr = addr,
	                   .len = len,
	                   .rbuf = rbuf,
	                   .wbuf = wbuf,
	                   .all_hit = true,
	                   .write = write,
	                   .nodata = chm_nodata(dev) || (write && !wbuf),
	                   .hint = hint};
	uint64_t nl = ((addr + len - 1) >> c->ix.shift) - (addr >> c->ix.shift) + 1;
	unsigned bmax = nl < c->batch_lines ? (unsigned)nl : c->batch_lines;
	uint64_t cur = addr;
	int rc = 0;

	struct lru_range range = {.a = addr, .b = addr + len, .write = write};
	a.done_max = chm_now_ns(dev);
	pthread_mutex_lock(&dev->lock);
	struct lru_scratch *sc = scratch_get(c);
	if (!sc) {
		pthread_mutex_unlock(&dev->lock);
		return -ENOMEM;
	}
	a.fills = sc->fills;
	a.ios = sc->ios;
	a.ptrs = sc->ptrs;
	range_enter(dev, &range);
	while (cur < addr + len && !rc) {
		bool grow;
		unsigned n = plan_batch(dev, &a, &cur, &grow);
		if (n) {
			uint64_t redo = 0;
			rc = run_batch(dev, &a, n, &redo);
			if (rc == 1) {
				rc = ++a.write_retries > WRITE_RETRIES
				             ? chm_backing_error(dev, "write")
				             : 0;
				cur = redo;
			}
		}
		if (grow && !rc) {
			unsigned want = a.bounce_lines ? a.bounce_lines * 2 : 1;
			if (want > bmax)
				want = bmax;
			pthread_mutex_unlock(&dev->lock);
			void *nb = NULL;
			if (posix_memalign(&nb, CHM_FILL_ALIGN, (size_t)want * c->ix.line))
				rc = -ENOMEM;
			pthread_mutex_lock(&dev->lock);
			if (!rc) {
				free(a.bounce);
				a.bounce = nb;
				a.bounce_lines = want;
			}
		}
	}
	if (a.write) {
		if (dev->cfg.clock == CHM_CLOCK_VIRTUAL)
			wb_drain_inline(c);
		else
			pthread_cond_signal(&c->wb_cond);
	} else {
		if (a.all_hit)
			chm_ctr_add(&dev->st.read_hits, 1);
		else
			chm_ctr_add(&dev->st.read_misses, 1);
		if (!rc)
			chm_ctr_add(&dev->st.bytes_from_dram, len);
	}
	range_leave(dev, &range);
	/* the host link, once per access, after the lines are in (store and
	 * forward); a hint's fill stays inside the device: its wait pays it */
	if (!rc && write)
		chm_pace(dev, chm_timing_host_in(&dev->timing, chm_now_ns(dev), len));
	else if (!rc && !hint)
		chm_pace(dev, chm_timing_host(&dev->timing, chm_now_ns(dev), len));
	if (done_ns)
		*done_ns = a.done_max;
	scratch_put(c, sc);
	pthread_mutex_unlock(&dev->lock);
	free(a.bounce);
	return rc;
}

int chm_lru_read(struct chm_dev *dev, uint64_t addr, void *buf, uint64_t len)
{
	if (!dev->lru || !len)
		return -EINVAL;
	return access_range(dev, addr, buf, NULL, len, false, false, NULL);
}

int chm_lru_write(struct chm_dev *dev, uint64_t addr, const void *buf, uint64_t len)
{
	if (!dev->lru || !len || addr % CHM_IO_ALIGN || len % CHM_IO_ALIGN)
		return -EINVAL;
	return access_range(dev, addr, NULL, buf, len, true, false, NULL);
}

/* ---- eager write-back ---- */

/* Takes up to wb_max DIRTY lines from the FIFO head (DIRTY -> WRITING_BACK)
 * and maps their writes. Lock held. Returns the number of lines. */
static unsigned wb_collect(struct chm_lru *c, unsigned *nios, uint64_t *done)
{
	struct chm_dev *dev = c->dev;
	uint64_t now = chm_now_ns(dev);
	unsigned n = 0, k = 0;

	for (uint32_t i = c->ix.dhead; i && n < c->wb_max; i = c->ix.lines[i - 1].dnext) {
		struct lru_line *l = &c->ix.lines[i - 1];
		if (l->state != CHM_LINE_DIRTY || l->busy)
			continue;
		chm_lru_index_set(&c->ix, l, CHM_LINE_WRITING_BACK);
		c->wb_lines[n] = l;
		c->wb_nios[n] = map_line(dev, CHM_IO_WRITE, l->addr, line_len(c, l->addr),
		                         line_buf(c, l), c->wb_ios + k);
		k += c->wb_nios[n];
		n++;
	}
	*done = chm_timing_ssd_ios(&dev->timing, now, c->wb_ios, k);
	if (*done > c->wb_model_done_ns)
		c->wb_model_done_ns = *done;
	*nios = k;
	return n;
}

/* Writes the collected lines, syncs, settles them. Lock held; dropped
 * around the I/O. Returns the number of lines that failed. */
static unsigned wb_run(struct chm_lru *c, unsigned n, unsigned nios, uint64_t done)
{
	struct chm_dev *dev = c->dev;
	unsigned failed = 0;
	uint64_t written = 0;
	int sync_err;

	pthread_mutex_unlock(&dev->lock);
	chm_ios_run(dev, c->wb_ios, c->wb_ptrs, nios, NULL, NULL);
	sync_err = ios_err(c->wb_ios, 0, nios) ? 0 : chm_ssd_sync_all(dev);
	pthread_mutex_lock(&dev->lock);
	/* virtual time advances only with the callers, never in the background */
	if (dev->cfg.clock == CHM_CLOCK_REAL)
		chm_pace(dev, done);
	for (unsigned i = 0, k = 0; i < n; k += c->wb_nios[i], i++) {
		struct lru_line *l = c->wb_lines[i];
		uint64_t len = line_len(c, l->addr);
		if (sync_err || ios_err(c->wb_ios, k, c->wb_nios[i])) {
			chm_lru_index_set(&c->ix, l,
			                  CHM_LINE_DIRTY); /* stays on the FIFO, retried */
			c->wb_errors++;
			failed++;
			continue;
		}
		chm_lru_index_set(&c->ix, l, CHM_LINE_CLEAN);
		chm_lru_index_fifo_remove(&c->ix, l);
		written += len;
	}
	if (written) {
		chm_ctr_add(&dev->st.lru_writeback_bytes, written);
		chm_ctr_add(&dev->st.bytes_written_ssd, written);
	}
	pthread_cond_broadcast(&dev->cond);
	return failed;
}

/* Virtual time: writes back every DIRTY line now, unless another caller
 * is at it. Lock held. Returns the number of lines written back. */
static unsigned wb_drain_inline(struct chm_lru *c)
{
	unsigned total = 0;

	if (c->wb_active)
		return 0;
	c->wb_active = true;
	for (;;) {
		unsigned nios;
		uint64_t done;
		unsigned n = wb_collect(c, &nios, &done);
		if (!n)
			break;
		total += n;
		if (wb_run(c, n, nios, done))
			break; /* left DIRTY; the next write or flush retries */
	}
	c->wb_active = false;
	return total;
}

static void *wb_main(void *arg)
{
	struct chm_lru *c = arg;
	struct chm_dev *dev = c->dev;

	pthread_mutex_lock(&dev->lock);
	while (!c->stop) {
		unsigned nios;
		uint64_t done;
		unsigned n = wb_collect(c, &nios, &done);
		if (!n) {
			pthread_cond_wait(&c->wb_cond, &dev->lock);
			continue;
		}
		if (wb_run(c, n, nios, done) && !c->stop) {
			struct timespec ts = chm_ns_to_timespec(chm_mono_ns() + WB_RETRY_NS);
			pthread_cond_timedwait(&c->wb_cond, &dev->lock, &ts);
		}
	}
	pthread_mutex_unlock(&dev->lock);
	return NULL;
}

int chm_lru_flush(struct chm_dev *dev, uint64_t timeout_ns)
{
	struct chm_lru *c = dev->lru;
	uint64_t deadline = 0;
	int rc = 0;

	if (!c)
		return -EINVAL;
	if (timeout_ns != UINT64_MAX) {
		uint64_t now = chm_mono_ns();
		deadline = timeout_ns > UINT64_MAX - now ? UINT64_MAX : now + timeout_ns;
	}
	pthread_mutex_lock(&dev->lock);
	uint64_t target = c->ix.seq, errors = c->wb_errors;
	bool inline_wb = dev->cfg.clock == CHM_CLOCK_VIRTUAL;
	if (!inline_wb)
		pthread_cond_signal(&c->wb_cond);
	while (c->ix.dhead && c->ix.lines[c->ix.dhead - 1].dseq <= target) {
		if (c->wb_errors != errors) {
			rc = chm_backing_error(dev, "flush");
			break;
		}
		if (inline_wb && wb_drain_inline(c))
			continue;
		if (timeout_ns == UINT64_MAX) {
			pthread_cond_wait(&dev->cond, &dev->lock);
			continue;
		}
		if (chm_mono_ns() >= deadline) {
			rc = -ETIMEDOUT;
			break;
		}
		/* dev->cond runs on CLOCK_MONOTONIC (set up at open) */
		struct timespec ts = chm_ns_to_timespec(deadline);
		pthread_cond_timedwait(&dev->cond, &dev->lock, &ts);
	}
	pthread_mutex_unlock(&dev->lock);
	/* lines written back by evictions were not synced: sync them all */
	if (!rc)
		rc = chm_ssd_sync_all(dev);
	return rc;
}

static void lru_stats(struct chm_dev *dev, struct chm_stats *out)
{
	/* the lru_* counters and line gauges are in dev->st (copied by
	 * chm_stats); dev->lru is not read: no lock, nothing freed at shutdown */
	chm_staging_stats(dev, out);
}

/* ---- setup / teardown ---- */

static int cache_init(struct chm_dev *dev)
{
	const struct chm_config *cfg = &dev->cfg;
	uint64_t line = cfg->lru_line_bytes;
	uint64_t bytes = dev->pool.bytes < cfg->dram_bytes ? dev->pool.bytes : cfg->dram_bytes;
	pthread_condattr_t ca;
	struct chm_lru *c;
	int rc = -ENOMEM;

	if (!dev->pool.base || !line || (line & (line - 1)) || line < CHM_FILL_ALIGN ||
	    bytes / line == 0 || bytes / line >= UINT32_MAX)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->dev = dev;
	rc = chm_lru_index_init(&c->ix, line, (uint32_t)(bytes / line), cfg->capacity);
	if (rc)
		goto err_index;
	c->ix.n_valid = &dev->st.lru_lines_valid;
	c->ix.n_dirty = &dev->st.lru_lines_dirty;
	chm_ctr_set(&dev->st.lru_lines_total, c->ix.nlines);
	rc = -ENOMEM;
	c->base = dev->pool.base;
	c->ios_per_line = chm_map_max_ios(cfg, line);
	c->batch_lines = (unsigned)(BATCH_BYTES / line);
	if (c->batch_lines > FILL_BATCH_LINES)
		c->batch_lines = FILL_BATCH_LINES;
	if (c->batch_lines > c->ix.nlines)
		c->batch_lines = c->ix.nlines;
	if (!c->batch_lines)
		c->batch_lines = 1;
	c->wb_max = c->batch_lines < WB_BATCH_LINES ? c->batch_lines : WB_BATCH_LINES;

	c->wb_lines = calloc(c->wb_max, sizeof(*c->wb_lines));
	c->wb_nios = calloc(c->wb_max, sizeof(*c->wb_nios));
	c->wb_ios = calloc((size_t)c->wb_max * c->ios_per_line, sizeof(*c->wb_ios));
	c->wb_ptrs = calloc((size_t)c->wb_max * c->ios_per_line, sizeof(*c->wb_ptrs));
	if (!c->wb_lines || !c->wb_nios || !c->wb_ios || !c->wb_ptrs)
		goto err_wb;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	rc = -pthread_cond_init(&c->wb_cond, &ca);
	pthread_condattr_destroy(&ca);
	if (rc)
		goto err_wb;
	dev->lru = c;
	if (cfg->clock == CHM_CLOCK_VIRTUAL)
		return 0;
	rc = -pthread_create(&c->thread, NULL, wb_main, c);
	if (rc)
		goto err_cond;
	pthread_setname_np(c->thread, "chm-lru-wb");
	c->thread_started = true;
	return 0;

err_cond:
	dev->lru = NULL;
	pthread_cond_destroy(&c->wb_cond);
err_wb:
	free(c->wb_ptrs);
	free(c->wb_ios);
	free(c->wb_nios);
	free(c->wb_lines);
	chm_lru_index_fini(&c->ix);
err_index:
	free(c);
	return rc;
}

/* Stops the write-back thread and writes back every dirty line. */
static void cache_stop(struct chm_dev *dev)
{
	struct chm_lru *c = dev->lru;

	pthread_mutex_lock(&dev->lock);
	c->stop = true;
	pthread_cond_signal(&c->wb_cond);
	pthread_mutex_unlock(&dev->lock);
	if (c->thread_started)
		pthread_join(c->thread, NULL);

	/* best effort: every dirty line once more, a few tries on errors */
	pthread_mutex_lock(&dev->lock);
	for (int tries = 0; tries < WRITE_RETRIES;) {
		unsigned nios;
		uint64_t done;
		unsigned n = wb_collect(c, &nios, &done);
		if (!n)
			break;
		if (wb_run(c, n, nios, done))
			tries++;
	}
	/* dirty lines left now are dropped: counted for chm_dev_lost */
	uint64_t dirty = chm_ctr_get(c->ix.n_dirty);
	if (dirty)
		chm_dev_note_lost(dev, dirty, dirty * c->ix.line);
	pthread_mutex_unlock(&dev->lock);
}

static void cache_free(struct chm_dev *dev)
{
	struct chm_lru *c = dev->lru;

	dev->lru = NULL;
	while (c->scratch) {
		struct lru_scratch *sc = c->scratch;
		c->scratch = sc->next;
		scratch_free(sc);
	}
	pthread_cond_destroy(&c->wb_cond);
	free(c->wb_ptrs);
	free(c->wb_ios);
	free(c->wb_nios);
	free(c->wb_lines);
	chm_lru_index_fini(&c->ix);
	free(c);
}

/* ---- prefetch hints filled through the cache ---- */

static unsigned lru_fill_start(struct chm_dev *dev, struct chm_slot *s)
{
	(void)dev;
	/* one job for a filler thread, which reads through the cache */
	memset(&s->ios[0], 0, sizeof(s->ios[0]));
	s->ios[0].len = (uint32_t)s->fill_len;
	return 1;
}

/* Fills slot s through the cache (lock not held): the hint's lines come
 * in from the SSD; the host link is left to the wait. */
static void fill_slot(struct chm_dev *dev, struct chm_slot *s)
{
	uint64_t done = 0;
	int rc = access_range(dev, s->addr, s->buf + (s->addr - s->fill_start), NULL, s->len, false,
	                      true, &done);
	s->ios[0].res = rc < 0 ? rc : (int32_t)s->ios[0].len;
	s->ios[0].model_done_ns = done;
	chm_staging_fill_io_done(&s->ios[0]);
}

static int lru_fill_submit(struct chm_dev *dev, struct chm_slot *s)
{
	struct chm_lru *c = dev->lru;
	if (dev->cfg.clock == CHM_CLOCK_VIRTUAL) {
		/* inline, in call order, so a replay is the same every run */
		fill_slot(dev, s);
		return 0;
	}
	pthread_mutex_lock(&dev->lock);
	c->lq[(c->lq_head + c->lq_len) % dev->nslots] = (uint32_t)(s - dev->slots);
	c->lq_len++;
	pthread_cond_signal(&c->lq_cond);
	pthread_mutex_unlock(&dev->lock);
	return 0;
}

static void lru_fill_end(struct chm_dev *dev, struct chm_slot *s)
{
	(void)dev;
	(void)s; /* the cache counted its own I/O */
}

static void *filler_main(void *arg)
{
	struct chm_dev *dev = arg;
	struct chm_lru *c = dev->lru;
	pthread_mutex_lock(&dev->lock);
	for (;;) {
		while (!c->lq_len && !c->lq_stop)
			pthread_cond_wait(&c->lq_cond, &dev->lock);
		if (!c->lq_len)
			break; /* stopping and drained */
		struct chm_slot *s = &dev->slots[c->lq[c->lq_head]];
		c->lq_head = (c->lq_head + 1) % dev->nslots;
		c->lq_len--;
		pthread_mutex_unlock(&dev->lock);
		fill_slot(dev, s);
		pthread_mutex_lock(&dev->lock);
	}
	pthread_mutex_unlock(&dev->lock);
	return NULL;
}

/* Drains the fill queue and stops the filler threads. */
static void fillers_stop(struct chm_dev *dev)
{
	struct chm_lru *c = dev->lru;
	pthread_mutex_lock(&dev->lock);
	c->lq_stop = true;
	pthread_cond_broadcast(&c->lq_cond);
	pthread_mutex_unlock(&dev->lock);
	for (unsigned i = 0; i < c->lq_nthreads; i++)
		pthread_join(c->lq_threads[i], NULL);
	c->lq_nthreads = 0;
}

static void hints_free(struct chm_lru *c)
{
	free(c->lq);
	c->lq = NULL;
	if (c->view_mem)
		munmap(c->view_mem, c->view_mem_bytes);
	c->view_mem = NULL;
}

static int lru_init(struct chm_dev *dev)
{
	int rc = cache_init(dev);
	if (rc)
		return rc;
	struct chm_lru *c = dev->lru;
	c->view_mem_bytes = chm_staging_mem_bytes(&dev->cfg);
	c->view_mem = mmap(NULL, c->view_mem_bytes, PROT_READ | PROT_WRITE,
	                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (c->view_mem == MAP_FAILED) {
		c->view_mem = NULL;
		rc = -ENOMEM;
		goto err_view;
	}
	c->lq = calloc(dev->cfg.slot_count ? dev->cfg.slot_count : 1, sizeof(*c->lq));
	if (!c->lq) {
		rc = -ENOMEM;
		goto err_view;
	}
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->lq_cond, &ca);
	pthread_condattr_destroy(&ca);
	rc = chm_staging_init(dev, c->view_mem);
	if (rc)
		goto err_staging;
	unsigned want = dev->nslots < 4 ? dev->nslots : 4;
	for (; c->lq_nthreads < want; c->lq_nthreads++) {
		if (pthread_create(&c->lq_threads[c->lq_nthreads], NULL, filler_main, dev)) {
			rc = -ENOMEM;
			goto err_threads;
		}
	}
	return 0;

err_threads:
	fillers_stop(dev);
	chm_staging_fini(dev);
err_staging:
	pthread_cond_destroy(&c->lq_cond);
err_view:
	hints_free(c);
	cache_stop(dev);
	cache_free(dev);
	return rc;
}

static void lru_stop(struct chm_dev *dev)
{
	fillers_stop(dev);
	cache_stop(dev);
}

static void lru_fini(struct chm_dev *dev)
{
	struct chm_lru *c = dev->lru;
	chm_staging_fini(dev);
	pthread_cond_destroy(&c->lq_cond);
	hints_free(c);
	cache_free(dev);
}

const struct chm_mode_ops chm_mode_lru_ops = {
        .name = "lru",
        .uses_pool = true,
        .staging = true,
        .init = lru_init,
        .cancel = chm_staging_cancel_all,
        .stop = lru_stop,
        .fini = lru_fini,
        .read = chm_lru_read,
        .write = chm_lru_write,
        .flush = chm_lru_flush,
        .stats = lru_stats,
        .fill_start = lru_fill_start,
        .fill_submit = lru_fill_submit,
        .fill_end = lru_fill_end,
};
