/*
 * test_spec_tables.c - prints the device's state machines as the C core has
 * them (enums of include/chm.h, csrc/states.h and csrc/dev.h, tables of
 * csrc/states.h, error codes and constants) as one JSON object on stdout, for
 * tests/spec/test_spec_vs_code.py to compare with the fw_spec yaml files.
 *
 * It also checks the tables on their own: every row names states of its
 * enum, no row is repeated, no row is a self-loop, every state is reachable
 * from the initial one and can get back to it, and CHM_TRANSITION accepts
 * every row and stops on a transition that is not one.
 *
 * Build: gcc -std=gnu11 -Wall -Wextra -Werror -Iinclude -Icsrc \
 *            tests/c/test_spec_tables.c -o test_spec_tables
 * Exit: 0 pass, 1 fail. The JSON goes to stdout, the checks to stderr.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chm.h"
#include "dev.h"
#include "states.h"

struct named {
	const char *name;
	long value;
};

#define N(x)                                                                                       \
	{                                                                                          \
#x, (long)(x)                                                                      \
	}
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static const struct named slot_states[] = {
        N(CHM_SLOT_FREE), N(CHM_SLOT_FILLING), N(CHM_SLOT_READY),
        N(CHM_SLOT_HELD), N(CHM_SLOT_FAILED),  N(CHM_SLOT_DRAINING),
};
static const struct named wbuf_states[] = {
        N(CHM_WB_FREE),    N(CHM_WB_ADMITTED), N(CHM_WB_FLUSHING),
        N(CHM_WB_DURABLE), N(CHM_WB_SKIPPED),
};
static const struct named line_states[] = {
        N(CHM_LINE_INVALID),
        N(CHM_LINE_CLEAN),
        N(CHM_LINE_DIRTY),
        N(CHM_LINE_WRITING_BACK),
};
static const struct named res_states[] = {
        N(CHM_RES_EMPTY),
        N(CHM_RES_RESIDENT),
        N(CHM_RES_HELD),
        N(CHM_RES_STALE),
};
static const struct named req_states[] = {
        N(CHM_REQ_FREE),
        N(CHM_REQ_QUEUED),
        N(CHM_REQ_SLOTTED),
        N(CHM_REQ_RESIDENT),
};
static const struct named backend_kinds[] = {
        N(CHM_BACKEND_URING),
        N(CHM_BACKEND_PREAD),
        N(CHM_BACKEND_GHOST),
};
static const struct named modes[] = {
        N(CHM_MODE_PREFETCH),
        N(CHM_MODE_LRU),
        N(CHM_MODE_DIRECT),
};
static const struct named pool_kinds[] = {
        N(CHM_POOL_ANON),
        N(CHM_POOL_HUGETLB),
        N(CHM_POOL_MEMFD),
        N(CHM_POOL_FILE),
};
static const struct named clock_kinds[] = {
        N(CHM_CLOCK_REAL),
        N(CHM_CLOCK_VIRTUAL),
};
static const struct named state_kinds[] = {
        N(CHM_STATE_SLOT),
        N(CHM_STATE_WBUF),
        N(CHM_STATE_LINE),
        N(CHM_STATE_RESIDENT),
};
static const struct named prefetch_flags[] = {
        N(CHM_PF_NOQUEUE),
        N(CHM_PF_RETAIN),
};
static const struct named fault_kinds[] = {
        N(CHM_FAULT_NONE),       N(CHM_FAULT_EIO_READ), N(CHM_FAULT_EIO_WRITE),
        N(CHM_FAULT_SHORT_READ), N(CHM_FAULT_SLOW),
};
static const struct named enum_kinds[] = {
        N(CHM_ENUM_BACKEND), N(CHM_ENUM_MODE),  N(CHM_ENUM_POOL),
        N(CHM_ENUM_CLOCK),   N(CHM_ENUM_FAULT),
};

/* The error vocabulary of include/chm.h. */
static const struct named errors[] = {
        N(EINVAL), N(ENOENT), N(EAGAIN),    N(ENOSPC), N(EBUSY),      N(ETIMEDOUT),
        N(EIO),    N(ESTALE), N(ECANCELED), N(ENOMEM), N(EOPNOTSUPP),
};

static const struct named constants[] = {
        N(CHM_IO_ALIGN),   N(CHM_FILL_ALIGN),    N(CHM_WRITE_SKIPPED), N(CHM_PF_NOQUEUE),
        N(CHM_PF_RETAIN),  N(CHM_MAX_TARGETS),   N(CHM_PATH_MAX),      N(CHM_HIST_BUCKETS),
        N(CHM_ERRMSG_MAX), N(CHM_VERSION_MAJOR), N(CHM_VERSION_MINOR), N(CHM_VERSION_PATCH),
};

