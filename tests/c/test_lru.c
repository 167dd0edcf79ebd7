/* test_lru.c - lru mode (the transparent-LRU baseline) on real files, with
 * the pread and the io_uring backends.
 *
 * Checks: reads return the backing file's bytes at any alignment; the cache
 * never holds more lines than the pool has; written data survives eviction
 * (eager write-back and dirty eviction), close and reopen; a victim that is
 * still dirty is written back before its line is reused (a dirty eviction)
 * and its bytes read back right; a one-hit-wonder sequential scan larger
 * than the cache hits nothing on its second pass and counts every line as
 * an LRU-induced refill, while a working set that fits hits on every line;
 * flush makes data durable (read with a separate fd), times out while
 * write-back is slow and reports a failed write-back as -EIO without losing
 * the line; two writer/reader threads on interleaved ranges that share
 * lines; a prefetch hint fills the cache.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chm.h"
#include "check.h"

#define CAP (4u << 20)
#define LINE (64u << 10)
#define NLINES_CACHE 8u
#define NLINES_DEV (CAP / LINE)

static char path[256];
static const char *backend;
static uint8_t *shadow; /* what the device must hold, CAP bytes */

static uint8_t pat(uint64_t a, unsigned seed)
{
	uint64_t x = a * 0x9e3779b97f4a7c15ull + seed * 0xd1b54a32d192ed03ull;
	x ^= x >> 29;
	x *= 0xbf58476d1ce4e5b9ull;
	return (uint8_t)(x >> 56);
}

static void fill(uint8_t *buf, uint64_t addr, uint64_t len, unsigned seed)
{
	for (uint64_t i = 0; i < len; i++)
		buf[i] = pat(addr + i, seed);
}

/* The backing file holds pattern 1 everywhere; the shadow follows. */
static void reset_file(void)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
	if (fd < 0) {
		perror(path);
		exit(1);
	}
	fill(shadow, 0, CAP, 1);
	if (pwrite(fd, shadow, CAP, 0) != CAP || fsync(fd)) {
		perror("pwrite");
		exit(1);
	}
	close(fd);
}

/* Reads the backing file with its own (buffered) fd. */
static void read_file(uint8_t *out)
{
	int fd = open(path, O_RDONLY);
	if (fd < 0 || pread(fd, out, CAP, 0) != CAP) {
		perror("read back");
		exit(1);
	}
	close(fd);
}

/* Opens the lru device over path. slow_writes: every SSD write is modelled
 * to take 200 ms (write-back is paced), 16 channels. */
static int open_dev(chm_dev **out, int slow_writes)
{
	struct chm_config c;
	cfg_init(&c, "targets", path, "create", "0", "backend", backend, "mode", "lru", "capacity",
	         "4M", "stripe_unit", "1M");
	cfg_set(&c, "dram", "512K"); /* NLINES_CACHE lines */
	cfg_set(&c, "wbuf", "0");
	cfg_set(&c, "lru_line", "64K");
	cfg_set(&c, "slot_size", "256K");
	cfg_set(&c, "slots", "2");
	cfg_set(&c, "queue_depth", "32");
	if (slow_writes) {
		cfg_set(&c, "ssd_write_lat_ns", "200000000");
		cfg_set(&c, "ssd_channels", "16");
	}
	return chm_dev_open(&c, out);
}

static chm_dev *must_open(int slow_writes)
{
	chm_dev *dev = NULL;
	int rc = open_dev(&dev, slow_writes);
	if (rc) {
		fprintf(stderr, "open (%s): %s\n", backend, chm_strerror(rc));
		exit(1);
	}
	return dev;
}

static struct chm_stats stats(chm_dev *dev)
{
	struct chm_stats s;
	if (chm_stats(dev, &s)) {
		fprintf(stderr, "chm_stats failed\n");
		exit(1);
	}
	return s;
}

