/* backend_pread.c - portable backend: worker threads doing pread/pwrite.
 *
 * min(queue_depth, 8) workers take ios from one FIFO. No io_uring, nothing
 * the kernel writes behind a sanitizer's back: the backend for ASan/TSan
 * builds and for hosts without io_uring.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "dev.h"

#define PREAD_MAX_WORKERS 8

struct pread_be {
	struct chm_dev *dev;
	unsigned nworkers;
	pthread_t workers[PREAD_MAX_WORKERS];

	pthread_mutex_t lock; /* guards the FIFO and stopping */
	pthread_cond_t cond;  /* work arrived, or stopping */
	struct chm_io *head, *tail;
	unsigned idle; /* workers waiting on cond */
	bool stopping;
};

static inline struct pread_be *to_pread(struct chm_backend *be)
{
	return (struct pread_be *)be;
}

static int32_t pread_transfer(int fd, int op, char *buf, uint32_t len, uint64_t off)
{
	uint32_t done = 0;
	ssize_t r;

	while (done < len) {
		if (op == CHM_IO_READ)
			r = pread(fd, buf + done, len - done, (off_t)(off + done));
		else
			r = pwrite(fd, buf + done, len - done, (off_t)(off + done));
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			return -EIO;
		done += (uint32_t)r;
	}
	return (int32_t)done;
}

static void pread_execute(struct chm_dev *dev, struct chm_io *io)
{
	int fd = dev->fds[io->target];

	if (io->op == CHM_IO_SYNC)
		io->res = fdatasync(fd) ? -errno : 0;
	else
		io->res = pread_transfer(fd, io->op, io->buf, io->len, io->offset);
}

static void *pread_worker(void *arg)
{
	struct pread_be *pb = arg;
	struct chm_io *io;
	uint64_t delay;

	pthread_mutex_lock(&pb->lock);
	for (;;) {
		while (!pb->head && !pb->stopping) {
			pb->idle++;
			pthread_cond_wait(&pb->cond, &pb->lock);
			pb->idle--;
		}
		io = pb->head;
		if (!io)
			break; /* stopping and drained */
		pb->head = io->next;
		if (!pb->head)
			pb->tail = NULL;
		pthread_mutex_unlock(&pb->lock);

		pread_execute(pb->dev, io);
		delay = chm_fault_apply(pb->dev, io);
		if (delay)
			chm_sleep_ns(delay);
		io->done(io);

		pthread_mutex_lock(&pb->lock);
	}
	pthread_mutex_unlock(&pb->lock);
	return NULL;
}

static void pread_stop(struct pread_be *pb, unsigned started)
{
	pthread_mutex_lock(&pb->lock);
	pb->stopping = true;
	pthread_cond_broadcast(&pb->cond);
	pthread_mutex_unlock(&pb->lock);
	while (started--)
		pthread_join(pb->workers[started], NULL);
}

static int pread_init(struct chm_dev *dev, struct chm_backend **out)
{
	struct pread_be *pb;
	char name[16];
	unsigned i;
	int ret;

	if (!dev || !out || dev->cfg.n_targets < 1 || dev->cfg.n_targets > CHM_MAX_TARGETS)
		return -EINVAL;
	pb = calloc(1, sizeof(*pb));
	if (!pb)
		return -ENOMEM;
	pb->dev = dev;
	pb->nworkers =
	        dev->cfg.queue_depth < PREAD_MAX_WORKERS ? dev->cfg.queue_depth : PREAD_MAX_WORKERS;
	if (!pb->nworkers)
		pb->nworkers = 1;

	ret = -pthread_mutex_init(&pb->lock, NULL);
	if (ret)
		goto err_free;
	ret = -pthread_cond_init(&pb->cond, NULL);
	if (ret)
		goto err_mutex;
	for (i = 0; i < pb->nworkers; i++) {
		ret = -pthread_create(&pb->workers[i], NULL, pread_worker, pb);
		if (ret)
			goto err_workers;
		snprintf(name, sizeof(name), "chm-pread%c", (char)('0' + i));
		pthread_setname_np(pb->workers[i], name);
	}
	*out = (struct chm_backend *)pb;
	return 0;

err_workers:
	pread_stop(pb, i);
	pthread_cond_destroy(&pb->cond);
err_mutex:
	pthread_mutex_destroy(&pb->lock);
err_free:
	free(pb);
	return ret;
}

static int pread_submit(struct chm_backend *be, struct chm_io **ios, unsigned n)
{
	struct pread_be *pb = to_pread(be);
	unsigned i;
	int ret;

	for (i = 0; i < n; i++) {
		ret = chm_io_check(pb->dev, ios[i]);
		if (ret)
			return ret;
	}
	if (!n)
		return 0;

	pthread_mutex_lock(&pb->lock);
	if (pb->stopping) {
		pthread_mutex_unlock(&pb->lock);
		return -ECANCELED;
	}
	for (i = 0; i < n; i++) {
		ios[i]->next = NULL;
		if (pb->tail)
			pb->tail->next = ios[i];
		else
			pb->head = ios[i];
		pb->tail = ios[i];
	}
	if (pb->idle > 1 && n > 1)
		pthread_cond_broadcast(&pb->cond);
	else if (pb->idle)
		pthread_cond_signal(&pb->cond);
	pthread_mutex_unlock(&pb->lock);
	return 0;
}

static void pread_shutdown(struct chm_backend *be)
{
	struct pread_be *pb = to_pread(be);

	if (!pb)
		return;
	pread_stop(pb, pb->nworkers);
	pthread_cond_destroy(&pb->cond);
	pthread_mutex_destroy(&pb->lock);
	free(pb);
}

const struct chm_backend_ops chm_backend_pread_ops = {
        .name = "pread",
        .init = pread_init,
        .submit = pread_submit,
        .shutdown = pread_shutdown,
};
