/* test_regress_pool_is_target.c - a pool=file pool_path naming a target file
 * (the same path, or a symlink to it) was accepted: the DRAM pool's mapping
 * and the SSD wrote over each other. Checks chm_dev_open_err refuses it with
 * -EINVAL and a reason naming pool_path, and that the open reasons of a
 * missing or short target name the path and the sizes (create=0). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chm.h"
#include "check.h"

static void config(struct chm_config *c, const char *target, const char *pool)
{
	cfg_init(c, "backend", "pread", "targets", target, "capacity", "4M", "dram", "2M", "wbuf",
	         "512K", "slot_size", "256K");
	if (pool) {
		cfg_set(c, "pool", "file");
		cfg_set(c, "pool_path", pool);
	}
}

int main(void)
{
	struct scratch sc;
	if (!scratch_make(&sc))
		return 77;
	char link[128], err[CHM_ERRMSG_MAX];
	snprintf(link, sizeof(link), "%s/pool-link", sc.dir);
	struct chm_config c;
	chm_dev *dev = NULL;

	/* missing target, no create: -ENOENT naming the path */
	config(&c, sc.path, NULL);
	CHECK_RC(chm_dev_open_err(&c, &dev, err, sizeof(err)), -ENOENT);
	CHECK(strstr(err, sc.path) && strstr(err, "create"), "reason: %s", err);
	CHECK(access(sc.path, F_OK) != 0, "created without create");

	/* short target, no create: -ENOSPC naming path and both sizes */
	int fd = open(sc.path, O_RDWR | O_CREAT, 0600);
	CHECK(fd >= 0 && ftruncate(fd, 1 << 20) == 0);
	CHECK_RC(chm_dev_open_err(&c, &dev, err, sizeof(err)), -ENOSPC);
	CHECK(strstr(err, sc.path) && strstr(err, "1048576") && strstr(err, "4194304"),
	      "reason: %s", err);
	CHECK(ftruncate(fd, 4 << 20) == 0);
	close(fd);

	/* the pool is the target: by its path, and through a symlink */
	const char *pools[] = {sc.path, link};
	CHECK(symlink(sc.path, link) == 0);
	for (int i = 0; i < 2; i++) {
		config(&c, sc.path, pools[i]);
		int rc = chm_dev_open_err(&c, &dev, err, sizeof(err));
		if (rc == -EOPNOTSUPP) {
			printf("SKIP: no O_DIRECT in /tmp\n");
			unlink(link);
			scratch_remove(&sc);
			return 77;
		}
		CHECK_RC(rc, -EINVAL);
		CHECK(strstr(err, "pool_path") && strstr(err, pools[i]), "reason: %s", err);
		if (rc == 0)
			chm_dev_close(dev);
	}
	/* a pool file of its own is fine */
	char own[128];
	snprintf(own, sizeof(own), "%s/pool", sc.dir);
	fd = open(own, O_RDWR | O_CREAT, 0600);
	close(fd);
	config(&c, sc.path, own);
	CHECK_RC(chm_dev_open_err(&c, &dev, err, sizeof(err)), 0);
	chm_dev_close(dev);
	unlink(own);
	unlink(link);
	scratch_remove(&sc);
	return check_summary();
}
