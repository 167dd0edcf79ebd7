/*
 * resident.pml - Promela model of the resident region of prefetch mode
 * (fw_spec/resident.yaml, invariants R1..R4; fw_spec/README.md §12).
 *
 * Objects are numbered 1..NOBJ and their bytes are versions: ver[o] is the
 * version of the newest admitted write of o. Slot and entry memory hold a
 * version of the object they stage. Two requesters each loop: prefetch an
 * object (a resident hit holds an entry; a miss takes a window slot, whose
 * fill lands with the newest version, write-buffer overlay included), read
 * the view (every scan must see the bytes the view had at its wait, R3),
 * release with or without CHM_PF_RETAIN (a retain exchanges the slot's
 * buffer with an EMPTY or evicted entry's). A writer admits writes (each
 * drops the unheld entries over it, makes held ones STALE and marks held
 * slots stale), and an evictor calls chm_resident_evict. Every command is
 * one atomic step under the device lock; views are read outside it.
 *
 * Run: python3 fw_spec/check_model.py -r resident
 */

#ifndef NOBJ
#define NOBJ		2
#endif
#define NENT		2	/* resident entries */
#define NSLOTS		2	/* staging window slots */
#define NUSERS		2
#define NWRITES		2
#define MAXVER		(NWRITES + 1)

#define RES_EMPTY	0
#define RES_RESIDENT	1
#define RES_HELD	2
#define RES_STALE	3

#define SLOT_FREE	0
#define SLOT_HELD	3

/* The entry transition table. tests/spec/test_model_check.py compares these
 * rows with fw_spec/resident.yaml. */
#define RES_LEGAL(f, t) ( \
	(f == RES_EMPTY && t == RES_RESIDENT) ||	/* retain */ \
	(f == RES_RESIDENT && t == RES_HELD) ||		/* hit */ \
	(f == RES_HELD && t == RES_RESIDENT) ||		/* unhold_last */ \
	(f == RES_RESIDENT && t == RES_EMPTY) ||	/* evict */ \
	(f == RES_HELD && t == RES_STALE) ||		/* write_held */ \
	(f == RES_STALE && t == RES_EMPTY))		/* unhold_last */

hidden byte R1 = 1;	/* residency never takes a slot from the window */
hidden byte R2 = 1;	/* a resident hit returns the newest bytes */
hidden byte R3 = 1;	/* a held resident view is a snapshot */
hidden byte R4 = 1;	/* entry accounting sums */

#define CHECK(id, e)	assert(id && (e))

typedef ent_t {
	byte state;
	byte obj;
	byte ver;	/* version the entry memory shows */
	byte holders;
};

typedef slot_t {
	byte state;
	byte obj;
	byte ver;
	bit stale;	/* held and written over since its wait (W11) */
};

ent_t ent[NENT];
slot_t slot[NSLOTS];
byte ver[NOBJ + 1];
byte used;		/* resident_entries_used */
/* temporaries of atomic steps only (never live across a step): hidden, so
 * they add no states */
hidden byte _i, _k, _n, _f, _tmp, _free0;

inline res_set(i, to)
{
	CHECK(R4, RES_LEGAL(ent[i].state, to));
	if
	:: ent[i].state == RES_EMPTY -> used++
	:: else -> skip
	fi;
	ent[i].state = to;
	if
	:: to == RES_EMPTY -> used--
	:: else -> skip
	fi
}

/* R4 at a moment the lock is free */
inline accounting()
{
	_n = 0;
	for (_k : 0 .. NENT - 1) {
		if
		:: ent[_k].state != RES_EMPTY -> _n++
		:: else -> skip
		fi;
		CHECK(R4, (ent[_k].holders > 0) == (ent[_k].state == RES_HELD || ent[_k].state == RES_STALE));
	}
	CHECK(R4, _n == used)
}

inline hit_lookup(o, e)
{
	e = NENT;
	for (_i : 0 .. NENT - 1) {
#ifdef BUG_HIT_STALE
		if
		:: e == NENT && ent[_i].obj == o && ent[_i].state != RES_EMPTY -> e = _i
		:: else -> skip
		fi
#else
		if
		:: e == NENT && ent[_i].obj == o &&
		   (ent[_i].state == RES_RESIDENT || ent[_i].state == RES_HELD) -> e = _i
		:: else -> skip
		fi
#endif
	}
}

/* an EMPTY entry, else the least recently used RESIDENT one (any here:
 * the model lets the victim be any unheld entry), else NENT */
inline victim(e)
{
	e = NENT;
	for (_i : 0 .. NENT - 1) {
		if
		:: e == NENT && ent[_i].state == RES_EMPTY -> e = _i
		:: else -> skip
		fi
	}
	if
	:: e == NENT ->
		for (_i : 0 .. NENT - 1) {
			if
#ifdef BUG_RETAIN_INTO_HELD
			:: e == NENT && ent[_i].state != RES_EMPTY -> e = _i
#else
			:: e == NENT && ent[_i].state == RES_RESIDENT -> e = _i
#endif
			:: else -> skip
			fi
		};
		if
		:: e < NENT && ent[e].state == RES_RESIDENT -> res_set(e, RES_EMPTY)	/* evict */
		:: else -> skip	/* (the bug: a HELD or STALE entry, taken as it is) */
		fi
	:: else -> skip
	fi
}