struct enum_desc {
	const char *name;
	const struct named *v;
	unsigned n;
};

#define ENUM(e, arr)                                                                               \
	{                                                                                          \
#e, arr, NELEM(arr)                                                                \
	}

static const struct enum_desc enums[] = {
        ENUM(chm_slot_state, slot_states),        ENUM(chm_wbuf_state, wbuf_states),
        ENUM(chm_line_state, line_states),        ENUM(chm_req_state, req_states),
        ENUM(chm_backend_kind, backend_kinds),    ENUM(chm_mode, modes),
        ENUM(chm_pool_kind, pool_kinds),          ENUM(chm_clock_kind, clock_kinds),
        ENUM(chm_prefetch_flags, prefetch_flags), ENUM(chm_fault_kind, fault_kinds),
        ENUM(chm_state_kind, state_kinds),        ENUM(chm_enum_kind, enum_kinds),
        ENUM(chm_res_state, res_states),
};

struct table_desc {
	const char *name;
	const struct chm_transition *t;
	unsigned n;
	const struct named *states;
	unsigned nstates;
	int initial;
};

static const struct table_desc tables[] = {
        {"chm_slot_transitions", chm_slot_transitions, CHM_NTRANS(chm_slot_transitions),
         slot_states, NELEM(slot_states), CHM_SLOT_FREE},
        {"chm_wbuf_transitions", chm_wbuf_transitions, CHM_NTRANS(chm_wbuf_transitions),
         wbuf_states, NELEM(wbuf_states), CHM_WB_FREE},
        {"chm_line_transitions", chm_line_transitions, CHM_NTRANS(chm_line_transitions),
         line_states, NELEM(line_states), CHM_LINE_INVALID},
        {"chm_res_transitions", chm_res_transitions, CHM_NTRANS(chm_res_transitions), res_states,
         NELEM(res_states), CHM_RES_EMPTY},
};

static int failures;

static void check(int ok, const char *what, const char *table, int from, int to)
{
	fprintf(stderr, "%s: %s %s (%d -> %d)\n", ok ? "ok" : "FAIL", table, what, from, to);
	if (!ok)
		failures++;
}

static const char *state_name(const struct table_desc *td, int v)
{
	for (unsigned i = 0; i < td->nstates; i++)
		if (td->states[i].value == v)
			return td->states[i].name;
	return NULL;
}

/* Marks in seen[] every state reachable from s (forward, or backward). */
static void reach(const struct table_desc *td, int s, bool *seen, bool backward)
{
	if (seen[s])
		return;
	seen[s] = true;
	for (unsigned i = 0; i < td->n; i++) {
		int a = backward ? td->t[i].to : td->t[i].from;
		int b = backward ? td->t[i].from : td->t[i].to;
		if (a == s)
			reach(td, b, seen, backward);
	}
}

static void check_table(const struct table_desc *td)
{
	bool fwd[16] = {false}, back[16] = {false};
	unsigned rows_ok = 0;

	for (unsigned i = 0; i < td->n; i++) {
		const struct chm_transition *r = &td->t[i];
		bool named =
		        state_name(td, r->from) && state_name(td, r->to) && r->event && r->event[0];
		bool unique = true;

		for (unsigned j = 0; j < i; j++)
			if (td->t[j].from == r->from && td->t[j].to == r->to &&
			    strcmp(td->t[j].event, r->event) == 0)
				unique = false;
		if (!named || !unique || r->from == r->to ||
		    !chm_transition_legal(td->t, td->n, r->from, r->to)) {
			check(named, "row names known states and an event", td->name, r->from,
			      r->to);
			check(unique, "row is not repeated", td->name, r->from, r->to);
			check(r->from != r->to, "row is not a self-loop", td->name, r->from, r->to);
		} else {
			rows_ok++;
		}
	}
	fprintf(stderr,
	        "ok: %s: %u of %u rows name known states, are unique, "
	        "and are legal\n",
	        td->name, rows_ok, td->n);
	if (rows_ok != td->n)
		failures++;

	reach(td, td->initial, fwd, false);
	reach(td, td->initial, back, true);
	for (unsigned i = 0; i < td->nstates; i++) {
		int s = (int)td->states[i].value;
		/* SKIPPED is terminal by design: reachable, never left */
		bool terminal = td->t == chm_wbuf_transitions && s == CHM_WB_SKIPPED;

		if (!fwd[s])
			check(0, "state reachable from the initial state", td->name, td->initial,
			      s);
		if (!terminal && !back[s])
			check(0, "initial state reachable from the state", td->name, s,
			      td->initial);
	}
	fprintf(stderr,
	        "ok: %s: all %u states reachable from %s and (but for "
	        "terminal ones) back\n",
	        td->name, td->nstates, state_name(td, td->initial));
}

