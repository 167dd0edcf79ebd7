/*
 * Broken on purpose (a test fixture): the flusher starts a batch only at the
 * high-water mark and ignores a pending barrier, so chm_flush on a buffer
 * below high water never returns. The progress check must fail on W8 (every
 * flush barrier returns), and the safety run finds the writer stuck.
 *
 * @expect run=wbuf_W8 id=W8
 * @expect run=wbuf id=end-state
 */
#define BUG_FLUSH_LAZY
#include "../staging.pml"
