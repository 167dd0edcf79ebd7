/* dev.h - internal structures of the chm device model (not part of the API). */
#ifndef CHM_DEV_H
#define CHM_DEV_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "chm.h"

_Static_assert(CHM_MAX_TARGETS == 16, "chm_config.targets is [16][1024]");
_Static_assert(CHM_PATH_MAX == 1024, "chm_config paths are 1024 bytes");
_Static_assert(CHM_HIST_BUCKETS == 32, "refill_lat_hist is [32]");

#define CHM_ALIGN_UP(x, a) (((x) + (a)-1) / (a) * (a))
#define CHM_ALIGN_DOWN(x, a) ((x) / (a) * (a))
/* Staged fills are widened to this so the first and last sector are whole. */
#define CHM_FILL_ALIGN 4096u

struct chm_dev;
struct chm_backend;

/* ---------------------------------------------------------------------------
 * Backend I/O: one contiguous transfer to one target.
 */
enum chm_io_op {
	CHM_IO_READ = 0,
	CHM_IO_WRITE = 1,
	CHM_IO_SYNC = 2
};

struct chm_io {
	int op;                          /* enum chm_io_op */
	int target;                      /* index into the device's targets */
	uint64_t offset;                 /* byte offset within the target (aligned) */
	void *buf;                       /* aligned, inside the pool or a bounce buffer */
	uint32_t len;                    /* aligned */
	int32_t res;                     /* set by the backend: bytes or -errno */
	uint64_t model_done_ns;          /* modeled completion time on the device clock */
	void (*done)(struct chm_io *io); /* called once, from a backend thread
					  * or (ghost) from the submitter */
	void *ctx;
	struct chm_io *next; /* backend-private queue link */
};

/* A backend is a table of named hooks (like fio's ioengine_ops). */
struct chm_backend_ops {
	const char *name;
	/* Set up for dev (targets already open in dev->fds). Registers the
	 * pool as fixed buffers where it can. Returns 0 or -errno. */
	int (*init)(struct chm_dev *dev, struct chm_backend **out);
	/* Queues n I/Os; never blocks on the device. Each io gets exactly one
	 * done() call, possibly before submit returns (ghost). Returns 0 or
	 * -errno (then no done() call is made for any of them). */
	int (*submit)(struct chm_backend *be, struct chm_io **ios, unsigned n);
	/* Drains every submitted I/O (done() runs for each), stops threads,
	 * frees the backend. */
	void (*shutdown)(struct chm_backend *be);
};

/* What every backend refuses (-EINVAL, no done() call): a missing done, a
 * bad op or target, a length of 0 or above max_io, anything not aligned to
 * CHM_IO_ALIGN. Catches mapping bugs in the core on every backend. */
static inline int chm_io_check(const struct chm_dev *dev, const struct chm_io *io);

extern const struct chm_backend_ops chm_backend_uring_ops;
extern const struct chm_backend_ops chm_backend_pread_ops;
extern const struct chm_backend_ops chm_backend_ghost_ops;

/* Faults, applied by the backends through chm_fault_apply(). */
struct chm_faults {
	pthread_mutex_t lock;
	int kind;
	uint64_t nth; /* remaining count until the fault fires */
	uint64_t arg;
};
/* Called by a backend before completing io (after the data moved). May
 * rewrite io->res. Returns extra delay in ns to apply (CHM_FAULT_SLOW). */
uint64_t chm_fault_apply(struct chm_dev *dev, struct chm_io *io);

/* ---------------------------------------------------------------------------
 * DRAM pool (pool.c)
 */
struct chm_pool {
	void *base;
	uint64_t bytes;
	int kind;       /* enum chm_pool_kind */
	int fd;         /* memfd or file fd, -1 otherwise */
	int numa_node;  /* bound node or -1 */
	bool hugepages; /* backed by huge pages (hugetlb, or THP advised) */
};
/* Maps bytes of DRAM of cfg->pool_kind, binds to cfg->numa_node. */
int chm_pool_create(struct chm_pool *pool, const struct chm_config *cfg, uint64_t bytes);
void chm_pool_destroy(struct chm_pool *pool);