/* CHM_TRANSITION must stop on an illegal transition: catch it here. */
static jmp_buf illegal_jmp;
static const char *illegal_table;
static int illegal_from, illegal_to;

_Noreturn void chm_illegal_transition(const char *table, int from, int to, const char *file,
                                      int line)
{
	(void)file;
	(void)line;
	illegal_table = table;
	illegal_from = from;
	illegal_to = to;
	longjmp(illegal_jmp, 1);
}

static void check_transition_macro(void)
{
	volatile int st;
	volatile unsigned i;
	int caught;

	for (i = 0; i < CHM_NTRANS(chm_slot_transitions); i++) {
		st = chm_slot_transitions[i].from;
		illegal_table = NULL;
		if (setjmp(illegal_jmp) == 0) {
			int s = st;
			CHM_TRANSITION(chm_slot_transitions, s, chm_slot_transitions[i].to);
			st = s;
		}
		if (illegal_table != NULL || st != chm_slot_transitions[i].to) {
			check(0, "CHM_TRANSITION takes a legal row", "chm_slot_transitions",
			      chm_slot_transitions[i].from, chm_slot_transitions[i].to);
			return;
		}
	}
	fprintf(stderr, "ok: CHM_TRANSITION takes every slot row\n");

	/* HELD -> FILLING: a slot refilled while held */
	st = CHM_SLOT_HELD;
	illegal_table = NULL;
	caught = 0;
	if (setjmp(illegal_jmp) == 0) {
		int s = st;
		CHM_TRANSITION(chm_slot_transitions, s, CHM_SLOT_FILLING);
		st = s;
	} else {
		caught = 1;
	}
	check(caught && illegal_table && strcmp(illegal_table, "chm_slot_transitions") == 0 &&
	              illegal_from == CHM_SLOT_HELD && illegal_to == CHM_SLOT_FILLING &&
	              st == CHM_SLOT_HELD,
	      "CHM_TRANSITION stops on an illegal transition", "chm_slot_transitions",
	      CHM_SLOT_HELD, CHM_SLOT_FILLING);
}

static void print_named(const struct named *v, unsigned n)
{
	printf("{");
	for (unsigned i = 0; i < n; i++)
		printf("%s\"%s\": %ld", i ? ", " : "", v[i].name, v[i].value);
	printf("}");
}

static void print_json(void)
{
	printf("{\n  \"enums\": {\n");
	for (unsigned e = 0; e < NELEM(enums); e++) {
		printf("    \"%s\": ", enums[e].name);
		print_named(enums[e].v, enums[e].n);
		printf("%s\n", e + 1 < NELEM(enums) ? "," : "");
	}
	printf("  },\n  \"tables\": {\n");
	for (unsigned k = 0; k < NELEM(tables); k++) {
		const struct table_desc *td = &tables[k];

		printf("    \"%s\": [\n", td->name);
		for (unsigned i = 0; i < td->n; i++)
			printf("      {\"from\": %d, \"to\": %d, \"event\": \"%s\"}%s\n",
			       td->t[i].from, td->t[i].to, td->t[i].event,
			       i + 1 < td->n ? "," : "");
		printf("    ]%s\n", k + 1 < NELEM(tables) ? "," : "");
	}
	printf("  },\n  \"errors\": ");
	print_named(errors, NELEM(errors));
	printf(",\n  \"constants\": ");
	print_named(constants, NELEM(constants));
	printf(",\n  \"handle_bits\": %zu\n}\n", sizeof(chm_handle) * 8);
}

int main(void)
{
	for (unsigned k = 0; k < NELEM(tables); k++)
		check_table(&tables[k]);
	check_transition_macro();
	print_json();
	fflush(stdout);
	if (failures) {
		fprintf(stderr, "FAIL: %d check(s) failed\n", failures);
		return 1;
	}
	fprintf(stderr, "PASS: %zu tables checked and printed\n", NELEM(tables));
	return 0;
}
