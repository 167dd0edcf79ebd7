/* check.h - the assertions of the C test programs: count every check, report
 * each failure with its place, exit 0 pass / 1 fail (77 skip is the test's). */
#ifndef CHM_TEST_CHECK_H
#define CHM_TEST_CHECK_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "chm.h"

static int failures, checks;

/* CHECK(cond) or CHECK(cond, "printf format", args...) */
#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		checks++;                                                                          \
		if (!(cond)) {                                                                     \
			failures++;                                                                \
			fprintf(stderr, "FAIL %s:%d: %s", __FILE__, __LINE__, #cond);              \
			check_detail("" __VA_ARGS__);                                              \
		}                                                                                  \
	} while (0)

/* A call that must return exactly want (0, a count or -errno). */
#define CHECK_RC(expr, want)                                                                       \
	do {                                                                                       \
		int rc_ = (expr);                                                                  \
		CHECK(rc_ == (want), "got %d (%s), want %d", rc_, chm_strerror(rc_), (want));      \
	} while (0)

#define check_detail(...) (fprintf(stderr, ": " __VA_ARGS__), fprintf(stderr, "\n"))

/* Sets a configuration option, or exits 1 with the reason (a broken test
 * setup, not a device failure). */
/* xorshift64: the tests' reproducible pseudo-random sequence from *s (nonzero). */
static inline uint64_t check_rng(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static inline void cfg_set(struct chm_config *c, const char *key, const char *value)
{
	char err[256];
	if (chm_config_set(c, key, value, err, sizeof(err))) {
		fprintf(stderr, "config %s=%s: %s\n", key, value, err);
		exit(1);
	}
}

/* chm_config_init(c), then cfg_set() of each key, value pair in turn:
 * cfg_init(&c, "backend", "ghost", "capacity", "1G"). */
#define cfg_init(c, ...) cfg_init_((c), __VA_ARGS__, (const char *)NULL)
static inline void cfg_init_(struct chm_config *c, ...)
{
	va_list ap;
	chm_config_init(c);
	va_start(ap, c);
	for (const char *key; (key = va_arg(ap, const char *));) {
		const char *value = va_arg(ap, const char *);
		if (!value) {
			fprintf(stderr, "config %s: no value given (cfg_init takes pairs)\n", key);
			exit(1);
		}
		cfg_set(c, key, value);
	}
	va_end(ap);
}

/* Prints the tally; returns the exit status. */
static inline int check_summary(void)
{
	printf("%s: %d checks, %d failures\n", failures ? "FAIL" : "PASS", checks, failures);
	return failures ? 1 : 0;
}

/* A scratch backing file, path, in a fresh directory under /tmp. */
struct scratch {
	char dir[64];
	char path[96];
};

/* Makes the directory; false when /tmp cannot hold one (skip the test). */
static inline bool scratch_make(struct scratch *sc)
{
	snprintf(sc->dir, sizeof(sc->dir), "/tmp/chm_test_XXXXXX");
	if (!mkdtemp(sc->dir))
		return false;
	snprintf(sc->path, sizeof(sc->path), "%s/t0", sc->dir);
	return true;
}

static inline void scratch_remove(struct scratch *sc)
{
	unlink(sc->path);
	rmdir(sc->dir);
}

/* Opens a device on c (whose target is sc->path, created here: create=1).
 * Returns 0, or the status main() should exit with: 77 after printing why
 * when this host lacks what c needs (-EOPNOTSUPP), the tally when the open
 * failed otherwise. */
static inline int scratch_open(struct scratch *sc, const struct chm_config *c, chm_dev **dev,
                               const char *lacking)
{
	struct chm_config cc = *c;
	cc.create = 1;
	int rc = chm_dev_open(&cc, dev);
	if (rc == -EOPNOTSUPP) {
		printf("SKIP: %s\n", lacking);
		scratch_remove(sc);
		return 77;
	}
	CHECK_RC(rc, 0);
	if (rc) {
		scratch_remove(sc);
		return check_summary();
	}
	return 0;
}

#endif /* CHM_TEST_CHECK_H */
