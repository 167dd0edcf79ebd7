/*
 * Broken on purpose (a test fixture): release frees a READY/HELD/FAILED slot
 * but does not hand it to the refill queue head, so a queued prefetch can
 * wait forever. The check must fail on S7 (a freed slot goes to the queue
 * head at once).
 *
 * @expect run=staging id=S7
 */
#define BUG_NO_GRANT
#include "../staging.pml"
