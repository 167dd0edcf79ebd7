/* test_regress_dup_targets.c - the same backing file listed twice (directly,
 * or via a hard link) passes validation and opens; stripes of "both" targets
 * then land on the same file offsets and overwrite each other. Checks that
 * such a device is refused at open or keeps every stripe's data. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chm.h"
#include "check.h"

static void try_targets(const char *what, const char *targets)
{
	struct chm_config c;
	cfg_init(&c, "backend", "pread", "mode", "direct", "targets", targets, "create", "1",
	         "stripe_unit", "64K", "capacity", "1M");
	chm_dev *dev;
	int rc = chm_dev_open(&c, &dev);
	if (rc == -EOPNOTSUPP) {
		printf("SKIP: no O_DIRECT in /tmp\n");
		exit(77);
	}
	if (rc < 0) {
		printf("%s: refused at open (%s): fine\n", what, chm_strerror(rc));
		return;
	}
	static char a[65536] __attribute__((aligned(4096)));
	static char b[65536] __attribute__((aligned(4096)));
	static char got[65536];
	memset(a, 0xaa, sizeof(a));
	memset(b, 0xbb, sizeof(b));
	/* stripe 0 -> target 0 offset 0, stripe 1 -> target 1 offset 0 */
	CHECK_RC(chm_write_object(dev, 0, a, sizeof(a), 0), 0);
	CHECK_RC(chm_write_object(dev, 65536, b, sizeof(b), 0), 0);
	CHECK_RC(chm_read(dev, 0, got, sizeof(got)), 0);
	CHECK(memcmp(got, a, sizeof(a)) == 0,
	      "%s: stripe 0 reads back 0x%02x, not 0xaa: overwritten by stripe 1", what,
	      (unsigned char)got[0]);
	chm_dev_close(dev);
	printf("%s: opened; stripe data checked\n", what);
}

int main(void)
{
	char dir[] = "/tmp/chm_regress_XXXXXX";
	if (!mkdtemp(dir))
		return 77;
	char t[3000], f0[1100], f1[1100];
	snprintf(f0, sizeof(f0), "%s/t0", dir);
	snprintf(f1, sizeof(f1), "%s/t1", dir);
	snprintf(t, sizeof(t), "%s,%s", f0, f0);
	/* an existing file: a refused open removes only the files it created */
	int fd = open(f0, O_RDWR | O_CREAT, 0600);
	if (fd < 0)
		return 77;
	close(fd);
	try_targets("same path twice", t);
	CHECK(access(f0, F_OK) == 0, "a refused open removed %s, which it did not create", f0);
	if (link(f0, f1) == 0) {
		snprintf(t, sizeof(t), "%s,%s", f0, f1);
		try_targets("path and a hard link to it", t);
	}
	unlink(f1);
	unlink(f0);
	rmdir(dir);
	return check_summary();
}
