/*
 * staging.pml - Promela model of the chm staging window (slots, request
 * entries and handles, bounded FIFO refill queue, refill engine) and of the
 * write buffer with its flusher, as specified in fw_spec/README.md and
 * fw_spec/staging.yaml, fw_spec/wbuf.yaml.
 *
 * Processes: NUSERS requesters doing prefetch / wait / release (and stale
 * calls on released handles), one writer doing write / flush barrier, the
 * refill engine (fill completions in any order, each may fail -EIO), the
 * flusher (batches that may fail, reclaim), a closer that closes the device
 * at any moment or never, and a monitor that checks the state invariants in
 * every reachable state.
 *
 * Every device call is one atomic step, as a call under the device lock; a
 * blocking wait or flush barrier gives the lock up while it is blocked.
 *
 * CHECK(id, expr) asserts invariant `id` of the spec. The id is a hidden
 * constant that pan and `spin -t` print as part of the failed assertion.
 * Progress properties are the ltl blocks at the end (weak fairness).
 *
 * Sizes can be overridden with -D (spin -DROUNDS=2 ...). STAGING=0 or WBUF=0
 * leaves the requesters and engine, or the writer and flusher, out of a run.
 * DATA=1 adds the bytes of one object as a version number: every write
 * covers object DOBJ (handle 0 of requester 0), a slot holding it carries
 * the version its memory shows, and the requester reads the object with
 * chm_read while it holds a view (W10 read-your-writes, W11 snapshots).
 * READER=1 adds a reader that copies hits of DOBJ the way the C core does:
 * pin under the lock, copy without it, unpin (S17). A slot written over
 * (behind) is brought up to date the same way by whoever holds its last
 * pin: the writer, the fill completion or the last hit re-overlays the log
 * with the lock dropped, again if a write lands meanwhile (S18).
 * Broken variants in fw_spec/broken/ define one BUG_* and include this file.
 *
 * Run: python3 fw_spec/check_model.py fw_spec/staging.pml
 */

#ifndef NSLOTS
#define NSLOTS		3	/* slot_count */
#endif
#ifndef QCAP
#define QCAP		1	/* refill_queue */
#endif
#define NREQS		(NSLOTS + QCAP)	/* request entries, as in the device */
#ifndef NUSERS
#define NUSERS		2	/* requester processes */
#endif
#ifndef NH
#define NH		2	/* handles a requester keeps in flight */
#endif
#ifndef ROUNDS
#define ROUNDS		1	/* issue-consume rounds per requester */
#endif
#ifndef NWRITES
#define NWRITES		3	/* writes by the writer, seq 1..NWRITES */
#endif
#ifndef STAGING
#define STAGING		1
#endif
#ifndef WBUF
#define WBUF		1
#endif
#ifndef CLOSER
#define CLOSER		1	/* a closer process */
#endif
#ifndef FILL_ERRORS
#define FILL_ERRORS	1	/* fills may fail with -EIO */
#endif
#ifndef DATA
#define DATA		0	/* model object DOBJ's bytes as a version */
#endif
#define DOBJ		1	/* the object every write covers (DATA=1) */
#ifndef READER
#define READER		0	/* a reader copying pinned hits (needs DATA) */
#endif
#define NREADS		2	/* hits the reader copies */
#ifndef EXTRAS
#define EXTRAS		1	/* NOQUEUE prefetch, repeated and stale calls */
#endif
#define NWB		2	/* write-buffer entries (space in units of one write) */
#define WB_HIGH		2	/* high-water mark: flushing is forced at this use */

#if NSLOTS != 3 || NUSERS * NH > 4 || NUSERS > 2 || NREQS > 5 || NWRITES > 3
#error "the expanded invariant expressions below assume these sizes"
#endif

/* enum chm_slot_state */
#define SLOT_FREE	0
#define SLOT_FILLING	1
#define SLOT_READY	2
#define SLOT_HELD	3
#define SLOT_FAILED	4
#define SLOT_DRAINING	5

/* enum chm_req_state (csrc/dev.h) */
#define R_FREE		0
#define R_QUEUED	1
#define R_SLOTTED	2
#define R_RESIDENT	3	/* a resident hit: modelled in resident.pml, not here */

/* enum chm_wbuf_state */
#define WB_FREE		0
#define WB_ADMITTED	1
#define WB_FLUSHING	2
#define WB_DURABLE	3
#define WB_SKIPPED	4

/* call results: 0, CHM_WRITE_SKIPPED, or the errno a call returns negated */
#define OK		0
#define SKIPPED		1
#define EIO		5
#define EAGAIN		11
#define ETIMEDOUT	110
#define ESTALE		116
#define ECANCELED	125
#define BLOCKED		255	/* model only: the caller is blocked */

#define NOREQ		255

/* The transition tables. tests/spec/test_model_check.py compares these rows
 * with fw_spec/staging.yaml and fw_spec/wbuf.yaml. */
