/* fault.c - fault injection into backend completions (tests). */
#include <errno.h>
#include <pthread.h>

#include "dev.h"
#include "errdetail.h"

int chm_fault_inject(chm_dev *dev, int kind, uint64_t nth, uint64_t arg)
{
	chm_detail_clear();
	struct chm_faults *f;

	if (!dev)
		return chm_detail(-EINVAL, "fault_inject: NULL dev");
	switch (kind) {
	case CHM_FAULT_NONE:
	case CHM_FAULT_SLOW: break;
	case CHM_FAULT_EIO_READ:
	case CHM_FAULT_EIO_WRITE:
	case CHM_FAULT_SHORT_READ:
		if (nth < 1)
			return chm_detail(-EINVAL, "fault_inject: nth is 0 (it counts from 1)");
		break;
	default: return chm_detail(-EINVAL, "fault_inject: unknown kind %d", kind);
	}

	f = &dev->faults;
	pthread_mutex_lock(&f->lock);
	f->nth = nth;
	f->arg = arg;
	/* kind is also read without the lock by chm_fault_apply()'s fast path,
	 * which only compares it with NONE and then rereads everything under
	 * the lock, so a relaxed store is enough. */
	__atomic_store_n(&f->kind, kind, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&f->lock);
	return 0;
}

static bool fault_matches(int kind, int op)
{
	switch (kind) {
	case CHM_FAULT_EIO_READ:
	case CHM_FAULT_SHORT_READ: return op == CHM_IO_READ;
	case CHM_FAULT_EIO_WRITE: return op == CHM_IO_WRITE;
	default: return false;
	}
}

uint64_t chm_fault_apply(struct chm_dev *dev, struct chm_io *io)
{
	struct chm_faults *f = &dev->faults;
	uint64_t delay = 0;
	int kind;

	/* Unarmed is the hot path: no lock. A fault armed concurrently with
	 * this completion may or may not see it, as with any racing I/O. */
	if (__atomic_load_n(&f->kind, __ATOMIC_RELAXED) == CHM_FAULT_NONE)
		return 0;

	pthread_mutex_lock(&f->lock);
	kind = __atomic_load_n(&f->kind, __ATOMIC_RELAXED);
	if (kind == CHM_FAULT_SLOW) {
		delay = f->arg;
	} else if (fault_matches(kind, io->op) && --f->nth == 0) {
		if (kind == CHM_FAULT_SHORT_READ) {
			if (io->res > 0)
				io->res = (int32_t)(io->len / 2);
		} else {
			io->res = -EIO;
		}
		__atomic_store_n(&f->kind, CHM_FAULT_NONE, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&f->lock);
	return delay;
}
