/* mode.h - the mode table: what a device mode (prefetch, lru, direct) does
 * for each call, as the backends are a table of hooks (fio's ioengine_ops,
 * NVMeVirt's per-namespace proc_io_cmd). device.c validates the arguments
 * of every API call, enters the device and dispatches through dev->mode;
 * the implementations are mode_prefetch.c, lru.c and mode_direct.c. */
#ifndef CHM_MODE_H
#define CHM_MODE_H

#include <stdbool.h>
#include <stdint.h>

#include "chm.h"

struct chm_dev;
struct chm_slot;

struct chm_mode_ops {
	const char *name;
	bool uses_pool; /* the DRAM pool is mapped for it (dram_bytes) */
	bool staging;   /* a staging window serves prefetch, wait and release */

	/* Open, on a running backend: sets up the mode's state and threads.
	 * Returns 0 or -errno, having undone itself. */
	int (*init)(struct chm_dev *dev);
	/* Close, dev->lock held, just after the device was marked closing:
	 * cancels what would otherwise wait (queued prefetches). May be NULL. */
	void (*cancel)(struct chm_dev *dev);
	/* Close, no lock, every caller gone, backend still running: stops the
	 * mode's threads, writes back what it buffers (best effort). */
	void (*stop)(struct chm_dev *dev);
	/* Close, after the backend drained: frees the mode's state. */
	void (*fini)(struct chm_dev *dev);

	/* Data path, inside the device (entered), arguments checked; no lock
	 * held. Contracts as chm_read, chm_write_object and chm_flush. */
	int (*read)(struct chm_dev *dev, uint64_t addr, void *buf, uint64_t len);
	int (*write)(struct chm_dev *dev, uint64_t addr, const void *buf, uint64_t len);
	int (*flush)(struct chm_dev *dev, uint64_t timeout_ns);
	/* Fills the mode's fields of *out. No lock held (chm_stats never waits):
	 * reads only what is kept with atomics (counters.h) and is never freed
	 * before close; most of it lives in dev->st, copied already. */
	void (*stats)(struct chm_dev *dev, struct chm_stats *out);

	/* Staging fills (modes with a staging window, else NULL). fill_start
	 * (lock held) sets up s->ios[0, n) to bring [s->fill_start,
	 * +s->fill_len) into s->buf, charges the model (io->model_done_ns) and
	 * returns n >= 1; fill_submit (no lock) starts them: 0, or -errno and
	 * no done() runs for any; fill_end (lock held) runs once, when the last
	 * of them completed, before the slot changes state. */
	unsigned (*fill_start)(struct chm_dev *dev, struct chm_slot *s);
	int (*fill_submit)(struct chm_dev *dev, struct chm_slot *s);
	void (*fill_end)(struct chm_dev *dev, struct chm_slot *s);
};

extern const struct chm_mode_ops chm_mode_prefetch_ops;
extern const struct chm_mode_ops chm_mode_lru_ops;
extern const struct chm_mode_ops chm_mode_direct_ops;

#endif /* CHM_MODE_H */
