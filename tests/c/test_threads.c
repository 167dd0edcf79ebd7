/* test_threads.c - several threads issue, wait, release, read and write at
 * once on one device (built under TSan too); afterwards no space is leaked
 * and the counters balance. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chm.h"
#include "check.h"

#define NTHREADS 4
#define ROUNDS 300
#define CAP (64ull << 20)
#define OBJ (256u << 10)

static chm_dev *dev;
static uint8_t *image; /* the backing file's bytes; threads write elsewhere */

struct worker {
	unsigned id;
	unsigned seed;
	int bad;
};

static uint64_t rnd(unsigned *s)
{
	return (uint64_t)rand_r(s) * 2654435761u;
}

static void *work(void *arg)
{
	struct worker *w = arg;
	/* each thread writes only into its own 1 MiB at the top of the device */
	uint64_t wbase = CAP - (uint64_t)(w->id + 1) * (1u << 20);
	uint8_t *buf = malloc(OBJ);
	for (unsigned i = 0; i < ROUNDS; i++) {
		chm_handle h[3];
		unsigned n = 1 + (unsigned)(rnd(&w->seed) % 3);
		uint64_t addr[3], len[3];
		for (unsigned k = 0; k < n; k++) {
			len[k] = 1 + rnd(&w->seed) % OBJ;
			addr[k] = rnd(&w->seed) % (CAP / 2 - len[k]);
			int rc = chm_prefetch_object(dev, addr[k], len[k], 0, &h[k]);
			if (rc == -EAGAIN) {
				n = k;
				break;
			}
			if (rc)
				w->bad++;
		}
		for (unsigned k = 0; k < n; k++) {
			struct chm_view v;
			if (chm_prefetch_wait(dev, h[k], 10ull * 1000000000ull, &v) ||
			    memcmp(v.data, image + addr[k], len[k]))
				w->bad++;
			if (rnd(&w->seed) % 2 &&
			    chm_read(dev, addr[k], buf, len[k] < 4096 ? len[k] : 4096))
				w->bad++;
			if (chm_prefetch_release(dev, h[k]))
				w->bad++;
		}
		uint64_t rl = 1 + rnd(&w->seed) % 65536;
		uint64_t ra = rnd(&w->seed) % (CAP / 2 - rl);
		if (chm_read(dev, ra, buf, rl) || memcmp(buf, image + ra, rl))
			w->bad++;
		memset(buf, (int)(w->id + i), 8192);
		uint64_t wa = wbase + (rnd(&w->seed) % 128) * 8192;
		int wr = chm_write_object(dev, wa, buf, 8192, 0);
		if (wr != 0 && wr != CHM_WRITE_SKIPPED)
			w->bad++;
		if (i % 100 == 99 && chm_flush(dev, 10ull * 1000000000ull))
			w->bad++;
	}
	free(buf);
	return NULL;
}

static void run(const char *backend, const char *path)
{
	struct chm_config c;
	char err[256];
	chm_config_init(&c);
	chm_config_set(&c, "backend", backend, err, sizeof(err));
	chm_config_set(&c, "targets", path, err, sizeof(err));
	chm_config_set(&c, "capacity", "64M", err, sizeof(err));
	chm_config_set(&c, "slot_size", "256K", err, sizeof(err));
	chm_config_set(&c, "slots", "6", err, sizeof(err));
	chm_config_set(&c, "refill_queue", "4", err, sizeof(err));
	chm_config_set(&c, "dram", "8M", err, sizeof(err));
	chm_config_set(&c, "wbuf", "256K", err, sizeof(err));
	int rc = chm_dev_open(&c, &dev);
	if (rc == -EOPNOTSUPP) {
		printf("skip %s: not available here\n", backend);
		return;
	}
	CHECK_RC(rc, 0);
	if (rc)
		return;
	pthread_t t[NTHREADS];
	struct worker w[NTHREADS];
	for (unsigned i = 0; i < NTHREADS; i++) {
		w[i] = (struct worker){.id = i, .seed = 1234 + i};
		pthread_create(&t[i], NULL, work, &w[i]);
	}
	for (unsigned i = 0; i < NTHREADS; i++) {
		pthread_join(t[i], NULL);
		CHECK(w[i].bad == 0, "%s thread %u: %d bad results", backend, i, w[i].bad);
	}
	CHECK_RC(chm_flush(dev, 10ull * 1000000000ull), 0);
	struct chm_stats st;
	chm_stats(dev, &st);
	CHECK(st.slots_free == st.slots_total, "%s: %u of %u slots free", backend, st.slots_free,
	      st.slots_total);
	CHECK(st.queue_len == 0);
	CHECK(st.prefetch_issued == st.prefetch_released, "%s: issued %llu released %llu", backend,
	      (unsigned long long)st.prefetch_issued, (unsigned long long)st.prefetch_released);
	CHECK(st.prefetch_issued ==
	      st.prefetch_completed + st.prefetch_failed + st.prefetch_cancelled);
	CHECK(st.wr_admitted + st.wr_skipped == NTHREADS * ROUNDS);
	CHECK(st.wr_flushed_bytes == st.wr_admitted_bytes);
	printf("ok %s: %d threads x %d rounds; issued %llu (queued %llu, rejected %llu), "
	       "writes admitted %llu skipped %llu; no slot leaked\n",
	       backend, NTHREADS, ROUNDS, (unsigned long long)st.prefetch_issued,
	       (unsigned long long)st.prefetch_queued, (unsigned long long)st.prefetch_rejected,
	       (unsigned long long)st.wr_admitted, (unsigned long long)st.wr_skipped);
	chm_dev_close(dev);
}

int main(void)
{
	const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/var/tmp";
	char path[512];
	snprintf(path, sizeof(path), "%s/chm-test-threads-%d.img", dir, (int)getpid());
	image = malloc(CAP);
	for (uint64_t i = 0; i < CAP; i++)
		image[i] = (uint8_t)((i * 2654435761u) >> 11);
	FILE *f = fopen(path, "w");
	if (!f || fwrite(image, 1, CAP, f) != CAP) {
		perror(path);
		return 1;
	}
	fclose(f);
	run("pread", path);
	run("uring", path);
	unlink(path);
	free(image);
	return check_summary();
}
