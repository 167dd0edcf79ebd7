/*
 * Broken on purpose (a test fixture): the completion of a fill whose
 * request was released meanwhile is dropped, so the orphaned slot stays
 * FILLING for good and a queued prefetch never gets a slot. No state
 * invariant breaks; the progress checks must fail on S11 (every issued
 * prefetch ends READY or FAILED) and S12 (every blocked wait returns).
 *
 * @expect run=staging_S11 id=S11
 * @expect run=staging_S12 id=S12
 */
#define BUG_ORPHAN_LEAK
#include "../staging.pml"
