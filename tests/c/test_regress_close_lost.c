/* test_regress_close_lost.c - a close whose final write-back keeps failing
 * (the backing's filesystem is full) drops the writes that are not durable,
 * as a power cut would; it used to do so without a trace. chm_dev_lost,
 * read between chm_dev_shutdown and chm_dev_close, must report them: the
 * writes, their bytes, -ENOSPC and a detail naming the target. Before
 * shutdown, and after a close that lost nothing, it reports 0 and 0.
 *
 * Real parts: a 4 MiB tmpfs mounted here (root; skipped otherwise), nearly
 * filled by a ballast file, under a real O_DIRECT target. The prefetch-mode
 * case waits out close's 10 s retry budget (the virtual clock, which would
 * simulate it, moves no data). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "chm.h"
#include "check.h"

#define CHUNK (1u << 20)

static char dir[64], target[96], ballast[96];

/* Fills the filesystem but for about 1 MiB; true when it did. */
static bool fill(void)
{
	int fd = open(ballast, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		return false;
	static char zero[CHUNK];
	bool ok = true;
	for (int i = 0; i < 3 && ok; i++)
		ok = write(fd, zero, CHUNK) == (ssize_t)CHUNK;
	close(fd);
	return ok;
}

static void config(struct chm_config *c, const char *mode)
{
	cfg_init(c, "backend", "pread", "targets", target, "capacity", "16M", "dram", "16M", "wbuf",
	         "8M", "slot_size", "1M", "mode", mode);
}

/* Writes n chunks, then closes in two halves; *lost_* get what
 * chm_dev_lost reports. Returns its rc (1 when the open failed). */
static int write_and_close(const char *mode, unsigned n, bool flush, uint64_t *lost_writes,
                           uint64_t *lost_bytes)
{
	struct chm_config c;
	config(&c, mode);
	c.create = 1;
	chm_dev *dev;
	char why[256] = "";
	int rc = chm_dev_open_err(&c, &dev, why, sizeof(why));
	CHECK(rc == 0, "%s: open: %d: %s", mode, rc, why);
	if (rc)
		return 1;
	static char data[CHUNK] __attribute__((aligned(4096)));
	for (unsigned i = 0; i < n; i++) {
		memset(data, (int)i + 1, CHUNK);
		int w = chm_write_object(dev, (uint64_t)i * CHUNK, data, CHUNK, 0);
		CHECK(w >= 0, "%s: write %u: %d", mode, i, w);
	}
	if (flush)
		CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
	uint64_t w0 = 1, b0 = 1;
	CHECK_RC(chm_dev_lost(dev, &w0, &b0), 0); /* not shut down: nothing yet */
	CHECK(w0 == 0 && b0 == 0, "%s: lost before shutdown: %llu/%llu", mode,
	      (unsigned long long)w0, (unsigned long long)b0);
	CHECK_RC(chm_dev_lost(dev, NULL, &b0), -EINVAL);
	chm_dev_shutdown(dev);
	rc = chm_dev_lost(dev, lost_writes, lost_bytes);
	if (rc) {
		const char *d = chm_last_error_detail(rc);
		CHECK(strstr(d, target) && strstr(d, "written but never flushed"),
		      "%s: detail names the target and the loss: %s", mode, d);
		CHECK(strcmp(chm_last_error_path(rc), target) == 0, "%s: path %s", mode,
		      chm_last_error_path(rc));
		char want[64];
		snprintf(want, sizeof(want), "%llu bytes in %llu writes",
		         (unsigned long long)*lost_bytes, (unsigned long long)*lost_writes);
		CHECK(strstr(d, want), "%s: detail says \"%s\": %s", mode, want, d);
	}
	chm_dev_close(dev);
	unlink(target);
	return rc;
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/chm_test_XXXXXX");
	if (!mkdtemp(dir))
		return 77;
	if (mount("tmpfs", dir, "tmpfs", 0, "size=4m") != 0) {
		printf("SKIP: cannot mount a tmpfs: %s\n", strerror(errno));
		rmdir(dir);
		return 77;
	}
	snprintf(target, sizeof(target), "%s/t0", dir);
	snprintf(ballast, sizeof(ballast), "%s/ballast", dir);
	int status = 0;
	struct chm_config c;
	config(&c, "prefetch");
	c.create = 1;
	chm_dev *probe;
	int rc = chm_dev_open(&c, &probe);
	if (rc == -EOPNOTSUPP) {
		printf("SKIP: no O_DIRECT on tmpfs here (%d)\n", rc);
		status = 77;
		goto out;
	}
	CHECK_RC(rc, 0);
	if (rc)
		goto out;
	chm_dev_close(probe);
	unlink(target);

	const char *modes[] = {"prefetch", "lru"};
	for (int m = 0; m < 2; m++) {
		uint64_t nw = 0, nb = 0;
		/* the control: what fits and is flushed loses nothing */
		CHECK_RC(write_and_close(modes[m], 1, true, &nw, &nb), 0);
		CHECK(nw == 0 && nb == 0, "%s: a flushed close lost %llu/%llu", modes[m],
		      (unsigned long long)nw, (unsigned long long)nb);

		if (!fill()) {
			CHECK(false, "cannot write the ballast");
			break;
		}
		struct statvfs sv;
		CHECK(statvfs(dir, &sv) == 0, "statvfs");
		uint64_t free_bytes = (uint64_t)sv.f_bavail * sv.f_frsize;
		unsigned n = (unsigned)(free_bytes / CHUNK) + 2;
		uint64_t written = (uint64_t)n * CHUNK;
		CHECK_RC(write_and_close(modes[m], n, false, &nw, &nb), -ENOSPC);
		CHECK(nw > 0 && nb <= written && nb >= written - free_bytes,
		      "%s: %llu bytes in %llu writes lost of %llu written, %llu free", modes[m],
		      (unsigned long long)nb, (unsigned long long)nw, (unsigned long long)written,
		      (unsigned long long)free_bytes);
		unlink(ballast);
	}
	printf("a lossy close is counted and reported; a flushed one is not\n");
out:
	unlink(ballast);
	unlink(target);
	umount2(dir, MNT_DETACH);
	rmdir(dir);
	return status ? status : check_summary();
}
