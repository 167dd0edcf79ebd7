/* config.c - every configuration option declared once (name, type, default,
 * help), parsed from text, and validated in one function. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "chm.h"
#include "dev.h"
#include "errdetail.h"
#include "names.h"

enum opt_type {
	OPT_SIZE,
	OPT_UINT,
	OPT_INT,
	OPT_STR,
	OPT_ENUM,
	OPT_PATH,
	OPT_TARGETS,
	OPT_PRESET
};

struct opt {
	const char *name;
	enum opt_type type;
	size_t off;   /* offset in struct chm_config */
	size_t width; /* field size in bytes */
	const char *defval;
	const char *help;
	const char *const *names; /* OPT_ENUM: value i is names[i] */
};

/* The enum options' names are names.c's tables (chm_enum_name). */

#define F(field) offsetof(struct chm_config, field), sizeof(((struct chm_config *)0)->field)
#define T(field)                                                                                   \
	offsetof(struct chm_config, timing.field), sizeof(((struct chm_config *)0)->timing.field)

static const struct opt opts[] = {
        {"capacity", OPT_SIZE, F(capacity), "64G",
         "address-space size in bytes (K/M/G/T suffixes), a multiple of stripe_unit", NULL},
        {"targets", OPT_TARGETS, F(targets), "",
         "comma-separated backing files or block devices (1..16), striped", NULL},
        {"create", OPT_UINT, F(create), "0",
         "1: create missing backing files (mode 0600, sparse) and extend short ones to the "
         "size they need; 0: use them only as they are",
         NULL},
        {"stripe_unit", OPT_SIZE, F(stripe_unit), "1M",
         "bytes per stripe on each target, a multiple of 4096", NULL},
        {"backend", OPT_ENUM, F(backend), "uring",
         "I/O backend: uring (io_uring, O_DIRECT), pread (threads, O_DIRECT), ghost (no data)",
         chm_backend_names},
        {"mode", OPT_ENUM, F(mode), "prefetch",
         "DRAM management: prefetch (staging window + write buffer), lru (transparent cache), "
         "direct (no DRAM)",
         chm_mode_names},
        {"queue_depth", OPT_UINT, F(queue_depth), "64", "backend I/Os in flight (1..4096)", NULL},
        {"sqpoll", OPT_UINT, F(sqpoll), "0", "1: io_uring submission-queue polling thread", NULL},
        {"max_io", OPT_SIZE, F(max_io), "1M", "largest single backend I/O (4K..64M)", NULL},
        {"dram", OPT_SIZE, F(dram_bytes), "320M",
         "internal DRAM: staging window + write buffer (prefetch) or cache (lru)", NULL},
        {"wbuf", OPT_SIZE, F(wbuf_bytes), "32M", "write-buffer share of dram (prefetch mode)",
         NULL},
        {"resident", OPT_SIZE, F(resident_bytes), "0",
         "share of dram kept for resident objects (prefetch mode; CHM_PF_RETAIN), apart from "
         "the staging window; 0 = none",
         NULL},
        {"pool", OPT_ENUM, F(pool_kind), "anon",
         "DRAM pool: anon (THP advised), hugetlb, memfd (shareable), file (pool_path: file or devdax)",
         chm_pool_names},
        {"numa_node", OPT_INT, F(numa_node), "-1", "bind the DRAM pool to this NUMA node (-1: no)",
         NULL},
        {"pool_path", OPT_PATH, F(pool_path), "", "file or devdax device for pool=file", NULL},
        {"slot_size", OPT_SIZE, F(slot_bytes), "32M",
         "largest staged object; each slot holds one (use 4K for small objects)", NULL},
        {"slots", OPT_UINT, F(slot_count), "0",
         "staging depth; 0 = as many slots as the staging window holds", NULL},
        {"refill_queue", OPT_UINT, F(refill_queue), "1024",
         "prefetches that may wait for a slot; beyond it prefetch returns EAGAIN", NULL},
        {"lru_line", OPT_SIZE, F(lru_line_bytes), "64K", "LRU-mode cache line size", NULL},
        {"clock", OPT_ENUM, F(clock), "real",
         "real: pace completions in wall time; virtual: simulated clock (ghost backend)",
         chm_clock_names},
        {"flush_high_water_pct", OPT_UINT, F(flush_high_water_pct), "75",
         "write-buffer fill (percent) at which flushing is forced despite reads", NULL},
        {"object_size", OPT_SIZE, F(object_bytes), "0",
         "size of the objects written and prefetched (e.g. a KV block); raises slot_size and "
         "wbuf (two objects) from their defaults to fit; 0: not given",
         NULL},
        {"timing", OPT_PRESET, 0, 0, "none",
         "timing preset: none, gen5-tlc-200g, fpga-cxlhm (sets the ssd_/dram_/link_ fields)", NULL},
        {"ssd_read_lat_ns", OPT_UINT, T(ssd_read_lat_ns), "0", "SSD read latency per I/O, ns",
         NULL},
        {"ssd_write_lat_ns", OPT_UINT, T(ssd_write_lat_ns), "0", "SSD write latency per I/O, ns",
         NULL},
        {"ssd_read_bw_bps", OPT_SIZE, T(ssd_read_bw_bps), "0",
         "SSD read bandwidth, bytes/s (0: unlimited)", NULL},
        {"ssd_write_bw_bps", OPT_SIZE, T(ssd_write_bw_bps), "0",
         "SSD write bandwidth, bytes/s (0: unlimited)", NULL},
        {"ssd_channels", OPT_UINT, T(ssd_channels), "0", "SSD internal parallelism (0: 1)", NULL},
        {"dram_bw_bps", OPT_SIZE, T(dram_bw_bps), "0",
         "device DRAM bandwidth, bytes/s (0: unlimited)", NULL},
        {"link_bw_bps", OPT_SIZE, T(link_bw_bps), "0",
         "host link bandwidth, bytes/s (0: unlimited)", NULL},
        {"link_lat_ns", OPT_UINT, T(link_lat_ns), "0", "host link latency per transfer, ns", NULL},
        {"time_dilation", OPT_UINT, F(time_dilation), "1",
         "clock=real: run the timing model this many times slower (1..1000000); the device "
         "clock and every reported time are device time, wall / time_dilation",
         NULL},
};

