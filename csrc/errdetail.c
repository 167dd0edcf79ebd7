/* errdetail.c - the per-thread error detail: one line saying why the most
 * recent failing call of this thread failed, tagged with its error code.
 *
 * Thread-local storage, so no lock and no sharing: a detail set by one
 * thread is never seen by another. Set only at failure sites in caller
 * threads (validation, refusals); completion threads set none. */
#include <stdarg.h>
#include <stdio.h>

#include "chm.h"
#include "errdetail.h"

static __thread char detail[CHM_ERRMSG_MAX];
static __thread int detail_err;                   /* the -errno detail was set with; 0: none */
static __thread char detail_file[CHM_ERRMSG_MAX]; /* the path it is about, or "" */

void chm_detail_clear(void)
{
	detail_err = 0;
	detail[0] = 0;
	detail_file[0] = 0;
}

int chm_detail(int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	detail_err = err;
	detail_file[0] = 0;
	return err;
}

int chm_detail_to(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	detail_err = rc;
	detail_file[0] = 0;
	if (err && errlen)
		snprintf(err, errlen, "%s", detail);
	return rc;
}

const char *chm_last_error_detail(int err)
{
	if (err == 0 || err != detail_err)
		return "";
	return detail;
}

int chm_detail_path(const char *path, int rc)
{
	snprintf(detail_file, sizeof(detail_file), "%s", path ? path : "");
	return rc;
}

const char *chm_last_error_path(int err)
{
	if (err == 0 || err != detail_err)
		return "";
	return detail_file;
}
