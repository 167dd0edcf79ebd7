/*
 * Broken on purpose (a test fixture): a hit pins a slot that is behind,
 * i.e. one that a write was admitted over and whose catch-up copies the
 * write buffer into it with the lock dropped. The hit copies bytes older
 * than the newest admitted write (and that are being rewritten under it).
 * The check must fail on W10 (views and reads hold every admitted write),
 * which the reader asserts as it pins, before the catch-up's S18 check.
 *
 * @expect run=views id=W10
 */
#define BUG_HIT_BEHIND
#include "../staging.pml"
