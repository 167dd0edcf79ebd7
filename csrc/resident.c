/* resident.c - the resident region of prefetch mode: entries of slot-stride
 * buffers after the staging window that keep released objects in device
 * DRAM (fw_spec/resident.yaml, invariants R1..R5).
 *
 * An entry enters the region by exchange, not by copy: a retained slot that
 * is up to date when released hands its buffer to an EMPTY (or evicted)
 * entry and takes that entry's buffer back, so the window keeps its slot
 * count and no byte moves. A prefetch that an entry covers is a resident
 * hit: its request record points at the entry (CHM_REQ_RESIDENT), which
 * stays HELD until the last such request is released. Writes over an entry
 * take it out of service: an unheld entry is dropped at once (KV blocks are
 * immutable, so a write over one is rare, and dropping it copies nothing
 * under the lock; the next read refills it with the write-buffer overlay,
 * W10), a held one keeps its bytes for the views (W11) and turns STALE,
 * dropped at its last release.
 * Replacement among unheld entries is least recently used; admission (which
 * prefetches carry CHM_PF_RETAIN) is the caller's policy (chm/kv/residency.py).
 *
 * Locking: dev->lock guards every field; nothing here copies or sleeps, so
 * no call drops it. Calls nothing outside this file.
 */
#include <errno.h>
#include <stdlib.h>

#include "counters.h"
#include "dev.h"
#include "resident.h"
#include "states.h"

struct chm_res_entry {
	int state;           /* enum chm_res_state */
	char *buf;           /* stride bytes of the pool */
	uint64_t fill_start; /* device address of buf[0] */
	uint64_t fill_len;   /* bytes of buf that hold the object's sectors */
	uint32_t holders;    /* live CHM_REQ_RESIDENT requests on it */
	uint64_t last_use;   /* tick of the last retain or hit (LRU) */
};

struct chm_resident {
	struct chm_res_entry *e;
	uint32_t n;
	uint32_t used; /* entries not EMPTY */
	uint64_t tick;
};

static void res_set(struct chm_dev *dev, struct chm_res_entry *e, int to)
{
	if (e->state == CHM_RES_EMPTY) {
		dev->res->used++;
		chm_ctr32_add(&dev->st.resident_entries_used, 1);
	}
	CHM_TRANSITION(chm_res_transitions, e->state, to);
	if (to == CHM_RES_EMPTY) {
		dev->res->used--;
		chm_ctr32_add(&dev->st.resident_entries_used, -1);
	}
}

uint32_t chm_resident_count(const struct chm_config *cfg, uint64_t stride)
{
	if (!stride)
		return 0;
	uint64_t n = cfg->resident_bytes / stride;
	return n > (1u << 20) ? (1u << 20) : (uint32_t)n;
}

int chm_resident_init(struct chm_dev *dev, char *mem, uint32_t count)
{
	dev->res = NULL;
	if (!count)
		return 0;
	struct chm_resident *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->e = calloc(count, sizeof(*r->e));
	if (!r->e) {
		free(r);
		return -ENOMEM;
	}
	r->n = count;
	chm_ctr32_add(&dev->st.resident_entries_total, (int32_t)count); /* read by chm_stats */
	for (uint32_t i = 0; i < count; i++)
		r->e[i].buf = mem + (uint64_t)i * dev->slot_stride;
	dev->res = r;
	return 0;
}

void chm_resident_fini(struct chm_dev *dev)
{
	if (!dev->res)
		return;
	free(dev->res->e);
	free(dev->res);
	dev->res = NULL;
}

static bool covers(const struct chm_res_entry *e, uint64_t addr, uint64_t len)
{
	return addr >= e->fill_start && addr + len <= e->fill_start + e->fill_len;
}

static bool overlaps(const struct chm_res_entry *e, uint64_t addr, uint64_t len)
{
	return addr < e->fill_start + e->fill_len && e->fill_start < addr + len;
}

int32_t chm_resident_hit(struct chm_dev *dev, uint64_t addr, uint64_t len)
{
	struct chm_resident *r = dev->res;
	if (!r)
		return -1;
	for (uint32_t i = 0; i < r->n; i++) {
		struct chm_res_entry *e = &r->e[i];
		if ((e->state == CHM_RES_RESIDENT || e->state == CHM_RES_HELD) &&
		    covers(e, addr, len)) {
			if (e->state == CHM_RES_RESIDENT)
				res_set(dev, e, CHM_RES_HELD); /* hit */
			e->holders++;
			e->last_use = ++r->tick;
			chm_ctr_add(&dev->st.resident_hits, 1);
			return (int32_t)i;
		}
	}
	chm_ctr_add(&dev->st.resident_misses, 1);
	return -1;
}