#define SLOT_LEGAL(f, t) ( \
	(f == SLOT_FREE && t == SLOT_FILLING) ||	/* fill_start */ \
	(f == SLOT_FILLING && t == SLOT_READY) ||	/* fill_done */ \
	(f == SLOT_FILLING && t == SLOT_FAILED) ||	/* fill_error */ \
	(f == SLOT_FILLING && t == SLOT_FREE) ||	/* fill_done_orphan */ \
	(f == SLOT_READY && t == SLOT_HELD) ||		/* wait */ \
	(f == SLOT_READY && t == SLOT_FREE) ||		/* release */ \
	(f == SLOT_HELD && t == SLOT_FREE) ||		/* release */ \
	(f == SLOT_FAILED && t == SLOT_FREE) ||		/* release */ \
	(f == SLOT_READY && t == SLOT_DRAINING) ||	/* release_pinned */ \
	(f == SLOT_HELD && t == SLOT_DRAINING) ||	/* release_pinned */ \
	(f == SLOT_DRAINING && t == SLOT_FREE))		/* unpin_last */

#define WB_LEGAL(f, t) ( \
	(f == WB_FREE && t == WB_ADMITTED) ||		/* admit */ \
	(f == WB_FREE && t == WB_SKIPPED) ||		/* skip */ \
	(f == WB_ADMITTED && t == WB_FLUSHING) ||	/* flush_start */ \
	(f == WB_FLUSHING && t == WB_DURABLE) ||	/* flush_done */ \
	(f == WB_FLUSHING && t == WB_ADMITTED) ||	/* flush_error */ \
	(f == WB_DURABLE && t == WB_FREE))		/* reclaim */

/* Invariant ids of the fw_spec yaml files (hidden: not in the state vector). */
hidden byte S1 = 1;	/* a slot is never refilled while held */
hidden byte S2 = 1;	/* a view is never handed out before its fill completed */
hidden byte S3 = 1;	/* release frees exactly once */
hidden byte S4 = 1;	/* slot, request and queue accounting always sums */
hidden byte S5 = 1;	/* every slot transition is a row of the table */
hidden byte S6 = 1;	/* at most one fill in flight per slot */
hidden byte S7 = 1;	/* a freed slot goes to the queue head at once (FIFO) */
hidden byte S8 = 1;	/* prefetch never blocks; -EAGAIN only when it must */
hidden byte S9 = 1;	/* a released handle is stale for good */
hidden byte S10 = 1;	/* wait on HELD returns the same view */
hidden byte S13 = 1;	/* close cancels waiters and the queue, drains fills */
hidden byte S14 = 1;	/* a staged object's range is a chm_read hit */
hidden byte S15 = 1;	/* prefetch counters balance when nothing is pending */
hidden byte S17 = 1;	/* a pinned slot is never refilled, freed or patched */
hidden byte S18 = 1;	/* a catch-up copies into a slot nobody else reads */
hidden byte W1 = 1;	/* an admitted write stays readable */
hidden byte W2 = 1;	/* a skipped write changes nothing */
hidden byte W3 = 1;	/* flush barrier 0 => earlier admitted writes durable */
hidden byte W4 = 1;	/* a failed flush is never reported durable */
hidden byte W5 = 1;	/* every wbuf transition is a row of the table */
hidden byte W6 = 1;	/* write-buffer space accounting sums */
hidden byte W10 = 1;	/* views and reads hold every admitted write */
hidden byte W11 = 1;	/* a held view is a snapshot */

#define CHECK(id, e)	assert(id && (e))

typedef slot_t {
	byte state;
	byte req;	/* owning request, NOREQ when free or orphaned */
	byte obj;	/* object held or being filled, 0 when free */
	bit valid;	/* the slot memory holds obj completely */
	bit io;		/* a fill I/O is in flight */
	byte ver;	/* DATA: version of DOBJ the slot memory shows */
	bit stale;	/* HELD and written over since wait (W11) */
	byte pins;	/* hits copying from it without the lock (S17) */
	bit behind;	/* READY, written over: no hits, no wait, until the
			 * holder of its last pin has re-overlaid the log */
	bit repatch;	/* behind, written over again during the catch-up */
};

typedef req_t {
	byte state;
	byte gen;	/* bumped on every free; part of the handle */
	byte slot;
	byte obj;
};

typedef wb_t {
	byte state;
	byte seq;	/* which write the entry holds */
};

slot_t slot[NSLOTS];
req_t req[NREQS];
byte q[QCAP];			/* refill FIFO of request indices */
byte qlen;
byte nslot[6];			/* slot count by state (stats slots_*) */
bit pending[5];			/* issued, not yet READY/FAILED/released */
byte view[4];		/* slot+1 of the live view of handle v, or 0 */
byte vsnap[4];		/* DATA: the version view v showed at wait */
byte nwaiting;			/* callers blocked in wait or flush */
bit user_waiting[2];
byte issued, completed, failed, cancelled;

wb_t wb[NWB];
byte nwb[5];			/* entry count by state */
bit admitted[NWRITES + 1];	/* ghost: write seq was admitted */
bit durable[NWRITES + 1];	/* ghost: write seq is on the backing store */
bit barrier_pending;
byte barrier_target;		/* newest seq admitted before the barrier */
bit barrier_err;		/* a covered entry failed to flush meanwhile */
byte last_admitted;
byte logpins;			/* behind slots: the log is not reclaimed */

