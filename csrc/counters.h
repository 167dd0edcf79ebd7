/* counters.h - statistics counters that are read without the device lock.
 *
 * Every field of dev->st (and every gauge chm_stats() reports) is written
 * through these helpers: relaxed atomic adds, subtracts and stores, so that
 * chm_stats() can read them with relaxed atomic loads while writers hold
 * dev->lock (or no lock at all). Relaxed is enough: a counter is exact on
 * its own; no reader orders other memory through it. Calls nothing.
 */
#ifndef CHM_COUNTERS_H
#define CHM_COUNTERS_H

#include <stddef.h>
#include <stdint.h>

static inline void chm_ctr_add(uint64_t *c, uint64_t v)
{
	__atomic_fetch_add(c, v, __ATOMIC_RELAXED);
}

static inline void chm_ctr_sub(uint64_t *c, uint64_t v)
{
	__atomic_fetch_sub(c, v, __ATOMIC_RELAXED);
}

static inline void chm_ctr_set(uint64_t *c, uint64_t v)
{
	__atomic_store_n(c, v, __ATOMIC_RELAXED);
}

static inline uint64_t chm_ctr_get(const uint64_t *c)
{
	return __atomic_load_n(c, __ATOMIC_RELAXED);
}

static inline void chm_ctr32_add(uint32_t *c, int32_t v)
{
	__atomic_fetch_add(c, (uint32_t)v, __ATOMIC_RELAXED);
}

static inline uint32_t chm_ctr32_get(const uint32_t *c)
{
	return __atomic_load_n(c, __ATOMIC_RELAXED);
}

/* Copies n bytes (a multiple of 8, both 8-aligned) of counters word by word
 * with relaxed atomic loads: every aligned field of up to 8 bytes comes out
 * as one value some writer stored; fields are not one atomic cut. */
static inline void chm_ctr_copy(void *dst, const void *src, size_t n)
{
	uint64_t *d = dst;
	const uint64_t *s = src;
	for (size_t i = 0; i < n / 8; i++)
		d[i] = __atomic_load_n(&s[i], __ATOMIC_RELAXED);
}

#endif /* CHM_COUNTERS_H */
