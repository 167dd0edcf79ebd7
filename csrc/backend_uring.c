/* backend_uring.c - io_uring backend: O_DIRECT targets as fixed files, the
 * DRAM pool as registered buffers (piecewise, off the open path, where the
 * kernel allows), one ring and one completion thread.
 *
 * At most qd ios hold an SQE or CQE at a time; the rest wait on a FIFO and
 * are submitted as completions arrive. Short transfers are resubmitted for
 * their remainder; an io's progress lives in io->res until it completes.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "dev.h"

#define URING_PIECE_SHIFT 30      /* a registered buffer is at most 1 GiB */
#define URING_BG_PIECE_SHIFT 24   /* 16 MiB pieces when registered piecewise */
#define URING_MAX_BUFS (1u << 14) /* kernel limit on registered buffers */
#define URING_MAX_QD 16384u
#define URING_MIN_ENTRIES 8u
#define URING_BATCH 64u
#define URING_SQ_IDLE_MS 20u
#define URING_WAKE UINT64_MAX /* user_data of the shutdown nop */

/* Linux 6.15; liburing 2.3 predates them. */
#ifndef IORING_ENTER_NO_IOWAIT
#define IORING_ENTER_NO_IOWAIT (1u << 7)
#endif
#ifndef IORING_FEAT_NO_IOWAIT
#define IORING_FEAT_NO_IOWAIT (1u << 17)
#endif

/* An io travels from its submitter to the reaper through the kernel's rings,
 * which a race detector cannot see: tell it about the hand-over. */
#if defined(__SANITIZE_THREAD__)
#define URING_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define URING_TSAN 1
#endif
#endif
#ifdef URING_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define handoff_send(io) __tsan_release(io)
#define handoff_recv(io) __tsan_acquire(io)
#else
#define handoff_send(io) ((void)(io))
#define handoff_recv(io) ((void)(io))
#endif

struct uring_be {
	struct chm_dev *dev;
	struct io_uring ring;
	unsigned qd; /* in-flight cap */
	bool sqpoll;
	bool fixed_files;    /* targets registered: fd = target index */
	unsigned wait_flags; /* extra io_uring_enter flags of the reaper */
	unsigned nbufs;      /* pool pieces registered, 0 = plain buffers */
	uintptr_t pool_base;
	uint64_t pool_bytes;
	pthread_t reaper;
	/* Piecewise registration (Linux 5.19+): a sparse table of pool pieces
	 * filled one piece at a time by a thread of its own, off the open path
	 * (registering pins, so faults in, the piece; each update holds the
	 * ring's lock only that long). A piece is used once its bit is set;
	 * before that, plain buffers. piece_shift is the piece size then. */
	unsigned piece_shift;
	uint64_t *piece_ready; /* bitmap, atomics */
	pthread_t pieces_thread;
	bool pieces_started;
	bool pieces_stop; /* atomics */

	/* liburing's SQ is single-producer: every get_sqe/prep/submit on the
	 * ring, from callers and from the reaper, happens under lock. The CQ
	 * is consumed only by the reaper, without lock. */
	pthread_mutex_t lock;
	struct chm_io *head, *tail; /* waiting for an in-flight slot */
	bool stopping;
	/* Atomics, so the reaper takes lock only when it has SQ work. */
	unsigned nwaiting;    /* FIFO length; written under lock */
	unsigned inflight;    /* ios owning an SQE or CQE; raised under lock */
	uint64_t outstanding; /* submitted, done() not yet returned */
};

static inline struct uring_be *to_uring(struct chm_backend *be)
{
	return (struct uring_be *)be;
}

/* Index of the registered piece holding all of [buf, buf+len), or -1. */
static int uring_buf_index(const struct uring_be *ub, const char *buf, uint32_t len)
{
	uintptr_t p = (uintptr_t)buf;
	uint64_t off;

	if (!ub->nbufs || p < ub->pool_base)
		return -1;
	off = p - ub->pool_base;
	if (off >= ub->pool_bytes || len > ub->pool_bytes - off)
		return -1;
	if ((off >> ub->piece_shift) != ((off + len - 1) >> ub->piece_shift))
		return -1;
	uint64_t i = off >> ub->piece_shift;
	if (ub->piece_ready &&
	    !(__atomic_load_n(&ub->piece_ready[i / 64], __ATOMIC_ACQUIRE) & (1ull << (i % 64))))
		return -1; /* not registered yet */
	return (int)i;
}