bit closing, closed;

/* ---- state invariants, checked by the monitor in every state ---- */

/* S1/S2: a live view points at its own completed, held fill (the object
 * of handle v is v + 1). */
#define VIEW_OK(v) (v >= NUSERS * NH -> 1 : VIEW_OK_(v))
#define VIEW_OK_(v) (view[v] == 0 || \
	(slot[view[v] - 1].state == SLOT_HELD && slot[view[v] - 1].valid && \
	 !slot[view[v] - 1].io && slot[view[v] - 1].obj == v + 1))
#define INV_S1 (VIEW_OK(0) && VIEW_OK(1) && VIEW_OK(2) && VIEW_OK(3))

#define SCOUNT(st) ((slot[0].state == st) + (slot[1].state == st) + \
		    (slot[2].state == st))
#define RSTATE(i) (i < NREQS -> req[i].state : R_FREE)
#define RCOUNT(st) ((RSTATE(0) == st) + (RSTATE(1) == st) + (RSTATE(2) == st) + \
		    (RSTATE(3) == st) + (RSTATE(4) == st))
#define OWNED(i) (slot[i].req != NOREQ)
#define LINK_OK(i) (!OWNED(i) || (slot[i].state != SLOT_FREE && \
	req[slot[i].req].state == R_SLOTTED && req[slot[i].req].slot == i))
/* S4: counters match the slots and sum to slot_count; every owned slot
 * and every queued request belongs to exactly one live request. */
#define INV_S4 (nslot[0] == SCOUNT(0) && nslot[1] == SCOUNT(1) && \
	nslot[2] == SCOUNT(2) && nslot[3] == SCOUNT(3) && nslot[4] == SCOUNT(4) && \
	nslot[5] == SCOUNT(5) && \
	nslot[0] + nslot[1] + nslot[2] + nslot[3] + nslot[4] + nslot[5] == NSLOTS && \
	qlen <= QCAP && RCOUNT(R_QUEUED) == qlen && \
	RCOUNT(R_SLOTTED) == OWNED(0) + OWNED(1) + OWNED(2) && \
	LINK_OK(0) && LINK_OK(1) && LINK_OK(2))
#define INV_S7 (qlen == 0 || nslot[SLOT_FREE] == 0)
/* S6: a slot has a fill in flight exactly when it is FILLING */
#define INV_S6 ((slot[0].io == (slot[0].state == SLOT_FILLING)) && \
	(slot[1].io == (slot[1].state == SLOT_FILLING)) && \
	(slot[2].io == (slot[2].state == SLOT_FILLING)))

#define WB_HOLDS(e, s) (wb[e].state != WB_FREE && wb[e].seq == s)
#define READABLE(s) (s > NWRITES || !admitted[s] || durable[s] || \
	WB_HOLDS(0, s) || WB_HOLDS(1, s))
#define INV_W1 (READABLE(1) && READABLE(2) && READABLE(3))
/* W11: every live view still shows the version it showed at wait */
#define SNAP_OK(v) (view[v] == 0 || slot[view[v] - 1].ver == vsnap[v])
#define INV_W11 (SNAP_OK(0) && SNAP_OK(1) && SNAP_OK(2) && SNAP_OK(3))
#define INV_W6 (nwb[WB_FREE] + nwb[WB_ADMITTED] + nwb[WB_FLUSHING] + \
	nwb[WB_DURABLE] == NWB && nwb[WB_SKIPPED] == 0 && \
	nwb[WB_FREE] == (wb[0].state == WB_FREE) + (wb[1].state == WB_FREE))

proctype monitor()
{
end:	atomic {
		!(INV_S1 && INV_S4 && INV_S6 && INV_S7 && INV_W1 && INV_W6 &&
		  INV_W11) ->
		CHECK(S1, INV_S1);
		CHECK(S4, INV_S4);
		CHECK(S6, INV_S6);
		CHECK(S7, INV_S7);
		CHECK(W1, INV_W1);
		CHECK(W6, INV_W6);
		CHECK(W11, INV_W11)
	}
}

/* ---- the staging window ---- */

inline slot_set(i, to)
{
	CHECK(S5, SLOT_LEGAL(slot[i].state, to));
	nslot[slot[i].state]--;
	nslot[to]++;
	slot[i].state = to
}

inline wb_set(e, to)
{
	CHECK(W5, WB_LEGAL(wb[e].state, to));
	nwb[wb[e].state]--;
	nwb[to]++;
	wb[e].state = to
}

/* FREE -> FILLING for request r */
inline fill_start(i, r)
{
	for (vi : 0 .. NUSERS * NH - 1) {
		CHECK(S1, view[vi] != i + 1)
	}
	vi = 0;
	CHECK(S6, !slot[i].io);
	CHECK(S17, slot[i].pins == 0);
	slot_set(i, SLOT_FILLING);
	slot[i].req = r;
	slot[i].obj = req[r].obj;
	slot[i].valid = 0;
	slot[i].ver = 0;
	slot[i].stale = 0;
	slot[i].io = 1
}

