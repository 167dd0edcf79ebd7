/* test_regress_wbuf_overlap.c - two overlapping writes in flight together.
 * W1 reserves its log entry first but is slow to copy its bytes in (its
 * source page faults; a handler holds it); W2 to the same range is reserved
 * second and admitted first. The log, the overlay of miss reads and the
 * flusher order W1 before W2 (W2 wins), but each admit patches staged slots
 * in admission-completion order, so the staged copy ends with W1's bytes:
 * a read served from the staged slot and a read of the same range after the
 * slot is released disagree for good. Checks that they agree. The slot is
 * READY (staged, no view yet) while the writes land: a held view is a
 * snapshot that later writes do not patch (W11). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "chm.h"
#include "check.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#endif

#define LEN 4096

static chm_dev *dev;
static char *slow_src; /* W1's source: PROT_NONE until W2 is admitted */
static volatile sig_atomic_t in_handler, go;
static int w1_rc = -1;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	char *a = si->si_addr;
	if (a < slow_src || a >= slow_src + LEN)
		abort();
	in_handler = 1;
	while (!go)
		;
	mprotect(slow_src, LEN, PROT_READ);
}

static void *w1_main(void *arg)
{
	(void)arg;
	w1_rc = chm_write_object(dev, 0, slow_src, LEN, 0);
	return NULL;
}

int main(void)
{
#ifdef UNDER_SANITIZER
	printf("SKIP: uses a SIGSEGV handler to hold a copy, not under sanitizers\n");
	return 77;
#endif
	struct scratch sc;
	if (!scratch_make(&sc))
		return 77;
	struct chm_config c;
	cfg_init(&c, "backend", "pread", "targets", sc.path, "capacity", "16M", "dram", "2M",
	         "wbuf", "512K", "slot_size", "4K", "slots", "4");
	int status = scratch_open(&sc, &c, &dev, "no O_DIRECT in /tmp");
	if (status)
		return status;

	chm_handle h;
	struct chm_view v;
	struct chm_stats st0, st1;
	CHECK_RC(chm_prefetch_object(dev, 0, LEN, 0, &h), 0);
	do { /* READY, no view handed out */
		usleep(100);
		chm_stats(dev, &st0);
	} while (st0.slots_ready != 1);

	slow_src = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(slow_src, 0x11, LEN); /* W1's bytes */
	mprotect(slow_src, LEN, PROT_NONE);
	struct sigaction sa = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO};
	sigaction(SIGSEGV, &sa, NULL);

	pthread_t t1;
	pthread_create(&t1, NULL, w1_main, NULL);
	while (!in_handler)
		usleep(100);
	/* W1 holds a reserved entry and is stuck in its copy: W2 overtakes it */
	static char w2[LEN] __attribute__((aligned(4096)));
	memset(w2, 0x22, LEN);
	CHECK_RC(chm_write_object(dev, 0, w2, LEN, 0), 0);
	go = 1;
	pthread_join(t1, NULL);
	CHECK_RC(w1_rc, 0);

	static char hit[LEN], after[LEN];
	chm_stats(dev, &st0);
	CHECK_RC(chm_read(dev, 0, hit, LEN), 0);
	chm_stats(dev, &st1);
	CHECK(st1.read_hits == st0.read_hits + 1, "the first read was a staged hit");
	CHECK_RC(chm_prefetch_wait(dev, h, UINT64_MAX, &v), 0);
	CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
	static char view_copy[LEN];
	memcpy(view_copy, v.data, LEN);
	CHECK_RC(chm_prefetch_release(dev, h), 0);
	CHECK_RC(chm_read(dev, 0, after, LEN), 0);
	printf("staged hit reads 0x%02x, the range after release reads 0x%02x\n",
	       (unsigned char)hit[0], (unsigned char)after[0]);
	CHECK(memcmp(hit, after, LEN) == 0,
	      "staged copy (0x%02x) and durable data (0x%02x) of one range disagree",
	      (unsigned char)hit[0], (unsigned char)after[0]);
	CHECK(memcmp(view_copy, after, LEN) == 0, "the view disagrees with durable data");
	chm_dev_close(dev);
	scratch_remove(&sc);
	return check_summary();
}
