/* states.h - the device's state machines as data. fw_spec/staging.yaml holds the
 * same tables; tests/c/test_spec_tables.c prints these and a test compares. */
#ifndef CHM_STATES_H
#define CHM_STATES_H

#include <assert.h>
#include <stdbool.h>

#include "chm.h"

/* Staging slot states (fw_spec/staging.yaml). Internal: Python and
 * tools see them as names, through chm_state_name(). */
enum chm_slot_state {
	CHM_SLOT_FREE = 0,
	CHM_SLOT_FILLING = 1,
	CHM_SLOT_READY = 2,
	CHM_SLOT_HELD = 3,
	CHM_SLOT_FAILED = 4,
	CHM_SLOT_DRAINING = 5, /* released while hits still copy from it */
};

/* Write-buffer entry states (fw_spec/wbuf.yaml). SKIPPED is never stored:
 * it is the outcome of a write that was not admitted. */
enum chm_wbuf_state {
	CHM_WB_FREE = 0,
	CHM_WB_ADMITTED = 1,
	CHM_WB_FLUSHING = 2,
	CHM_WB_DURABLE = 3,
	CHM_WB_SKIPPED = 4,
};

/* Resident entry states (fw_spec/resident.yaml). */
enum chm_res_state {
	CHM_RES_EMPTY = 0,
	CHM_RES_RESIDENT = 1, /* retained, no view out: hits served, writes patch it */
	CHM_RES_HELD = 2,     /* views out: hits served, writes make it STALE */
	CHM_RES_STALE = 3,    /* held views of bytes a write replaced: no hits */
};

/* LRU line states (fw_spec/lru.yaml). */
enum chm_line_state {
	CHM_LINE_INVALID = 0,
	CHM_LINE_CLEAN = 1,
	CHM_LINE_DIRTY = 2,
	CHM_LINE_WRITING_BACK = 3,
};

struct chm_transition {
	int from;
	int to;
	const char *event; /* the named transition function / event */
};

/* Staging slot: FREE -> FILLING -> READY -> HELD -> FREE, plus FAILED, and
 * DRAINING for a slot released while hits still copy from it. */
static const struct chm_transition chm_slot_transitions[] = {
        {CHM_SLOT_FREE, CHM_SLOT_FILLING, "fill_start"},
        {CHM_SLOT_FILLING, CHM_SLOT_READY, "fill_done"},
        {CHM_SLOT_FILLING, CHM_SLOT_FAILED, "fill_error"},
        {CHM_SLOT_FILLING, CHM_SLOT_FREE, "fill_done_orphan"}, /* released while filling */
        {CHM_SLOT_READY, CHM_SLOT_HELD, "wait"},
        {CHM_SLOT_READY, CHM_SLOT_FREE, "release"},
        {CHM_SLOT_HELD, CHM_SLOT_FREE, "release"},
        {CHM_SLOT_FAILED, CHM_SLOT_FREE, "release"},
        {CHM_SLOT_READY, CHM_SLOT_DRAINING, "release_pinned"},
        {CHM_SLOT_HELD, CHM_SLOT_DRAINING, "release_pinned"},
        {CHM_SLOT_DRAINING, CHM_SLOT_FREE, "unpin_last"},
};

/* Write-buffer entry. SKIPPED is terminal and never occupies space. */
static const struct chm_transition chm_wbuf_transitions[] = {
        {CHM_WB_FREE, CHM_WB_ADMITTED, "admit"},
        {CHM_WB_FREE, CHM_WB_SKIPPED, "skip"},
        {CHM_WB_ADMITTED, CHM_WB_FLUSHING, "flush_start"},
        {CHM_WB_FLUSHING, CHM_WB_DURABLE, "flush_done"},
        {CHM_WB_FLUSHING, CHM_WB_ADMITTED, "flush_error"}, /* retried, never lost */
        {CHM_WB_DURABLE, CHM_WB_FREE, "reclaim"},
};

/* Resident entry: EMPTY -> RESIDENT <-> HELD, HELD -> STALE -> EMPTY. */
static const struct chm_transition chm_res_transitions[] = {
        {CHM_RES_EMPTY, CHM_RES_RESIDENT, "retain"},
        {CHM_RES_RESIDENT, CHM_RES_HELD, "hit"},
        {CHM_RES_HELD, CHM_RES_RESIDENT, "unhold_last"},
        {CHM_RES_RESIDENT, CHM_RES_EMPTY, "evict"},
        {CHM_RES_HELD, CHM_RES_STALE, "write_held"},
        {CHM_RES_STALE, CHM_RES_EMPTY, "unhold_last"},
};

/* LRU line. */
static const struct chm_transition chm_line_transitions[] = {
        {CHM_LINE_INVALID, CHM_LINE_CLEAN, "fill"},
        {CHM_LINE_INVALID, CHM_LINE_DIRTY, "write_full"},
        {CHM_LINE_CLEAN, CHM_LINE_DIRTY, "write"},
        {CHM_LINE_CLEAN, CHM_LINE_INVALID, "evict"},
        {CHM_LINE_DIRTY, CHM_LINE_WRITING_BACK, "writeback_start"},
        {CHM_LINE_WRITING_BACK, CHM_LINE_CLEAN, "writeback_done"},
        {CHM_LINE_WRITING_BACK, CHM_LINE_DIRTY, "writeback_error_or_rewrite"},
};

/* Names (lowercase fw_spec names) by value, for chm_state_name(). */
static const char *const chm_slot_names[] = {
        [CHM_SLOT_FREE] = "free", [CHM_SLOT_FILLING] = "filling", [CHM_SLOT_READY] = "ready",
        [CHM_SLOT_HELD] = "held", [CHM_SLOT_FAILED] = "failed",   [CHM_SLOT_DRAINING] = "draining",
};
static const char *const chm_wbuf_names[] = {
        [CHM_WB_FREE] = "free",         [CHM_WB_ADMITTED] = "admitted",
        [CHM_WB_FLUSHING] = "flushing", [CHM_WB_DURABLE] = "durable",
        [CHM_WB_SKIPPED] = "skipped",
};
static const char *const chm_res_names[] = {
        [CHM_RES_EMPTY] = "empty",
        [CHM_RES_RESIDENT] = "resident",
        [CHM_RES_HELD] = "held",
        [CHM_RES_STALE] = "stale",
};
static const char *const chm_line_names[] = {
        [CHM_LINE_INVALID] = "invalid",
        [CHM_LINE_CLEAN] = "clean",
        [CHM_LINE_DIRTY] = "dirty",
        [CHM_LINE_WRITING_BACK] = "writing_back",
};

#define CHM_NTRANS(t) (sizeof(t) / sizeof((t)[0]))

static inline bool chm_transition_legal(const struct chm_transition *t, unsigned n, int from,
                                        int to)
{
	for (unsigned i = 0; i < n; i++)
		if (t[i].from == from && t[i].to == to)
			return true;
	return false;
}

/* Asserts legality (also in release builds: an illegal transition is a bug
 * that must stop the device, not corrupt it). */
#define CHM_TRANSITION(table, statevar, to)                                                        \
	do {                                                                                       \
		if (!chm_transition_legal(table, CHM_NTRANS(table), (statevar), (to)))             \
			chm_illegal_transition(#table, (statevar), (to), __FILE__, __LINE__);      \
		(statevar) = (to);                                                                 \
	} while (0)

_Noreturn void chm_illegal_transition(const char *table, int from, int to, const char *file,
                                      int line);

#endif /* CHM_STATES_H */