#define NOPTS (sizeof(opts) / sizeof(opts[0]))

static const char *const opt_type_names[] = {
        [OPT_SIZE] = "size",       [OPT_UINT] = "uint",     [OPT_INT] = "int",
        [OPT_STR] = "str",         [OPT_ENUM] = "enum",     [OPT_PATH] = "path",
        [OPT_TARGETS] = "targets", [OPT_PRESET] = "preset",
};

/* Writes the reason into err (if non-NULL) and the thread's error detail. */
#define fail(err, errlen, ...) chm_detail_to(err, errlen, -EINVAL, __VA_ARGS__)

/* Parses "123", "64K", "1.5G", "4KiB", "16MB" (binary multiples): digits with
 * an optional fraction of at most 19 significant digits, then an optional
 * unit; the result must be a whole number of bytes below 2^64. Nothing else:
 * no whitespace, sign, exponent or hex float (all of which strtod accepts).
 * Exact integer arithmetic, so every byte count is represented. */
static int parse_size(const char *s, uint64_t *out)
{
	unsigned __int128 whole = 0, frac = 0, scale = 1;
	const char *p = s;
	for (; *p >= '0' && *p <= '9'; p++) {
		whole = whole * 10 + (unsigned)(*p - '0');
		if (whole > UINT64_MAX)
			return chm_detail(-EINVAL, "size: '%.64s' is larger than 2^64-1", s);
	}
	if (p == s)
		return chm_detail(
		        -EINVAL, "size: '%.64s' does not start with a digit (e.g. 4096, 64K, 1.5G)",
		        s);
	if (*p == '.') {
		const char *f = ++p, *last = p; /* last: one past the last non-zero digit */
		for (; *p >= '0' && *p <= '9'; p++)
			if (*p != '0')
				last = p + 1;
		if (last - f > 19)
			return chm_detail(
			        -EINVAL,
			        "size: '%.64s' has more than 19 significant fraction digits", s);
		for (; f < last; f++) {
			frac = frac * 10 + (unsigned)(*f - '0');
			scale *= 10;
		}
	}
	uint64_t mult = 1;
	switch (*p) {
	case 'k':
	case 'K': mult = 1ull << 10; break;
	case 'm':
	case 'M': mult = 1ull << 20; break;
	case 'g':
	case 'G': mult = 1ull << 30; break;
	case 't':
	case 'T': mult = 1ull << 40; break;
	case 'p':
	case 'P': mult = 1ull << 50; break;
	default: break;
	}
	if (mult > 1)
		p++;
	if (mult > 1 && (!strcasecmp(p, "iB") || !strcasecmp(p, "B")))
		p += strlen(p);
	else if (mult == 1 && !strcasecmp(p, "B"))
		p++;
	if (*p)
		return chm_detail(
		        -EINVAL,
		        "size: '%.64s' has '%.16s' after the number (a unit is one of "
		        "K, M, G, T, P, then optionally B or iB; no spaces, sign, exponent "
		        "or 0x)",
		        s, p);
	if (frac * mult % scale)
		return chm_detail(-EINVAL, "size: '%.64s' is not a whole number of bytes", s);
	unsigned __int128 bytes = whole * mult + frac * mult / scale;
	if (bytes > UINT64_MAX)
		return chm_detail(-EINVAL, "size: '%.64s' is larger than 2^64-1", s);
	*out = (uint64_t)bytes;
	return 0;
}

