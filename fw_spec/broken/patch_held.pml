/*
 * Broken on purpose (a test fixture): admitting a write re-overlays the
 * write-buffer log, oldest entry first, over a HELD slot too, one entry
 * after another while the view is read without the lock. A scan of the view
 * sees bytes older than a write admitted before it began. The check must
 * fail on W11 (a held view is a snapshot).
 *
 * @expect run=views id=W11
 */
#define BUG_PATCH_HELD
#include "../staging.pml"
