/*
 * chm.h - the contract of the chm CXL-hybrid-memory device emulator.
 *
 * A chm device is a byte-addressable address space [0, capacity) backed by SSD
 * targets (files or block devices, striped) with a small internal DRAM in
 * front of it. In prefetch mode the DRAM is a staging window driven by the
 * issue-wait-release API plus an isolated write buffer; in lru mode it is one
 * transparent LRU cache (the baseline); in direct mode there is no DRAM.
 *
 * Conventions (every call):
 *   - Every fallible call returns int: >= 0 on success, -errno on failure.
 *     errno is never used to pass errors back.
 *   - Error vocabulary: -EINVAL bad argument, -ENOENT no such object/option,
 *     -EAGAIN queue full, -ENOSPC no space left, -EBUSY in use, -ETIMEDOUT,
 *     -EIO backing I/O, -ESTALE stale handle, -ECANCELED device closing,
 *     -ENOMEM host memory, -EOPNOTSUPP feature missing on this host.
 *   - Thread safety: every call on a chm_dev is thread-safe, except that no
 *     call may start on a device after chm_dev_close() has begun.
 *     One completion thread per io_uring ring (or per pread worker) runs
 *     inside the device; callbacks never run in caller threads.
 *   - Memory: the caller owns every buffer it passes; the device owns its DRAM
 *     pool. A chm_view points into the pool and is valid from a successful
 *     chm_prefetch_wait() until chm_prefetch_release() of that handle.
 *
 * The region between CFFI_BEGIN and CFFI_END is parsed by cffi verbatim, so
 * it holds only declarations cffi understands (no expressions in #defines).
 */
#ifndef CHM_H
#define CHM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CFFI_BEGIN */

#define CHM_VERSION_MAJOR 0
#define CHM_VERSION_MINOR 1
#define CHM_VERSION_PATCH 0

#define CHM_MAX_TARGETS 16
#define CHM_PATH_MAX 1024
#define CHM_HIST_BUCKETS 32
#define CHM_ERRMSG_MAX 256

/* Direct I/O granularity: writes must be aligned to it in address and
 * length. (Staging fills are widened to 4096-byte boundaries internally.) */
#define CHM_IO_ALIGN 512

/* chm_write_object() return value when the write buffer is full: the object
 * was NOT admitted and nothing changed. Distinct from 0 (admitted). */
#define CHM_WRITE_SKIPPED 1

typedef struct chm_dev chm_dev;

/* An opaque prefetch token: device tag, generation and request index. A
 * released, foreign or never-issued handle is rejected, never reused: a
 * request record whose generation would wrap is retired instead (after at
 * least 2^47 prefetches of the device, see chm_prefetch_object's -ENOSPC). */
typedef uint64_t chm_handle;

enum chm_backend_kind {
	CHM_BACKEND_URING = 0, /* io_uring, O_DIRECT, registered buffers, fixed files */
	CHM_BACKEND_PREAD = 1, /* pread/pwrite worker threads, O_DIRECT */
	CHM_BACKEND_GHOST = 2, /* no data; completions at modeled times */
};

enum chm_mode {
	CHM_MODE_PREFETCH = 0, /* staging window + isolated write buffer */
	CHM_MODE_LRU = 1,      /* transparent LRU cache (baseline) */
	CHM_MODE_DIRECT = 2,   /* no DRAM: every access goes to the SSD */
};

enum chm_pool_kind {
	CHM_POOL_ANON = 0,    /* anonymous memory, transparent huge pages advised */
	CHM_POOL_HUGETLB = 1, /* MAP_HUGETLB (needs vm.nr_hugepages) */
	CHM_POOL_MEMFD = 2,   /* memfd, shareable with clients of a daemon */
	CHM_POOL_FILE = 3,    /* mmap of pool_path (a file or a devdax device) */
};

enum chm_clock_kind {
	CHM_CLOCK_REAL = 0,    /* completions paced in wall-clock time */
	CHM_CLOCK_VIRTUAL = 1, /* simulated clock (ghost backend only) */
};

/* The device's internal state machines, by kind, for chm_state_name(). The
 * states themselves are the core's (csrc/states.h); fw_spec/staging.yaml,
 * wbuf.yaml and lru.yaml name and number them. */
