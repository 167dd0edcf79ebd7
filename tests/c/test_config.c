/* test_config.c - options declared once: defaults are valid, text values
 * parse (sizes, enums, targets, presets), bad values and bad combinations
 * are refused with -EINVAL and a reason, unknown keys with -ENOENT. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "chm.h"
#include "check.h"

static int set_rc(struct chm_config *c, const char *k, const char *v, char *err)
{
	err[0] = 0;
	return chm_config_set(c, k, v, err, CHM_ERRMSG_MAX);
}

static void test_defaults_and_listing(void)
{
	struct chm_config c;
	char err[CHM_ERRMSG_MAX];
	CHECK_RC(chm_config_init(&c), 0);
	CHECK(c.capacity == 64ull << 30 && c.dram_bytes == 320ull << 20 &&
	      c.slot_bytes == 32u << 20);
	CHECK(c.backend == CHM_BACKEND_URING && c.mode == CHM_MODE_PREFETCH && c.numa_node == -1);
	/* defaults need targets (not ghost): the reason says so */
	CHECK_RC(chm_config_validate(&c, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "targets") != NULL, "reason: %s", err);
	cfg_set(&c, "backend", "ghost");
	CHECK_RC(chm_config_validate(&c, err, sizeof(err)), 0);

	struct chm_option_info oi;
	unsigned n = 0;
	while (chm_config_option(n, &oi) == 0) {
		CHECK(oi.name && oi.type && oi.defval && oi.help && oi.help[0]);
		/* every option's default parses */
		struct chm_config d;
		chm_config_init(&d);
		CHECK_RC(set_rc(&d, oi.name, oi.defval, err), 0);
		n++;
	}
	CHECK(n >= 25, "%u options", n);
	CHECK_RC(chm_config_option(n, &oi), -ENOENT);
	CHECK_RC(chm_config_option(0, NULL), -EINVAL);
	CHECK_RC(chm_config_init(NULL), -EINVAL);
	printf("ok defaults valid (ghost), %u options listed, each default parses\n", n);
}

static void test_values(void)
{
	struct chm_config c;
	char err[CHM_ERRMSG_MAX];
	chm_config_init(&c);
	cfg_set(&c, "capacity", "2T");
	CHECK(c.capacity == 2ull << 40);
	cfg_set(&c, "dram", "1.5G");
	CHECK(c.dram_bytes == 3ull << 29);
	cfg_set(&c, "wbuf", "64MiB");
	CHECK(c.wbuf_bytes == 64ull << 20);
	cfg_set(&c, "slot_size", "4096");
	CHECK(c.slot_bytes == 4096);
	cfg_set(&c, "mode", "LRU"); /* enum names are case-insensitive */
	CHECK(c.mode == CHM_MODE_LRU);
	cfg_set(&c, "numa_node", "-1");
	cfg_set(&c, "targets", "/a,/b,/c");
	CHECK(c.n_targets == 3 && !strcmp(c.targets[2], "/c"));
	cfg_set(&c, "timing", "gen5-tlc-200g");
	CHECK(c.timing.ssd_read_bw_bps > 0 && c.timing.link_bw_bps > 0);
	cfg_set(&c, "timing", "none");
	CHECK(c.timing.ssd_read_bw_bps == 0 && c.timing.link_bw_bps == 0);

	CHECK_RC(set_rc(&c, "capacity", "-1", err), -EINVAL);
	CHECK(strstr(err, "capacity") != NULL, "reason: %s", err);
	CHECK_RC(set_rc(&c, "capacity", "12Q", err), -EINVAL);
	CHECK_RC(set_rc(&c, "capacity", "99999999999P", err), -EINVAL);
	CHECK_RC(set_rc(&c, "queue_depth", "99999999999", err), -EINVAL);
	CHECK_RC(set_rc(&c, "queue_depth", "", err), -EINVAL);
	CHECK_RC(set_rc(&c, "numa_node", "x", err), -EINVAL);
	CHECK_RC(set_rc(&c, "mode", "fast", err), -EINVAL);
	CHECK(strstr(err, "prefetch") != NULL, "reason lists the choices: %s", err);
	CHECK_RC(set_rc(&c, "targets", "/a,,/b", err), -EINVAL);
	CHECK_RC(set_rc(&c, "timing", "warp", err), -EINVAL);
	CHECK_RC(set_rc(&c, "no_such_option", "1", err), -ENOENT);
	CHECK(strstr(err, "no_such_option") != NULL, "reason: %s", err);
	CHECK_RC(chm_config_set(&c, NULL, "1", NULL, 0), -EINVAL);
	/* a refused value leaves the field as it was */
	CHECK(c.capacity == 2ull << 40 && c.n_targets == 3 && c.mode == CHM_MODE_LRU);
	printf("ok sizes, enums, targets, presets parse; bad values -EINVAL with reasons\n");
}

/* A combination that must be refused, with a word of the reason. */
static void refuse(const char *k1, const char *v1, const char *k2, const char *v2, const char *why)
{
	struct chm_config c;
	char err[CHM_ERRMSG_MAX] = "";
	cfg_init(&c, "backend", "ghost", k1, v1);
	if (k2)
		cfg_set(&c, k2, v2);
	CHECK_RC(chm_config_validate(&c, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, why) != NULL, "%s=%s %s=%s: reason '%s' lacks '%s'", k1, v1, k2 ? k2 : "",
	      k2 ? v2 : "", err, why);
	chm_dev *dev = NULL;
	CHECK_RC(chm_dev_open(&c, &dev), -EINVAL);
}

static void test_validation(void)
{
	refuse("capacity", "1000000", NULL, NULL, "capacity");
	refuse("stripe_unit", "6000", NULL, NULL, "stripe_unit");
	refuse("queue_depth", "0", NULL, NULL, "queue_depth");
	refuse("max_io", "100M", NULL, NULL, "max_io");
	refuse("wbuf", "320M", NULL, NULL, "wbuf");
	refuse("dram", "60M", NULL, NULL, "slot_size");
	refuse("slot_size", "4K", "slots", "100000", "slots");
	refuse("mode", "lru", "lru_line", "3000", "lru_line");
	refuse("refill_queue", "9000000", NULL, NULL, "refill_queue");
	refuse("pool", "file", NULL, NULL, "pool_path");
	refuse("flush_high_water_pct", "0", NULL, NULL, "flush_high_water_pct");
	refuse("clock", "virtual", "backend", "pread", "clock");
	printf("ok invalid combinations refused by validate and by open, with reasons\n");
}

int main(void)
{
	test_defaults_and_listing();
	test_values();
	test_validation();
	return check_summary();
}
