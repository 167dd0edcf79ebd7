/* states.c - what the state tables of states.h need at run time: the stop
 * on an illegal transition, and the states' names for chm_state_name().
 * Calls nothing above it. */
#include <stdio.h>
#include <stdlib.h>

#include "states.h"

_Noreturn void chm_illegal_transition(const char *table, int from, int to, const char *file,
                                      int line)
{
	fprintf(stderr, "chm: illegal transition %d -> %d in %s at %s:%d\n", from, to, table, file,
	        line);
	abort();
}

const char *chm_state_name(int kind, int value)
{
	static const struct {
		const char *const *names;
		unsigned n;
	} kinds[] = {
	        [CHM_STATE_SLOT] = {chm_slot_names, CHM_NTRANS(chm_slot_names)},
	        [CHM_STATE_WBUF] = {chm_wbuf_names, CHM_NTRANS(chm_wbuf_names)},
	        [CHM_STATE_LINE] = {chm_line_names, CHM_NTRANS(chm_line_names)},
	        [CHM_STATE_RESIDENT] = {chm_res_names, CHM_NTRANS(chm_res_names)},
	};
	if (kind < 0 || (unsigned)kind >= CHM_NTRANS(kinds) || value < 0 ||
	    (unsigned)value >= kinds[kind].n)
		return NULL;
	return kinds[kind].names[value];
}
