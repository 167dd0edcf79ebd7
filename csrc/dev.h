/* dev.h - internal structures of the chm device model (not part of the API). */
#ifndef CHM_DEV_H
#define CHM_DEV_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
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
struct chm_mode_ops;

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
	bool hugepages; /* backed by huge pages (hugetlb, or THP advised); atomic
	                 * loads: a background pre-fault settles it */
	/* background pre-fault of an anon pool (chm_pool_create_bg) */
	pthread_t prefault_thread;
	bool prefault_started;
	_Atomic bool prefault_stop;
};
/* Maps bytes of DRAM of cfg->pool_kind, binds to cfg->numa_node, and
 * pre-faults it before returning. */
int chm_pool_create(struct chm_pool *pool, const struct chm_config *cfg, uint64_t bytes);
/* As chm_pool_create, but an anon pool is pre-faulted by a thread of its own
 * after the call returns (the device open: see pool.c); other kinds as
 * chm_pool_create. chm_pool_destroy stops and joins that thread. */
int chm_pool_create_bg(struct chm_pool *pool, const struct chm_config *cfg, uint64_t bytes);
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
/* Charges n transfers ios[0..n) submitted at now_ns, in array order, as n
 * chm_timing_ssd() calls under one lock: sets each io's model_done_ns and
 * returns the latest (now_ns for none). */
uint64_t chm_timing_ssd_ios(struct chm_timing_state *ts, uint64_t now_ns, struct chm_io *ios,
                            unsigned n);
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
	CHM_REQ_SLOTTED = 2,
	CHM_REQ_RESIDENT = 3 /* a resident hit: slot is the entry's index */
};

/* chm_req.flags */
#define CHM_REQF_RETAIN 1u /* CHM_PF_RETAIN: offer the slot to the resident region */
#define CHM_REQF_PAID 2u   /* a resident hit's view crossed the host link */

struct chm_req {
	uint64_t gen;  /* bumped on every free; part of the handle; 1.. */
	uint8_t state; /* enum chm_req_state */
	uint8_t flags; /* CHM_REQF_* */
	uint16_t sess; /* index of the session that issued it (live records) */
	int32_t slot;  /* CHM_REQ_SLOTTED: slot index; CHM_REQ_RESIDENT: entry */
	uint64_t addr, len;
	uint64_t issue_ns;   /* device clock at issue */
	uint32_t qnext;      /* its session's FIFO link (index+1, 0 = end) */
	uint32_t fnext;      /* free-list link (index+1, 0 = end) */
	pthread_cond_t cond; /* its waiters sleep here: a completion, release,
	                      * unpin or close wakes only them */
};

struct chm_slot {
	struct chm_dev *dev;
	int state;           /* enum chm_slot_state */
	int32_t req;         /* owning request, -1 if orphaned (released) */
	int32_t sess;        /* session charged for it (session.c), -1 none */
	uint64_t addr, len;  /* object */
	uint64_t fill_start; /* aligned device address of buf[0] */
	uint64_t fill_len;   /* aligned bytes being read */
	char *buf;           /* slot memory in the pool */
	uint32_t ios_pending;
	uint64_t fill_bytes;      /* bytes the fill's ios moved so far */
	int32_t err;              /* first -errno of the fill */
	uint64_t issue_ns;        /* device clock when the fill started */
	uint64_t ready_ns;        /* modeled completion (device clock) */
	struct chm_read_tok rtok; /* write-buffer read token of the fill */
	uint64_t link_credit;     /* host-link bytes already paid by wait */
	uint32_t pins;            /* copies from (hits) or into (a catch-up) the
	                           * slot without the lock */
	bool behind;              /* READY, and a write was admitted over it (or
	                           * over its fill): no hits, no wait, until the
	                           * last pin re-overlays the log (holding a log
	                           * pin until then) */
	bool repatch;             /* behind, and written over again during the
	                           * catch-up: it lays the log over once more */
	bool stale;               /* HELD, and a write was admitted over the fill
	                           * range since wait: the view is a snapshot
	                           * (W11), chm_read goes around the slot */
	struct chm_io *ios;       /* preallocated, max_ios entries */
	struct chm_io **ioptrs;   /* pointers to ios, for backend submit */
	uint32_t nios;            /* ios of the current fill */
	uint32_t fnext;           /* free-list link (index+1, 0 = end) */
	uint32_t start_next;      /* list of fills started under the lock (index+1) */
	uint32_t catch_next;      /* list of slots a writer catches up (index+1) */
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

