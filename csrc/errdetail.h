/* errdetail.h - the per-thread reason behind a failing call (chm_last_error_detail).
 *
 * A failure site records why it fails in one line, as it returns:
 *     return chm_detail(-EINVAL, "write: addr %#llx is not ...", ...);
 * Each API call clears the thread's detail on entry (chm_detail_clear), and
 * the detail remembers the error code it was set with, so a reason is only
 * ever reported for the failure that produced it. */
#ifndef CHM_ERRDETAIL_H
#define CHM_ERRDETAIL_H

#include <stddef.h>

/* Forgets this thread's detail. */
void chm_detail_clear(void);

/* Records a one-line reason for err on this thread; returns err. */
int chm_detail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* As chm_detail, and also writes the reason into err (when given): the
 * configuration and open paths, whose callers pass a message buffer. */
int chm_detail_to(char *err, size_t errlen, int rc, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));

/* Names the file this thread's detail (set just before, with rc) is
 * about, for chm_last_error_path(); returns rc. */
int chm_detail_path(const char *path, int rc);

#endif /* CHM_ERRDETAIL_H */