/* Slot i became FREE: the refill queue head takes it (FIFO). */
inline grant(i)
{
	if
	:: qlen > 0 ->
		gr = q[0];
		for (gi : 1 .. QCAP - 1) {
			q[gi - 1] = q[gi]
		}
		q[QCAP - 1] = 0;
		qlen--;
		gi = 0;
		req[gr].state = R_SLOTTED;
		req[gr].slot = i;
		fill_start(i, gr);
		gr = 0
	:: else
	fi
}

inline req_free(r)
{
	req[r].state = R_FREE;
	req[r].slot = 0;
	req[r].obj = 0;
	req[r].gen++;
	pending[r] = 0
}

/* chm_prefetch_object(); flags CHM_PF_NOQUEUE when noqueue */
/* READY slot i is written over: no hits, no wait; the log is pinned. */
inline make_behind(i)
{
	slot[i].behind = 1;
	logpins++
}

/* Drops a pin of slot p; the last one frees a DRAINING slot. */
inline unpin(p)
{
	atomic {
		slot[p].pins--;
		if
		:: slot[p].pins == 0 && slot[p].state == SLOT_DRAINING ->
			if
			:: slot[p].behind -> slot[p].behind = 0; logpins--
			:: else
			fi;
			slot[p].valid = 0;
			slot[p].obj = 0;
			slot_set(p, SLOT_FREE);		/* unpin_last */
			grant(p)
		:: else
		fi
	}
}

/* The catch-up of behind slot p by the holder of its only pin (S18): with
 * the lock dropped it lays over what the log held under the lock (cv),
 * again while a write admitted meanwhile set repatch, unless the slot was
 * released meanwhile; then, in the same step, behind ends and the pin is
 * dropped (unpin). The copy is a step of its own, between steps under the
 * lock. */
inline catch_up(p, cv)
{
	atomic {
		slot[p].repatch = 0;
		cv = last_admitted
	}
	do
	:: atomic {	/* the copy, lock dropped: the pin holds (S17) and
			 * nobody else reads the slot (S18) */
		CHECK(S17, slot[p].obj == DOBJ &&
		      (slot[p].state == SLOT_READY || slot[p].state == SLOT_DRAINING));
		CHECK(S18, slot[p].pins == 1 && slot[p].behind);
		slot[p].ver = cv
	}
		atomic {
			if
			:: slot[p].repatch && slot[p].state != SLOT_DRAINING ->
				slot[p].repatch = 0;
				cv = last_admitted
			:: else ->
				slot[p].repatch = 0;
				slot[p].behind = 0;
				logpins--;
				unpin(p);
				break
			fi
		}
	od;
	cv = 0
}

inline do_prefetch(k, noqueue)
{
	atomic {
		if
		:: closing -> ret = ECANCELED; dead = 1
		:: else ->
			s = NSLOTS;
			for (i : 0 .. NSLOTS - 1) {
				if
				:: s == NSLOTS && slot[i].state == SLOT_FREE -> s = i
#ifdef BUG_GRANT_HELD
				/* bug: with no slot free, a HELD slot is reused */
				:: s == NSLOTS && slot[i].state == SLOT_HELD &&
				   nslot[SLOT_FREE] == 0 -> s = i
#endif
				:: else
				fi
			}
			if
			:: s == NSLOTS && (noqueue || qlen == QCAP) ->
				ret = EAGAIN
			:: else ->
				r = NREQS;
				for (i : 0 .. NREQS - 1) {
					if
					:: r == NREQS && req[i].state == R_FREE -> r = i
					:: else
					fi
				}
				CHECK(S4, r < NREQS);
				req[r].obj = u * NH + k + 1;
				pending[r] = 1;
				issued++;
				if
				:: s < NSLOTS ->
					req[r].state = R_SLOTTED;
					req[r].slot = s;
					fill_start(s, r)
				:: else ->
					req[r].state = R_QUEUED;
					q[qlen] = r;
					qlen++
				fi;
				hi[k] = r;
				hg[k] = req[r].gen;
				live[k] = 1;
				ret = OK
			fi;
			CHECK(S8, ret == OK || (nslot[SLOT_FREE] == 0 &&
						(noqueue || qlen == QCAP)))
		fi;
		i = 0;
		r = 0;
		s = 0
	}
}

/* the slot of request r is not FILLING: hand out the view, or -EIO */
inline wait_finish(k)
{
	s = req[r].slot;
	if
	:: slot[s].state == SLOT_READY ->
		CHECK(S2, slot[s].valid && !slot[s].io && slot[s].req == r &&
		      slot[s].obj == req[r].obj);
		/* W10: the view holds every write admitted before wait */
		CHECK(W10, !DATA || slot[s].obj != DOBJ || slot[s].ver == last_admitted);
		slot_set(s, SLOT_HELD);
		view[u * NH + k] = s + 1;
		vsnap[u * NH + k] = slot[s].ver;
		ret = OK
	:: slot[s].state == SLOT_HELD ->
		CHECK(S10, view[u * NH + k] == s + 1);
		ret = OK
	:: slot[s].state == SLOT_FAILED ->
		ret = EIO
	:: else ->
		CHECK(S2, false)
	fi;
	/* S14: chm_read of the object is now a hit from this slot */
	CHECK(S14, ret != OK || (slot[s].state == SLOT_HELD && slot[s].valid &&
				 slot[s].obj == u * NH + k + 1))
}