enum chm_state_kind {
	CHM_STATE_SLOT = 0,     /* a staging slot */
	CHM_STATE_WBUF = 1,     /* a write-buffer entry */
	CHM_STATE_LINE = 2,     /* an LRU line */
	CHM_STATE_RESIDENT = 3, /* a resident-region entry */
};

/* chm_prefetch_object() flags. */
enum chm_prefetch_flags {
	CHM_PF_NOQUEUE = 1, /* fail with -EAGAIN instead of queueing */
	CHM_PF_RETAIN = 2,  /* prefetch mode with a resident region: keep the
	                     * object in device DRAM after release (see
	                     * chm_resident_evict); elsewhere no effect */
};

/* Timing model parameters; units are in the names. All-zero = no pacing. */
struct chm_timing {
	uint64_t ssd_read_lat_ns;  /* per-I/O read latency of one channel */
	uint64_t ssd_write_lat_ns; /* per-I/O program latency of one channel */
	uint64_t ssd_read_bw_bps;  /* aggregate read bandwidth, bytes/s */
	uint64_t ssd_write_bw_bps; /* aggregate write bandwidth, bytes/s */
	uint32_t ssd_channels;     /* internal parallelism */
	uint32_t reserved0;
	uint64_t dram_bw_bps; /* device DRAM bandwidth, bytes/s */
	uint64_t link_bw_bps; /* host link bandwidth, bytes/s */
	uint64_t link_lat_ns; /* host link latency per transfer */
};

/* Device configuration. Fill with chm_config_init(), then set fields
 * directly or by name with chm_config_set(). */
struct chm_config {
	uint64_t capacity;             /* address-space bytes, multiple of stripe_unit */
	uint32_t n_targets;            /* 1..CHM_MAX_TARGETS backing targets */
	uint32_t create;               /* 1: create missing / extend short files */
	char targets[16][1024];        /* backing paths (files or block devices) */
	uint64_t stripe_unit;          /* striping unit, multiple of 4096 */
	int32_t backend;               /* enum chm_backend_kind */
	int32_t mode;                  /* enum chm_mode */
	uint32_t queue_depth;          /* backend I/Os in flight */
	uint32_t sqpoll;               /* 1: IORING_SETUP_SQPOLL */
	uint64_t max_io;               /* largest single backend I/O, bytes */
	uint64_t dram_bytes;           /* internal DRAM: staging + write buffer */
	uint64_t wbuf_bytes;           /* write buffer share of dram_bytes */
	int32_t pool_kind;             /* enum chm_pool_kind */
	int32_t numa_node;             /* -1: no binding; else mbind to this node */
	char pool_path[1024];          /* CHM_POOL_FILE: file or devdax path */
	uint64_t slot_bytes;           /* largest staged object, 512..1G */
	uint32_t slot_count;           /* staging depth; 0 = derive from DRAM */
	uint32_t refill_queue;         /* bounded refill queue length */
	uint64_t lru_line_bytes;       /* LRU mode line size */
	int32_t clock;                 /* enum chm_clock_kind */
	uint32_t flush_high_water_pct; /* wbuf fill that forces flushing */
	struct chm_timing timing;      /* zero = no pacing */
	uint64_t object_bytes;         /* size of the caller's objects; 0 = not given */
	uint64_t resident_bytes;       /* prefetch mode: share of dram_bytes kept for
	                                * resident objects, apart from the window */
	uint32_t time_dilation;        /* clock=real: 1..1000000; the device runs its
	                                * timing model this many times slower than
	                                * modeled (see "the device clock") */
};

/* Description of one configuration option (see chm_config_option()). */
struct chm_option_info {
	const char *name;
	const char *type; /* "size", "uint", "int", "str", "enum", "path" */
	const char *defval;
	const char *help;
};

/* A staged object in device DRAM. */
struct chm_view {
	const void *data;     /* first byte of the object */
	uint64_t len;         /* object length */
	uint64_t dev_addr;    /* device address of data[0] */
	uint64_t pool_offset; /* offset of data[0] in the DRAM pool; UINT64_MAX
	                       * for lru-mode views (host copies) */
};

