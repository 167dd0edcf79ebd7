/* clock.h - the device clock, pacing and ns <-> timespec (clock.c). */
#ifndef CHM_CLOCK_H
#define CHM_CLOCK_H

#include <stdint.h>
#include <time.h>

struct chm_dev;

/* CLOCK_MONOTONIC in ns. */
uint64_t chm_mono_ns(void);

/* Device clock: virtual time, or monotonic ns since open divided by the
 * time dilation (clock=real). Lock held or not. */
uint64_t chm_now_ns(struct chm_dev *dev);

/* A wall-clock duration as device ns (divided by the time dilation). */
uint64_t chm_wall_to_dev_ns(const struct chm_dev *dev, uint64_t wall_ns);

/* The CLOCK_MONOTONIC time at which the real device clock reads dev_ns
 * (t0 + dev_ns * time dilation; UINT64_MAX past the range). */
uint64_t chm_dev_to_mono_ns(const struct chm_dev *dev, uint64_t dev_ns);

/* The virtual clock: read, and raise to t (never lowered; returns the clock
 * after). Lock held or not; lock-free. Raising does not run the hook. */
uint64_t chm_vclock_now(const struct chm_dev *dev);
uint64_t chm_vclock_raise(struct chm_dev *dev, uint64_t t);

/* Paces the caller to the modeled completion time done_ns: advances the
 * virtual clock, or sleeps (lock held; it is dropped while sleeping) until
 * the real device clock reaches it (wall chm_dev_to_mono_ns(done_ns)).
 * Counts host lateness, in device ns. */
void chm_pace(struct chm_dev *dev, uint64_t done_ns);

/* ns as a timespec: an absolute CLOCK_MONOTONIC time (condition variables
 * of the device run on that clock) or a duration. */
struct timespec chm_ns_to_timespec(uint64_t ns);

/* Sleeps until CLOCK_MONOTONIC reaches mono_ns (restarts on EINTR). */
void chm_sleep_until_ns(uint64_t mono_ns);

/* Sleeps for ns (restarts on EINTR). */
void chm_sleep_ns(uint64_t ns);

#endif /* CHM_CLOCK_H */
