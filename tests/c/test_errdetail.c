/* test_errdetail.c - chm_last_error_detail: a failing call leaves its reason
 * for its own thread only, tagged with its error code; the next call that
 * can set one clears it, so a reason is never attached to a later error.
 * A refused target names its path (chm_last_error_path) and what it is.
 * Also chm_parse_size, chm_config_get and the enum name tables. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "chm.h"
#include "check.h"

static void test_detail_names_the_reason(void)
{
	uint64_t v = 0;
	CHECK_RC(chm_parse_size("0.3K", &v), -EINVAL);
	const char *d = chm_last_error_detail(-EINVAL);
	CHECK(strstr(d, "'0.3K'") && strstr(d, "whole number of bytes"), "detail: %s", d);
	/* only for the error code it was set with */
	CHECK(chm_last_error_detail(-ENOENT)[0] == 0);
	CHECK(chm_last_error_detail(0)[0] == 0);

	struct chm_config c;
	CHECK_RC(chm_config_init(&c), 0);
	CHECK_RC(chm_config_set(&c, "capacity", "0x10", NULL, 0), -EINVAL);
	d = chm_last_error_detail(-EINVAL);
	CHECK(strstr(d, "capacity") && strstr(d, "'0x10'"), "detail: %s", d);
	CHECK_RC(chm_config_set(&c, "nosuch", "1", NULL, 0), -ENOENT);
	d = chm_last_error_detail(-ENOENT);
	CHECK(strstr(d, "nosuch") != NULL, "detail: %s", d);
}

static void test_detail_is_not_stale(void)
{
	uint64_t v = 0;
	CHECK_RC(chm_parse_size("12Q", &v), -EINVAL);
	CHECK(chm_last_error_detail(-EINVAL)[0] != 0);
	/* a later successful call clears it */
	CHECK_RC(chm_parse_size("12K", &v), 0);
	CHECK(v == 12 << 10);
	CHECK(chm_last_error_detail(-EINVAL)[0] == 0, "stale: %s", chm_last_error_detail(-EINVAL));
	/* and a later failure carries its own reason, not the earlier one */
	CHECK_RC(chm_parse_size("12Q", &v), -EINVAL);
	struct chm_config c;
	CHECK_RC(chm_config_init(&c), 0);
	CHECK_RC(chm_config_validate(&c, NULL, 0), -EINVAL); /* no targets */
	const char *d = chm_last_error_detail(-EINVAL);
	CHECK(strstr(d, "targets") && !strstr(d, "12Q"), "detail: %s", d);
	/* a failure whose site gives no reason shows none, not an earlier one */
	CHECK_RC(chm_config_set(&c, "nosuch", "1", NULL, 0), -ENOENT);
	struct chm_timing t;
	CHECK_RC(chm_timing_preset("bogus", &t), -ENOENT);
	CHECK(chm_last_error_detail(-ENOENT)[0] == 0, "stale: %s", chm_last_error_detail(-ENOENT));
}

static char other_detail[CHM_ERRMSG_MAX];

static void *other_thread(void *arg)
{
	(void)arg;
	/* this thread has failed nothing: it sees no detail */
	snprintf(other_detail, sizeof(other_detail), "%s", chm_last_error_detail(-EINVAL));
	uint64_t v;
	(void)chm_parse_size("", &v); /* sets this thread's own */
	return NULL;
}

static void test_detail_is_per_thread(void)
{
	uint64_t v;
	CHECK_RC(chm_parse_size("-1", &v), -EINVAL);
	char mine[CHM_ERRMSG_MAX];
	snprintf(mine, sizeof(mine), "%s", chm_last_error_detail(-EINVAL));
	CHECK(strstr(mine, "'-1'") != NULL, "detail: %s", mine);
	pthread_t t;
	CHECK_RC(pthread_create(&t, NULL, other_thread, NULL), 0);
	pthread_join(t, NULL);
	CHECK(other_detail[0] == 0, "another thread saw: %s", other_detail);
	CHECK(!strcmp(chm_last_error_detail(-EINVAL), mine), "changed by another thread: %s",
	      chm_last_error_detail(-EINVAL));
}

static void test_parse_size_grammar(void)
{
	static const struct {
		const char *s;
		uint64_t want; /* 0 with ok 0: refused */
		int ok;
	} cases[] = {
	        {"0", 0, 1},
	        {"4096", 4096, 1},
	        {"64K", 64 << 10, 1},
	        {"1.5G", 3ull << 29, 1},
	        {"4KiB", 4096, 1},
	        {"16MB", 16 << 20, 1},
	        {"512b", 512, 1},
	        {"0x10", 0, 0},
	        {" 1K", 0, 0},
	        {"1K ", 0, 0},
	        {"+1", 0, 0},
	        {"1e3", 0, 0},
	        {"", 0, 0},
	        {"1.3", 0, 0},
	        {"iB", 0, 0},
	        {"5iB", 0, 0},
	        {"16384P", 0, 0},
	        {"18446744073709551615", UINT64_MAX, 1},
	        {"18446744073709551616", 0, 0},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint64_t v = 7;
		int rc = chm_parse_size(cases[i].s, &v);
		if (cases[i].ok)
			CHECK(rc == 0 && v == cases[i].want, "'%s': rc %d v %llu", cases[i].s, rc,
			      (unsigned long long)v);
		else
			CHECK(rc == -EINVAL && v == 7 && chm_last_error_detail(-EINVAL)[0],
			      "'%s': rc %d", cases[i].s, rc);
	}
	CHECK_RC(chm_parse_size(NULL, NULL), -EINVAL);
}

