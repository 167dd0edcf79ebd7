/* lru.h - lru mode (lru.c): the whole pool as one transparent cache of
 * lru_line lines; its mode table is chm_mode_lru_ops (mode.h). */
#ifndef CHM_LRU_H
#define CHM_LRU_H

#include <stdint.h>

struct chm_dev;

/* Whole accesses through the cache. Take dev->lock themselves; block. */
int chm_lru_read(struct chm_dev *dev, uint64_t addr, void *buf, uint64_t len);
int chm_lru_write(struct chm_dev *dev, uint64_t addr, const void *buf, uint64_t len);
int chm_lru_flush(struct chm_dev *dev, uint64_t timeout_ns); /* dirty -> durable */

#endif /* CHM_LRU_H */
