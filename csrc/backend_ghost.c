/* backend_ghost.c - the virtual-time backend: no data moves, no threads.
 *
 * Every io completes inline, inside submit(), with its full length (0 for a
 * sync); the core's timing model decides when it "happened". Injected faults
 * still apply; a SLOW fault only moves io->model_done_ns.
 *
 * chm_ghost_pieces() is the same without an io or a buffer: the core's
 * payload-less paths (writes with no data, virtual-time flushes, reads that
 * copy nothing) use it so that faults still reach them, at O(pieces) cost
 * whatever the object's size.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "dev.h"

struct ghost_be {
	struct chm_dev *dev;
};

static inline struct ghost_be *to_ghost(struct chm_backend *be)
{
	return (struct ghost_be *)be;
}

static int ghost_init(struct chm_dev *dev, struct chm_backend **out)
{
	struct ghost_be *gb;

	if (!dev || !out || dev->cfg.n_targets > CHM_MAX_TARGETS)
		return -EINVAL;
	gb = calloc(1, sizeof(*gb));
	if (!gb)
		return -ENOMEM;
	gb->dev = dev;
	*out = (struct chm_backend *)gb;
	return 0;
}

static int ghost_submit(struct chm_backend *be, struct chm_io **ios, unsigned n)
{
	struct chm_dev *dev = to_ghost(be)->dev;
	unsigned i;
	int ret;

	for (i = 0; i < n; i++) {
		ret = chm_io_check(dev, ios[i]);
		if (ret)
			return ret;
	}
	for (i = 0; i < n; i++) {
		struct chm_io *io = ios[i];

		io->res = io->op == CHM_IO_SYNC ? 0 : (int32_t)io->len;
		io->model_done_ns += chm_fault_apply(dev, io);
		io->done(io);
	}
	return 0;
}

static void ghost_shutdown(struct chm_backend *be)
{
	free(to_ghost(be));
}

const struct chm_backend_ops chm_backend_ghost_ops = {
        .name = "ghost",
        .init = ghost_init,
        .submit = ghost_submit,
        .shutdown = ghost_shutdown,
};

int chm_ghost_pieces(struct chm_dev *dev, int op, uint64_t len, uint64_t piece, uint64_t *delay_ns)
{
	int err = 0;

	*delay_ns = 0;
	if (!piece)
		piece = len;
	while (len) {
		uint64_t n = len < piece ? len : piece;
		struct chm_io io = {.op = op, .len = (uint32_t)n, .res = (int32_t)n};
		uint64_t d = chm_fault_apply(dev, &io);

		if (d > *delay_ns)
			*delay_ns = d;
		if (!err && io.res < 0)
			err = io.res;
		else if (!err && (uint64_t)io.res != n)
			err = -EIO;
		len -= n;
	}
	return err;
}
