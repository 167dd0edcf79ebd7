/* mode_direct.h - direct mode's SSD read, shared with prefetch mode's misses
 * (mode_direct.c). */
#ifndef CHM_MODE_DIRECT_H
#define CHM_MODE_DIRECT_H

#include <stdint.h>

struct chm_dev;

/* Reads [addr, addr+len) (any alignment, checked against the capacity) from
 * the SSD through a bounce buffer, the write buffer's data on top (read your
 * writes), and paces the caller. Blocks; no lock held. Returns 0 or -errno. */
int chm_direct_read(struct chm_dev *dev, uint64_t addr, void *buf, uint64_t len);

#endif /* CHM_MODE_DIRECT_H */
