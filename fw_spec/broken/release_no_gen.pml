/*
 * Broken on purpose (a test fixture): release does not compare the handle's
 * generation, so releasing a dead handle whose request entry was reused
 * frees someone else's request. The check must fail on S3 (release frees
 * exactly once).
 *
 * @expect run=staging id=S3
 */
#define BUG_RELEASE_NO_GEN
#include "../staging.pml"
