/*
 * Broken on purpose (a test fixture): a retain that finds no EMPTY entry
 * takes one with views out (HELD or STALE) and exchanges its memory for the
 * released slot's, under the views. A scan of a held view sees another
 * object's bytes. The check must fail on R3 (a held resident view is a
 * snapshot).
 *
 * @expect run=resident id=R3
 */
#define BUG_RETAIN_INTO_HELD
#include "../resident.pml"