/* Device counters. A snapshot, consistent under the device lock. */
struct chm_stats {
	/* prefetch */
	uint64_t prefetch_issued;
	uint64_t prefetch_queued;    /* issued while no slot was free */
	uint64_t prefetch_completed; /* fills that reached READY */
	uint64_t prefetch_failed;    /* fills that reached FAILED */
	uint64_t prefetch_released;
	uint64_t prefetch_cancelled; /* queued or in flight at close/release */
	uint64_t prefetch_rejected;  /* -EAGAIN: refill queue full */
	/* reads */
	uint64_t read_hits;       /* chm_read served from DRAM */
	uint64_t read_misses;     /* chm_read that went to the SSD */
	uint64_t bytes_read_ssd;  /* all SSD reads (fills, misses, LRU fills) */
	uint64_t bytes_from_dram; /* bytes served from DRAM to the host */
	uint64_t bytes_written_ssd;
	/* staging window */
	uint32_t slots_total;
	uint32_t slots_free;
	uint32_t slots_filling;
	uint32_t slots_ready;
	uint32_t slots_held; /* HELD, and DRAINING: released, a hit still copying */
	uint32_t slots_failed;
	uint32_t queue_len;
	uint32_t queue_cap;
	uint64_t slot_bytes;
	uint64_t window_bytes;
	/* refill latency, device time (issue to the later of the I/O and the
	 * model's completion): bucket i counts fills of [2^i, 2^(i+1))
	 * microseconds; bucket 0 also counts fills under 1 us */
	uint64_t refill_lat_hist[32];
	uint64_t refill_lat_count;
	uint64_t refill_lat_sum_ns;
	/* write buffer */
	uint64_t wr_admitted;
	uint64_t wr_skipped;
	uint64_t wr_admitted_bytes;
	uint64_t wr_skipped_bytes;
	uint64_t wr_flushed_bytes;
	uint64_t flush_batches;
	uint64_t read_wait_flush_ns; /* device ns of reads that overlapped a flush batch or
	                              * write-back I/O (model completion in virtual time) */
	uint64_t wbuf_used_bytes;
	uint64_t wbuf_bytes;
	/* lru mode */
	uint64_t lru_hits;
	uint64_t lru_misses;
	uint64_t lru_refills; /* line evicted earlier, fetched again */
	uint64_t lru_dirty_evictions;
	uint64_t lru_writeback_bytes;
	uint64_t lru_lines_total;
	uint64_t lru_lines_valid;
	uint64_t lru_lines_dirty;
	/* resident region (prefetch mode, resident_bytes > 0) */
	uint64_t resident_hits;        /* prefetches served by a resident entry */
	uint64_t resident_misses;      /* prefetches no resident entry covered */
	uint64_t resident_retained;    /* released objects kept as resident */
	uint64_t resident_evictions;   /* entries dropped for room or by chm_resident_evict */
	uint64_t resident_skipped;     /* retains refused: slot out of date, or every entry held */
	uint64_t resident_invalidated; /* entries a write dropped or made STALE */
	uint32_t resident_entries_total;
	uint32_t resident_entries_used; /* RESIDENT, HELD or STALE */
	/* timing */
	uint64_t clock_now_ns;   /* device clock (virtual, or monotonic / time_dilation) */
	uint64_t pacing_late;    /* completions later than the model */
	uint64_t pacing_late_ns; /* total lateness of the host vs model, device ns */
	/* what was actually obtained */
	uint64_t pool_bytes;
	int32_t pool_kind;
	int32_t pool_numa_node;  /* -1 when not bound */
	uint32_t pool_hugepages; /* 1 when backed by huge pages */
	int32_t backend;
	int32_t mode;
	/* staging window, again: slots still behind the write buffer (S18),
	 * counted in slots_ready or slots_held; no hits, wait waits, until 0 */
	uint32_t slots_catching_up;
	uint32_t reserved1;
	/* device ns prefetches waited in the refill queue for a slot (issue to
	 * fill start), summed; prefetch_queued counts them */
	uint64_t refill_queue_wait_ns;
};

/* Returns the library version as MAJOR*10000 + MINOR*100 + PATCH. */
int chm_version(void);

/* Returns a static English string for a -errno value returned by chm. */
const char *chm_strerror(int err);

/* Returns the name of state value of machine kind (enum chm_state_kind): the
 * fw_spec name in lowercase ("free", "writing_back", ...), a static string;
 * NULL when kind or value names no state. Never blocks; thread-safe. */
const char *chm_state_name(int kind, int value);