/* chm_prefetch_wait(); timeout 0 (poll) or forever */
inline do_wait(k, forever)
{
	atomic {
		r = hi[k];
		if
		:: closing -> ret = ECANCELED; dead = 1
		:: !closing && (req[r].gen != hg[k] || req[r].state == R_FREE) ->
			ret = ESTALE
		:: !closing && req[r].gen == hg[k] && req[r].state != R_FREE ->
			if
			:: req[r].state == R_QUEUED ||
			   slot[req[r].slot].state == SLOT_FILLING ||
			   slot[req[r].slot].behind ->
				if
				:: !forever -> ret = ETIMEDOUT
				:: forever ->
					ret = BLOCKED;
					nwaiting++;
					user_waiting[u] = 1
				fi
			:: else -> wait_finish(k)
			fi
		fi
	}
	if
	:: ret == BLOCKED ->
		atomic {
			(closing || (req[r].state == R_SLOTTED &&
				     slot[req[r].slot].state != SLOT_FILLING &&
				     !slot[req[r].slot].behind)) ->
			nwaiting--;
			user_waiting[u] = 0;
			if
			:: closing -> ret = ECANCELED; dead = 1
			:: else -> wait_finish(k)
			fi
		}
	:: else
	fi;
	r = 0;
	s = 0
}

/* chm_read() of object DOBJ (DATA=1): a hit from a staged slot holding it
 * that is not stale, else a miss (the SSD with the write-buffer overlay,
 * which shows the newest admitted write, W1/W7). */
inline do_read()
{
	atomic {
		got = 255;
		for (i : 0 .. NSLOTS - 1) {
			if
			:: got == 255 && slot[i].obj == DOBJ && !slot[i].stale && !slot[i].behind &&
			   (slot[i].state == SLOT_READY || slot[i].state == SLOT_HELD) ->
				got = slot[i].ver
			:: else
			fi
		}
		if
		:: got == 255 -> got = last_admitted	/* miss */
		:: else
		fi;
		CHECK(W10, got == last_admitted);
		i = 0;
		got = 0
	}
}

/* chm_prefetch_release() */
inline do_release(k)
{
	atomic {
		r = hi[k];
		if
		:: closing -> ret = ECANCELED; dead = 1	/* no calls once close began */
		:: else ->
#ifdef BUG_RELEASE_NO_GEN
		/* bug: the generation is not compared */
		if
		:: req[r].state == R_FREE ->
#else
		if
		:: req[r].gen != hg[k] || req[r].state == R_FREE ->
#endif
			ret = ESTALE
		:: else ->
			if
			:: req[r].state == R_QUEUED ->
				/* dropped from the queue */
				for (i : 0 .. QCAP - 1) {
					if
					:: i < qlen && q[i] == r -> s = i
					:: else
					fi
				}
				for (i : s + 1 .. QCAP - 1) {
					q[i - 1] = q[i]
				}
				q[QCAP - 1] = 0;
				qlen--;
				cancelled++
			:: else ->
				s = req[r].slot;
				for (i : 0 .. NUSERS * NH - 1) {
					if
					:: view[i] == s + 1 -> view[i] = 0
					:: else
					fi
				}
				slot[s].req = NOREQ;
				if
				:: slot[s].state == SLOT_FILLING ->
					/* orphaned: fill_done_orphan frees it */
					cancelled++
#ifndef BUG_UNPIN_EARLY
				:: slot[s].state != SLOT_FILLING && slot[s].pins > 0 ->
					/* a hit copies from it: the last unpin frees it */
					slot[s].stale = 0;
					slot_set(s, SLOT_DRAINING)	/* release_pinned */
				:: slot[s].state != SLOT_FILLING && slot[s].pins == 0 ->
#else
				/* bug: the slot is freed under a copy */
				:: else ->
#endif
					slot[s].valid = 0;
					slot[s].obj = 0;
					slot_set(s, SLOT_FREE);
#ifndef BUG_NO_GRANT
					grant(s)
#endif
				fi
			fi;
			req_free(r);
			ret = OK
		fi
		fi;
		i = 0;
		r = 0;
		s = 0
	}
}

