/* test_regress_stripe_map.c - a stripe_unit that is not a multiple of max_io
 * (both valid on their own: e.g. stripe_unit=12K, max_io=8K, 2 targets) splits
 * every stripe into two ios, more than chm_map_max_ios() budgets. Checks that
 * such a configuration is either refused at validation or works: a prefetch
 * fill must not crash (prefetch mode), and lru-mode fills/write-backs must
 * move the data (not silently transfer nothing). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chm.h"
#include "check.h"

static void base_cfg(struct chm_config *c)
{
	cfg_init(c, "stripe_unit", "12K", "max_io", "8K");
	cfg_set(c, "capacity", "12M"); /* 1024 stripes of 12K */
	cfg_set(c, "dram", "4M");
	cfg_set(c, "wbuf", "1M");
	cfg_set(c, "slot_size", "128K");
	cfg_set(c, "slots", "4");
}

/* prefetch mode, ghost backend: issue + wait a 128 KiB object in a child. */
static void test_prefetch_fill(void)
{
	struct chm_config c;
	base_cfg(&c);
	cfg_set(&c, "backend", "ghost");
	cfg_set(&c, "targets", "g0,g1");
	if (chm_config_validate(&c, NULL, 0)) {
		printf("prefetch: config refused at validation (acceptable)\n");
		return;
	}
	pid_t pid = fork();
	if (pid == 0) {
		chm_dev *dev;
		if (chm_dev_open(&c, &dev))
			_exit(0); /* refused at open: acceptable */
		chm_handle h;
		struct chm_view v;
		int rc = chm_prefetch_object(dev, 0, 128 << 10, 0, &h);
		if (rc == 0)
			rc = chm_prefetch_wait(dev, h, UINT64_MAX, &v);
		if (rc == 0)
			rc = v.len == (128 << 10) ? 0 : -EIO;
		chm_dev_close(dev);
		_exit(rc == 0 ? 0 : 3);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "prefetch of 128K with stripe 12K / max_io 8K: child %s %d",
	      WIFSIGNALED(st) ? "killed by signal" : "exited",
	      WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
	printf("prefetch: fill with stripe 12K / max_io 8K checked\n");
}

/* lru mode on pread files: data written in direct mode must read back
 * through lru fills; data written in lru mode must reach the SSD. */
static void test_lru_data(void)
{
	char dir[] = "/tmp/chm_regress_XXXXXX";
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		exit(77);
	}
	char tl[2 * 1100];
	snprintf(tl, sizeof(tl), "%s/t0,%s/t1", dir, dir);
	struct chm_config c;
	base_cfg(&c);
	cfg_set(&c, "backend", "pread");
	cfg_set(&c, "targets", tl);
	cfg_set(&c, "create", "1");
	cfg_set(&c, "lru_line", "64K");
	const uint64_t len = 256 << 10;
	char *pat = malloc(len), *got = malloc(len);
	for (uint64_t i = 0; i < len; i++)
		pat[i] = (char)(i * 131 + 7 + (i >> 12));

	chm_dev *dev;
	/* 1: direct-mode write, lru-mode read */
	cfg_set(&c, "mode", "direct");
	int rc = chm_dev_open(&c, &dev);
	if (rc == -EOPNOTSUPP) {
		printf("SKIP: no O_DIRECT in /tmp\n");
		exit(77);
	}
	CHECK_RC(rc, 0);
	CHECK_RC(chm_write_object(dev, 0, pat, len, 0), 0);
	CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
	chm_dev_close(dev);
	cfg_set(&c, "mode", "lru");
	if (chm_config_validate(&c, NULL, 0) == 0) {
		CHECK_RC(chm_dev_open(&c, &dev), 0);
		memset(got, 0, len);
		CHECK_RC(chm_read(dev, 0, got, len), 0);
		CHECK(memcmp(got, pat, len) == 0,
		      "lru read of data written in direct mode differs (fill moved nothing?)");
		/* 2: lru-mode write of new data, flush, read back in direct mode */
		for (uint64_t i = 0; i < len; i++)
			pat[i] = (char)~pat[i];
		CHECK_RC(chm_write_object(dev, 512 << 10, pat, len, 0), 0);
		CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
		chm_dev_close(dev);
		cfg_set(&c, "mode", "direct");
		CHECK_RC(chm_dev_open(&c, &dev), 0);
		memset(got, 0, len);
		CHECK_RC(chm_read(dev, 512 << 10, got, len), 0);
		CHECK(memcmp(got, pat, len) == 0,
		      "data written and flushed in lru mode is not on the SSD (write-back moved "
		      "nothing?)");
		chm_dev_close(dev);
	} else {
		printf("lru: config refused at validation (acceptable)\n");
	}
	char p[1200];
	snprintf(p, sizeof(p), "%s/t0", dir);
	unlink(p);
	snprintf(p, sizeof(p), "%s/t1", dir);
	unlink(p);
	rmdir(dir);
	free(pat);
	free(got);
	printf("lru: data through fills and write-backs with stripe 12K / max_io 8K checked\n");
}

int main(void)
{
	test_prefetch_fill();
	test_lru_data();
	return check_summary();
}