/* Lock held. */
static struct io_uring_sqe *uring_sqe(struct uring_be *ub)
{
	struct io_uring_sqe *sqe;

	/* The SQ has more entries than qd + the wake nop, and a full SQ is
	 * submitted before lock is dropped, so it can only be full while an
	 * SQPOLL thread has not consumed what it was given yet. */
	while (!(sqe = io_uring_get_sqe(&ub->ring))) {
		io_uring_submit(&ub->ring);
		if (ub->sqpoll)
			io_uring_sqring_wait(&ub->ring);
		else
			sched_yield();
	}
	return sqe;
}

/* Queues the untransferred part of io. Lock held. */
static void uring_prep(struct uring_be *ub, struct chm_io *io)
{
	struct io_uring_sqe *sqe = uring_sqe(ub);
	uint32_t done = (uint32_t)io->res;
	char *buf = (char *)io->buf + done;
	uint32_t len = io->len - done;
	uint64_t off = io->offset + done;
	int fd = ub->fixed_files ? io->target : ub->dev->fds[io->target];
	int idx;

	switch (io->op) {
	case CHM_IO_READ:
		idx = uring_buf_index(ub, buf, len);
		if (idx >= 0)
			io_uring_prep_read_fixed(sqe, fd, buf, len, off, idx);
		else
			io_uring_prep_read(sqe, fd, buf, len, off);
		break;
	case CHM_IO_WRITE:
		idx = uring_buf_index(ub, buf, len);
		if (idx >= 0)
			io_uring_prep_write_fixed(sqe, fd, buf, len, off, idx);
		else
			io_uring_prep_write(sqe, fd, buf, len, off);
		break;
	default: io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC); break;
	}
	if (ub->fixed_files)
		sqe->flags |= IOSQE_FIXED_FILE;
	io_uring_sqe_set_data(sqe, io);
	handoff_send(io);
}

/* Moves FIFO ios into the SQ while the in-flight cap allows. Lock held.
 * Returns how many were queued. */
static unsigned uring_fill(struct uring_be *ub)
{
	struct chm_io *io;
	unsigned n = 0;

	/* Pairs with the reaper, which lowers inflight and then reads
	 * nwaiting: whoever comes second sees the other's update, so a
	 * waiting io is never left behind with a free slot (all seq_cst). */
	while ((io = ub->head) && __atomic_load_n(&ub->inflight, __ATOMIC_SEQ_CST) < ub->qd) {
		ub->head = io->next;
		if (!ub->head)
			ub->tail = NULL;
		__atomic_sub_fetch(&ub->nwaiting, 1, __ATOMIC_SEQ_CST);
		uring_prep(ub, io);
		__atomic_add_fetch(&ub->inflight, 1, __ATOMIC_SEQ_CST);
		n++;
	}
	return n;
}

/* Hands every prepared SQE to the kernel. Lock held. */
static void uring_flush(struct uring_be *ub)
{
	int ret;

	for (;;) {
		ret = io_uring_submit(&ub->ring);
		if (ret < 0 && ret != -EAGAIN && ret != -EBUSY && ret != -EINTR) {
			/* Only a broken ring gets here: the SQEs cannot be
			 * taken back, so no io could ever complete. */
			fprintf(stderr, "chm: io_uring_submit: %s\n", strerror(-ret));
			abort();
		}
		/* With SQPOLL the kernel thread consumes the SQ by itself. */
		if (ub->sqpoll || !io_uring_sq_ready(&ub->ring))
			return;
		if (ret <= 0)
			sched_yield();
	}
}

/* Accounts one CQE to io. Returns true when io is finished (io->res final),
 * false when the rest of it must be submitted again. */
static bool uring_account(struct chm_io *io, int res)
{
	/* We never cancel; the kernel cancels queued async work when the
	 * thread that submitted it exits. Nothing moved, so redo it. */
	if (res == -ECANCELED || res == -EINTR)
		return false;
	if (res < 0) {
		io->res = res;
		return true;
	}
	if (io->op == CHM_IO_SYNC) {
		io->res = 0;
		return true;
	}
	if (res == 0) {
		io->res = -EIO; /* end of file: the target is too short */
		return true;
	}
	io->res += res;
	return (uint32_t)io->res >= io->len;
}