int chm_parse_size(const char *s, uint64_t *out)
{
	chm_detail_clear();
	if (!s || !out)
		return chm_detail(-EINVAL, "parse_size: NULL argument");
	return parse_size(s, out);
}

/* "0", a decimal without leading zeros, or "0x" + hex digits; nothing around
 * them. strtoull alone would also take leading whitespace, a sign (" -1" is
 * 2^64-1) and octal after a leading 0. */
static int parse_uint(const char *s, uint64_t *out)
{
	const char *digits = s;
	int base = 10;
	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		base = 16;
		digits = s + 2;
	} else if (s[0] == '0' && s[1]) {
		return -EINVAL;
	}
	if (!*digits)
		return -EINVAL;
	for (const char *p = digits; *p; p++)
		if (base == 10 ? !(*p >= '0' && *p <= '9') : !isxdigit((unsigned char)*p))
			return -EINVAL;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(digits, &end, base);
	if (errno || *end)
		return -EINVAL;
	*out = v;
	return 0;
}

/* The unsigned grammar after an optional '-', within int32. */
static int parse_int32(const char *s, int32_t *out)
{
	bool neg = s[0] == '-';
	uint64_t v;
	if (parse_uint(neg ? s + 1 : s, &v) || v > (neg ? 2147483648ull : 2147483647ull))
		return -EINVAL;
	*out = neg ? (int32_t)(-(int64_t)v) : (int32_t)v;
	return 0;
}

static void store_uint(struct chm_config *cfg, const struct opt *o, uint64_t v)
{
	char *p = (char *)cfg + o->off;
	if (o->width == 8)
		memcpy(p, &v, 8);
	else {
		uint32_t v32 = (uint32_t)v;
		memcpy(p, &v32, 4);
	}
}

static int set_targets(struct chm_config *cfg, const char *value, char *err, size_t errlen)
{
	uint32_t n = 0;
	const char *p = value;
	char tmp[CHM_MAX_TARGETS][CHM_PATH_MAX];
	while (*p) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		if (len == 0)
			return fail(err, errlen, "targets: empty path in list");
		if (len >= CHM_PATH_MAX)
			return fail(err, errlen, "targets: path '%.48s...' is longer than %d bytes",
			            p, CHM_PATH_MAX - 1);
		if (n == CHM_MAX_TARGETS)
			return fail(err, errlen, "targets: more than %d targets", CHM_MAX_TARGETS);
		memcpy(tmp[n], p, len);
		tmp[n][len] = 0;
		n++;
		p += len;
		if (comma)
			p++;
	}
	memset(cfg->targets, 0, sizeof(cfg->targets));
	memcpy(cfg->targets, tmp, sizeof(tmp[0]) * n);
	cfg->n_targets = n;
	return 0;
}

