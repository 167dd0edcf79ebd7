/*
 * Broken on purpose (a test fixture): a prefetch is served by any entry of
 * its object that is not EMPTY, a STALE one too, whose bytes a write
 * replaced while it was held. The hit hands out bytes older than an
 * admitted write. The check must fail on R2 (a resident hit returns the
 * newest bytes).
 *
 * @expect run=resident id=R2
 */
#define BUG_HIT_STALE
#include "../resident.pml"