	const struct chm_mode_ops *mode; /* prefetch | lru | direct (mode.h) */

	/* call gate (gate.c): atomics, and gate_lock for the close that waits */
	_Atomic bool closing;
	_Atomic uint32_t active_calls; /* callers inside the device */
	pthread_mutex_t gate_lock;
	pthread_cond_t idle_cond; /* signalled when active_calls drops to 0 */

	/* the latest failed backing write or sync (iomap.c, atomics): its
	 * -errno and target, so a failed flush says what happened */
	_Atomic int backing_err;
	_Atomic int backing_err_target;
	/* what the final flush of chm_dev_shutdown could not make durable and
	 * dropped (chm_dev_lost); written once, during shutdown */
	uint64_t lost_writes, lost_bytes;
	int lost_err; /* -errno of the last failed backing write then */
	int lost_target;

	pthread_mutex_t lock; /* guards everything below */
	pthread_cond_t cond;  /* lru and write-buffer waits: a line, a flush */
	bool shut;            /* chm_dev_shutdown finished: resources freed */

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
	uint32_t q_len;           /* queued requests, all sessions */
	uint32_t slots_behind;    /* slots with behind set (stats.slots_catching_up) */
	/* sessions (session.c): index 0 is the default session */
	struct chm_sess *sess;
	uint32_t nsess;     /* CHM_SESSION_MAX + 1 */
	uint32_t sess_free; /* free-list head (index+1) */
	uint32_t rr_head;   /* ring of sessions with queued requests (index+1) */
	uint32_t rr_tail;
	uint32_t max_ios;         /* ios per slot */
	uint64_t slot_stride;     /* bytes of slot memory per slot (derived) */
	int32_t staged_head;      /* first READY/HELD slot, -1 = none */
	struct chm_resident *res; /* resident region (resident.c), NULL = none */

	/* timing */
	struct chm_timing_state timing;
	uint64_t vclock_ns; /* CHM_CLOCK_VIRTUAL device clock (atomics, clock.c) */
	/* virtual time: run by the clock whenever it moves, lock held (the
	 * mode's work at simulated times: the write buffer's flusher); NULL
	 * for none. A hook, so the clock never calls up into a mode. */
	void (*clock_hook)(struct chm_dev *dev);
	uint64_t t0_ns; /* CLOCK_MONOTONIC at open */

	struct chm_faults faults;
	struct chm_stats st; /* counters (pool/slot fields filled on copy) */

	/* write buffer and LRU mode state */
	struct chm_wbuf *wbuf;
	struct chm_lru *lru;
};

/* Config (config.c) */
int chm_config_derive(struct chm_config *cfg); /* fills 0 = derive fields */

/* True when writes carry no payload and lines, the write buffer and bounce
 * buffers hold no data: the ghost backend. */
static inline bool chm_nodata(const struct chm_dev *dev)
{
	return dev->cfg.backend == CHM_BACKEND_GHOST;
}

/* Counts writes (and their bytes) that the final flush of shutdown could not
 * make durable and drops, with the last backing error then (chm_dev_lost).
 * Lock held. */
static inline void chm_dev_note_lost(struct chm_dev *dev, uint64_t writes, uint64_t bytes)
{
	dev->lost_writes += writes;
	dev->lost_bytes += bytes;
	int e = atomic_load(&dev->backing_err);
	if (e) {
		dev->lost_err = e;
		dev->lost_target = atomic_load(&dev->backing_err_target);
	}
}

/* Ghost I/O without a buffer (backend_ghost.c): len bytes in pieces of at
 * most piece bytes, op CHM_IO_READ or CHM_IO_WRITE, with the injected faults
 * a ghost submit would apply to each piece. *delay_ns gets the largest
 * fault delay. Returns 0 or the first piece's -errno (-EIO for short). */
int chm_ghost_pieces(struct chm_dev *dev, int op, uint64_t len, uint64_t piece, uint64_t *delay_ns);

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