/* Applies faults and calls done() for finished ios. No lock held. */
static void uring_complete(struct uring_be *ub, struct chm_io **ios, unsigned n)
{
	uint64_t t0 = 0;
	bool have_t0 = false;
	uint64_t delay;
	unsigned i;

	for (i = 0; i < n; i++) {
		delay = chm_fault_apply(ub->dev, ios[i]);
		if (delay) {
			/* A batch completed together is late together. */
			if (!have_t0) {
				t0 = chm_mono_ns();
				have_t0 = true;
			}
			chm_sleep_until_ns(t0 + delay);
		}
		ios[i]->done(ios[i]);
	}
}

/* Blocks until a CQE is ready. The reaper waiting is not the device busy,
 * so where the kernel allows it the wait is not accounted as iowait. */
static int uring_wait(struct uring_be *ub)
{
	if (io_uring_cq_ready(&ub->ring))
		return 0;
	if (syscall(__NR_io_uring_enter, ub->ring.ring_fd, 0, 1,
	            IORING_ENTER_GETEVENTS | ub->wait_flags, NULL, 0) < 0)
		return -errno;
	return 0;
}

static void *uring_reaper(void *arg)
{
	struct uring_be *ub = arg;
	struct io_uring_cqe *cqes[URING_BATCH];
	struct chm_io *fin[URING_BATCH], *again[URING_BATCH];
	unsigned n, i, nfin, nagain;
	bool woken = false, quit = false;
	struct chm_io *io;
	uint64_t ud;
	int ret;

	while (!quit) {
		ret = uring_wait(ub);
		if (ret == -EINTR || ret == -EAGAIN)
			continue;
		if (ret < 0) {
			fprintf(stderr, "chm: io_uring_enter: %s\n", strerror(-ret));
			abort();
		}
		n = io_uring_peek_batch_cqe(&ub->ring, cqes, URING_BATCH);
		nfin = nagain = 0;
		for (i = 0; i < n; i++) {
			ud = io_uring_cqe_get_data64(cqes[i]);
			if (ud == URING_WAKE) {
				woken = true;
				continue;
			}
			io = (struct chm_io *)(uintptr_t)ud;
			handoff_recv(io);
			if (uring_account(io, cqes[i]->res))
				fin[nfin++] = io;
			else
				again[nagain++] = io;
		}
		io_uring_cq_advance(&ub->ring, n);

		__atomic_sub_fetch(&ub->inflight, nfin, __ATOMIC_SEQ_CST);
		if (nagain || __atomic_load_n(&ub->nwaiting, __ATOMIC_SEQ_CST)) {
			pthread_mutex_lock(&ub->lock);
			for (i = 0; i < nagain; i++)
				uring_prep(ub, again[i]);
			if (uring_fill(ub) + nagain)
				uring_flush(ub);
			pthread_mutex_unlock(&ub->lock);
		}

		uring_complete(ub, fin, nfin);
		quit = !__atomic_sub_fetch(&ub->outstanding, nfin, __ATOMIC_SEQ_CST) && woken;
	}
	return NULL;
}

static int uring_setup(struct uring_be *ub, unsigned entries)
{
	unsigned flags = IORING_SETUP_SUBMIT_ALL;
	struct io_uring_params p;
	struct io_uring probe;
	int ret;

	if (ub->sqpoll)
		flags |= IORING_SETUP_SQPOLL;
	for (;;) {
		memset(&p, 0, sizeof(p));
		p.flags = flags;
		p.sq_thread_idle = URING_SQ_IDLE_MS;
		ret = io_uring_queue_init_params(entries, &ub->ring, &p);
		if (ret != -EINVAL || !(flags & IORING_SETUP_SUBMIT_ALL))
			break;
		flags &= ~IORING_SETUP_SUBMIT_ALL; /* before Linux 5.18 */
	}
	if (!ret) {
		if (p.features & IORING_FEAT_NO_IOWAIT)
			ub->wait_flags = IORING_ENTER_NO_IOWAIT;
		return 0;
	}
	if (ret == -ENOSYS)
		return -EOPNOTSUPP;
	if (ret != -EPERM)
		return ret;
	if (!ub->sqpoll)
		return -EOPNOTSUPP; /* io_uring disabled (kernel.io_uring_disabled) */
	/* Tell "no SQPOLL for us" (-EPERM) from "no io_uring at all". */
	ret = io_uring_queue_init(URING_MIN_ENTRIES, &probe, 0);
	if (ret)
		return -EOPNOTSUPP;
	io_uring_queue_exit(&probe);
	return -EPERM;
}

