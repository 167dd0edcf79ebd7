/*
 * Broken on purpose (a test fixture): the flush barrier waits only for the
 * entries that are already FLUSHING and returns while earlier writes are
 * still ADMITTED. The check must fail on W3 (after chm_flush returns 0,
 * every write admitted before the call is durable).
 *
 * @expect run=wbuf id=W3
 */
#define BUG_FLUSH_EARLY
#include "../staging.pml"
