/* gate.h - API entry and exit accounting, so close can wait for callers (gate.c). */
#ifndef CHM_GATE_H
#define CHM_GATE_H

struct chm_dev;

/* A caller enters the device before it touches device state and leaves
 * after. Returns 0, or -ECANCELED when the device is closing. No lock held
 * or needed. */
int chm_enter(struct chm_dev *dev);
void chm_leave(struct chm_dev *dev);

/* Close: marks the device closing (new callers get -ECANCELED). Call with
 * dev->lock held, so that a waiter that checks closing under the lock and
 * then sleeps cannot miss the wake-up that follows. */
void chm_gate_close(struct chm_dev *dev);

/* Close: waits until every caller that entered has left. Lock not held. */
void chm_gate_drain(struct chm_dev *dev);

#endif /* CHM_GATE_H */
