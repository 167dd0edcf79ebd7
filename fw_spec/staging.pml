/*
 * staging.pml - Promela model of the chm staging window (slots, refill queue,
 * refill engine, handles) and of the write buffer with its flusher, as
 * specified in fw_spec/README.md and fw_spec/{staging,wbuf}.yaml.
 *
 * Processes: NUSERS requesters doing prefetch / wait / chm_read / release
 * (and stale releases), one writer doing write / flush barrier, the refill
 * engine (fill completions, nondeterministic I/O errors), the flusher
 * (batches, nondeterministic I/O errors, reclaim) and a closer that may or
 * may not close the device at any moment.
 *
 * Every device call is one atomic step, like a call under the device lock;
 * a blocking wait or flush releases it while blocked.
 *
 * Safety: CHECK(id, expr) asserts invariant `id` of the spec; the id is a
 * hidden constant so that pan and `spin -t` print it in the failed assertion.
 * check_all() runs after every state change.
 * Progress: the ltl blocks at the end, checked with weak fairness.
 *
 * Run: python3 fw_spec/check_model.py fw_spec/staging.pml
 * Broken variants (fw_spec/broken/) define BUG_* and include this file.
 */

#define NSLOTS		3	/* slot_count */
#define QCAP		2	/* refill_queue */
#define NREQS		5	/* NSLOTS + QCAP request entries, as in the device */
#define NUSERS		2	/* requester processes */
#define NH		2	/* handles a requester keeps in flight */
#define ROUNDS		1	/* issue-consume rounds per requester */
#define NWB		2	/* write-buffer entries (space in units of one write) */
#define NWRITES		3	/* writes by the writer, seq 1..NWRITES */
#define WB_HIGH		2	/* high-water mark: flushing is forced at this use */

/* enum chm_slot_state */
#define SLOT_FREE	0
#define SLOT_FILLING	1
#define SLOT_READY	2
#define SLOT_HELD	3
#define SLOT_FAILED	4

/* enum chm_req_state (csrc/dev.h) */
#define R_FREE		0
#define R_QUEUED	1
#define R_SLOTTED	2

/* enum chm_wbuf_state */
#define WB_FREE		0
#define WB_ADMITTED	1
#define WB_FLUSHING	2
#define WB_DURABLE	3
#define WB_SKIPPED	4

/* results (positive errno values; calls return the negation) */
#define OK		0
#define SKIPPED		1	/* CHM_WRITE_SKIPPED */
#define EIO		5
#define EAGAIN		11
#define ETIMEDOUT	110
#define ESTALE		116
#define ECANCELED	125
#define BLOCKED		255	/* model only: the call is blocked */

#define NOREQ		255

/* The transition tables; tests/spec/test_model_check.py compares these rows
 * with fw_spec/staging.yaml and fw_spec/wbuf.yaml. */
#define SLOT_LEGAL(f, t) ( \
	(f == SLOT_FREE && t == SLOT_FILLING) ||	/* fill_start */ \
	(f == SLOT_FILLING && t == SLOT_READY) ||	/* fill_done */ \
	(f == SLOT_FILLING && t == SLOT_FAILED) ||	/* fill_error */ \
	(f == SLOT_FILLING && t == SLOT_FREE) ||	/* fill_done_orphan */ \
	(f == SLOT_READY && t == SLOT_HELD) ||		/* wait */ \
	(f == SLOT_READY && t == SLOT_FREE) ||		/* release */ \
	(f == SLOT_HELD && t == SLOT_FREE) ||		/* release */ \
	(f == SLOT_FAILED && t == SLOT_FREE))		/* release */

#define WB_LEGAL(f, t) ( \
	(f == WB_FREE && t == WB_ADMITTED) ||		/* admit */ \
	(f == WB_FREE && t == WB_SKIPPED) ||		/* skip */ \
	(f == WB_ADMITTED && t == WB_FLUSHING) ||	/* flush_start */ \
	(f == WB_FLUSHING && t == WB_DURABLE) ||	/* flush_done */ \
	(f == WB_FLUSHING && t == WB_ADMITTED) ||	/* flush_error */ \
	(f == WB_DURABLE && t == WB_FREE))		/* reclaim */

