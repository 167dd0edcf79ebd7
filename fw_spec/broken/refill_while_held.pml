/*
 * Broken on purpose (a test fixture): when no slot is FREE, prefetch takes
 * a HELD slot for the new fill instead of queueing, so the bytes under a
 * live view change. The check must fail on S1 (a slot is never refilled
 * while held).
 *
 * @expect run=staging id=S1
 */
#define BUG_GRANT_HELD
#include "../staging.pml"
