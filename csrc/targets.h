/* targets.h - opening backing targets and checking identities (targets.c). */
#ifndef CHM_TARGETS_H
#define CHM_TARGETS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct chm_dev;

/* What the open path did to target i, so a failed open can undo it. */
struct chm_target_undo {
	bool created;        /* the file did not exist: remove it */
	bool grown;          /* the file was extended: truncate it back */
	uint64_t orig_bytes; /* its size before */
	dev_t st_dev;        /* identity, checked before undoing anything */
	ino_t st_ino;
};

/* The identities of an open target or pool file: device and inode of a
 * regular file, the device number of a block device and, for a loop device,
 * its backing file. Two objects overlap when any identities match. (A
 * partition of a target drive needs no check here: the kernel refuses the
 * second exclusive open of overlapping block devices with -EBUSY, and a
 * mounted filesystem claims its drive the same way.) */
struct chm_ident {
	int n;
	struct {
		bool blk;
		dev_t dev;
		ino_t ino;
	} id[2];
};

/* Opens target i O_DIRECT (block devices exclusively). A missing regular file
 * is created (mode 0600, sparse) and a short one extended only with
 * cfg.create; otherwise -ENOENT / -ENOSPC naming the path and the sizes.
 * Records what it did in *undo. */
int chm_target_open(struct chm_dev *dev, unsigned i, struct chm_target_undo *undo, char *err,
                    size_t errlen);

/* Undoes what chm_target_open did to the targets of a failed open. */
void chm_targets_undo(struct chm_dev *dev, const struct chm_target_undo *undo);

/* -EINVAL (with a reason) when two open targets are the same file or device;
 * fills ids[] with the identity of each target. */
int chm_targets_check_distinct(struct chm_dev *dev, struct chm_ident *ids, char *err,
                               size_t errlen);

/* -EINVAL (with a reason) when a pool=file pool is, or backs, a target. fd < 0:
 * checks the path before the pool is opened; else the open pool. */
int chm_pool_check_not_target(struct chm_dev *dev, const struct chm_ident *ids, int fd, char *err,
                              size_t errlen);

#endif /* CHM_TARGETS_H */