char *chm_resident_data(struct chm_dev *dev, int32_t ei, uint64_t addr)
{
	struct chm_res_entry *e = &dev->res->e[ei];
	return e->buf + (addr - e->fill_start);
}

void chm_resident_unhold(struct chm_dev *dev, int32_t ei)
{
	struct chm_res_entry *e = &dev->res->e[ei];
	if (--e->holders)
		return;
	res_set(dev, e, e->state == CHM_RES_STALE ? CHM_RES_EMPTY : CHM_RES_RESIDENT);
}

/* An EMPTY entry, else the least recently used unheld one (evicted), else
 * NULL. */
static struct chm_res_entry *res_victim(struct chm_dev *dev)
{
	struct chm_resident *r = dev->res;
	struct chm_res_entry *lru = NULL;
	for (uint32_t i = 0; i < r->n; i++) {
		struct chm_res_entry *e = &r->e[i];
		if (e->state == CHM_RES_EMPTY)
			return e;
		if (e->state == CHM_RES_RESIDENT && (!lru || e->last_use < lru->last_use))
			lru = e;
	}
	if (lru) {
		res_set(dev, lru, CHM_RES_EMPTY); /* evict */
		chm_ctr_add(&dev->st.resident_evictions, 1);
	}
	return lru;
}

void chm_resident_retain(struct chm_dev *dev, struct chm_slot *s)
{
	struct chm_resident *r = dev->res;
	if (!r)
		return;
	/* a held snapshot older than a write, a copy a write could not patch
	 * yet, or a hit still copying from it: its bytes cannot be kept */
	if (s->stale || s->behind || s->pins || s->err) {
		chm_ctr_add(&dev->st.resident_skipped, 1);
		return;
	}
	for (uint32_t i = 0; i < r->n; i++) {
		struct chm_res_entry *e = &r->e[i];
		if ((e->state == CHM_RES_RESIDENT || e->state == CHM_RES_HELD) &&
		    covers(e, s->fill_start, s->fill_len)) {
			e->last_use = ++r->tick; /* already resident (R5: one copy) */
			return;
		}
	}
	struct chm_res_entry *e = res_victim(dev);
	if (!e) {
		chm_ctr_add(&dev->st.resident_skipped, 1);
		return;
	}
	char *spare = e->buf;
	e->buf = s->buf;
	s->buf = spare;
	e->fill_start = s->fill_start;
	e->fill_len = s->fill_len;
	e->holders = 0;
	e->last_use = ++r->tick;
	res_set(dev, e, CHM_RES_RESIDENT); /* retain */
	chm_ctr_add(&dev->st.resident_retained, 1);
}

void chm_resident_patch(struct chm_dev *dev, uint64_t addr, uint64_t len)
{
	struct chm_resident *r = dev->res;
	if (!r)
		return;
	for (uint32_t i = 0; i < r->n; i++) {
		struct chm_res_entry *e = &r->e[i];
		if (!overlaps(e, addr, len))
			continue;
		if (e->state == CHM_RES_RESIDENT) {
			res_set(dev, e, CHM_RES_EMPTY); /* evict: the next read refills */
			chm_ctr_add(&dev->st.resident_invalidated, 1);
		} else if (e->state == CHM_RES_HELD) {
			res_set(dev, e, CHM_RES_STALE); /* write_held */
			chm_ctr_add(&dev->st.resident_invalidated, 1);
		}
	}
}

int chm_resident_evict_range(struct chm_dev *dev, uint64_t addr, uint64_t len)
{
	struct chm_resident *r = dev->res;
	int n = 0;
	for (uint32_t i = 0; r && i < r->n; i++) {
		struct chm_res_entry *e = &r->e[i];
		if (!overlaps(e, addr, len))
			continue;
		if (e->state == CHM_RES_RESIDENT) {
			res_set(dev, e, CHM_RES_EMPTY); /* evict */
			chm_ctr_add(&dev->st.resident_evictions, 1);
			n++;
		} else if (e->state == CHM_RES_HELD) {
			res_set(dev, e, CHM_RES_STALE);
			chm_ctr_add(&dev->st.resident_evictions, 1);
			n++;
		}
	}
	return n;
}