static int opt_set(struct chm_config *cfg, const struct opt *o, const char *value, char *err,
                   size_t errlen)
{
	uint64_t v;
	switch (o->type) {
	case OPT_SIZE:
		if (parse_size(value, &v))
			return fail(err, errlen, "%s: '%s' is not a size (e.g. 4096, 64K, 16M, 2T)",
			            o->name, value);
		if (o->width == 4 && v > UINT32_MAX)
			return fail(err, errlen, "%s: '%s' is too large (at most 4294967295)",
			            o->name, value);
		store_uint(cfg, o, v);
		return 0;
	case OPT_UINT:
		if (parse_uint(value, &v) || (o->width == 4 && v > UINT32_MAX))
			return fail(
			        err, errlen,
			        "%s: '%s' is not an unsigned integer in 0..%llu (decimal, or hex "
			        "after 0x; no spaces, sign or leading zeros)",
			        o->name, value,
			        o->width == 4 ? 4294967295ull : 18446744073709551615ull);
		store_uint(cfg, o, v);
		return 0;
	case OPT_INT: {
		int32_t i;
		if (parse_int32(value, &i))
			return fail(
			        err, errlen,
			        "%s: '%s' is not an integer in -2147483648..2147483647 (decimal, or "
			        "hex after 0x; no spaces, '+' or leading zeros)",
			        o->name, value);
		memcpy((char *)cfg + o->off, &i, 4);
		return 0;
	}
	case OPT_ENUM:
		for (int32_t i = 0; o->names[i]; i++) {
			if (!strcasecmp(o->names[i], value)) {
				memcpy((char *)cfg + o->off, &i, 4);
				return 0;
			}
		}
		return fail(err, errlen, "%s: '%s' is not one of %s%s%s%s%s%s%s", o->name, value,
		            o->names[0], o->names[1] ? ", " : "", o->names[1] ? o->names[1] : "",
		            o->names[1] && o->names[2] ? ", " : "",
		            o->names[1] && o->names[2] ? o->names[2] : "",
		            o->names[1] && o->names[2] && o->names[3] ? ", " : "",
		            o->names[1] && o->names[2] && o->names[3] ? o->names[3] : "");
	case OPT_PATH:
	case OPT_STR:
		if (strlen(value) >= o->width)
			return fail(err, errlen, "%s: '%.48s...' is longer than %zu bytes", o->name,
			            value, o->width - 1);
		memset((char *)cfg + o->off, 0, o->width);
		memcpy((char *)cfg + o->off, value, strlen(value));
		return 0;
	case OPT_TARGETS: return set_targets(cfg, value, err, errlen);
	case OPT_PRESET: {
		int rc = chm_timing_preset(value, &cfg->timing);
		if (rc == -ENOENT)
			return fail(err, errlen,
			            "timing: unknown preset '%s' (none, gen5-tlc-200g, fpga-cxlhm)",
			            value);
		return rc;
	}
	}
	return -EINVAL;
}

int chm_config_init(struct chm_config *cfg)
{
	chm_detail_clear();
	if (!cfg)
		return -EINVAL;
	memset(cfg, 0, sizeof(*cfg));
	for (unsigned i = 0; i < NOPTS; i++) {
		int rc = opt_set(cfg, &opts[i], opts[i].defval, NULL, 0);
		if (rc)
			return rc; /* a broken default is a bug; tests catch it */
	}
	return 0;
}

/* object_size given: slot_size and wbuf still at their defaults grow to
 * hold one object and two objects (one flushing, one arriving). */