/* Why the most recent failing chm call of this thread failed, in one line
 * naming the call, the argument and the rule, e.g. "write: addr 0x7b is not
 * a multiple of 512 (CHM_IO_ALIGN)", when that call returned err (a -errno
 * value) and its failure site gave a reason; "" otherwise. Every call that
 * returns int clears the thread's detail on entry, and a detail is
 * returned only for the error code it was set with, so a reason from an
 * earlier call is never attached to a later error. Batched calls leave no
 * detail for their elements. The string is thread-local and valid until the
 * thread's next chm call. Never blocks, never fails. */
const char *chm_last_error_detail(int err);

/* The file the most recent failing chm call of this thread was about (a
 * backing target, the pool file), when that call returned err and its
 * failure site named one; "" otherwise. Same lifetime and rules as
 * chm_last_error_detail(). Never blocks, never fails. */
const char *chm_last_error_path(int err);

/* The public enumerations chm_enum_name() and chm_enum_value() know (the
 * internal state machines' names come from chm_state_name()). */
enum chm_enum_kind {
	CHM_ENUM_BACKEND = 0, /* enum chm_backend_kind */
	CHM_ENUM_MODE = 1,    /* enum chm_mode */
	CHM_ENUM_POOL = 2,    /* enum chm_pool_kind */
	CHM_ENUM_CLOCK = 3,   /* enum chm_clock_kind */
	CHM_ENUM_FAULT = 4,   /* enum chm_fault_kind */
};

/* The lowercase name of value in enumeration kind (chm_enum_name(
 * CHM_ENUM_MODE, CHM_MODE_LRU) is "lru"), the name the option parser
 * accepts; NULL for an unknown kind or value. Every kind's values are 0, 1,
 * 2, ..., so a binding lists a kind by asking for 0, 1, ... until NULL.
 * Static strings; never blocks; thread-safe. */
const char *chm_enum_name(int kind, int value);

/* The value of name (case-insensitive) in enumeration kind. Returns the
 * value (>= 0), -ENOENT for an unknown name, -EINVAL for an unknown kind or
 * a NULL name. */
int chm_enum_value(int kind, const char *name);

/* ---- configuration (non-blocking, touch only *cfg, thread-safe per cfg) ---- */

/* Fills *cfg with defaults. Returns 0, or -EINVAL when cfg is NULL. */
int chm_config_init(struct chm_config *cfg);

/* Sets option `key` from its text form `value` (sizes accept K/M/G/T/P
 * suffixes and a fraction that makes whole bytes, enums their names,
 * "targets" a comma-separated list; integers are decimal or 0x-hex, with no
 * whitespace, no sign but the '-' of a signed option, no leading zero). The
 * reason names the option and quotes the value. On failure
 * writes a one-line reason into err (if non-NULL). Returns 0, -ENOENT for an
 * unknown key, -EINVAL for a bad value. */
int chm_config_set(struct chm_config *cfg, const char *key, const char *value, char *err,
                   size_t errlen);

/* Reads option `key` of *cfg back in the text form chm_config_set() takes:
 * sizes and integers in decimal, enums by name, "targets" comma-separated,
 * "timing" the name of the preset its fields equal or "custom". Writes the
 * NUL-terminated text into out. Returns its length, -ENOENT for an unknown
 * key, -ENOSPC when outlen bytes do not hold it, -EINVAL for NULL arguments.
 * Touches only *out. */
int chm_config_get(const struct chm_config *cfg, const char *key, char *out, size_t outlen);

/* Parses a byte size in the grammar of every size option: digits with an
 * optional fraction (at most 19 significant digits), then an optional unit
 * K, M, G, T or P (binary multiples, any case), optionally followed by B or
 * iB, or a plain B; the result a whole number of bytes below 2^64. Nothing
 * else: no whitespace, sign, exponent or 0x. Returns 0 and the size in *out,
 * or -EINVAL (the reason in chm_last_error_detail). */
int chm_parse_size(const char *s, uint64_t *out);

/* Checks a whole configuration. Returns 0 or -EINVAL with a one-line reason
 * in err (if non-NULL). chm_dev_open() runs the same check. */
int chm_config_validate(const struct chm_config *cfg, char *err, size_t errlen);

/* Describes option number idx (0-based). Returns 0, or -ENOENT past the end.
 * The strings are static. */
int chm_config_option(unsigned idx, struct chm_option_info *out);

/* Loads a named timing preset ("none", "gen5-tlc-200g", "fpga-cxlhm").
 * Returns 0, -ENOENT for an unknown name, -EINVAL for NULL arguments. */
int chm_timing_preset(const char *name, struct chm_timing *out);

/* ---- device lifecycle ---- */