inline consume(k)
{
	if
	:: dead || !live[k] -> skip
	:: else ->
		if
		:: skip		/* release without waiting, in any state */
		:: do_wait(k, 0);
			if
			:: ret == ETIMEDOUT -> do_wait(k, 1)
			:: else
			fi;
			if
			:: ret == OK ->
				if
				:: skip
				:: EXTRAS && k == 0 -> do_wait(k, 0); CHECK(S10, ret == OK || dead)
				:: DATA && u == 0 && k == 0 -> do_read()
				fi
			:: else
			fi
		fi;
		if
		:: dead -> skip
		:: else ->
			do_release(k);
			CHECK(S3, ret == OK || dead);
			live[k] = 0;
			if
			:: skip
			:: EXTRAS && k == NH - 1 -> atomic {
				/* the handle is dead now */
				do_release(k);
				CHECK(S3, ret == ESTALE || dead);
				do_wait(k, 0);
				CHECK(S9, ret == ESTALE || dead)
			}
			fi
		fi
	fi
}

proctype user(byte u)
{
	byte hi[NH], hg[NH];
	bit live[NH];
	byte k, round, ret, r, s, i, gi, gr, vi, got;
	bit dead;

	do
	:: dead || round == ROUNDS -> break
	:: else ->
		for (k : 0 .. NH - 1) {
			if
			:: dead -> skip
			:: else ->
				if
				:: do_prefetch(k, 0)
				:: EXTRAS && k == 0 -> do_prefetch(k, 1)
				fi
			fi
		}
		for (k : 0 .. NH - 1) {
			consume(k)
		}
		k = 0;
		round++
	od
}

/* The completion thread: fills finish in any order, ok or -EIO. */
proctype engine()
{
	byte i, r, gi, gr, vi, cv;
	bit ok, catching;

end:	do
	:: atomic {
#ifdef BUG_ORPHAN_LEAK
#define COMPLETES(i) (slot[i].io && slot[i].req != NOREQ)
#else
#define COMPLETES(i) (slot[i].io)
#endif
		if	/* a slot with a fill in flight (NSLOTS == 3) */
		:: COMPLETES(0) -> i = 0
		:: COMPLETES(1) -> i = 1
		:: COMPLETES(2) -> i = 2
		fi;
		if
		:: ok = 1
		:: FILL_ERRORS -> ok = 0
		fi;
		slot[i].io = 0;
		if
		:: slot[i].req == NOREQ ->
			slot[i].obj = 0;
			slot_set(i, SLOT_FREE);		/* fill_done_orphan */
			grant(i)
		:: else ->
			r = slot[i].req;
			pending[r] = 0;
			if
			:: ok ->
				slot[i].valid = 1;
				slot_set(i, SLOT_READY);	/* fill_done */
				completed++;
				/* with buffered writes over it, READY but behind,
				 * and this thread catches it up (W10, S18) */
				if
				:: DATA && slot[i].obj == DOBJ && nwb[WB_FREE] < NWB ->
					slot[i].ver = 0;	/* the SSD's older bytes */
					make_behind(i);
					slot[i].pins++;
					catching = 1
				:: DATA && slot[i].obj == DOBJ && nwb[WB_FREE] == NWB ->
					slot[i].ver = last_admitted
				:: else
				fi
			:: else ->
				slot_set(i, SLOT_FAILED);	/* fill_error */
				failed++
			fi
		fi;
		r = 0;
		ok = 0
	}
	/* the writes the fill missed, laid over without the lock */
	if
	:: catching -> catch_up(i, cv); catching = 0
	:: else
	fi;
	i = 0
	od
}

/* ---- the write buffer ---- */

/* Write w (DATA=1: over object DOBJ) was admitted: READY copies are marked
 * behind and caught up by the holder of their last pin (the writer itself,
 * mine, when no hit copies from it), with the lock dropped (W10, S18); one
 * being caught up already is caught up again (repatch); a HELD copy is a
 * snapshot and is only marked stale (W11). */
inline patch_staged(w)
{
	for (i : 0 .. NSLOTS - 1) {
		if
		:: slot[i].obj == DOBJ && slot[i].state == SLOT_READY && slot[i].behind ->
#ifndef BUG_NO_REPATCH
			slot[i].repatch = 1
#else
			skip	/* bug: the catch-up under way misses this write */
#endif
		:: slot[i].obj == DOBJ && slot[i].state == SLOT_READY && !slot[i].behind &&
		   slot[i].pins == 0 ->
			make_behind(i);
			slot[i].pins++;
			mine = mine | (1 << i)
		:: slot[i].obj == DOBJ && slot[i].state == SLOT_READY && !slot[i].behind &&
		   slot[i].pins > 0 ->
			make_behind(i)	/* the last unpin catches up */
		:: slot[i].obj == DOBJ && slot[i].state == SLOT_HELD ->
#ifdef BUG_PATCH_HELD
			/* bug: the held copy is re-overlaid too, oldest entry
			 * first, while its view is read without the lock: the
			 * oldest entry's bytes land now, the newer ones later */
			slot[i].ver = (wb[0].state != WB_FREE && wb[0].seq < w -> wb[0].seq :
				       (wb[1].state != WB_FREE && wb[1].seq < w -> wb[1].seq : w));
			patch_slot = i + 1
#else
			slot[i].stale = 1
#endif
		:: else
		fi
	}
}

