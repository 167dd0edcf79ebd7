/* test_regress_handle_wrap_full.c - test_regress_handle_wrap.c's part 1 over
 * a full cycle of the old 24-bit generation: 2^24 + 2 prefetch/release cycles
 * of one request record (~30 s in the plain build, skipped in the sanitizer
 * builds). */
/* tier: slow */
#define HANDLE_WRAP_FULL 1
#include "test_regress_handle_wrap.c"
