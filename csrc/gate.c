/* gate.c - the device's call gate: API entry/exit accounting so that close
 * can wait for the callers inside the device. Lock-free on the call path
 * (two atomic operations per call); only the last caller out of a closing
 * device takes gate_lock, to wake the close that waits. Calls nothing above
 * it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "dev.h"
#include "errdetail.h"
#include "gate.h"

int chm_enter(struct chm_dev *dev)
{
	/* increment first, then look at closing; close stores closing, then
	 * reads the count (both sequentially consistent): either close sees
	 * this caller or this caller sees closing */
	atomic_fetch_add(&dev->active_calls, 1);
	if (atomic_load(&dev->closing)) {
		chm_leave(dev);
		return chm_detail(-ECANCELED,
		                  "the device is closing (chm_dev_close or shutdown began)");
	}
	return 0;
}

void chm_leave(struct chm_dev *dev)
{
	if (atomic_load(&dev->closing)) {
		/* closing: leave under gate_lock, which drain holds while it reads
		 * the count, so the close cannot free the device under us */
		pthread_mutex_lock(&dev->gate_lock);
		if (atomic_fetch_sub(&dev->active_calls, 1) == 1)
			pthread_cond_broadcast(&dev->idle_cond);
		pthread_mutex_unlock(&dev->gate_lock);
		return;
	}
	/* not closing when looked: after this the device may be freed, so it
	 * is not touched again; a close that began in between sleeps in short
	 * timed waits and sees the count fall */
	atomic_fetch_sub(&dev->active_calls, 1);
}

void chm_gate_close(struct chm_dev *dev)
{
	atomic_store(&dev->closing, true);
}

void chm_gate_drain(struct chm_dev *dev)
{
	pthread_mutex_lock(&dev->gate_lock);
	while (atomic_load(&dev->active_calls)) {
		/* idle_cond runs on CLOCK_MONOTONIC; 1 ms bounds the wait for a
		 * caller that left without a broadcast (see chm_leave) */
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&dev->idle_cond, &dev->gate_lock, &ts);
	}
	pthread_mutex_unlock(&dev->gate_lock);
}
