/* iomap.h - address mapping and synchronous SSD transfers (iomap.c). */
#ifndef CHM_IOMAP_H
#define CHM_IOMAP_H

#include <stdint.h>

#include "chm.h"

struct chm_dev;
struct chm_io;

/* Address mapping: splits [addr, addr+len) (aligned) into ios for target
 * stripes, each at most cfg.max_io. Returns the number of ios written, or
 * -EINVAL if more than max would be needed. */
int chm_map_ios(struct chm_dev *dev, int op, uint64_t addr, uint64_t len, char *buf,
                struct chm_io *ios, unsigned max);
/* Upper bound of ios for a transfer of len bytes. */
unsigned chm_map_max_ios(const struct chm_config *cfg, uint64_t len);

/* Submits ios[0, n) to the backend in one go and waits for every one (blocks;
 * no lock held): each io->res ends up bytes or -errno (a refused submission
 * sets them all). ptrs is scratch space for n pointers. *bytes and *done_ns
 * (either may be NULL) get the bytes moved and the latest modeled completion,
 * fault delays included. Returns the first error (-EIO for a short
 * transfer), or 0. */
int chm_ios_run(struct chm_dev *dev, struct chm_io *ios, struct chm_io **ptrs, unsigned n,
                uint64_t *bytes, uint64_t *done_ns);

/* Synchronous SSD transfer through the backend (blocks the caller). buf must
 * be CHM_IO_ALIGN-aligned, addr/len too. The transfer is charged to the
 * timing model once, as one object, at submission; *done_ns (may be NULL)
 * gets the latest modeled completion, fault delays included. Returns 0 or
 * -errno. */
int chm_ssd_rw_sync(struct chm_dev *dev, int op, uint64_t addr, void *buf, uint64_t len,
                    uint64_t *done_ns);
/* The same transfer with the model charged by the caller: each I/O carries
 * model_ns as its modeled completion (fault delays added on top). */
int chm_ssd_rw_data(struct chm_dev *dev, int op, uint64_t addr, void *buf, uint64_t len,
                    uint64_t model_ns, uint64_t *done_ns);

/* The error for a failed write-back or flush (call names the API call):
 * -ENOSPC when the latest failed backing write or sync ran out of space
 * (ENOSPC, EDQUOT), naming the target file and the space left on its
 * filesystem, else -EIO naming the target and the error, or plain -EIO
 * when no backing write failed (an injected fault). Sets the thread's
 * detail and path. */
int chm_backing_error(struct chm_dev *dev, const char *call);

/* fdatasync of every target through the backend (blocks). */
int chm_ssd_sync_all(struct chm_dev *dev);

#endif /* CHM_IOMAP_H */