/* chm_write_object() of write number w */
inline do_write(w)
{
	atomic {
		if
		:: closing -> ret = ECANCELED; dead = 1
		:: else ->
			e = NWB;
			for (i : 0 .. NWB - 1) {
				if
				:: e == NWB && wb[i].state == WB_FREE -> e = i
				:: else
				fi
			}
			if
			:: e < NWB ->
				wb_set(e, WB_ADMITTED);		/* admit */
				wb[e].seq = w;
				admitted[w] = 1;
				last_admitted = w;
				if
				:: DATA -> patch_staged(w)
				:: else
				fi;
				ret = OK
			:: else ->
				ret = SKIPPED;			/* skip */
				CHECK(W2, nwb[WB_FREE] == 0 && !admitted[w])
			fi
		fi;
		e = 0;
		i = 0
	}
}

/* Every entry admitted up to barrier_target has reached DURABLE (NWB == 2). */
#ifdef BUG_FLUSH_EARLY
/* bug: only the entries already being flushed are waited for */
#define covered_done() \
	((wb[0].state != WB_FLUSHING || wb[0].seq > barrier_target) && \
	 (wb[1].state != WB_FLUSHING || wb[1].seq > barrier_target))
#else
#define covered_done() \
	((wb[0].state != WB_ADMITTED && wb[0].state != WB_FLUSHING || \
	  wb[0].seq > barrier_target) && \
	 (wb[1].state != WB_ADMITTED && wb[1].state != WB_FLUSHING || \
	  wb[1].seq > barrier_target))
#endif

/* chm_flush(UINT64_MAX) */
inline do_flush()
{
	atomic {
		if
		:: closing -> ret = ECANCELED; dead = 1
		:: else ->
			barrier_pending = 1;
			barrier_target = last_admitted;
			barrier_err = 0;
			ret = BLOCKED;
			nwaiting++
		fi
	}
	if
	:: ret == BLOCKED ->
		atomic {
			(closing || barrier_err || covered_done()) ->
			nwaiting--;
			if
			:: closing -> ret = ECANCELED; dead = 1
			:: !closing && barrier_err -> ret = EIO
			:: !closing && !barrier_err ->
				ret = OK;
				CHECK(W3, (1 > barrier_target || !admitted[1] || durable[1]) &&
				      (2 > barrier_target || !admitted[2] || durable[2]) &&
				      (3 > barrier_target || !admitted[3] || durable[3]))
			fi;
			barrier_pending = 0;
			barrier_target = 0;
			barrier_err = 0
		}
	:: else
	fi
}

#ifdef BUG_PATCH_HELD
byte patch_slot;	/* slot+1 of a held copy half re-overlaid */
#endif

proctype writer()
{
	byte w, ret, e, i, mine, p, cv, gi, gr, vi;
	bit dead;

	w = 1;
	do
	:: dead || w > NWRITES -> break
	:: else ->
		do_write(w);
		/* the READY copies it marked behind, caught up here */
		for (p : 0 .. NSLOTS - 1) {
			if
			:: mine & (1 << p) -> catch_up(p, cv)
			:: else
			fi
		}
		mine = 0;
		p = 0;
#ifdef BUG_PATCH_HELD
		/* the rest of the oldest-first re-overlay, a copy later */
		if
		:: patch_slot > 0 -> atomic {
			if
			:: slot[patch_slot - 1].state == SLOT_HELD &&
			   slot[patch_slot - 1].obj == DOBJ -> slot[patch_slot - 1].ver = w
			:: else
			fi;
			patch_slot = 0
		}
		:: else
		fi;
#endif
		if
		:: skip
		:: !dead -> do_flush()
		fi;
		w++
	od;
	if
	:: !dead -> do_flush()
	:: else
	fi;
	w = 0
}

/* chm_read hits of DOBJ as the C core copies them: pin under the lock, copy
 * with it dropped, unpin; the last pin of a behind slot brings it up to date
 * (catch_up) before it unpins, the last unpin frees a DRAINING slot. */
proctype reader()
{
	byte n, p, pinv, i, gi, gr, vi, cv;
	bit catching;

	do
	:: n == NREADS -> break
	:: else ->
		atomic {
			p = NSLOTS;
			for (i : 0 .. NSLOTS - 1) {
				if
#ifndef BUG_HIT_BEHIND
				:: p == NSLOTS && slot[i].obj == DOBJ && !slot[i].stale &&
				   !slot[i].behind && (slot[i].state == SLOT_READY ||
						       slot[i].state == SLOT_HELD) -> p = i
#else
				/* bug: a slot being caught up serves hits too */
				:: p == NSLOTS && slot[i].obj == DOBJ && !slot[i].stale &&
				   (slot[i].state == SLOT_READY || slot[i].state == SLOT_HELD) -> p = i
#endif
				:: else
				fi
			}
			i = 0;
			if
			:: p < NSLOTS ->
				slot[p].pins++;
				pinv = slot[p].ver;
				CHECK(W10, pinv == last_admitted)
			:: else
			fi
		}
		if
		:: p < NSLOTS ->
			/* the copy, lock dropped: the slot must still hold it */
			atomic {
				CHECK(S17, slot[p].pins > 0 && slot[p].obj == DOBJ &&
				      slot[p].ver == pinv &&
				      (slot[p].state == SLOT_READY || slot[p].state == SLOT_HELD ||
				       slot[p].state == SLOT_DRAINING))
			}
			/* the last pin of a behind slot catches it up first
			 * (and unpins at its end), any other pin unpins now */
			atomic {
				if
				:: slot[p].pins == 1 && slot[p].behind &&
				   slot[p].state != SLOT_DRAINING -> catching = 1
				:: else -> catching = 0; unpin(p)
				fi
			}
			if
			:: catching -> catch_up(p, cv); catching = 0
			:: else
			fi
		:: else
		fi;
		p = 0;
		pinv = 0;
		n++
	od
}