proctype user()
{
	byte o, e, s, vv, rounds = 0;
	bit retain;
	do
	:: rounds < 2 ->
		rounds++;
		select(o : 1 .. NOBJ);
		select(retain : 0 .. 1);
		atomic {
			hit_lookup(o, e);
			if
			:: e < NENT ->
				if
				:: ent[e].state == RES_RESIDENT -> res_set(e, RES_HELD)	/* hit */
				:: else -> skip
				fi;
				ent[e].holders++;
				vv = ent[e].ver;
				CHECK(R2, vv == ver[o]);
				accounting()
			:: else ->
				/* a miss: a free slot (the requesters never hold more
				 * than one each, so there is one), filled with the
				 * newest bytes (fill_done overlays the write buffer) */
				s = NSLOTS;
				for (_i : 0 .. NSLOTS - 1) {
					if
					:: s == NSLOTS && slot[_i].state == SLOT_FREE -> s = _i
					:: else -> skip
					fi
				};
				CHECK(R1, s < NSLOTS);
				slot[s].state = SLOT_HELD;
				slot[s].obj = o;
				slot[s].ver = ver[o];
				slot[s].stale = 0;
				vv = ver[o]
			fi
		}
		/* scans of the view, outside the lock */
		if
		:: e < NENT -> CHECK(R3, ent[e].ver == vv && ent[e].obj == o)
		:: else -> CHECK(R3, slot[s].ver == vv)
		fi;
		if
		:: e < NENT -> CHECK(R3, ent[e].ver == vv && ent[e].obj == o)
		:: else -> CHECK(R3, slot[s].ver == vv)
		fi;
		atomic {
			if
			:: e < NENT ->
				ent[e].holders--;
				if
				:: ent[e].holders == 0 && ent[e].state == RES_STALE ->
					res_set(e, RES_EMPTY)	/* unhold_last */
				:: ent[e].holders == 0 && ent[e].state == RES_HELD ->
					res_set(e, RES_RESIDENT)	/* unhold_last */
				:: else -> skip
				fi
			:: else ->
				_free0 = 0;
				for (_k : 0 .. NSLOTS - 1) {
					if
					:: slot[_k].state == SLOT_FREE -> _free0++
					:: else -> skip
					fi
				};
				if
				:: retain && !slot[s].stale ->
					hit_lookup(o, e);
					if
					:: e == NENT ->
						victim(e);
						if
						:: e < NENT ->
							/* exchange: the entry takes the slot's memory */
							_tmp = ent[e].ver;
							ent[e].ver = slot[s].ver;
							slot[s].ver = _tmp;
							ent[e].obj = o;
							if
							:: ent[e].state == RES_EMPTY -> res_set(e, RES_RESIDENT)	/* retain */
							:: else -> skip	/* BUG_RETAIN_INTO_HELD */
							fi
						:: else -> skip
						fi
					:: else -> skip	/* already resident */
					fi;
					e = NENT
				:: else -> skip
				fi;
				slot[s].state = SLOT_FREE;
				slot[s].obj = 0;
				slot[s].ver = 0;
				_free0++;
				/* the window has its slots back, one for one */
				_f = 0;
				for (_k : 0 .. NSLOTS - 1) {
					if
					:: slot[_k].state == SLOT_FREE -> _f++
					:: else -> skip
					fi
				};
				CHECK(R1, _f == _free0)
			fi;
			accounting();
			o = 0; e = 0; s = 0; vv = 0; retain = 0
		}
	:: else -> break
	od
}

proctype writer()
{
	byte o, n = 0;
	do
	:: n < NWRITES ->
		n++;
		select(o : 1 .. NOBJ);
		atomic {
			ver[o]++;
			/* admit: staged copies and entries over it, in the same step */
			for (_k : 0 .. NSLOTS - 1) {
				if
				:: slot[_k].state == SLOT_HELD && slot[_k].obj == o -> slot[_k].stale = 1
				:: else -> skip
				fi
			};
			for (_k : 0 .. NENT - 1) {
				if
				:: ent[_k].obj == o && ent[_k].state == RES_RESIDENT -> res_set(_k, RES_EMPTY)
				:: ent[_k].obj == o && ent[_k].state == RES_HELD -> res_set(_k, RES_STALE)
				:: else -> skip
				fi
			};
			accounting();
			o = 0
		}
	:: else -> break
	od
}

proctype evictor()
{
	byte o;
	select(o : 1 .. NOBJ);
	atomic {
		for (_k : 0 .. NENT - 1) {
			if
			:: ent[_k].obj == o && ent[_k].state == RES_RESIDENT -> res_set(_k, RES_EMPTY)
			:: ent[_k].obj == o && ent[_k].state == RES_HELD -> res_set(_k, RES_STALE)
			:: else -> skip
			fi
		};
		accounting()
	}
}

init {
	atomic {
		byte u;
		for (u : 1 .. NUSERS) {
			run user()
		};
		run writer();
		run evictor()
	}
}