/* ---------------------------------------------------------------------------
 * Timing model (timing.c). Pure functions over a state.
 */
struct chm_timing_state {
	pthread_mutex_t lock;      /* the model's own lock: guards the fields below,
	                            * never held while taking dev->lock */
	struct chm_timing p;       /* parameters */
	bool enabled;              /* derived: any parameter non-zero */
	uint64_t chan_free_ns[64]; /* per-channel busy-until on the device clock */
	uint64_t link_free_ns;     /* device->host link direction busy-until */
	uint64_t link_in_free_ns;  /* host->device link direction busy-until */
	uint64_t ssd_read_free_ns, ssd_write_free_ns; /* bandwidth pipes */
};
/* The functions below take ts->lock themselves: callers may hold dev->lock
 * or not. */
void chm_timing_init(struct chm_timing_state *ts, const struct chm_timing *p);
/* Returns when an SSD transfer of len bytes submitted at now_ns completes. */
uint64_t chm_timing_ssd(struct chm_timing_state *ts, int write, uint64_t now_ns, uint64_t len);
/* Returns when an SSD transfer of a whole object of len bytes, split into
 * pieces of at most piece bytes all submitted at now_ns, completes (the
 * latest piece). The one SSD cost of an object in every mode. */
uint64_t chm_timing_ssd_object(struct chm_timing_state *ts, int write, uint64_t now_ns,
                               uint64_t len, uint64_t piece);
/* Returns when a DRAM->host transfer of len bytes started at now_ns completes. */
uint64_t chm_timing_host(struct chm_timing_state *ts, uint64_t now_ns, uint64_t len);
/* Returns when a host->DRAM transfer of len bytes started at now_ns completes
 * (the link's other direction: a write does not hold up reads' transfers). */
uint64_t chm_timing_host_in(struct chm_timing_state *ts, uint64_t now_ns, uint64_t len);
/* When the SSD read pipe is busy until (read pressure, virtual flusher). */
uint64_t chm_timing_read_busy_until(struct chm_timing_state *ts);

/* Write-buffer read token (see chm_wbuf_read_begin). */
struct chm_read_tok {
	uint64_t epoch;
	uint64_t batch_mark;
	uint64_t begin_ns;
};

/* ---------------------------------------------------------------------------
 * Staging window (staging.c)
 */
enum chm_req_state {
	CHM_REQ_FREE = 0,
	CHM_REQ_QUEUED = 1,
	CHM_REQ_SLOTTED = 2
};

struct chm_req {
	uint64_t gen;  /* bumped on every free; part of the handle; 1.. */
	uint8_t state; /* enum chm_req_state */
	int32_t slot;  /* CHM_REQ_SLOTTED: slot index */
	uint64_t addr, len;
	uint64_t issue_ns;   /* device clock at issue */
	uint32_t qnext;      /* FIFO link (index+1, 0 = end) */
	uint32_t fnext;      /* free-list link (index+1, 0 = end) */
	pthread_cond_t cond; /* its waiters sleep here: a completion, release,
	                      * unpin or close wakes only them */
};

struct chm_slot {
	struct chm_dev *dev;
	int state;           /* enum chm_slot_state */
	int32_t req;         /* owning request, -1 if orphaned (released) */
	uint64_t addr, len;  /* object */
	uint64_t fill_start; /* aligned device address of buf[0] */
	uint64_t fill_len;   /* aligned bytes being read */
	char *buf;           /* slot memory in the pool */
	uint32_t ios_pending;
	int32_t err;              /* first -errno of the fill */
	uint64_t issue_ns;        /* device clock when the fill started */
	uint64_t ready_ns;        /* modeled completion (device clock) */
	struct chm_read_tok rtok; /* write-buffer read token of the fill */
	uint64_t link_credit;     /* host-link bytes already paid by wait */
	uint32_t pins;            /* hits copying from the slot without the lock */
	bool behind;              /* READY and pinned when a write was admitted
	                           * over it: the last unpin re-overlays the log
	                           * (holding a log pin until then); no hits */
	bool stale;               /* HELD, and a write was admitted over the fill
	                           * range since wait: the view is a snapshot
	                           * (W11), chm_read goes around the slot */
	struct chm_io *ios;       /* preallocated, max_ios entries */
	struct chm_io **ioptrs;   /* pointers to ios, for backend submit */
	uint32_t nios;            /* ios of the current fill */
	uint32_t fnext;           /* free-list link (index+1, 0 = end) */
	uint32_t start_next;      /* list of fills started under the lock (index+1) */
	int32_t sprev, snext;     /* list of READY/HELD slots (index, -1 = end) */
};