/* Registers the targets; a failure (here and for the pool) just means
 * running without. */
static void uring_register(struct uring_be *ub)
{
	struct chm_dev *dev = ub->dev;
	ub->fixed_files = !io_uring_register_files(&ub->ring, dev->fds, dev->cfg.n_targets);
}

/* Registers the whole pool at once (kernels without a sparse table). */
static void uring_register_whole(struct uring_be *ub)
{
	struct chm_dev *dev = ub->dev;
	uint64_t piece = 1ull << URING_PIECE_SHIFT, off;
	struct iovec *iov;
	unsigned n, i;

	if (!dev->pool.base || !dev->pool.bytes)
		return;
	n = (unsigned)((dev->pool.bytes + piece - 1) >> URING_PIECE_SHIFT);
	if (n > URING_MAX_BUFS)
		return;
	iov = calloc(n, sizeof(*iov));
	if (!iov)
		return;
	for (i = 0, off = 0; i < n; i++, off += piece) {
		iov[i].iov_base = (char *)dev->pool.base + off;
		iov[i].iov_len = dev->pool.bytes - off < piece ? dev->pool.bytes - off : piece;
	}
	if (!io_uring_register_buffers(&ub->ring, iov, n)) {
		ub->nbufs = n;
		ub->pool_base = (uintptr_t)dev->pool.base;
		ub->pool_bytes = dev->pool.bytes;
	}
	free(iov);
}

/* Fills the sparse table piece by piece (see struct uring_be). */
static void *uring_register_pieces(void *arg)
{
	struct uring_be *ub = arg;
	uint64_t piece = 1ull << ub->piece_shift;
	for (unsigned i = 0; i < ub->nbufs; i++) {
		if (__atomic_load_n(&ub->pieces_stop, __ATOMIC_ACQUIRE))
			break;
		uint64_t off = (uint64_t)i << ub->piece_shift;
		struct iovec iov = {.iov_base = (char *)ub->pool_base + off,
		                    .iov_len = ub->pool_bytes - off < piece ? ub->pool_bytes - off
		                                                            : piece};
		__u64 tag = 0;
		if (io_uring_register_buffers_update_tag(&ub->ring, i, &iov, &tag, 1) != 1)
			break; /* the rest stay plain */
		__atomic_fetch_or(&ub->piece_ready[i / 64], 1ull << (i % 64), __ATOMIC_RELEASE);
	}
	return NULL;
}

/* Stops and joins the piecewise registration (what it registered stays). */
static void uring_pieces_stop(struct uring_be *ub)
{
	if (!ub->pieces_started)
		return;
	__atomic_store_n(&ub->pieces_stop, true, __ATOMIC_RELEASE);
	pthread_join(ub->pieces_thread, NULL);
	ub->pieces_started = false;
}

/* Registers the pool piecewise in the background when the kernel takes a
 * sparse table; else (false) the caller registers it whole, now. */
static bool uring_register_bg(struct uring_be *ub)
{
	struct chm_dev *dev = ub->dev;
	unsigned shift = URING_BG_PIECE_SHIFT;
	if (!dev->pool.base || !dev->pool.bytes)
		return true; /* nothing to register */
	uint64_t n = (dev->pool.bytes + (1ull << shift) - 1) >> shift;
	if (n > URING_MAX_BUFS)
		return false;
	ub->piece_ready = calloc((n + 63) / 64, sizeof(uint64_t));
	if (!ub->piece_ready)
		return false;
	if (io_uring_register_buffers_sparse(&ub->ring, (unsigned)n)) {
		free(ub->piece_ready);
		ub->piece_ready = NULL;
		return false;
	}
	ub->piece_shift = shift;
	ub->nbufs = (unsigned)n;
	ub->pool_base = (uintptr_t)dev->pool.base;
	ub->pool_bytes = dev->pool.bytes;
	ub->pieces_started =
	        pthread_create(&ub->pieces_thread, NULL, uring_register_pieces, ub) == 0;
	if (!ub->pieces_started)
		uring_register_pieces(ub); /* no thread: here */
	return true;
}

