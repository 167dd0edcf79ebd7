/* states.c - what the state tables of states.h need at run time: the stop
 * on an illegal transition. Calls nothing above it. */
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