static void size_for_objects(struct chm_config *cfg)
{
	struct chm_config d;
	chm_config_init(&d);
	if (cfg->slot_bytes == d.slot_bytes && cfg->object_bytes > cfg->slot_bytes)
		cfg->slot_bytes = cfg->object_bytes;
	if (cfg->wbuf_bytes == d.wbuf_bytes && 2 * cfg->object_bytes > cfg->wbuf_bytes)
		cfg->wbuf_bytes = 2 * cfg->object_bytes;
}

int chm_config_set(struct chm_config *cfg, const char *key, const char *value, char *err,
                   size_t errlen)
{
	chm_detail_clear();
	if (!cfg || !key || !value)
		return fail(err, errlen, "config_set: NULL argument");
	for (unsigned i = 0; i < NOPTS; i++)
		if (!strcmp(opts[i].name, key)) {
			int rc = opt_set(cfg, &opts[i], value, err, errlen);
			if (!rc && cfg->object_bytes && !strcmp(key, "object_size"))
				size_for_objects(cfg);
			return rc;
		}
	fail(err, errlen, "unknown option '%.64s'", key);
	return chm_detail(-ENOENT, "unknown option '%.64s'", key);
}

static const char *const preset_names[] = {"none", "gen5-tlc-200g", "fpga-cxlhm"};

/* The text of one option's value (see chm_config_get). */
static int opt_get(const struct chm_config *cfg, const struct opt *o, char *out, size_t outlen)
{
	const char *p = (const char *)cfg + o->off;
	int n = -1;
	switch (o->type) {
	case OPT_SIZE:
	case OPT_UINT: {
		uint64_t v;
		if (o->width == 8) {
			memcpy(&v, p, 8);
		} else {
			uint32_t v32;
			memcpy(&v32, p, 4);
			v = v32;
		}
		n = snprintf(out, outlen, "%llu", (unsigned long long)v);
		break;
	}
	case OPT_INT: {
		int32_t i;
		memcpy(&i, p, 4);
		n = snprintf(out, outlen, "%d", i);
		break;
	}
	case OPT_ENUM: {
		int32_t i;
		memcpy(&i, p, 4);
		const char *name = NULL;
		for (int32_t k = 0; i >= 0 && o->names[k]; k++)
			if (k == i)
				name = o->names[k];
		n = name ? snprintf(out, outlen, "%s", name) : snprintf(out, outlen, "%d", i);
		break;
	}
	case OPT_PATH:
	case OPT_STR: n = snprintf(out, outlen, "%.*s", (int)strnlen(p, o->width), p); break;
	case OPT_TARGETS: {
		size_t used = 0;
		out[0] = 0;
		for (uint32_t t = 0; t < cfg->n_targets && t < CHM_MAX_TARGETS; t++) {
			int m = snprintf(out + used, outlen - used, "%s%.*s", t ? "," : "",
			                 (int)strnlen(cfg->targets[t], CHM_PATH_MAX),
			                 cfg->targets[t]);
			if (m < 0 || (size_t)m >= outlen - used)
				return chm_detail(-ENOSPC,
				                  "config_get: targets: %zu bytes are too few",
				                  outlen);
			used += (size_t)m;
		}
		return (int)used;
	}
	case OPT_PRESET: {
		const char *name = "custom";
		for (size_t k = 0; k < sizeof(preset_names) / sizeof(preset_names[0]); k++) {
			struct chm_timing t;
			if (!chm_timing_preset(preset_names[k], &t) &&
			    !memcmp(&t, &cfg->timing, sizeof(t))) {
				name = preset_names[k];
				break;
			}
		}
		n = snprintf(out, outlen, "%s", name);
		break;
	}
	}
	if (n < 0 || (size_t)n >= outlen)
		return chm_detail(-ENOSPC, "config_get: %s: %zu bytes are too few", o->name,
		                  outlen);
	return n;
}