/* ---------------------------------------------------------------------------
 * The device
 */
struct chm_dev {
	struct chm_config cfg;
	uint16_t tag;             /* random, nonzero: handles carry it */
	int fds[CHM_MAX_TARGETS]; /* O_DIRECT fds */
	uint64_t target_bytes[CHM_MAX_TARGETS];
	uint32_t write_align; /* CHM_IO_ALIGN, or a target's larger logical block */

	struct chm_pool pool;
	const struct chm_backend_ops *be_ops;
	struct chm_backend *be;

	pthread_mutex_t lock; /* guards everything below */
	pthread_cond_t cond;  /* broadcast on any completion / release */
	bool closing;
	bool shut;                /* chm_dev_shutdown finished: resources freed */
	uint32_t active_calls;    /* callers inside the device */
	pthread_cond_t idle_cond; /* signalled when active_calls drops to 0 */

	/* staging window */
	struct chm_slot *slots;
	uint32_t nslots;
	uint32_t slot_free_head; /* index+1 */
	uint32_t slot_count_by_state[6];
	struct chm_req *reqs;
	uint32_t nreqs;           /* nslots + refill_queue */
	uint32_t req_free_head;   /* index+1 */
	uint32_t req_free_tail;   /* index+1: the free list is a FIFO */
	uint32_t reqs_live;       /* QUEUED or SLOTTED records */
	uint32_t reqs_retired;    /* FREE records off the free list for good */
	uint32_t handle_idx_bits; /* derived: bit length of nreqs */
	uint64_t handle_gen_last; /* derived: largest generation a handle carries */
	uint32_t q_head, q_tail;  /* refill FIFO (index+1) */
	uint32_t q_len;
	uint32_t max_ios;     /* ios per slot */
	uint64_t staging_off; /* offset of the window in the pool */
	uint64_t slot_stride; /* bytes of pool per slot (derived) */
	int32_t staged_head;  /* first READY/HELD slot, -1 = none */
	/* lru mode: slots are host view buffers filled through the cache by
	 * filler threads (prefetch is a hint there; nothing is pinned) */
	void *view_mem;
	uint64_t view_mem_bytes;
	uint32_t *lq; /* ring of slot indices to fill */
	uint32_t lq_head, lq_len;
	pthread_cond_t lq_cond;
	pthread_t lq_threads[4];
	unsigned lq_nthreads;
	bool lq_stop;

	/* timing */
	struct chm_timing_state timing;
	uint64_t vclock_ns; /* CHM_CLOCK_VIRTUAL device clock (atomic, vclock.c) */
	uint64_t t0_ns;     /* CLOCK_MONOTONIC at open */

	struct chm_faults faults;
	struct chm_stats st; /* counters (pool/slot fields filled on copy) */

	/* write buffer and LRU mode state */
	struct chm_wbuf *wbuf;
	struct chm_lru *lru;
};

/* Device clock: virtual time or monotonic ns since open. Lock held or not. */
uint64_t chm_now_ns(struct chm_dev *dev);

/* The virtual clock (vclock.c): read, and raise to t (never lowered;
 * returns the clock after). Lock held or not; lock-free. */
uint64_t chm_vclock_now(const struct chm_dev *dev);
uint64_t chm_vclock_raise(struct chm_dev *dev, uint64_t t);