/* Invariant ids (fw_spec/*.yaml). Hidden: not part of the state vector. */
hidden byte S1 = 1;	/* a slot is never refilled while held */
hidden byte S2 = 1;	/* a view is never handed out before its fill completed */
hidden byte S3 = 1;	/* release frees exactly once */
hidden byte S4 = 1;	/* slot and request accounting always sums */
hidden byte S5 = 1;	/* every slot transition is a row of the table */
hidden byte S6 = 1;	/* at most one fill in flight per slot */
hidden byte S7 = 1;	/* no slot is FREE while a request is queued */
hidden byte S8 = 1;	/* prefetch never blocks; -EAGAIN only when it must */
hidden byte S9 = 1;	/* a released handle is stale forever */
hidden byte S10 = 1;	/* wait on HELD returns the same view */
hidden byte S13 = 1;	/* close cancels waiters, drops the queue, drains fills */
hidden byte S14 = 1;	/* a held object's range is a chm_read hit */
hidden byte W1 = 1;	/* an admitted write stays readable */
hidden byte W2 = 1;	/* a skipped write changes nothing */
hidden byte W3 = 1;	/* flush barrier 0 => all earlier admitted writes durable */
hidden byte W4 = 1;	/* a failed flush is never reported durable */
hidden byte W5 = 1;	/* every wbuf transition is a row of the table */
hidden byte W6 = 1;	/* write-buffer space accounting sums */

#define CHECK(id, e)	assert(id && (e))

/* scratch locals of the inlines, reset to 0 after use */
#define SCRATCH byte ci, cn, cv, vi, gi, gr

typedef slot_t {
	byte state;
	byte req;	/* owning request, NOREQ when free or orphaned */
	byte obj;	/* object held or being filled */
	bit valid;	/* the slot memory holds obj completely */
	bit io;		/* a fill I/O is in flight */
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
byte nslot[5];			/* slot count by state (stats slots_*) */
bit pending[NREQS];		/* issued, not yet READY/FAILED/released */
byte view[NUSERS * NH];		/* slot+1 of a live view, 0: none */
byte view_obj[NUSERS * NH];
byte nwaiting;			/* callers blocked in wait or flush */
bit user_waiting[NUSERS];
byte issued, completed, failed, cancelled;

wb_t wb[NWB];
byte nwb[5];			/* entry count by state */
bit admitted[NWRITES + 1];	/* ghost: write seq was admitted */
bit durable[NWRITES + 1];	/* ghost: write seq is on the backing store */
bit barrier_pending;
byte barrier_target;		/* newest seq admitted before the barrier */
bit barrier_err;		/* a covered entry failed to flush meanwhile */
byte last_admitted;

bit closing, closed;

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

inline check_all()
{
	/* S4: slot counters match the slots and sum to slot_count; the queue
	 * and the live requests fit their bounds */
	cn = 0;
	for (ci : 0 .. 4) {
		cn = cn + nslot[ci]
	}
	CHECK(S4, cn == NSLOTS && qlen <= QCAP);
	for (ci : 0 .. 4) {
		cn = 0;
		for (cv : 0 .. NSLOTS - 1) {
			if
			:: slot[cv].state == ci -> cn++
			:: else
			fi
		}
		CHECK(S4, cn == nslot[ci])
	}
	cn = 0;
	for (ci : 0 .. NREQS - 1) {
		if
		:: req[ci].state != R_FREE -> cn++
		:: else
		fi
	}
	cv = 0;
	for (ci : 0 .. NSLOTS - 1) {
		if
		:: slot[ci].req != NOREQ -> cv++;
			CHECK(S4, slot[ci].state != SLOT_FREE &&
			      req[slot[ci].req].state == R_SLOTTED &&
			      req[slot[ci].req].slot == ci)
		:: else
		fi
	}
	CHECK(S4, cn == cv + qlen);
	/* S7: a freed slot goes to the queue head at once */
	CHECK(S7, qlen == 0 || nslot[SLOT_FREE] == 0);
	/* S1/S2: a live view points at its own completed, held fill */
	for (ci : 0 .. NUSERS * NH - 1) {
		if
		:: view[ci] != 0 ->
			cv = view[ci] - 1;
			CHECK(S1, slot[cv].state == SLOT_HELD && slot[cv].valid &&
			      slot[cv].obj == view_obj[ci] && !slot[cv].io)
		:: else
		fi
	}
	/* W6: wbuf counters sum */
	CHECK(W6, nwb[WB_FREE] + nwb[WB_ADMITTED] + nwb[WB_FLUSHING] +
	      nwb[WB_DURABLE] == NWB && nwb[WB_SKIPPED] == 0);
	/* W1: an admitted write is in the buffer until it is durable */
	for (ci : 1 .. NWRITES) {
		if
		:: admitted[ci] && !durable[ci] ->
			cn = 0;
			for (cv : 0 .. NWB - 1) {
				if
				:: wb[cv].state != WB_FREE && wb[cv].seq == ci -> cn++
				:: else
				fi
			}
			CHECK(W1, cn == 1)
		:: else
		fi
	}
	ci = 0;
	cn = 0;
	cv = 0
}

/* FREE -> FILLING for request r */
inline fill_start(i, r)
{
	for (vi : 0 .. NUSERS * NH - 1) {
		CHECK(S1, view[vi] != i + 1)
	}
	vi = 0;
	CHECK(S6, !slot[i].io);
	slot_set(i, SLOT_FILLING);
	slot[i].req = r;
	slot[i].obj = req[r].obj;
	slot[i].valid = 0;
	slot[i].io = 1
}

/* A slot became FREE: the refill queue head takes it (FIFO). */
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

/* ---- requester calls (u, handle number k; locals of the user process) ---- */

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
				/* bug: under pressure a HELD slot is taken for reuse */
				:: s == NSLOTS && slot[i].state == SLOT_HELD && qlen == 0 -> s = i
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
						(noqueue || qlen == QCAP)));
			check_all()
		fi;
		i = 0;
		r = 0;
		s = 0
	}
}