/* Opens a device: validates cfg, opens the backing targets, allocates the
 * DRAM pool, starts completion threads. Blocks for setup only. A missing
 * regular-file target is created (mode 0600, sparse) and one shorter than
 * its share of capacity extended only with cfg->create; a failed open
 * removes the files it created and truncates back the ones it extended, and
 * touches no other. On success *out owns everything; cfg is copied.
 * Returns 0, -EINVAL (bad config, reason via chm_config_validate; two
 * targets that are the same file or device; a pool=file pool_path that is a
 * target, or backs a loop-device target), -ENOENT (target missing without
 * create), -ENOSPC (target smaller than needed, without create for a file),
 * -ENOMEM (pool), -EOPNOTSUPP (backend or pool kind unavailable on this
 * host, no O_DIRECT on the target's filesystem, logical blocks above
 * 4 KiB), -EBUSY (a block device in use), or another -errno from
 * open/mmap/io_uring_queue_init. */
int chm_dev_open(const struct chm_config *cfg, chm_dev **out);

/* chm_dev_open that also writes a one-line reason into err (if non-NULL) on
 * failure, naming the option, path and sizes involved. Returns the same
 * values: 0, -EINVAL, -ENOENT, -ENOSPC, -ENOMEM, -EOPNOTSUPP, -EBUSY, or
 * another -errno from open/mmap/io_uring_queue_init. */
int chm_dev_open_err(const struct chm_config *cfg, chm_dev **out, char *err, size_t errlen);

/* Closes a device. Outstanding prefetches are cancelled: blocked waiters
 * return -ECANCELED, in-flight I/O is drained, the write buffer is flushed
 * (best effort: failed batches are retried for up to 10 s; writes that are
 * still not durable then are lost, as on a power cut without chm_flush(),
 * and counted: chm_dev_shutdown then chm_dev_lost reports them).
 * Blocks until all of that is done and every target is closed (the io_uring
 * ring's registered files included), so a block-device target can be opened
 * exclusively (or detached) as soon as close returns. Accepts NULL. No other
 * call on dev may start once close has begun (release included). */
void chm_dev_close(chm_dev *dev);

/* The first half of chm_dev_close: cancels and drains exactly as close does
 * and frees the pool, targets and threads, but keeps dev itself valid, so a
 * multi-threaded host can stop the device while its own threads may still
 * be about to call it: from then on every call returns -ECANCELED (stats
 * and config still answer). Idempotent. chm_dev_close frees dev. */
void chm_dev_shutdown(chm_dev *dev);

/* What the final flush of chm_dev_shutdown could not make durable and
 * dropped: *writes gets the writes (write-buffer objects, or dirty lru
 * lines) and *bytes their bytes; 0 and 0 before shutdown and when all
 * written data reached the backing. Call it between chm_dev_shutdown and
 * chm_dev_close to report a lossy close. Returns 0 when nothing was lost,
 * else -ENOSPC (the backing's filesystem was full or over quota) or -EIO
 * (another backing failure), with a detail naming the target, the bytes
 * and the writes; -EINVAL for a NULL argument. Never waits for I/O. */
int chm_dev_lost(chm_dev *dev, uint64_t *writes, uint64_t *bytes);

/* Copies the device's effective configuration. Returns 0 or -EINVAL. */
int chm_dev_config(chm_dev *dev, struct chm_config *out);

/* Returns the DRAM pool's memfd (CHM_POOL_MEMFD) for sharing, -ENOENT for
 * other pool kinds, -EINVAL for a NULL device, -ECANCELED after
 * chm_dev_shutdown. The fd stays owned by the device. */
int chm_dev_pool_fd(chm_dev *dev);

/* ---- prefetch: issue - wait - release ---- */

/* Issues a prefetch of [addr, addr+len) into the staging window, in the
 * default session (see chm_session_open). Never blocks: takes a free slot
 * and starts the fill, or queues on the bounded refill queue (round-robin
 * across sessions, FIFO within one; started as slots are released). Returns 0 and a
 * handle in *h; -EINVAL (len 0, len > slot_bytes, range beyond capacity,
 * unknown flags, NULL h), -EAGAIN (refill queue full, or no free slot with
 * CHM_PF_NOQUEUE, or no free request record while some are in use),
 * -ENOSPC (every request record is retired: the device has issued all the
 * handles it can without reusing one, 2^47 or more; reopen it),
 * -EOPNOTSUPP (direct mode), -ECANCELED (closing). In lru
 * mode the call is a hint that fills cache lines and pins nothing. */
