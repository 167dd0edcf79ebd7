/* targets.c - opening the backing targets and checking their identities:
 * O_DIRECT open (block devices exclusively), sparse create or extend of a
 * short regular file when cfg.create allows it, undo of all that for a
 * failed open, and the identity checks that refuse two targets that are one
 * file (or a loop device over another) and a pool file that is a target.
 * Every refusal names the path and the reason in the caller's err buffer.
 * No locks (runs inside chm_dev_open); calls nothing above it.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/loop.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dev.h"
#include "errdetail.h"
#include "targets.h"

/* What a path that is neither a regular file nor a block device is. */
static const char *file_kind(mode_t m)
{
	if (S_ISFIFO(m))
		return "a FIFO (named pipe)";
	if (S_ISCHR(m))
		return "a character device";
	if (S_ISSOCK(m))
		return "a socket";
	if (S_ISDIR(m))
		return "a directory";
	return "not a regular file";
}

/* Why path cannot be reached by this process (EACCES): the first directory
 * on the way that it may not search, or the file itself. */
static void access_reason(const char *path, char *out, size_t outlen)
{
	char dir[CHM_PATH_MAX];
	snprintf(dir, sizeof(dir), "%s", path);
	for (char *slash = strchr(dir + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
		*slash = 0;
		if (faccessat(AT_FDCWD, dir, X_OK, AT_EACCESS) < 0 && errno == EACCES) {
			struct stat st;
			if (stat(dir, &st) == 0)
				snprintf(out, outlen,
				         "directory %s (mode %04o, owner uid %u) is not searchable "
				         "by uid %u",
				         dir, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid,
				         (unsigned)geteuid());
			else
				snprintf(out, outlen, "directory %s is not searchable by uid %u",
				         dir, (unsigned)geteuid());
			return;
		}
		*slash = '/';
	}
	snprintf(out, outlen, "uid %u may not read and write it (or create it in its directory)",
	         (unsigned)geteuid());
}

/* A refusal about target i at path: the reason in err and the thread's
 * detail, the path for chm_last_error_path(). */
#define TARGET_FAIL(rc, ...) chm_detail_path(path, chm_detail_to(err, errlen, rc, __VA_ARGS__))

static int target_errno(unsigned i, const char *path, int e, char *err, size_t errlen)
{
	if (e == EACCES || e == EPERM) {
		char why[CHM_PATH_MAX + 128];
		access_reason(path, why, sizeof(why));
		return TARGET_FAIL(-e, "target %u: %s: %s", i, path, why);
	}
	return TARGET_FAIL(-e, "target %u: %s: %s", i, path, strerror(e));
}

static uint64_t target_need(const struct chm_config *c, unsigned i)
{
	uint64_t stripes = c->capacity / c->stripe_unit;
	uint64_t n = c->n_targets;
	uint64_t mine = stripes / n + (i < stripes % n ? 1 : 0);
	return mine * c->stripe_unit;
}

/* Opens target i O_DIRECT (block devices exclusively). A missing regular file
 * is created (mode 0600, sparse) and a short one extended only with
 * cfg.create; otherwise -ENOENT / -ENOSPC naming the path and the sizes. */
int chm_target_open(struct chm_dev *dev, unsigned i, struct chm_target_undo *undo, char *err,
                    size_t errlen)
{
	const struct chm_config *c = &dev->cfg;
	const char *path = c->targets[i];
	uint64_t need = target_need(c, i);
	struct stat st;
	int flags = O_RDWR | O_DIRECT | O_CLOEXEC;
	if (stat(path, &st) < 0) {
		int e = errno;
		if (e != ENOENT)
			return target_errno(i, path, e, err, errlen);
		if (!c->create)
			return TARGET_FAIL(
			        -ENOENT,
			        "target %u: %s does not exist (create=1 creates it, sparse, "
			        "at %llu bytes)",
			        i, path, (unsigned long long)need);
		flags |= O_CREAT | O_EXCL; /* so we know the file is ours to remove */
	} else if (S_ISBLK(st.st_mode)) {
		flags |= O_EXCL; /* a mounted or otherwise claimed drive: -EBUSY */
	} else if (!S_ISREG(st.st_mode)) {
		return TARGET_FAIL(-EINVAL,
		                   "target %u: %s is %s; a target is a regular file or a block "
		                   "device",
		                   i, path, file_kind(st.st_mode));
	}
	int fd = open(path, flags, 0600);
	if (fd < 0) {
		int e = errno;
		/* A filesystem without O_DIRECT creates the file, then fails the
		 * open with EINVAL; with O_EXCL the new file is ours: remove it,
		 * a failed open leaves nothing behind. */
		if (e == EINVAL && (flags & O_CREAT))
			unlink(path);
		if (e == EINVAL)
			return TARGET_FAIL(-EOPNOTSUPP,
			                   "target %u: %s: no O_DIRECT on its filesystem", i, path);
		if (e == EBUSY)
			return TARGET_FAIL(
			        -EBUSY,
			        "target %u: %s is in use (mounted, or opened exclusively "
			        "elsewhere)",
			        i, path);
		return target_errno(i, path, e, err, errlen);
	}
	undo->created = flags & O_CREAT;
	if (fstat(fd, &st) < 0)
		goto err_errno;
	undo->st_dev = st.st_dev;
	undo->st_ino = st.st_ino;
	uint64_t have;
	if (S_ISBLK(st.st_mode)) {
		if (ioctl(fd, BLKGETSIZE64, &have) < 0)
			goto err_errno;
		int lbs = 0;
		if (ioctl(fd, BLKSSZGET, &lbs) < 0)
			goto err_errno;
		if (lbs > 4096) { /* staging fills are widened to 4 KiB only */
			close(fd);
			return TARGET_FAIL(
			        -EOPNOTSUPP,
			        "target %u: %s has %d-byte logical blocks (at most 4096)", i, path,
			        lbs);
		}
		if ((uint32_t)lbs > dev->write_align)
			dev->write_align = (uint32_t)lbs;
		if (have < need) {
			close(fd);
			return TARGET_FAIL(
			        -ENOSPC,
			        "target %u: %s has %llu bytes, its share of capacity needs "
			        "%llu",
			        i, path, (unsigned long long)have, (unsigned long long)need);
		}
	} else {
		have = (uint64_t)st.st_size;
		if (have < need) {
			if (!c->create) {
				close(fd);
				return TARGET_FAIL(
				        -ENOSPC,
				        "target %u: %s is %llu bytes, smaller than its share "
				        "of capacity (%llu bytes); create=1 extends it",
				        i, path, (unsigned long long)have,
				        (unsigned long long)need);
			}
			if (ftruncate(fd, (off_t)need) < 0) /* sparse */
				goto err_errno;
			undo->grown = !undo->created;
			undo->orig_bytes = have;
			have = need;
		}
	}
	dev->fds[i] = fd;
	dev->target_bytes[i] = have;
	return 0;
err_errno:;
	int e = errno;
	close(fd);
	if (undo->created)
		unlink(path);
	undo->created = false;
	return target_errno(i, path, e, err, errlen);
}

/* Undoes what open_target did to the targets of a failed open: removes the
 * files it created and truncates back the ones it extended, and only those
 * (the path must still name the same file). */
void chm_targets_undo(struct chm_dev *dev, const struct chm_target_undo *undo)
{
	for (unsigned i = 0; i < dev->cfg.n_targets; i++) {
		struct stat st;
		const char *path = dev->cfg.targets[i];
		if (!undo[i].created && !undo[i].grown)
			continue;
		if (stat(path, &st) < 0 || st.st_dev != undo[i].st_dev ||
		    st.st_ino != undo[i].st_ino)
			continue;
		if (undo[i].created)
			unlink(path);
		else if (dev->fds[i] >= 0 && ftruncate(dev->fds[i], (off_t)undo[i].orig_bytes))
			continue; /* best effort */
	}
}

static int ident_of(int fd, const char *path, struct chm_ident *out)
{
	struct stat st;
	if (fd >= 0 ? fstat(fd, &st) : stat(path, &st))
		return -errno;
	out->n = 1;
	if (S_ISBLK(st.st_mode)) {
		out->id[0].blk = true;
		out->id[0].dev = st.st_rdev;
		out->id[0].ino = 0;
		struct loop_info64 li;
		if (fd >= 0 && ioctl(fd, LOOP_GET_STATUS64, &li) == 0) {
			out->id[1].blk = false;
			out->id[1].dev = (dev_t)li.lo_device;
			out->id[1].ino = (ino_t)li.lo_inode;
			out->n = 2;
		}
	} else {
		out->id[0].blk = false;
		out->id[0].dev = st.st_dev;
		out->id[0].ino = st.st_ino;
	}
	return 0;
}

static bool ident_overlap(const struct chm_ident *a, const struct chm_ident *b)
{
	for (int i = 0; i < a->n; i++)
		for (int j = 0; j < b->n; j++)
			if (a->id[i].blk == b->id[j].blk && a->id[i].dev == b->id[j].dev &&
			    a->id[i].ino == b->id[j].ino)
				return true;
	return false;
}

/* Two targets that are the same file (a path listed twice, a hard link, a
 * symlink, a loop device over the other) would share offsets and overwrite
 * each other's stripes. */
int chm_targets_check_distinct(struct chm_dev *dev, struct chm_ident *ids, char *err, size_t errlen)
{
	for (unsigned i = 0; i < dev->cfg.n_targets; i++) {
		int rc = ident_of(dev->fds[i], NULL, &ids[i]);
		if (rc)
			return chm_detail_to(err, errlen, rc, "target %u: %s: %s", i,
			                     dev->cfg.targets[i], strerror(-rc));
		for (unsigned j = 0; j < i; j++)
			if (ident_overlap(&ids[i], &ids[j]))
				return chm_detail_to(
				        err, errlen, -EINVAL,
				        "targets %u (%s) and %u (%s) are the same file or "
				        "device",
				        j, dev->cfg.targets[j], i, dev->cfg.targets[i]);
	}
	return 0;
}

/* A pool=file pool that is (or is backed by) a target would have the DRAM
 * contents and the SSD contents overwrite each other. fd < 0: check the
 * path (following symlinks) before the pool is opened; else the open pool. */
int chm_pool_check_not_target(struct chm_dev *dev, const struct chm_ident *ids, int fd, char *err,
                              size_t errlen)
{
	if (dev->cfg.pool_kind != CHM_POOL_FILE || dev->cfg.backend == CHM_BACKEND_GHOST)
		return 0;
	struct chm_ident pool;
	if (ident_of(fd, dev->cfg.pool_path, &pool))
		return 0; /* missing: the pool's own open reports it */
	for (unsigned i = 0; i < dev->cfg.n_targets; i++)
		if (ident_overlap(&pool, &ids[i]))
			return chm_detail_to(
			        err, errlen, -EINVAL,
			        "pool_path %s is target %u (%s), or backs it: the DRAM pool "
			        "and the SSD would overwrite each other",
			        dev->cfg.pool_path, i, dev->cfg.targets[i]);
	return 0;
}