int chm_config_get(const struct chm_config *cfg, const char *key, char *out, size_t outlen)
{
	chm_detail_clear();
	if (!cfg || !key || !out || !outlen)
		return chm_detail(-EINVAL, "config_get: NULL argument");
	for (unsigned i = 0; i < NOPTS; i++)
		if (!strcmp(opts[i].name, key))
			return opt_get(cfg, &opts[i], out, outlen);
	return chm_detail(-ENOENT, "unknown option '%.64s'", key);
}

int chm_config_option(unsigned idx, struct chm_option_info *out)
{
	chm_detail_clear();
	if (!out)
		return chm_detail(-EINVAL, "config_option: NULL out");
	if (idx >= NOPTS)
		return chm_detail(-ENOENT, "config_option: %u is past the last option (%u)", idx,
		                  (unsigned)NOPTS - 1);
	out->name = opts[idx].name;
	out->type = opt_type_names[opts[idx].type];
	out->defval = opts[idx].defval;
	out->help = opts[idx].help;
	return 0;
}

/* Fills fields whose 0 means "derive". Validated config in, same out. */
int chm_config_derive(struct chm_config *cfg)
{
	if (cfg->backend == CHM_BACKEND_GHOST && cfg->n_targets == 0) {
		/* no data moves: one notional target carries the address space */
		cfg->n_targets = 1;
		strcpy(cfg->targets[0], "ghost");
	}
	if (cfg->mode == CHM_MODE_PREFETCH && cfg->slot_count == 0) {
		uint64_t window = cfg->dram_bytes - cfg->wbuf_bytes - cfg->resident_bytes;
		uint64_t stride = CHM_ALIGN_UP(cfg->slot_bytes, CHM_FILL_ALIGN) + CHM_FILL_ALIGN;
		uint64_t n = window / stride;
		cfg->slot_count = n > (1u << 20) ? (1u << 20) : (uint32_t)n;
	}
	if (cfg->mode == CHM_MODE_LRU && cfg->slot_count == 0)
		cfg->slot_count = 8; /* host view buffers for prefetch hints */
	return 0;
}

static int is_pow2(uint64_t v)
{
	return v && !(v & (v - 1));
}