int chm_prefetch_object(chm_dev *dev, uint64_t addr, uint64_t len, uint32_t flags, chm_handle *h);

/* Waits up to timeout_ns (0: poll; UINT64_MAX: forever) for the object to be
 * staged; on success fills *view and the slot becomes HELD. Waiting again on
 * a HELD handle returns the same view. The view holds every write admitted
 * before wait and is a snapshot: writes admitted later do not change it (in
 * prefetch mode they reach chm_read and the next prefetch; in lru mode the
 * view is a host copy, all old or all new bytes of each write). Returns 0, -ETIMEDOUT, -EIO (the fill
 * failed; release the handle), -ESTALE (released), -EINVAL (foreign or
 * malformed handle, a handle of another session than the default one, NULL
 * view), -ECANCELED (device closing). */
int chm_prefetch_wait(chm_dev *dev, chm_handle h, uint64_t timeout_ns, struct chm_view *view);

/* Releases a handle in any state (in lru mode too, where the view is a host
 * copy read through the cache; -ECANCELED after chm_dev_shutdown, which
 * released everything): a queued request is dropped, a filling
 * slot is freed when its I/O completes, a READY/HELD/FAILED slot is freed
 * now (and the next queued request starts). The handle and any view from it
 * are dead afterwards. Returns 0, -ESTALE (already released or never
 * issued), -EINVAL (foreign or malformed, or another session's than the
 * default one), -ECANCELED (shut down). */
int chm_prefetch_release(chm_dev *dev, chm_handle h);

/* Batched calls take at most this many elements. */
#define CHM_BATCH_MAX 4096

/* Batched chm_prefetch_object: n objects in one call, the device lock taken
 * once and the fills started after it is dropped; never blocks. results[i]
 * is exactly what chm_prefetch_object would return for element i at its
 * turn, in order (0, -EINVAL, -EAGAIN, -ENOSPC, -EOPNOTSUPP, -ECANCELED), and
 * handles[i] is set where it is 0. Returns the number of elements issued, or
 * -EINVAL (NULL dev or array, n > CHM_BATCH_MAX) with none attempted. */
int chm_prefetch_objects(chm_dev *dev, uint32_t n, const uint64_t *addrs, const uint64_t *lens,
                         uint32_t flags, chm_handle *handles, int32_t *results);

/* Batched chm_prefetch_release: results[i] is what chm_prefetch_release
 * would return for handles[i] (0, -ESTALE, -EINVAL, -ECANCELED), in order.
 * Returns the number released, or -EINVAL (NULL dev or array,
 * n > CHM_BATCH_MAX) with none attempted. */
int chm_prefetch_release_many(chm_dev *dev, uint32_t n, const chm_handle *handles,
                              int32_t *results);

/* ---- resident objects (prefetch mode, resident_bytes > 0) ---- */

/* A prefetch with CHM_PF_RETAIN keeps its object in the resident region of
 * device DRAM when it is released up to date: a later prefetch of a range it
 * covers is a resident hit, staged at once without a slot or SSD I/O (its
 * view points into the region until that handle is released). Writes keep
 * entries coherent: an entry without views is dropped, one with views keeps
 * them as snapshots and is dropped when the last is released. When the
 * region is full, a retain evicts the least recently hit entry without
 * views; which objects to retain is the caller's policy.
 * chm_resident_evict drops every entry overlapping [addr, addr+len) now
 * (one with views when they are released). Never blocks. Returns the
 * number of entries taken out of service (0 in a device without a region),
 * -EINVAL (NULL dev, len 0, range beyond capacity), -ECANCELED (closing). */
int chm_resident_evict(chm_dev *dev, uint64_t addr, uint64_t len);

/* Batched chm_write_object: results[i] is 0 (admitted), CHM_WRITE_SKIPPED or
 * the -errno chm_write_object gives element i, in order; never blocks in
 * prefetch mode. Returns the number admitted, or -EINVAL (NULL dev or array,
 * n > CHM_BATCH_MAX) with none attempted. */
int chm_write_objects(chm_dev *dev, uint32_t n, const uint64_t *addrs, const void *const *bufs,
                      const uint64_t *lens, uint32_t flags, int32_t *results);

/* ---- sessions: scopes of handles, with a quota ---- */

