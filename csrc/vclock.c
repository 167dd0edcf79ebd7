/* vclock.c - the virtual clock (clock=virtual): a cheap read, explicit
 * advance, and what happens at simulated times.
 *
 * The virtual clock is one 64-bit counter of simulated ns. It only moves
 * forward: a caller paced to a modeled completion raises it, and
 * chm_advance_clock() raises it to a replay's arrival time. It is read and
 * raised with atomics, so chm_clock_ns() takes no lock and never waits
 * behind a copy or a stats snapshot. Raising it under dev->lock also runs
 * the write buffer's virtual flusher up to the new time (wbuf.c), so
 * flushes complete when the modeled SSD says so and idle gaps drain the
 * buffer, identically on every run of the same calls.
 */
#include <errno.h>

#include "dev.h"

uint64_t chm_vclock_now(const struct chm_dev *dev)
{
	return __atomic_load_n(&dev->vclock_ns, __ATOMIC_ACQUIRE);
}

uint64_t chm_vclock_raise(struct chm_dev *dev, uint64_t t)
{
	uint64_t cur = __atomic_load_n(&dev->vclock_ns, __ATOMIC_ACQUIRE);
	/* max() by compare-and-swap: a concurrent raise to a later time wins */
	while (cur < t && !__atomic_compare_exchange_n(&dev->vclock_ns, &cur, t, true,
	                                               __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		;
	return cur < t ? t : cur;
}

int chm_clock_ns(chm_dev *dev, uint64_t *now_ns)
{
	if (!dev || !now_ns)
		return -EINVAL;
	if (dev->cfg.clock == CHM_CLOCK_VIRTUAL)
		*now_ns = chm_vclock_now(dev);
	else
		*now_ns = chm_mono_ns() - dev->t0_ns;
	return 0;
}

int chm_advance_clock(chm_dev *dev, uint64_t t_ns)
{
	if (!dev)
		return -EINVAL;
	if (dev->cfg.clock != CHM_CLOCK_VIRTUAL)
		return -EOPNOTSUPP;
	pthread_mutex_lock(&dev->lock);
	int rc = chm_enter(dev);
	if (!rc) {
		chm_vclock_raise(dev, t_ns);
		chm_wbuf_vt_advance(dev);
		chm_leave(dev);
	}
	pthread_mutex_unlock(&dev->lock);
	return rc;
}