inline wait_finish(k)
{
	s = req[r].slot;
	if
	:: slot[s].state == SLOT_READY ->
		CHECK(S2, slot[s].valid && !slot[s].io && slot[s].req == r &&
		      slot[s].obj == req[r].obj);
		slot_set(s, SLOT_HELD);
		view[u * NH + k] = s + 1;
		view_obj[u * NH + k] = req[r].obj;
		ret = OK
	:: slot[s].state == SLOT_HELD ->
		CHECK(S10, view[u * NH + k] == s + 1);
		ret = OK
	:: slot[s].state == SLOT_FAILED ->
		ret = EIO
	:: else ->
		CHECK(S2, false)
	fi;
	check_all()
}

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
			   slot[req[r].slot].state == SLOT_FILLING ->
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
				     slot[req[r].slot].state != SLOT_FILLING)) ->
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
				for (i : 0 .. QCAP - 1) {
					if
					:: i < qlen && q[i] == r ->
						s = i
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
					:: view[i] == s + 1 -> view[i] = 0; view_obj[i] = 0
					:: else
					fi
				}
				if
				:: slot[s].state == SLOT_FILLING ->
					/* orphaned: freed by fill_done_orphan */
					slot[s].req = NOREQ;
					cancelled++
				:: else ->
					slot[s].req = NOREQ;
					slot[s].valid = 0;
					slot_set(s, SLOT_FREE);
#ifndef BUG_NO_GRANT
					grant(s)
#endif
				fi
			fi;
			req_free(r);
			ret = OK
		fi;
		fi;
		check_all();
		i = 0;
		r = 0;
		s = 0
	}
}

/* chm_read of the user's own object: a hit when its slot is READY/HELD */
inline do_read(k)
{
	atomic {
		r = hi[k];
		s = NSLOTS;
		for (i : 0 .. NSLOTS - 1) {
			if
			:: (slot[i].state == SLOT_READY || slot[i].state == SLOT_HELD) &&
			   slot[i].valid && slot[i].obj == u * NH + k + 1 -> s = i
			:: else
			fi
		}
		CHECK(S14, s < NSLOTS && s == req[r].slot);
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
			:: ret == ETIMEDOUT ->
				if
				:: skip		/* give up: release while queued/filling */
				:: do_wait(k, 1)
				fi
			:: else
			fi;
			if
			:: ret == OK ->
				if
				:: skip
				:: do_wait(k, 1); CHECK(S10, ret == OK || ret == ECANCELED)
				:: do_read(k)
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
			:: atomic { !closing -> do_release(k); CHECK(S3, ret == ESTALE) }
			:: atomic { !closing -> do_wait(k, 0); CHECK(S9, ret == ESTALE) }
			fi
		fi
	fi
}

proctype user(byte u)
{
	byte hi[NH], hg[NH];
	bit live[NH];
	byte k, round, ret, r, s, i;
	SCRATCH;
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
				:: k == 0 -> do_prefetch(k, 1)	/* CHM_PF_NOQUEUE */
				fi;
				if
				:: ret == EAGAIN -> live[k] = 0
				:: else
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
	byte i, r;
	bit ok;
	SCRATCH;

end:	do
	:: atomic {
		if	/* any slot with a fill in flight (NSLOTS == 3) */
		:: slot[0].io -> i = 0
		:: slot[1].io -> i = 1
		:: slot[2].io -> i = 2
		fi;
		if
		:: ok = 1
		:: ok = 0
		fi;
		slot[i].io = 0;
		if
		:: slot[i].req == NOREQ ->
			slot_set(i, SLOT_FREE);		/* fill_done_orphan */
			grant(i)
		:: else ->
			r = slot[i].req;
			pending[r] = 0;
			if
			:: ok ->
				slot[i].valid = 1;
				slot_set(i, SLOT_READY);	/* fill_done */
				completed++
			:: else ->
				slot_set(i, SLOT_FAILED);	/* fill_error */
				failed++
			fi
		fi;
		check_all();
		i = 0;
		r = 0;
		ok = 0
	}
	od
}

/* ---- write buffer ---- */

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
				ret = OK
			:: else ->
				/* skip: nothing changes */
				i = nwb[WB_FREE];
				ret = SKIPPED;
				CHECK(W2, nwb[WB_FREE] == i && !admitted[w] && i == 0)
			fi;
			check_all()
		fi;
		e = 0;
		i = 0
	}
}

