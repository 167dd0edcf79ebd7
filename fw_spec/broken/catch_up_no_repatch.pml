/*
 * Broken on purpose (a test fixture): a write admitted over a slot whose
 * catch-up is under way (behind, its log copy made with the lock dropped)
 * does not ask for another round, so the catch-up ends with the bytes of the
 * log as they were when it started and the slot goes back to serving hits
 * without the newer write. The check must fail on W10 (views and reads hold
 * every admitted write).
 *
 * @expect run=views id=W10
 */
#define BUG_NO_REPATCH
#include "../staging.pml"
