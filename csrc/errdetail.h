/* errdetail.h - the per-thread reason behind a failing call (chm_last_error_detail).
 *
 * A failure site records why it fails in one line, as it returns:
 *     return chm_detail(-EINVAL, "write: addr %#llx is not ...", ...);
 * Each API call clears the thread's detail on entry (chm_detail_clear), and
 * the detail remembers the error code it was set with, so a reason is only
 * ever reported for the failure that produced it. */
#ifndef CHM_ERRDETAIL_H
#define CHM_ERRDETAIL_H

/* Forgets this thread's detail. */
void chm_detail_clear(void);

/* Records a one-line reason for err on this thread; returns err. */
int chm_detail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* CHM_ERRDETAIL_H */
