/* resident.h - the resident region (resident.c): device DRAM that keeps
 * objects after their prefetch is released, so a later prefetch of the same
 * object is served from DRAM with no SSD I/O. Prefetch mode only; a budget
 * of its own (cfg.resident_bytes), apart from the staging window, so
 * residency never takes a slot streaming needs. */
#ifndef CHM_RESIDENT_H
#define CHM_RESIDENT_H

#include <stdbool.h>
#include <stdint.h>

#include "chm.h"

struct chm_dev;
struct chm_slot;

/* Entries of the region for cfg (resident_bytes / slot stride); prefetch
 * mode asks (config.c refuses resident_bytes in the other modes). */
uint32_t chm_resident_count(const struct chm_config *cfg, uint64_t stride);
/* Sets up the region's entries over mem (count * stride bytes). Returns 0
 * or -ENOMEM; with count 0 there is no region and every hook is a no-op. */
int chm_resident_init(struct chm_dev *dev, char *mem, uint32_t count);
void chm_resident_fini(struct chm_dev *dev);

/* A prefetch of [addr, addr+len): the index of a RESIDENT or HELD entry
 * covering it, now held once more (R3), or -1 (a miss). Counts the hit or
 * miss. Lock held. */
int32_t chm_resident_hit(struct chm_dev *dev, uint64_t addr, uint64_t len);
/* The view of entry ei for an object at addr. Lock held. */
char *chm_resident_data(struct chm_dev *dev, int32_t ei, uint64_t addr);
/* A request holding entry ei was released (R4). Lock held. */
void chm_resident_unhold(struct chm_dev *dev, int32_t ei);

/* Release of a retained prefetch whose slot s is READY or HELD: when s is
 * up to date (no missed write, no hit copying from it), its buffer becomes
 * a RESIDENT entry and the slot takes the entry's spare buffer in exchange,
 * evicting the least recently used unheld entry if none is EMPTY (R1).
 * The caller then frees s as usual. Lock held. */
void chm_resident_retain(struct chm_dev *dev, struct chm_slot *s);

/* A write of [addr, addr+len) was admitted (R2): unheld entries over it
 * are dropped, held ones keep their bytes (the views are snapshots, W11)
 * and turn STALE: no new hit, dropped at the last release. Lock held. */
void chm_resident_patch(struct chm_dev *dev, uint64_t addr, uint64_t len);

/* chm_resident_evict: drops unheld entries overlapping the range, marks
 * held ones STALE. Returns how many entries it took out of service. Lock
 * held. */
int chm_resident_evict_range(struct chm_dev *dev, uint64_t addr, uint64_t len);

#endif /* CHM_RESIDENT_H */