/* Every entry admitted up to barrier_target has reached DURABLE. */
#ifdef BUG_FLUSH_EARLY
/* bug: only entries already being flushed are waited for */
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
				for (i : 1 .. NWRITES) {
					CHECK(W3, i > barrier_target || !admitted[i] || durable[i])
				}
				i = 0
			fi;
			barrier_pending = 0;
			barrier_target = 0;
			barrier_err = 0
		}
	:: else
	fi
}

proctype writer()
{
	byte w, ret, e, i;
	bit dead;
	SCRATCH;

	w = 1;
	do
	:: dead || w > NWRITES -> break
	:: else ->
		do_write(w);
		if
		:: skip
		:: !dead -> do_flush()
		fi;
		w++
	od;
	if
	:: !dead -> do_flush()
	:: else
	fi
}

/* Flushes when the read side is quiet, at high water, for a barrier and at
 * close; a batch is every ADMITTED entry; then fdatasync; errors retry. */
proctype flusher()
{
	byte e;
	bit ok;
	SCRATCH;

end:	do
	:: atomic {
		!closed && nwb[WB_ADMITTED] > 0 &&
#ifdef BUG_FLUSH_LAZY
		/* bug: flushes only at high water, a barrier below it hangs */
		(nwb[WB_ADMITTED] + nwb[WB_FLUSHING] + nwb[WB_DURABLE] >= WB_HIGH) ->
#else
		(nslot[SLOT_FILLING] <= 1 || barrier_pending || closing ||
		 nwb[WB_ADMITTED] + nwb[WB_FLUSHING] + nwb[WB_DURABLE] >= WB_HIGH) ->
#endif
		for (e : 0 .. NWB - 1) {
			if
			:: wb[e].state == WB_ADMITTED -> wb_set(e, WB_FLUSHING)	/* flush_start */
			:: else
			fi
		}
		e = 0;
		check_all()
	}
	atomic {
		if
		:: ok = 1
		:: ok = 0
		fi;
		for (e : 0 .. NWB - 1) {
			if
			:: wb[e].state == WB_FLUSHING && ok ->
				wb_set(e, WB_DURABLE);			/* flush_done */
				durable[wb[e].seq] = 1
			:: wb[e].state == WB_FLUSHING && !ok ->
				wb_set(e, WB_ADMITTED);			/* flush_error */
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
		ok = 0;
		check_all()
	}
	:: atomic {
		nwb[WB_DURABLE] > 0 ->
		for (e : 0 .. NWB - 1) {
			if
			:: wb[e].state == WB_DURABLE ->
				wb_set(e, WB_FREE);			/* reclaim */
				wb[e].seq = 0
			:: else
			fi
		}
		e = 0;
		check_all()
	}
	od
}

/* chm_dev_close at a nondeterministic moment, or never. */
proctype closer()
{
	byte i, r;
	SCRATCH;

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
		r = 0;
		check_all()
	}
		/* waiters leave with -ECANCELED; in-flight fills and the
		 * flush batch drain */
		atomic {
			nwaiting == 0 && nslot[SLOT_FILLING] == 0 &&
			nwb[WB_FLUSHING] == 0 ->
			for (i : 0 .. NSLOTS - 1) {
				CHECK(S13, !slot[i].io)
			}
			CHECK(S13, qlen == 0);
			i = 0;
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
		i = 0;
		nslot[SLOT_FREE] = NSLOTS;
		nwb[WB_FREE] = NWB;
#ifndef NO_STAGING
		run engine();
		for (i : 0 .. NUSERS - 1) {
			run user(i)
		}
#endif
#ifndef NO_WBUF
		run flusher();
		run writer();
#endif
		run closer();
		i = 0
	}
}

/* S11: every issued prefetch ends READY or FAILED (or is released or
 * cancelled first). */
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