static void check_capacity(chm_dev *dev)
{
	struct chm_stats s = stats(dev);
	CHECK(s.lru_lines_total == NLINES_CACHE, "lines_total %llu",
	      (unsigned long long)s.lru_lines_total);
	CHECK(s.lru_lines_valid <= s.lru_lines_total, "valid %llu > total %llu",
	      (unsigned long long)s.lru_lines_valid, (unsigned long long)s.lru_lines_total);
	CHECK(s.lru_lines_dirty <= s.lru_lines_valid, "dirty %llu > valid %llu",
	      (unsigned long long)s.lru_lines_dirty, (unsigned long long)s.lru_lines_valid);
}

/* Reads [addr, addr+len) through the device and compares with the shadow. */
static int read_cmp(chm_dev *dev, uint64_t addr, uint64_t len)
{
	uint8_t *buf = malloc(len);
	int ok = buf && chm_read(dev, addr, buf, len) == 0 && !memcmp(buf, shadow + addr, len);
	free(buf);
	return ok;
}

static int write_shadow(chm_dev *dev, uint64_t addr, uint64_t len, unsigned seed)
{
	fill(shadow + addr, addr, len, seed);
	return chm_write_object(dev, addr, shadow + addr, len, 0);
}

static int file_matches_shadow(void)
{
	uint8_t *buf = malloc(CAP);
	read_file(buf);
	int ok = !memcmp(buf, shadow, CAP);
	free(buf);
	return ok;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

/* ---- the checks ---- */

static void test_reads_match_file(void)
{
	chm_dev *dev = must_open(0);
	uint64_t s = 0x1234567;
	unsigned bad = 0, n = 300;
	for (unsigned i = 0; i < n; i++) {
		uint64_t addr = check_rng(&s) % CAP;
		uint64_t max = CAP - addr < 300000 ? CAP - addr : 300000;
		uint64_t len = 1 + check_rng(&s) % max;
		if (!read_cmp(dev, addr, len))
			bad++;
		check_capacity(dev);
	}
	CHECK(bad == 0, "%u of %u random reads differ from the file", bad, n);
	CHECK(read_cmp(dev, CAP - 1, 1), "last byte");
	CHECK(read_cmp(dev, 0, CAP), "whole device in one read (bigger than the cache)");
	struct chm_stats st = stats(dev);
	CHECK(st.read_hits + st.read_misses == n + 2, "read calls counted %llu",
	      (unsigned long long)(st.read_hits + st.read_misses));
	CHECK(st.lru_misses > 0 && st.lru_hits > 0, "hits %llu misses %llu",
	      (unsigned long long)st.lru_hits, (unsigned long long)st.lru_misses);
	CHECK(st.bytes_read_ssd >= st.lru_misses * LINE, "bytes_read_ssd %llu",
	      (unsigned long long)st.bytes_read_ssd);
	chm_dev_close(dev);
	printf("  random reads at any alignment return the file's bytes; capacity held\n");
}

static void test_dirty_data_survives(void)
{
	chm_dev *dev = must_open(0);
	/* a whole line, a partial sector inside a line, and a range over three
	 * lines with partial ends */
	CHECK_RC(write_shadow(dev, 3 * LINE, LINE, 2), 0);
	CHECK_RC(write_shadow(dev, 5 * LINE + 1024, 512, 2), 0);
	CHECK_RC(write_shadow(dev, 10 * LINE + 4096, 2 * LINE + 4096, 2), 0);
	CHECK(read_cmp(dev, 3 * LINE - 100, 13 * LINE), "read-your-writes");
	check_capacity(dev);
	/* every other line once: the written lines are evicted */
	for (unsigned l = 16; l < NLINES_DEV; l++)
		CHECK(read_cmp(dev, (uint64_t)l * LINE, LINE), "line %u", l);
	check_capacity(dev);
	CHECK(read_cmp(dev, 0, 16 * LINE), "written bytes after eviction");
	/* a line under eager write-back is not a victim and is counted when
	 * its write-back settles: the barrier waits for that */
	CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
	struct chm_stats st = stats(dev);
	CHECK(st.lru_writeback_bytes >= 5 * LINE, "writeback bytes %llu",
	      (unsigned long long)st.lru_writeback_bytes);
	CHECK_RC(write_shadow(dev, 40 * LINE + 512, 1024, 4), 0);
	chm_dev_close(dev); /* writes back what is still dirty */
	CHECK(file_matches_shadow(), "backing file after close");
	dev = must_open(0);
	CHECK(read_cmp(dev, 0, CAP), "reopened device");
	chm_dev_close(dev);
	printf("  written bytes survive eviction, close and reopen\n");
}

static void test_dirty_eviction(void)
{
	/* write-back of line 0 takes 200 ms (modelled, paced); the lines
	 * written meanwhile stay DIRTY, so the next miss must evict one */
	chm_dev *dev = must_open(1);
	CHECK_RC(write_shadow(dev, 0, LINE, 5), 0);
	sleep_ms(80); /* the thread has taken line 0 and waits out its 200 ms */
	for (unsigned l = 1; l < NLINES_CACHE; l++)
		CHECK_RC(write_shadow(dev, (uint64_t)l * LINE, LINE, 5), 0);
	struct chm_stats st0 = stats(dev);
	CHECK(st0.lru_lines_dirty == NLINES_CACHE, "dirty lines %llu",
	      (unsigned long long)st0.lru_lines_dirty);
	CHECK(read_cmp(dev, 20 * LINE, 100), "miss over dirty lines");
	struct chm_stats st1 = stats(dev);
	CHECK(st1.lru_dirty_evictions >= 1, "dirty evictions %llu",
	      (unsigned long long)st1.lru_dirty_evictions);
	check_capacity(dev);
	/* the evicted line comes back from the SSD with the written bytes */
	CHECK(read_cmp(dev, 0, NLINES_CACHE * LINE), "dirty-evicted lines read back");
	CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
	CHECK(file_matches_shadow(), "file after flush");
	chm_dev_close(dev);
	printf("  a dirty victim is written back before reuse (%llu dirty evictions)\n",
	       (unsigned long long)st1.lru_dirty_evictions);
}

static void test_one_hit_wonder(void)
{
	chm_dev *dev = must_open(0);
	uint8_t *buf = malloc(LINE);
	struct chm_stats s[3];
	unsigned bad = 0;
	s[0] = stats(dev);
	for (int pass = 0; pass < 2; pass++) {
		for (unsigned l = 0; l < NLINES_DEV; l++) {
			CHECK_RC(chm_read(dev, (uint64_t)l * LINE, buf, LINE), 0);
			bad += memcmp(buf, shadow + (uint64_t)l * LINE, LINE) != 0;
		}
		s[pass + 1] = stats(dev);
	}
	CHECK(bad == 0, "%u lines differ", bad);
	uint64_t hits = s[2].lru_hits - s[1].lru_hits, miss = s[2].lru_misses - s[1].lru_misses;
	uint64_t refills = s[2].lru_refills - s[1].lru_refills;
	CHECK(s[1].lru_refills == s[0].lru_refills, "first pass refills %llu",
	      (unsigned long long)(s[1].lru_refills - s[0].lru_refills));
	CHECK(hits == 0 && miss == NLINES_DEV, "second pass hits %llu misses %llu",
	      (unsigned long long)hits, (unsigned long long)miss);
	CHECK(refills == NLINES_DEV, "second pass refills %llu", (unsigned long long)refills);
	CHECK(s[2].read_hits == s[0].read_hits, "read_hits %llu",
	      (unsigned long long)s[2].read_hits);
	printf("  scan of %u lines through %u: second pass hit rate %.2f, %llu LRU refills\n",
	       NLINES_DEV, NLINES_CACHE, (double)hits / (double)(hits + miss),
	       (unsigned long long)refills);

	/* a working set that fits: every line of the second pass hits */
	for (int pass = 0; pass < 2; pass++) {
		s[0] = stats(dev);
		for (unsigned l = 0; l < NLINES_CACHE - 2; l++)
			CHECK_RC(chm_read(dev, (uint64_t)l * LINE + 7, buf, LINE - 7), 0);
		s[1] = stats(dev);
	}
	CHECK(s[1].lru_hits - s[0].lru_hits == NLINES_CACHE - 2 &&
	              s[1].lru_misses == s[0].lru_misses,
	      "fitting set: hits %llu misses %llu",
	      (unsigned long long)(s[1].lru_hits - s[0].lru_hits),
	      (unsigned long long)(s[1].lru_misses - s[0].lru_misses));
	CHECK(s[1].read_hits - s[0].read_hits == NLINES_CACHE - 2, "read_hits %llu",
	      (unsigned long long)(s[1].read_hits - s[0].read_hits));
	free(buf);
	chm_dev_close(dev);
}

static void test_flush(void)
{
	chm_dev *dev = must_open(0);
	CHECK_RC(write_shadow(dev, 20 * LINE + 512, 3 * LINE, 3), 0);
	CHECK_RC(write_shadow(dev, 30 * LINE, LINE, 3), 0);
	CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
	struct chm_stats st = stats(dev);
	CHECK(st.lru_lines_dirty == 0, "dirty lines after flush %llu",
	      (unsigned long long)st.lru_lines_dirty);
	CHECK(file_matches_shadow(), "file after flush (device still open)");
	CHECK_RC(chm_flush(dev, 0), 0); /* nothing dirty: done at once */
	chm_dev_close(dev);
	printf("  flush: data on the backing file, read with a separate fd\n");

	dev = must_open(1);
	CHECK_RC(write_shadow(dev, 7 * LINE, LINE, 6), 0);
	CHECK_RC(chm_flush(dev, 10 * 1000 * 1000), -ETIMEDOUT); /* write-back takes 200 ms */
	CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
	CHECK(file_matches_shadow(), "file after slow flush");

	/* the next backend write fails: the barrier reports it, the line stays
	 * dirty and a later flush makes it durable */
	CHECK_RC(chm_fault_inject(dev, CHM_FAULT_EIO_WRITE, 1, 0), 0);
	CHECK_RC(write_shadow(dev, 8 * LINE + 4096, 8192, 7), 0);
	CHECK_RC(chm_flush(dev, UINT64_MAX), -EIO);
	st = stats(dev);
	CHECK(st.lru_lines_dirty >= 1, "failed line must stay dirty, %llu",
	      (unsigned long long)st.lru_lines_dirty);
	CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
	CHECK(file_matches_shadow(), "file after a failed then retried write-back");
	CHECK(read_cmp(dev, 0, CAP), "device after retry");
	chm_dev_close(dev);
	printf("  flush times out on slow write-back; -EIO on a failed one, line kept\n");
}

struct worker {
	chm_dev *dev;
	unsigned id;
	unsigned ops, bad, errs;
	uint64_t seed;
};

#define BLOCK (32u << 10) /* ownership unit: two owners per line */

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	uint8_t *buf = malloc(BLOCK);
	for (unsigned i = 0; i < w->ops; i++) {
		uint64_t blk = (check_rng(&w->seed) % (CAP / BLOCK / 2)) * 2 + w->id;
		uint64_t base = blk * BLOCK;
		if (check_rng(&w->seed) % 2) {
			uint64_t sec = check_rng(&w->seed) % (BLOCK / 512);
			uint64_t n = 1 + check_rng(&w->seed) % (BLOCK / 512 - sec);
			uint64_t addr = base + sec * 512, len = n * 512;
			fill(shadow + addr, addr, len, 100 + i);
			if (chm_write_object(w->dev, addr, shadow + addr, len, 0))
				w->errs++;
		} else {
			uint64_t off = check_rng(&w->seed) % BLOCK;
			uint64_t len = 1 + check_rng(&w->seed) % (BLOCK - off);
			if (chm_read(w->dev, base + off, buf, len))
				w->errs++;
			else if (memcmp(buf, shadow + base + off, len))
				w->bad++;
		}
	}
	free(buf);
	return NULL;
}