/* Ghost I/O without a buffer (backend_ghost.c): len bytes in pieces of at
 * most piece bytes, op CHM_IO_READ or CHM_IO_WRITE, with the injected faults
 * a ghost submit would apply to each piece. *delay_ns gets the largest
 * fault delay. Returns 0 or the first piece's -errno (-EIO for short). */
int chm_ghost_pieces(struct chm_dev *dev, int op, uint64_t len, uint64_t piece, uint64_t *delay_ns);

/* True when writes carry no payload and lines, the write buffer and bounce
 * buffers hold no data: the ghost backend. */
static inline bool chm_nodata(const struct chm_dev *dev)
{
	return dev->cfg.backend == CHM_BACKEND_GHOST;
}
uint64_t chm_mono_ns(void);

/* API entry/exit accounting so close can wait for callers. Lock held.
 * chm_enter returns -ECANCELED when the device is closing. */
int chm_enter(struct chm_dev *dev);
void chm_leave(struct chm_dev *dev);

/* Paces the caller to the modeled completion time done_ns: advances the
 * virtual clock, or sleeps (lock held; it is dropped while sleeping) until
 * the monotonic device clock reaches it. Counts host lateness. */
void chm_pace(struct chm_dev *dev, uint64_t done_ns);

/* Address mapping: splits [addr, addr+len) (aligned) into ios for target
 * stripes, each at most cfg.max_io. Returns the number of ios written, or
 * -EINVAL if more than max would be needed. */
int chm_map_ios(struct chm_dev *dev, int op, uint64_t addr, uint64_t len, char *buf,
                struct chm_io *ios, unsigned max);
/* Upper bound of ios for a transfer of len bytes. */
unsigned chm_map_max_ios(const struct chm_config *cfg, uint64_t len);

/* Synchronous SSD transfer through the backend (blocks the caller). buf must
 * be CHM_IO_ALIGN-aligned, addr/len too. The transfer is charged to the
 * timing model once, as one object, at submission; *done_ns (may be NULL) gets the latest modeled
 * completion, fault delays included. Returns 0 or -errno. */
int chm_ssd_rw_sync(struct chm_dev *dev, int op, uint64_t addr, void *buf, uint64_t len,
                    uint64_t *done_ns);
/* The same transfer with the model charged by the caller: each I/O carries
 * model_ns as its modeled completion (fault delays added on top). */
int chm_ssd_rw_data(struct chm_dev *dev, int op, uint64_t addr, void *buf, uint64_t len,
                    uint64_t model_ns, uint64_t *done_ns);

/* fdatasync of every target through the backend (blocks). */
int chm_ssd_sync_all(struct chm_dev *dev);

/* Staging window (staging.c); callers hold dev->lock unless noted. */
int chm_staging_init(struct chm_dev *dev);
void chm_staging_fini(struct chm_dev *dev);
/* Copies [addr,addr+len) from a READY/HELD slot covering it that is not
 * stale or behind; true on hit. Called with the lock held; the slot is
 * pinned and the copy made with the lock dropped, so the caller looks at
 * device state again afterwards. Fills started by the unpin (a DRAINING slot
 * freed) are chained on *start for chm_staging_submit.
 * *link_bytes is what the copy costs on the host link: a view handed out by
 * wait already paid for one pass over its object, which reads consume. */
bool chm_staging_read_hit(struct chm_dev *dev, uint64_t addr, void *buf, uint64_t len,
                          uint64_t *link_bytes, uint32_t *start);
/* Test-only hooks (tests/c/test_regress_handle_wrap.c), not part of the API:
 * set the generation of FREE request record idx to gen (1..last), so a test
 * reaches the last generation without 2^47 prefetches; returns 0, -EINVAL or
 * -EBUSY (record in use). Take dev->lock themselves. */
int chm_staging_test_set_generation(struct chm_dev *dev, uint32_t idx, uint64_t gen);
uint64_t chm_staging_last_generation(struct chm_dev *dev);
/* Stops lru-mode filler threads after draining their queue (close). */
void chm_staging_stop_fillers(struct chm_dev *dev);
/* Cancels queued requests and wakes every waiter (close). Lock held. */
void chm_staging_cancel_all(struct chm_dev *dev);
/* Submits fills started under the lock; call with the lock NOT held.
 * head is the start list (slot index+1) returned by the locked section. */