/* An open session of a device: an opaque token (device tag, generation and
 * index), like a handle. A session scopes handles: a handle is used (waited
 * on, released) only through the session that issued it. Every device has a
 * default session, CHM_SESSION_DEFAULT, which is never closed and has no
 * quota but the device's own; the calls without a session argument
 * (chm_prefetch_object, _wait, _release and their batched forms) use it.
 * The refill queue is served round-robin across the sessions that have
 * queued requests (one grant each in turn, FIFO within a session), so a
 * session that floods the queue delays another's queued request by at most
 * one grant per session. */
typedef uint64_t chm_session;

#define CHM_SESSION_DEFAULT 0
/* Sessions a device can have open at once, besides the default one. */
#define CHM_SESSION_MAX 1024

/* Opens a session that may hold at most quota request entries at once
 * (slots, including a released one whose fill is still in flight, plus
 * queued requests); a prefetch over it fails -EAGAIN. quota is 1..2^32-1;
 * one at least slot_count + refill_queue never limits. Never blocks.
 * Returns 0 and the session in *out; -EINVAL (NULL dev or out, quota 0),
 * -ENOSPC (CHM_SESSION_MAX sessions open), -EOPNOTSUPP (direct mode: no
 * staging window), -ECANCELED (closing). */
int chm_session_open(chm_dev *dev, uint32_t quota, chm_session *out);

/* Closes a session: releases every handle it holds, as chm_prefetch_release
 * would (queued requests are dropped, a filling slot is freed when its I/O
 * completes, views from its handles are dead), wakes their waiters (they
 * return -ESTALE) and invalidates the session. Never blocks on I/O. Works
 * while the device is closing. Returns the number of handles released (>= 0),
 * -ESTALE (already closed), -EINVAL (CHM_SESSION_DEFAULT, foreign or
 * malformed), -ECANCELED (after chm_dev_shutdown, which released
 * everything). */
int chm_session_close(chm_dev *dev, chm_session s);

/* chm_prefetch_objects in session s: the handles belong to s, and each
 * element also fails -EAGAIN when s holds its quota. Returns the number
 * issued, or -EINVAL (NULL dev or array, n > CHM_BATCH_MAX, s foreign or
 * malformed), -ESTALE (s closed) with none attempted. */
int chm_session_prefetch(chm_dev *dev, chm_session s, uint32_t n, const uint64_t *addrs,
                         const uint64_t *lens, uint32_t flags, chm_handle *handles,
                         int32_t *results);

/* chm_prefetch_wait in session s. A live handle of another session is
 * -EINVAL. Returns 0, -ETIMEDOUT, -EIO, -ESTALE (released, or s closed),
 * -EINVAL (another session's, foreign or malformed handle or session, NULL
 * view), -ECANCELED. */
int chm_session_wait(chm_dev *dev, chm_session s, chm_handle h, uint64_t timeout_ns,
                     struct chm_view *view);

/* chm_prefetch_release_many in session s: results[i] is 0, -ESTALE, -EINVAL
 * (another session's live handle: not released) or -ECANCELED. Returns the
 * number released, or -EINVAL (NULL dev or array, n > CHM_BATCH_MAX, s
 * foreign or malformed), -ESTALE (s closed) with none attempted. */
int chm_session_release(chm_dev *dev, chm_session s, uint32_t n, const chm_handle *handles,
                        int32_t *results);

/* ---- data path ---- */

/* Reads [addr, addr+len) into buf. Served from DRAM when a READY/HELD staged
 * object covers the whole range and no write landed on a held one since its
 * wait (a hit; in lru mode, per line), otherwise
 * read from the SSD without touching the staging window (a miss). Sees
 * admitted-but-unflushed writes. Blocks until the data is in buf. Returns 0,
 * -EINVAL (range, NULL buf), -EIO, -ECANCELED. */
int chm_read(chm_dev *dev, uint64_t addr, void *buf, uint64_t len);

/* Offers [addr, addr+len) from buf for writing. Never blocks on the SSD: in
 * prefetch mode the object is copied into the write buffer (returns 0,
 * "admitted") or, when the buffer lacks contiguous space, not written at
 * all (returns CHM_WRITE_SKIPPED); an object larger than wbuf_bytes can
 * never be admitted and is -EINVAL (a configuration error, not a skip).
 * lru mode dirties cache lines; direct mode writes through (blocking).
 * Every mode pays the host link for the bytes (fw_spec/cost.yaml); the
 * caller is paced to it. addr and len must be multiples of CHM_IO_ALIGN (or
 * of a block-device target's logical block size, when that is larger). On
 * the ghost backend no payload is ever read: buf may be NULL, and the call
 * costs O(1) host time whatever len is.
 * Returns 0, CHM_WRITE_SKIPPED, -EINVAL, -EIO (direct), -ECANCELED. */
