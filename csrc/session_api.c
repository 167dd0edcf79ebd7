/* session_api.c - the public session calls (chm_session_open, _close,
 * _prefetch, _wait, _release): they enter the device (gate.h), check their
 * arguments as device.c does for the default session, and call the staging
 * window, which finds the session under dev->lock. The session table itself
 * is session.c's, below the staging window; this file is the top of the
 * core, beside device.c, so that nothing calls back up.
 */
#include <errno.h>
#include <stdlib.h>

#include "dev.h"
#include "errdetail.h"
#include "gate.h"
#include "mode.h"
#include "session.h"
#include "staging.h"

int chm_session_open(chm_dev *dev, uint32_t quota, chm_session *out)
{
	chm_detail_clear();
	if (!dev || !out || quota == 0)
		return chm_detail(-EINVAL, "session_open: %s",
		                  quota ? "a NULL argument" : "quota 0");
	int rc = chm_enter(dev);
	if (rc)
		return rc;
	if (!dev->mode->staging) {
		chm_leave(dev);
		/* no window: no handle to scope */
		return chm_detail(-EOPNOTSUPP, "session_open: mode=direct has no staging window");
	}
	pthread_mutex_lock(&dev->lock);
	if (!dev->sess_free) {
		rc = chm_detail(-ENOSPC, "session_open: every session is open");
	} else {
		uint32_t si = dev->sess_free - 1;
		struct chm_sess *ss = &dev->sess[si];
		dev->sess_free = ss->rr_next;
		ss->rr_next = 0;
		ss->open = true;
		ss->quota = quota;
		ss->used = 0;
		ss->q_head = ss->q_tail = 0;
		ss->in_rr = false;
		*out = chm_sess_token(dev, si);
	}
	pthread_mutex_unlock(&dev->lock);
	chm_leave(dev);
	return rc;
}

int chm_session_close(chm_dev *dev, chm_session s)
{
	chm_detail_clear();
	if (!dev || s == CHM_SESSION_DEFAULT)
		return chm_detail(-EINVAL, "session_close: %s",
		                  dev ? "the default session cannot be closed" : "NULL dev");
	if (!dev->mode->staging) /* no session was ever opened */
		return chm_detail(-EINVAL, "session_close: mode=direct has no sessions");
	uint32_t start = 0, si;
	pthread_mutex_lock(&dev->lock);
	/* like release, close works while the device is closing, but not after
	 * shutdown freed the tables */
	int rc = dev->shut ? -ECANCELED : chm_sess_lookup(dev, s, &si);
	if (rc)
		goto out_unlock;
	/* queued requests first, so the slots freed next do not start fills
	 * for requests of this session that are about to be released */
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t i = 0; i < dev->nreqs; i++) {
			struct chm_req *r = &dev->reqs[i];
			if (r->state == CHM_REQ_FREE || r->sess != si ||
			    (pass == 0) != (r->state == CHM_REQ_QUEUED))
				continue;
			chm_staging_release_req(dev, r, &start);
			rc++;
		}
	}
	/* fills it released and still in flight free their slot on completion
	 * without charging a later session of this record */
	for (uint32_t i = 0; i < dev->nslots; i++)
		if (dev->slots[i].sess == (int32_t)si)
			chm_sess_uncharge(dev, &dev->slots[i]);
	struct chm_sess *ss = &dev->sess[si];
	ss->open = false;
	ss->quota = 0;
	if (ss->gen != SESS_GEN_LAST) { /* else retired: never on the free list again */
		ss->gen++;
		ss->rr_next = dev->sess_free;
		dev->sess_free = si + 1;
	}
out_unlock:
	pthread_mutex_unlock(&dev->lock);
	if (start)
		chm_staging_submit(dev, start);
	return rc;
}

int chm_session_prefetch(chm_dev *dev, chm_session s, uint32_t n, const uint64_t *addrs,
                         const uint64_t *lens, uint32_t flags, chm_handle *handles,
                         int32_t *results)
{
	chm_detail_clear();
	if (!dev || !addrs || !lens || !handles || !results || n > CHM_BATCH_MAX)
		return chm_detail(-EINVAL, "session_prefetch: %s",
		                  n > CHM_BATCH_MAX ? "n is above CHM_BATCH_MAX"
		                                    : "a NULL argument");
	if (!dev->mode->staging && s != CHM_SESSION_DEFAULT) /* no session was ever opened */
		return chm_detail(-EINVAL, "session_prefetch: mode=direct has no sessions");
	int rc = chm_enter(dev);
	int ok = 0;
	for (uint32_t i = 0; i < n; i++) {
		results[i] = rc ? rc : chm_prefetch_check(dev, addrs[i], lens[i], flags);
		ok += results[i] == 0;
	}
	if (rc)
		return 0;
	/* the session is checked even when no element is valid */
	ok = dev->mode->staging
	             ? chm_staging_prefetch(dev, s, n, addrs, lens, flags, handles, results)
	             : 0;
	chm_leave(dev);
	if (n != 1)
		chm_detail_clear(); /* an element's reason is not the call's */
	return ok;
}

int chm_session_wait(chm_dev *dev, chm_session s, chm_handle h, uint64_t timeout_ns,
                     struct chm_view *view)
{
	chm_detail_clear();
	if (!dev || !view)
		return chm_detail(-EINVAL, "session_wait: NULL %s", !dev ? "dev" : "view");
	int rc = chm_enter(dev);
	if (rc)
		return rc;
	/* without a window no handle or session was ever issued */
	rc = dev->mode->staging ? chm_staging_wait(dev, s, h, timeout_ns, view)
	                        : chm_detail(-EINVAL, "session_wait: mode=direct has no sessions");
	chm_leave(dev);
	return rc;
}

int chm_session_release(chm_dev *dev, chm_session s, uint32_t n, const chm_handle *handles,
                        int32_t *results)
{
	chm_detail_clear();
	if (!dev || !handles || !results || n > CHM_BATCH_MAX)
		return chm_detail(-EINVAL, "session_release: %s",
		                  n > CHM_BATCH_MAX ? "n is above CHM_BATCH_MAX"
		                                    : "a NULL argument");
	if (dev->mode->staging) { /* release works while closing too */
		int ok = chm_staging_release(dev, s, n, handles, results);
		if (n != 1)
			chm_detail_clear(); /* an element's reason is not the call's */
		return ok;
	}
	if (s != CHM_SESSION_DEFAULT)
		return chm_detail(-EINVAL, "session_release: mode=direct has no sessions");
	return chm_prefetch_release_many(dev, n, handles, results);
}