static int poll_stop;

static void *poller_main(void *arg)
{
	chm_dev *dev = arg;
	unsigned *viol = calloc(1, sizeof(unsigned));
	while (!__atomic_load_n(&poll_stop, __ATOMIC_RELAXED)) {
		struct chm_stats s;
		chm_stats(dev, &s);
		if (s.lru_lines_valid > s.lru_lines_total || s.lru_lines_dirty > s.lru_lines_valid)
			(*viol)++;
		usleep(100);
	}
	return viol;
}

static void test_concurrency(void)
{
	chm_dev *dev = must_open(0);
	struct worker w[2];
	pthread_t t[2], pt;
	void *viol;
	__atomic_store_n(&poll_stop, 0, __ATOMIC_RELAXED);
	pthread_create(&pt, NULL, poller_main, dev);
	for (unsigned i = 0; i < 2; i++) {
		w[i] = (struct worker){
		        .dev = dev, .id = i, .ops = 600, .seed = 0xabcdef + i * 7919};
		pthread_create(&t[i], NULL, worker_main, &w[i]);
	}
	for (unsigned i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	__atomic_store_n(&poll_stop, 1, __ATOMIC_RELAXED);
	pthread_join(pt, &viol);
	for (unsigned i = 0; i < 2; i++)
		CHECK(w[i].bad == 0 && w[i].errs == 0, "thread %u: %u bad reads, %u errors", i,
		      w[i].bad, w[i].errs);
	CHECK(*(unsigned *)viol == 0, "%u capacity violations seen by stats", *(unsigned *)viol);
	free(viol);
	CHECK(read_cmp(dev, 0, CAP), "whole device after the threads");
	CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
	CHECK(file_matches_shadow(), "file after flush");
	struct chm_stats st = stats(dev);
	chm_dev_close(dev);
	CHECK(file_matches_shadow(), "file after close");
	printf("  2 threads, interleaved 32K ranges sharing lines: %llu hits, %llu misses, "
	       "%llu dirty evictions\n",
	       (unsigned long long)st.lru_hits, (unsigned long long)st.lru_misses,
	       (unsigned long long)st.lru_dirty_evictions);
}

static void test_prefetch_hint(void)
{
	chm_dev *dev = must_open(0);
	chm_handle h;
	struct chm_view v;
	uint64_t addr = 50 * LINE + 300, len = 2 * LINE;
	CHECK_RC(chm_prefetch_object(dev, addr, len, 0, &h), 0);
	CHECK_RC(chm_prefetch_wait(dev, h, UINT64_MAX, &v), 0);
	CHECK(v.len == len && !memcmp(v.data, shadow + addr, len), "hinted view bytes");
	CHECK_RC(chm_prefetch_release(dev, h), 0);
	struct chm_stats s0 = stats(dev);
	CHECK(read_cmp(dev, addr, len), "read after the hint");
	struct chm_stats s1 = stats(dev);
	CHECK(s1.read_hits == s0.read_hits + 1, "read after a hint is a hit");
	chm_dev_close(dev);
	printf("  a prefetch hint fills the cache\n");
}

/* Virtual time on the ghost backend: 1 TiB address space, 1 MiB lines,
 * 64 lines of DRAM. Runs a read scan with or without appends interleaved;
 * returns the device clock at the end and fills *st. */
static uint64_t ghost_run(int with_writes, struct chm_stats *st)
{
	struct chm_config c;
	chm_dev *dev;
	const uint64_t mb = 1u << 20;
	uint8_t *buf = malloc(mb);
	cfg_init(&c, "backend", "ghost", "clock", "virtual", "timing", "gen5-tlc-200g", "mode",
	         "lru", "capacity", "1T", "dram", "64M", "wbuf", "0", "lru_line", "1M", "slot_size",
	         "1M", "slots", "2");
	int rc = chm_dev_open(&c, &dev);
	CHECK(rc == 0, "ghost open: %s", chm_strerror(rc));
	if (rc) {
		free(buf);
		return 0;
	}
	memset(buf, 0x5a, mb);
	uint64_t wr = 512ull << 30; /* appends go far away from the reads */
	for (int pass = 0; pass < 2; pass++) {
		for (uint64_t l = 0; l < 256; l++) {
			CHECK_RC(chm_read(dev, l * mb, buf, mb), 0);
			if (with_writes && l % 4 == 3) {
				CHECK_RC(chm_write_object(dev, wr, buf, mb, 0), 0);
				wr += mb;
			}
		}
	}
	CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
	*st = stats(dev);
	chm_dev_close(dev);
	free(buf);
	return st->clock_now_ns;
}

static void test_ghost_virtual(void)
{
	struct chm_stats a, b, a2, b2;
	uint64_t ta = ghost_run(0, &a), tb = ghost_run(1, &b);
	uint64_t ta2 = ghost_run(0, &a2), tb2 = ghost_run(1, &b2);
	CHECK(ta == ta2 && tb == tb2, "virtual time must replay exactly: %llu/%llu %llu/%llu",
	      (unsigned long long)ta, (unsigned long long)ta2, (unsigned long long)tb,
	      (unsigned long long)tb2);
	CHECK(a.lru_refills == 256 && a.lru_hits == 0, "scan: refills %llu hits %llu",
	      (unsigned long long)a.lru_refills, (unsigned long long)a.lru_hits);
	CHECK(b.lru_writeback_bytes == 128ull << 20 && b.lru_lines_dirty == 0,
	      "appends written back: %llu bytes, %llu dirty",
	      (unsigned long long)b.lru_writeback_bytes, (unsigned long long)b.lru_lines_dirty);
	CHECK(tb > ta, "write-back must cost the reads time: %llu vs %llu", (unsigned long long)tb,
	      (unsigned long long)ta);
	printf("ghost (virtual time, 1 TiB): 512 MiB of scan reads take %.2f ms, %.2f ms with "
	       "128 MiB of appends written back eagerly (deterministic)\n",
	       (double)ta / 1e6, (double)tb / 1e6);
}

int main(void)
{
	const char *dir = getenv("TMPDIR");
	static const char *const backends[] = {"pread", "uring"};
	unsigned ran = 0;

	if (!dir || !*dir)
		dir = "/var/tmp";
	snprintf(path, sizeof(path), "%s/chm-test-lru-%d.img", dir, (int)getpid());
	shadow = malloc(CAP);
	if (!shadow)
		return 1;
	for (unsigned b = 0; b < 2; b++) {
		backend = backends[b];
		reset_file();
		chm_dev *probe = NULL;
		int rc = open_dev(&probe, 0);
		if (rc == -EOPNOTSUPP || rc == -ENOSYS || rc == -EPERM) {
			printf("%s: skipped (%s)\n", backend, chm_strerror(rc));
			continue;
		}
		if (rc) {
			fprintf(stderr, "FAIL: open lru device on %s: %s\n", backend,
			        chm_strerror(rc));
			failures++;
			continue;
		}
		chm_dev_close(probe);
		printf("%s:\n", backend);
		test_reads_match_file();
		test_dirty_data_survives();
		test_dirty_eviction();
		test_one_hit_wonder();
		test_flush();
		test_concurrency();
		test_prefetch_hint();
		ran++;
	}
	unlink(path);
	free(shadow);
	test_ghost_virtual();
	if (!ran && !failures) {
		printf("SKIP: no backend could open the device\n");
		return 77;
	}
	printf("%d checks, %d failures\n", checks, failures);
	return failures ? 1 : 0;
}