int chm_write_object(chm_dev *dev, uint64_t addr, const void *buf, uint64_t len, uint32_t flags);

/* Durability barrier: returns once every write admitted before the call is
 * on the backing targets and synced (fdatasync or equivalent). Blocks up to
 * timeout_ns (UINT64_MAX: forever). Returns 0, -ETIMEDOUT, -EIO (a flush
 * failed; the affected writes are not durable), -ECANCELED. */
int chm_flush(chm_dev *dev, uint64_t timeout_ns);

/* Copies the counters without taking any lock: it never waits behind a
 * copy, a fill or a flush. Each field is exact (a value it really had), but
 * the fields are read one after another while the device runs, so they are
 * not mutually consistent at one instant; once the device is quiet (no call
 * in progress, no fill or flush in flight) they all agree. Returns 0 or
 * -EINVAL. */
int chm_stats(chm_dev *dev, struct chm_stats *out);

/* ---- the device clock ---- */

/* Time dilation (clock=real, option time_dilation = D, default 1): a host
 * whose backing disk is slower than the modeled SSD cannot be paced to the
 * model (pacing only slows the host down; stats' pacing_late counts the
 * completions it missed). With D > 1 the device runs its whole timing model
 * D times slower: the real device clock reads (wall ns since open) / D, and
 * a completion modeled at device time t is slept to wall t0 + t * D. Every
 * time the device reports is device time: chm_clock_ns, stats'
 * clock_now_ns, refill_lat_*, read_wait_flush_ns, pacing_late_ns. So a
 * bandwidth measured as device bytes / device time is the modeled one, and
 * pacing_late says whether the host kept up with the dilated device. The
 * timeouts a caller passes (wait, flush) and CHM_FAULT_SLOW's delay on a
 * real backend stay host wall time. clock=virtual has no wall clock to
 * dilate: D > 1 with it is -EINVAL. */

/* Reads the device clock into *now_ns: simulated ns (clock=virtual) or
 * monotonic ns since open divided by time_dilation (clock=real), as stats'
 * clock_now_ns. Never
 * blocks and takes no lock, so it costs a load, not a stats snapshot.
 * Answers after chm_dev_shutdown too. Returns 0 or -EINVAL (NULL). */
int chm_clock_ns(chm_dev *dev, uint64_t *now_ns);

/* Virtual time only: moves the simulated clock forward to t_ns (never back:
 * a t_ns in the past leaves it as it is), running the write buffer's
 * flusher up to it, so a replay can place arrivals at their timestamps and
 * let idle gaps drain the buffer. Never blocks on I/O; thread-safe. Returns
 * 0, -EINVAL (NULL dev), -EOPNOTSUPP (clock=real: wall time cannot be
 * advanced), -ECANCELED (closing). */
int chm_advance_clock(chm_dev *dev, uint64_t t_ns);

/* ---- fault injection (tests) ---- */

enum chm_fault_kind {
	CHM_FAULT_NONE = 0,
	CHM_FAULT_EIO_READ = 1,   /* the nth backend read (from now) fails -EIO */
	CHM_FAULT_EIO_WRITE = 2,  /* the nth backend write fails -EIO */
	CHM_FAULT_SHORT_READ = 3, /* the nth backend read returns half its bytes */
	CHM_FAULT_SLOW = 4,       /* every backend I/O completes arg ns late */
};

/* Arms a fault in the backend, replacing any armed one. nth counts backend
 * I/Os of the matching direction from 1, at completion; syncs do not count;
 * the fault fires once. CHM_FAULT_SLOW ignores nth and delays every
 * completion by arg ns until replaced (CHM_FAULT_NONE disarms). A short read
 * fails its request with -EIO. Returns 0 or -EINVAL (kind, nth 0). */
int chm_fault_inject(chm_dev *dev, int kind, uint64_t nth, uint64_t arg);

/* CFFI_END */

#ifdef __cplusplus
}
#endif

#endif /* CHM_H */
