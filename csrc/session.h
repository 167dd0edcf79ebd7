/* session.h - device sessions (session.c): the session table, quotas and
 * the round-robin refill queue, used by the staging window. */
#ifndef CHM_SESSION_H
#define CHM_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "chm.h"

struct chm_dev;
struct chm_req;
struct chm_slot;

/* One session record. A session's refill FIFO holds its QUEUED requests;
 * the sessions with a non-empty FIFO form the round-robin ring. */
struct chm_sess {
	uint32_t gen; /* bumped on close; part of the session token; 1.. */
	bool open;
	uint32_t quota; /* most request entries charged at once */
	/* charged: its queued requests + slots (owned, or orphaned by a
	 * release while filling) */
	uint32_t used;
	uint32_t q_head, q_tail; /* its FIFO (request index+1) */
	uint32_t rr_next;        /* ring link (session index+1); free-list link */
	bool in_rr;
};

/* Allocates the session table with the default session open (staging
 * init). Returns 0 or -ENOMEM. */
int chm_sess_init(struct chm_dev *dev);
/* The token of session record idx (its current generation). */
chm_session chm_sess_token(const struct chm_dev *dev, uint32_t idx);
/* A record whose generation reaches this retires (session_api.c's close). */
#define SESS_GEN_LAST UINT32_MAX
void chm_sess_fini(struct chm_dev *dev);
/* The session index of token s (0 for CHM_SESSION_DEFAULT), -EINVAL
 * (foreign or malformed) or -ESTALE (closed). Lock held. */
int chm_sess_lookup(struct chm_dev *dev, chm_session s, uint32_t *idx);
/* -EAGAIN when session si holds its quota, else 0. Lock held. */
int chm_sess_admit(struct chm_dev *dev, uint32_t si);
/* Charges slot s to session si / uncharges it (no-op when uncharged).
 * Lock held. */
void chm_sess_charge(struct chm_dev *dev, struct chm_slot *s, uint32_t si);
void chm_sess_uncharge(struct chm_dev *dev, struct chm_slot *s);
/* Appends request r to its session's FIFO (charging it); removes it from
 * anywhere in it (uncharging it); pops the next request round-robin across
 * sessions (uncharging it: the slot it is granted is charged instead) or
 * returns NULL. Lock held. */
void chm_sess_enqueue(struct chm_dev *dev, struct chm_req *r);
void chm_sess_unqueue(struct chm_dev *dev, struct chm_req *r);
struct chm_req *chm_sess_dequeue(struct chm_dev *dev);

/* device.c's per-element prefetch check (range, flags, mode), which the
 * session calls share. No lock needed. */
int chm_prefetch_check(const struct chm_dev *dev, uint64_t addr, uint64_t len, uint32_t flags);

#endif /* CHM_SESSION_H */
