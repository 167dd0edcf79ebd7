/* clock.c - the device clock and pacing.
 *
 * The device clock is CLOCK_MONOTONIC ns since open (clock=real) or a
 * virtual clock that only moves when a caller is paced to a modeled
 * completion or advances it (clock=virtual). The virtual clock is one
 * counter read and raised with atomics, so reading it takes no lock; a
 * raise under dev->lock runs the device's clock hook (the mode's work at
 * simulated times, e.g. the write buffer's flusher). Pacing in real time sleeps until the modeled
 * completion; an emulator can only slow the host down, so a completion the
 * host already missed is counted as late instead (pacing_late). With
 * time_dilation D > 1 (clock=real) the device runs D times slower than
 * modeled: its clock reads (wall ns since open) / D and a completion at
 * device time t is slept to wall t0 + t * D, so a host slower than the
 * modeled device can still keep up. The one ns -> timespec conversion of
 * the core lives here. Calls nothing above it.
 */
#include <errno.h>
#include <pthread.h>
#include <time.h>

#include "clock.h"
#include "counters.h"
#include "dev.h"

struct timespec chm_ns_to_timespec(uint64_t ns)
{
	struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
	                      .tv_nsec = (long)(ns % 1000000000ull)};
	return ts;
}

uint64_t chm_mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void chm_sleep_until_ns(uint64_t mono_ns)
{
	struct timespec ts = chm_ns_to_timespec(mono_ns);
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

void chm_sleep_ns(uint64_t ns)
{
	struct timespec ts = chm_ns_to_timespec(ns);
	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

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

uint64_t chm_wall_to_dev_ns(const struct chm_dev *dev, uint64_t wall_ns)
{
	uint32_t d = dev->cfg.time_dilation;
	return d > 1 ? wall_ns / d : wall_ns;
}

uint64_t chm_dev_to_mono_ns(const struct chm_dev *dev, uint64_t dev_ns)
{
	uint32_t d = dev->cfg.time_dilation > 1 ? dev->cfg.time_dilation : 1;
	/* saturate: a time past the end of the monotonic range is "never" */
	if (dev_ns > (UINT64_MAX - dev->t0_ns) / d)
		return UINT64_MAX;
	return dev->t0_ns + dev_ns * d;
}

uint64_t chm_now_ns(struct chm_dev *dev)
{
	if (dev->cfg.clock == CHM_CLOCK_VIRTUAL)
		return chm_vclock_now(dev);
	return chm_wall_to_dev_ns(dev, chm_mono_ns() - dev->t0_ns);
}

void chm_pace(struct chm_dev *dev, uint64_t done_ns)
{
	if (dev->cfg.clock == CHM_CLOCK_VIRTUAL) {
		chm_vclock_raise(dev, done_ns);
		if (dev->clock_hook) /* what the mode did meanwhile (the flusher) */
			dev->clock_hook(dev);
		return;
	}
	if (!dev->timing.enabled)
		return;
	uint64_t now = chm_now_ns(dev);
	if (now > done_ns) {
		chm_ctr_add(&dev->st.pacing_late, 1);
		chm_ctr_add(&dev->st.pacing_late_ns, now - done_ns);
		return;
	}
	pthread_mutex_unlock(&dev->lock);
	chm_sleep_until_ns(chm_dev_to_mono_ns(dev, done_ns));
	pthread_mutex_lock(&dev->lock);
}