static void test_config_get(void)
{
	struct chm_config c;
	char out[64];
	CHECK_RC(chm_config_init(&c), 0);
	cfg_set(&c, "dram", "64M");
	cfg_set(&c, "mode", "lru");
	cfg_set(&c, "numa_node", "-1");
	cfg_set(&c, "targets", "/a,/b");
	CHECK_RC(chm_config_get(&c, "dram", out, sizeof(out)), 8);
	CHECK(!strcmp(out, "67108864"), "%s", out);
	CHECK_RC(chm_config_get(&c, "mode", out, sizeof(out)), 3);
	CHECK(!strcmp(out, "lru"), "%s", out);
	CHECK_RC(chm_config_get(&c, "numa_node", out, sizeof(out)), 2);
	CHECK(!strcmp(out, "-1"), "%s", out);
	CHECK_RC(chm_config_get(&c, "targets", out, sizeof(out)), 5);
	CHECK(!strcmp(out, "/a,/b"), "%s", out);
	CHECK_RC(chm_config_get(&c, "timing", out, sizeof(out)), 4);
	CHECK(!strcmp(out, "none"), "%s", out);
	cfg_set(&c, "timing", "fpga-cxlhm");
	CHECK_RC(chm_config_get(&c, "timing", out, sizeof(out)), 10);
	CHECK(!strcmp(out, "fpga-cxlhm"), "%s", out);
	cfg_set(&c, "link_lat_ns", "1");
	CHECK_RC(chm_config_get(&c, "timing", out, sizeof(out)), 6);
	CHECK(!strcmp(out, "custom"), "%s", out);
	CHECK_RC(chm_config_get(&c, "nosuch", out, sizeof(out)), -ENOENT);
	CHECK_RC(chm_config_get(&c, "dram", out, 4), -ENOSPC);
	CHECK_RC(chm_config_get(&c, "targets", out, 3), -ENOSPC);
	CHECK_RC(chm_config_get(NULL, "dram", out, sizeof(out)), -EINVAL);
	/* every option reads back in a form chm_config_set takes, to the same struct */
	struct chm_option_info oi;
	char big[CHM_MAX_TARGETS * CHM_PATH_MAX + 64];
	for (unsigned i = 0; chm_config_option(i, &oi) == 0; i++) {
		struct chm_config d;
		CHECK_RC(chm_config_init(&d), 0);
		CHECK(chm_config_get(&c, oi.name, big, sizeof(big)) >= 0, "%s", oi.name);
		if (strcmp(oi.name, "timing")) /* "custom" is not a preset */
			CHECK_RC(chm_config_set(&d, oi.name, big, NULL, 0), 0);
	}
}

static void test_enum_names(void)
{
	CHECK(!strcmp(chm_enum_name(CHM_ENUM_MODE, CHM_MODE_LRU), "lru"));
	CHECK(!strcmp(chm_enum_name(CHM_ENUM_FAULT, CHM_FAULT_SLOW), "slow"));
	CHECK(!strcmp(chm_enum_name(CHM_ENUM_BACKEND, CHM_BACKEND_GHOST), "ghost"));
	CHECK(chm_enum_name(CHM_ENUM_MODE, 3) == NULL);
	CHECK(chm_enum_name(CHM_ENUM_MODE, -1) == NULL);
	CHECK(chm_enum_name(99, 0) == NULL);
	CHECK_RC(chm_enum_value(CHM_ENUM_POOL, "MemFD"), CHM_POOL_MEMFD);
	CHECK_RC(chm_enum_value(CHM_ENUM_POOL, "nope"), -ENOENT);
	CHECK_RC(chm_enum_value(99, "lru"), -EINVAL);
	CHECK_RC(chm_enum_value(CHM_ENUM_MODE, NULL), -EINVAL);
}

/* A FIFO, a character device, a socket, a directory as a target: -EINVAL
 * at once (never opened: a FIFO would block), the reason saying what the
 * path is, chm_last_error_path naming it; a later call clears the path. */
static void test_non_regular_target_named(void)
{
	char dir[] = "/tmp/chm_errdetail_XXXXXX";
	CHECK(mkdtemp(dir) != NULL);
	char fifo[64], sock[64];
	snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
	snprintf(sock, sizeof(sock), "%s/sock", dir);
	CHECK(mkfifo(fifo, 0600) == 0);
	int s = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	CHECK(s >= 0 && bind(s, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	const char *paths[] = {fifo, "/dev/null", sock, dir};
	const char *kinds[] = {"FIFO", "character device", "socket", "directory"};
	for (int i = 0; i < 4; i++) {
		struct chm_config c;
		cfg_init(&c, "backend", "pread", "mode", "direct", "capacity", "1M", "targets",
		         paths[i]);
		chm_dev *dev = NULL;
		char err[CHM_ERRMSG_MAX];
		CHECK_RC(chm_dev_open_err(&c, &dev, err, sizeof(err)), -EINVAL);
		CHECK(strstr(err, paths[i]) && strstr(err, kinds[i]), "err: %s", err);
		CHECK(strcmp(chm_last_error_path(-EINVAL), paths[i]) == 0, "path: %s",
		      chm_last_error_path(-EINVAL));
		CHECK(chm_last_error_path(-ENOENT)[0] == 0);
	}
	uint64_t v;
	CHECK_RC(chm_parse_size("12Q", &v), -EINVAL);
	CHECK(chm_last_error_path(-EINVAL)[0] == 0, "stale: %s", chm_last_error_path(-EINVAL));
	close(s);
	unlink(sock);
	unlink(fifo);
	rmdir(dir);
}

int main(void)
{
	test_detail_names_the_reason();
	test_detail_is_not_stale();
	test_detail_is_per_thread();
	test_parse_size_grammar();
	test_config_get();
	test_enum_names();
	test_non_regular_target_named();
	return check_summary();
}
