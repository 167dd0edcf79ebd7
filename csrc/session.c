/* session.c - device sessions: scopes of prefetch handles, each with a quota
 * and its own refill FIFO, served round-robin.
 *
 * A session is a record of a fixed table (CHM_SESSION_MAX + 1 records; record
 * 0 is the default session, always open, quota UINT32_MAX). Its token carries
 * the device tag, the record's generation and index, so a closed session's
 * token is refused (-ESTALE) and never answers for a later session in the
 * same record; a record whose generation would wrap is retired.
 *
 * Every request record names its session (chm_req.sess) and every busy slot
 * the session it is charged to (chm_slot.sess). A session's `used` counts
 * its queued requests plus its charged slots: a slot stays charged after a
 * release while its fill is still in flight (fill_done_orphan uncharges it),
 * so release-while-filling cannot take more slots than the quota. Closing a
 * session releases its requests and moves the charge of its orphaned fills
 * to nobody, so their completion touches no later session of the record.
 *
 * Queue: each session's QUEUED requests form a FIFO through chm_req.qnext;
 * the sessions with a non-empty FIFO form a ring (rr_head .. rr_tail). A
 * grant takes the head request of the ring's first session and moves that
 * session to the ring's end, so with k sessions queued a request waits for
 * at most k - 1 grants to others per grant of its own session.
 *
 * Locking: everything here runs under dev->lock. The public calls are
 * session_api.c's (they sit above the staging window and device.c, which
 * call down into this file). A mode without a staging window (direct) has
 * no sessions.
 */
#include <errno.h>
#include <stdlib.h>

#include "counters.h"
#include "dev.h"
#include "errdetail.h"
#include "session.h"

/* Session token: device tag in bits 63..48, generation in 47..16, index in
 * 15..0. Token 0 is CHM_SESSION_DEFAULT (the tag is nonzero, so no opened
 * session has token 0). */
#define SESS_TAG_SHIFT 48
#define SESS_GEN_SHIFT 16
#define SESS_IDX_MASK 0xffffu

_Static_assert(CHM_SESSION_MAX < SESS_IDX_MASK, "session index fits 16 bits");

chm_session chm_sess_token(const struct chm_dev *dev, uint32_t idx)
{
	return ((uint64_t)dev->tag << SESS_TAG_SHIFT) |
	       ((uint64_t)dev->sess[idx].gen << SESS_GEN_SHIFT) | idx;
}

int chm_sess_init(struct chm_dev *dev)
{
	dev->nsess = CHM_SESSION_MAX + 1;
	dev->sess = calloc(dev->nsess, sizeof(*dev->sess));
	if (!dev->sess)
		return -ENOMEM;
	for (uint32_t i = 0; i < dev->nsess; i++) {
		dev->sess[i].gen = 1;
		/* the free list: 1..CHM_SESSION_MAX in order */
		dev->sess[i].rr_next = i > 0 && i + 1 < dev->nsess ? i + 2 : 0;
	}
	dev->sess[0].open = true;
	dev->sess[0].quota = UINT32_MAX;
	dev->sess_free = dev->nsess > 1 ? 2 : 0;
	dev->rr_head = dev->rr_tail = 0;
	return 0;
}

void chm_sess_fini(struct chm_dev *dev)
{
	free(dev->sess);
	dev->sess = NULL;
	dev->nsess = 0;
}

int chm_sess_lookup(struct chm_dev *dev, chm_session s, uint32_t *idx)
{
	if (s == CHM_SESSION_DEFAULT) {
		*idx = 0;
		return 0;
	}
	uint32_t i = (uint32_t)(s & SESS_IDX_MASK);
	uint64_t gen = (s >> SESS_GEN_SHIFT) & UINT32_MAX;
	if ((uint16_t)(s >> SESS_TAG_SHIFT) != dev->tag || i == 0 || i >= dev->nsess || gen == 0)
		return chm_detail(-EINVAL, "session %#llx is not one of this device's",
		                  (unsigned long long)s);
	if (!dev->sess[i].open || dev->sess[i].gen != gen)
		return chm_detail(-ESTALE, "session %#llx is closed", (unsigned long long)s);
	*idx = i;
	return 0;
}