void chm_staging_submit(struct chm_dev *dev, uint32_t head);

/* Config (config.c) */
int chm_config_derive(struct chm_config *cfg); /* fills 0 = derive fields */

/* Write buffer (wbuf.c), prefetch mode. The region is the last wbuf_bytes
 * of the pool. Calls without "lock held" take dev->lock themselves. */
int chm_wbuf_init(struct chm_dev *dev);  /* starts the flusher */
void chm_wbuf_fini(struct chm_dev *dev); /* flushes (best effort), stops */
/* Admits (0) or skips (CHM_WRITE_SKIPPED); never waits for the SSD. */
int chm_wbuf_write(struct chm_dev *dev, uint64_t addr, const void *buf, uint64_t len);
int chm_wbuf_flush(struct chm_dev *dev, uint64_t timeout_ns);
/* Virtual time: runs the flusher up to the device clock (completes the
 * batches the model has finished by then, starts those due). Lock held;
 * a no-op without a write buffer or in real time. */
void chm_wbuf_vt_advance(struct chm_dev *dev);
/* Overlays buffered data on [addr,addr+len) in buf, oldest first. Lock held. */
void chm_wbuf_overlay(struct chm_dev *dev, uint64_t addr, void *buf, uint64_t len);
/* Read-side bookkeeping: an SSD read in flight keeps buffered entries that
 * became durable after it started from being reclaimed (it may have read the
 * old bytes and needs the overlay), and tells the flusher reads are busy.
 * Lock held; no-ops when the device has no write buffer. */
void chm_wbuf_read_begin(struct chm_dev *dev, struct chm_read_tok *tok);
void chm_wbuf_read_end(struct chm_dev *dev, const struct chm_read_tok *tok);
/* A log pin keeps every entry from reclaim (a slot that is behind the log
 * needs them for its re-overlay). Lock held. */
void chm_wbuf_pin_log(struct chm_dev *dev);
void chm_wbuf_unpin_log(struct chm_dev *dev);
void chm_wbuf_stats(struct chm_dev *dev, struct chm_stats *out); /* lock held */

/* LRU mode (lru.c): the whole pool is one transparent cache of lru_line
 * lines. Calls take dev->lock themselves unless noted; they block. */
int chm_lru_init(struct chm_dev *dev);  /* starts the write-back thread */
void chm_lru_fini(struct chm_dev *dev); /* writes back dirty lines, stops */
int chm_lru_read(struct chm_dev *dev, uint64_t addr, void *buf, uint64_t len);
int chm_lru_write(struct chm_dev *dev, uint64_t addr, const void *buf, uint64_t len);
/* A prefetch hint's fill: reads through the cache into buf without the host
 * link; in virtual time it does not move the clock and *done_ns gets the
 * modeled completion. */
int chm_lru_fill(struct chm_dev *dev, uint64_t addr, void *buf, uint64_t len, uint64_t *done_ns);
int chm_lru_flush(struct chm_dev *dev, uint64_t timeout_ns);    /* dirty -> durable */
void chm_lru_stats(struct chm_dev *dev, struct chm_stats *out); /* lock held */

static inline int chm_io_check(const struct chm_dev *dev, const struct chm_io *io)
{
	uint32_t ntargets = dev->cfg.n_targets ? dev->cfg.n_targets : 1;
	if (!io->done || io->target < 0 || (uint32_t)io->target >= ntargets)
		return -EINVAL;
	if (io->op == CHM_IO_SYNC)
		return 0;
	if (io->op != CHM_IO_READ && io->op != CHM_IO_WRITE)
		return -EINVAL;
	if (!io->len || io->len > INT32_MAX || (dev->cfg.max_io && io->len > dev->cfg.max_io))
		return -EINVAL;
	if ((io->offset | io->len | (uintptr_t)io->buf) & (CHM_IO_ALIGN - 1))
		return -EINVAL;
	return 0;
}

#endif /* CHM_DEV_H */