int chm_config_validate(const struct chm_config *cfg, char *err, size_t errlen)
{
	chm_detail_clear();
	if (!cfg)
		return fail(err, errlen, "config is NULL");
	if (cfg->backend < 0 || cfg->backend > CHM_BACKEND_GHOST)
		return fail(err, errlen, "backend %d out of range", cfg->backend);
	if (cfg->mode < 0 || cfg->mode > CHM_MODE_DIRECT)
		return fail(err, errlen, "mode %d out of range", cfg->mode);
	if (cfg->pool_kind < 0 || cfg->pool_kind > CHM_POOL_FILE)
		return fail(err, errlen, "pool %d out of range", cfg->pool_kind);
	if (cfg->clock < 0 || cfg->clock > CHM_CLOCK_VIRTUAL)
		return fail(err, errlen, "clock %d out of range", cfg->clock);
	if (cfg->clock == CHM_CLOCK_VIRTUAL && cfg->backend != CHM_BACKEND_GHOST)
		return fail(err, errlen,
		            "clock=virtual needs backend=ghost (no data moves in "
		            "virtual time)");
	if (cfg->time_dilation < 1 || cfg->time_dilation > 1000000)
		return fail(err, errlen, "time_dilation: %u not in 1..1000000", cfg->time_dilation);
	if (cfg->time_dilation > 1 && cfg->clock == CHM_CLOCK_VIRTUAL)
		return fail(err, errlen,
		            "time_dilation: %u needs clock=real (virtual time has no wall clock "
		            "to dilate)",
		            cfg->time_dilation);
	if (cfg->backend != CHM_BACKEND_GHOST &&
	    (cfg->n_targets < 1 || cfg->n_targets > CHM_MAX_TARGETS))
		return fail(err, errlen, "targets: need 1..%d backing targets, got %u",
		            CHM_MAX_TARGETS, cfg->n_targets);
	if (cfg->n_targets > CHM_MAX_TARGETS)
		return fail(err, errlen, "targets: %u is more than %d", cfg->n_targets,
		            CHM_MAX_TARGETS);
	for (uint32_t i = 0; i < cfg->n_targets; i++)
		if (!memchr(cfg->targets[i], 0, CHM_PATH_MAX) || !cfg->targets[i][0])
			return fail(err, errlen, "targets: target %u is empty or unterminated", i);
	if (cfg->stripe_unit < 4096 || cfg->stripe_unit % 4096)
		return fail(err, errlen, "stripe_unit: %llu is not a non-zero multiple of 4096",
		            (unsigned long long)cfg->stripe_unit);
	if (cfg->capacity == 0 || cfg->capacity % cfg->stripe_unit)
		return fail(err, errlen,
		            "capacity: %llu is not a non-zero multiple of stripe_unit "
		            "(%llu)",
		            (unsigned long long)cfg->capacity,
		            (unsigned long long)cfg->stripe_unit);
	if (cfg->capacity > (1ull << 56))
		return fail(err, errlen, "capacity: %llu is larger than 64 PiB (2^56)",
		            (unsigned long long)cfg->capacity);
	if (cfg->queue_depth < 1 || cfg->queue_depth > 4096)
		return fail(err, errlen, "queue_depth: %u not in 1..4096", cfg->queue_depth);
	if (cfg->max_io < 4096 || cfg->max_io > (64u << 20) || cfg->max_io % 4096)
		return fail(err, errlen, "max_io: %llu not a multiple of 4096 in 4K..64M",
		            (unsigned long long)cfg->max_io);
	if (cfg->numa_node < -1)
		return fail(err, errlen, "numa_node: %d (use -1 for no binding)", cfg->numa_node);
	if (!memchr(cfg->pool_path, 0, CHM_PATH_MAX))
		return fail(err, errlen, "pool_path: unterminated");
	if (cfg->pool_kind == CHM_POOL_FILE && !cfg->pool_path[0])
		return fail(err, errlen, "pool=file needs pool_path (a file or a devdax device)");
	if (cfg->flush_high_water_pct < 1 || cfg->flush_high_water_pct > 100)
		return fail(err, errlen, "flush_high_water_pct: %u not in 1..100",
		            cfg->flush_high_water_pct);
	if (cfg->refill_queue >= (1u << 23))
		return fail(err, errlen, "refill_queue: %u is not below 2^23", cfg->refill_queue);
	if (cfg->resident_bytes && cfg->mode != CHM_MODE_PREFETCH)
		return fail(err, errlen,
		            "resident: %llu bytes, but only prefetch mode has a region",
		            (unsigned long long)cfg->resident_bytes);
	if (cfg->mode == CHM_MODE_DIRECT)
		return 0;
	if (cfg->object_bytes && cfg->object_bytes > cfg->slot_bytes)
		return fail(err, errlen,
		            "object_size: %llu-byte objects do not fit slot_size %llu (every "
		            "prefetch of one would be refused); raise slot_size",
		            (unsigned long long)cfg->object_bytes,
		            (unsigned long long)cfg->slot_bytes);
	if (cfg->mode == CHM_MODE_PREFETCH && cfg->object_bytes &&
	    cfg->object_bytes > cfg->wbuf_bytes)
		return fail(err, errlen,
		            "object_size: %llu-byte objects do not fit wbuf %llu (every write "
		            "of one would be refused); raise wbuf",
		            (unsigned long long)cfg->object_bytes,
		            (unsigned long long)cfg->wbuf_bytes);
	if (cfg->dram_bytes == 0)
		return fail(err, errlen, "dram: 0 bytes (use mode=direct for no DRAM)");
	if (cfg->mode == CHM_MODE_LRU) {
		if (!is_pow2(cfg->lru_line_bytes) || cfg->lru_line_bytes < 4096 ||
		    cfg->lru_line_bytes > (64u << 20))
			return fail(err, errlen, "lru_line: %llu is not a power of two in 4K..64M",
			            (unsigned long long)cfg->lru_line_bytes);
		if (cfg->dram_bytes < cfg->lru_line_bytes)
			return fail(err, errlen, "dram: %llu is smaller than one lru_line (%llu)",
			            (unsigned long long)cfg->dram_bytes,
			            (unsigned long long)cfg->lru_line_bytes);
		if (cfg->slot_bytes < 512 || cfg->slot_bytes > (1ull << 30))
			return fail(err, errlen, "slot_size: %llu not in 512..1G",
			            (unsigned long long)cfg->slot_bytes);
		if (cfg->slot_count > 4096)
			return fail(err, errlen,
			            "slots: %u is above 4096 prefetch views in lru mode",
			            cfg->slot_count);
		return 0;
	}
	/* prefetch: a default that conflicts with a value given says so, and
	 * which option to pass */
	struct chm_config d;
	chm_config_init(&d);
	if (cfg->wbuf_bytes >= cfg->dram_bytes && cfg->wbuf_bytes == d.wbuf_bytes)
		return fail(err, errlen,
		            "wbuf: the default write buffer (wbuf %llu) does not fit in dram "
		            "%llu: pass a smaller wbuf or a larger dram (a wbuf of at most half "
		            "of dram leaves room for slots)",
		            (unsigned long long)cfg->wbuf_bytes,
		            (unsigned long long)cfg->dram_bytes);
	if (cfg->wbuf_bytes >= cfg->dram_bytes)
		return fail(err, errlen, "wbuf: %llu must be smaller than dram %llu",
		            (unsigned long long)cfg->wbuf_bytes,
		            (unsigned long long)cfg->dram_bytes);
	if (cfg->slot_bytes < 512 || cfg->slot_bytes > (1ull << 30))
		return fail(err, errlen, "slot_size: %llu not in 512..1G",
		            (unsigned long long)cfg->slot_bytes);
	if (cfg->resident_bytes >= cfg->dram_bytes - cfg->wbuf_bytes)
		return fail(err, errlen, "resident: %llu must be smaller than dram - wbuf (%llu)",
		            (unsigned long long)cfg->resident_bytes,
		            (unsigned long long)(cfg->dram_bytes - cfg->wbuf_bytes));
	uint64_t window = cfg->dram_bytes - cfg->wbuf_bytes - cfg->resident_bytes;
	uint64_t stride = CHM_ALIGN_UP(cfg->slot_bytes, CHM_FILL_ALIGN) + CHM_FILL_ALIGN;
	uint64_t fits = window / stride;
	if (fits < 1 && cfg->slot_bytes == d.slot_bytes)
		return fail(err, errlen,
		            "slot_size: one slot of the default slot_size (%llu bytes with "
		            "alignment) does not fit the staging window (dram - wbuf%s = %llu): "
		            "pass a smaller slot_size%s or a larger dram",
		            (unsigned long long)stride, cfg->resident_bytes ? " - resident" : "",
		            (unsigned long long)window,
		            cfg->wbuf_bytes == d.wbuf_bytes ? " or wbuf" : "");
	if (fits < 1)
		return fail(
		        err, errlen,
		        "slot_size: one slot (%llu bytes with alignment) does not fit the staging "
		        "window (dram - wbuf = %llu)",
		        (unsigned long long)stride, (unsigned long long)window);
	if (cfg->slot_count > fits)
		return fail(err, errlen,
		            "slots: %u slots of %llu bytes need %llu bytes, the staging "
		            "window (dram - wbuf - resident) has %llu",
		            cfg->slot_count, (unsigned long long)stride,
		            (unsigned long long)(stride * cfg->slot_count),
		            (unsigned long long)window);
	uint64_t nslots =
	        cfg->slot_count ? cfg->slot_count : (fits > (1u << 20) ? (1u << 20) : fits);
	if (nslots + cfg->refill_queue >= (1u << 24))
		return fail(err, errlen,
		            "slots + refill_queue: %llu + %u must stay below 2^24 (16777216)",
		            (unsigned long long)nslots, cfg->refill_queue);
	return 0;
}