int chm_sess_admit(struct chm_dev *dev, uint32_t si)
{
	const struct chm_sess *ss = &dev->sess[si];
	if (ss->used >= ss->quota)
		return chm_detail(-EAGAIN, "prefetch: the session's quota (%u) is in use",
		                  ss->quota);
	return 0;
}

void chm_sess_charge(struct chm_dev *dev, struct chm_slot *s, uint32_t si)
{
	s->sess = (int32_t)si;
	dev->sess[si].used++;
}

void chm_sess_uncharge(struct chm_dev *dev, struct chm_slot *s)
{
	if (s->sess < 0)
		return;
	dev->sess[s->sess].used--;
	s->sess = -1;
}

static void rr_append(struct chm_dev *dev, uint32_t si)
{
	struct chm_sess *ss = &dev->sess[si];
	ss->rr_next = 0;
	ss->in_rr = true;
	if (dev->rr_tail)
		dev->sess[dev->rr_tail - 1].rr_next = si + 1;
	else
		dev->rr_head = si + 1;
	dev->rr_tail = si + 1;
}

/* Takes session si out of the ring, wherever it is. */
static void rr_remove(struct chm_dev *dev, uint32_t si)
{
	uint32_t prev = 0;
	for (uint32_t q = dev->rr_head; q; prev = q, q = dev->sess[q - 1].rr_next) {
		if (q != si + 1)
			continue;
		if (prev)
			dev->sess[prev - 1].rr_next = dev->sess[si].rr_next;
		else
			dev->rr_head = dev->sess[si].rr_next;
		if (dev->rr_tail == si + 1)
			dev->rr_tail = prev;
		break;
	}
	dev->sess[si].rr_next = 0;
	dev->sess[si].in_rr = false;
}

void chm_sess_enqueue(struct chm_dev *dev, struct chm_req *r)
{
	struct chm_sess *ss = &dev->sess[r->sess];
	uint32_t ri = (uint32_t)(r - dev->reqs) + 1;
	r->qnext = 0;
	if (ss->q_tail)
		dev->reqs[ss->q_tail - 1].qnext = ri;
	else
		ss->q_head = ri;
	ss->q_tail = ri;
	ss->used++;
	chm_ctr32_add(&dev->q_len, 1); /* read without the lock */
	if (!ss->in_rr)
		rr_append(dev, r->sess);
}

void chm_sess_unqueue(struct chm_dev *dev, struct chm_req *r)
{
	struct chm_sess *ss = &dev->sess[r->sess];
	uint32_t ri = (uint32_t)(r - dev->reqs) + 1, prev = 0;
	for (uint32_t q = ss->q_head; q; prev = q, q = dev->reqs[q - 1].qnext) {
		if (q != ri)
			continue;
		if (prev)
			dev->reqs[prev - 1].qnext = r->qnext;
		else
			ss->q_head = r->qnext;
		if (ss->q_tail == ri)
			ss->q_tail = prev;
		break;
	}
	r->qnext = 0;
	ss->used--;
	chm_ctr32_add(&dev->q_len, -1);
	if (!ss->q_head)
		rr_remove(dev, r->sess);
}

struct chm_req *chm_sess_dequeue(struct chm_dev *dev)
{
	if (!dev->rr_head)
		return NULL;
	uint32_t si = dev->rr_head - 1;
	struct chm_sess *ss = &dev->sess[si];
	struct chm_req *r = &dev->reqs[ss->q_head - 1];
	ss->q_head = r->qnext;
	if (!ss->q_head)
		ss->q_tail = 0;
	r->qnext = 0;
	ss->used--; /* the slot it is granted is charged instead */
	chm_ctr32_add(&dev->q_len, -1);
	/* its turn is over: to the end of the ring, or out of it */
	dev->rr_head = ss->rr_next;
	if (!dev->rr_head)
		dev->rr_tail = 0;
	ss->rr_next = 0;
	ss->in_rr = false;
	if (ss->q_head)
		rr_append(dev, si);
	return r;
}
