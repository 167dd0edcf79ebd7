/*
 * Broken on purpose (a test fixture): release frees a slot that a hit is
 * still copying from (it ignores the pin), so the slot can be refilled with
 * another object under the copy. The check must fail on S17 (a pinned slot
 * is never refilled, freed or patched).
 *
 * @expect run=views id=S17
 */
#define BUG_UNPIN_EARLY
#include "../staging.pml"