/* Batches every ADMITTED entry when no SSD read is in flight, at high
 * water, for a barrier and at close; the batch is written and synced or fails (-EIO:
 * back to ADMITTED, retried); DURABLE entries are reclaimed. */
proctype flusher()
{
	byte e;
	bit ok;

end:	do
	:: atomic {
		!closed && nwb[WB_ADMITTED] > 0 &&
#ifdef BUG_FLUSH_LAZY
		/* bug: flushes only at high water, a barrier below it hangs */
		(NWB - nwb[WB_FREE] >= WB_HIGH) ->
#else
		(nslot[SLOT_FILLING] == 0 || barrier_pending || closing ||
		 NWB - nwb[WB_FREE] >= WB_HIGH) ->
#endif
		for (e : 0 .. NWB - 1) {
			if
			:: wb[e].state == WB_ADMITTED ->
				wb_set(e, WB_FLUSHING)		/* flush_start */
			:: else
			fi
		}
		e = 0
	}
	atomic {
		if
		:: ok = 1
		:: ok = 0
		fi;
		for (e : 0 .. NWB - 1) {
			if
			:: wb[e].state == WB_FLUSHING && ok ->
				wb_set(e, WB_DURABLE);		/* flush_done */
				durable[wb[e].seq] = 1
			:: wb[e].state == WB_FLUSHING && !ok ->
				wb_set(e, WB_ADMITTED);		/* flush_error */
				CHECK(W4, !durable[wb[e].seq]);
				if
				:: barrier_pending && wb[e].seq <= barrier_target ->
					barrier_err = 1
				:: else
				fi
			:: else
			fi
		}
		e = 0;
		ok = 0
	}
	:: atomic {
		nwb[WB_DURABLE] > 0 && logpins == 0 ->
		for (e : 0 .. NWB - 1) {
			if
			:: wb[e].state == WB_DURABLE ->
				wb_set(e, WB_FREE);		/* reclaim */
				wb[e].seq = 0
			:: else
			fi
		}
		e = 0
	}
	od
}

/* chm_dev_close() at any moment, or never. */
proctype closer()
{
	byte i, r;

	if
	:: skip
	:: atomic {
		closing = 1;
		/* queued requests are dropped */
		for (i : 0 .. QCAP - 1) {
			if
			:: i < qlen ->
				r = q[i];
				req_free(r);
				cancelled++;
				q[i] = 0
			:: else
			fi
		}
		qlen = 0;
		i = 0;
		r = 0
	}
		/* blocked callers leave with -ECANCELED; fills in flight
		 * complete as usual and the flush batch in flight drains */
		atomic {
			nwaiting == 0 && nslot[SLOT_FILLING] == 0 &&
			nwb[WB_FLUSHING] == 0 ->
			CHECK(S13, !slot[0].io && !slot[1].io && !slot[2].io &&
			      qlen == 0);
			/* S15: nothing queued or filling, so every issued
			 * prefetch completed, failed or was cancelled */
			CHECK(S15, issued == completed + failed + cancelled);
			closed = 1
		}
	fi
}

init {
	byte i;

	atomic {
		for (i : 0 .. NSLOTS - 1) {
			slot[i].req = NOREQ
		}
		nslot[SLOT_FREE] = NSLOTS;
		nwb[WB_FREE] = NWB;
#if STAGING
		run engine();
		for (i : 0 .. NUSERS - 1) {
			run user(i)
		}
#endif
#if WBUF
		run flusher();
		run writer();
#endif
#if CLOSER
		run closer();
#endif
#if READER
		run reader();
#endif
		run monitor();
		i = 0
	}
}

/* S11: every issued prefetch ends READY or FAILED (unless it is released
 * or cancelled first). */
ltl S11_fill_progress {
	[] ((pending[0] -> <> !pending[0]) && (pending[1] -> <> !pending[1]) &&
	    (pending[2] -> <> !pending[2]) && (pending[3] -> <> !pending[3]) &&
	    (pending[4] -> <> !pending[4]))
}

/* S12: every blocked wait returns. */
ltl S12_wait_returns {
	[] ((user_waiting[0] -> <> !user_waiting[0]) &&
	    (user_waiting[1] -> <> !user_waiting[1]))
}

/* W8: every flush barrier returns. */
ltl W8_flush_returns {
	[] (barrier_pending -> <> !barrier_pending)
}