static int uring_init(struct chm_dev *dev, struct chm_backend **out)
{
	struct uring_be *ub;
	unsigned entries;
	int ret;

	if (!dev || !out || dev->cfg.n_targets < 1 || dev->cfg.n_targets > CHM_MAX_TARGETS)
		return -EINVAL;
	ub = calloc(1, sizeof(*ub));
	if (!ub)
		return -ENOMEM;
	ub->dev = dev;
	ub->sqpoll = dev->cfg.sqpoll != 0;
	ub->qd = dev->cfg.queue_depth;
	if (ub->qd < 1)
		ub->qd = 1;
	if (ub->qd > URING_MAX_QD)
		ub->qd = URING_MAX_QD;
	entries = URING_MIN_ENTRIES;
	while (entries < ub->qd + 1)
		entries <<= 1;

	ret = uring_setup(ub, entries);
	if (ret)
		goto err_free;
	ub->piece_shift = URING_PIECE_SHIFT;
	uring_register(ub);
	if (!uring_register_bg(ub))
		uring_register_whole(ub);
	ret = -pthread_mutex_init(&ub->lock, NULL);
	if (ret)
		goto err_ring;
	ret = -pthread_create(&ub->reaper, NULL, uring_reaper, ub);
	if (ret)
		goto err_mutex;
	pthread_setname_np(ub->reaper, "chm-uring");
	*out = (struct chm_backend *)ub;
	return 0;

err_mutex:
	pthread_mutex_destroy(&ub->lock);
err_ring:
	uring_pieces_stop(ub);
	if (ub->fixed_files)
		io_uring_unregister_files(&ub->ring);
	if (ub->nbufs)
		io_uring_unregister_buffers(&ub->ring);
	io_uring_queue_exit(&ub->ring);
err_free:
	free(ub);
	return ret;
}

static int uring_submit(struct chm_backend *be, struct chm_io **ios, unsigned n)
{
	struct uring_be *ub = to_uring(be);
	unsigned i;
	int ret;

	for (i = 0; i < n; i++) {
		ret = chm_io_check(ub->dev, ios[i]);
		if (ret)
			return ret;
	}
	if (!n)
		return 0;

	pthread_mutex_lock(&ub->lock);
	if (ub->stopping) {
		pthread_mutex_unlock(&ub->lock);
		return -ECANCELED;
	}
	for (i = 0; i < n; i++) {
		ios[i]->res = 0;
		ios[i]->next = NULL;
		if (ub->tail)
			ub->tail->next = ios[i];
		else
			ub->head = ios[i];
		ub->tail = ios[i];
	}
	__atomic_add_fetch(&ub->outstanding, n, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(&ub->nwaiting, n, __ATOMIC_SEQ_CST);
	if (uring_fill(ub))
		uring_flush(ub);
	pthread_mutex_unlock(&ub->lock);
	return 0;
}

static void uring_shutdown(struct chm_backend *be)
{
	struct uring_be *ub = to_uring(be);
	struct io_uring_sqe *sqe;

	if (!ub)
		return;
	pthread_mutex_lock(&ub->lock);
	ub->stopping = true;
	sqe = uring_sqe(ub);
	io_uring_prep_nop(sqe);
	io_uring_sqe_set_data64(sqe, URING_WAKE);
	uring_flush(ub);
	pthread_mutex_unlock(&ub->lock);

	pthread_join(ub->reaper, NULL);
	uring_pieces_stop(ub);
	/* Why unregister before the exit: closing the ring fd leaves its
	 * teardown to a kernel worker, whose fput of the registered targets is
	 * deferred again; until then a block-device target stays claimed
	 * (O_EXCL reopen -EBUSY, losetup -d only deferred). Unregistering here,
	 * with nothing in flight, drops those references in this task before
	 * the syscall returns, so close() returns with the targets released. */
	if (ub->fixed_files)
		io_uring_unregister_files(&ub->ring);
	if (ub->nbufs)
		io_uring_unregister_buffers(&ub->ring);
	io_uring_queue_exit(&ub->ring);
	pthread_mutex_destroy(&ub->lock);
	free(ub->piece_ready);
	free(ub);
}

const struct chm_backend_ops chm_backend_uring_ops = {
        .name = "uring",
        .init = uring_init,
        .submit = uring_submit,
        .shutdown = uring_shutdown,
};
