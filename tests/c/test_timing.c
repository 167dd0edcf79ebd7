/*
 * test_timing.c - the timing model's bounds and presets.
 *
 * Checks: completion is monotonic in transfer size; a burst never beats
 * total / bandwidth (SSD read, SSD write, DRAM->host); n simultaneous small
 * transfers on c channels finish no earlier than ceil(n/c) * latency (and
 * exactly then when bandwidth is unlimited, so the channel count is honoured);
 * zero parameters mean no delay; terabyte transfers do not overflow; presets
 * load, unknown names are -ENOENT and NULL arguments -EINVAL.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dev.h"
#include "check.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
	return check_rng(&rng_state);
}

/* ceil(a * 1e9 / b) in 128-bit, the test's own arithmetic. */
static uint64_t ns_for(uint64_t bytes, uint64_t bw)
{
	unsigned __int128 n = (unsigned __int128)bytes * 1000000000u;

	return (uint64_t)((n + bw - 1) / bw);
}

static const char *const preset_names[] = {"none", "gen5-tlc-200g", "fpga-cxlhm"};

static struct chm_timing custom(uint64_t lat, uint64_t bw, uint32_t ch)
{
	struct chm_timing t;

	memset(&t, 0, sizeof(t));
	t.ssd_read_lat_ns = lat;
	t.ssd_write_lat_ns = lat / 2;
	t.ssd_read_bw_bps = bw;
	t.ssd_write_bw_bps = bw / 2;
	t.ssd_channels = ch;
	t.dram_bw_bps = bw * 3;
	t.link_bw_bps = bw * 2;
	t.link_lat_ns = lat / 10;
	return t;
}

/* The parameter sets every property is checked against. */
static int param_sets(struct chm_timing *out, int max)
{
	int n = 0;

	for (unsigned i = 0; i < sizeof(preset_names) / sizeof(preset_names[0]); i++)
		if (n < max && chm_timing_preset(preset_names[i], &out[n]) == 0)
			n++;
	if (n + 5 > max)
		return n;
	out[n++] = custom(50000, 1000000000ull, 4);
	out[n++] = custom(0, 7000000000ull, 16);      /* bandwidth only */
	out[n++] = custom(80000, 0, 8);               /* latency only */
	out[n++] = custom(10000, 3000000000ull, 0);   /* 0 channels = 1 */
	out[n++] = custom(10000, 3000000000ull, 200); /* capped at 64 */
	return n;
}

/* Random history so the monotonicity check also sees busy channels. */
static void warm(struct chm_timing_state *ts, uint64_t *now)
{
	int n = (int)(rng() % 200);

	for (int i = 0; i < n; i++) {
		*now += rng() % 20000;
		if (rng() % 3 == 0)
			chm_timing_host(ts, *now, rng() % (4u << 20));
		else
			chm_timing_ssd(ts, (int)(rng() % 2), *now, 1 + rng() % (2u << 20));
	}
}

static void test_monotonic(const struct chm_timing *sets, int nsets)
{
	static const uint64_t sizes[] = {
	        0, 1, 512, 4096, 65536, 1u << 20, 16u << 20, (1ull << 30) + 7, 1ull << 40};
	const int nsizes = (int)(sizeof(sizes) / sizeof(sizes[0]));
	int bad = 0;

	for (int s = 0; s < nsets; s++) {
		for (int trial = 0; trial < 50; trial++) {
			struct chm_timing_state base, a, b;
			uint64_t now = rng() % 1000000, prev_ssd[2] = {0, 0}, prev_host = 0;

			chm_timing_init(&base, &sets[s]);
			warm(&base, &now);
			for (int k = 0; k < nsizes; k++) {
				for (int w = 0; w < 2; w++) {
					uint64_t t;

					a = base;
					t = chm_timing_ssd(&a, w, now, sizes[k]);
					if (t < prev_ssd[w] || t < now)
						bad++;
					prev_ssd[w] = t;
				}
				b = base;
				uint64_t h = chm_timing_host(&b, now, sizes[k]);
				if (h < prev_host || h < now)
					bad++;
				prev_host = h;
			}
			/* random pairs, too */
			for (int k = 0; k < 20; k++) {
				uint64_t x = rng() % (64u << 20), y = x + rng() % (64u << 20);
				int w = (int)(rng() % 2);

				a = base;
				b = base;
				if (chm_timing_ssd(&a, w, now, x) > chm_timing_ssd(&b, w, now, y))
					bad++;
			}
		}
	}
	CHECK(bad == 0, "%d size pairs finished in the wrong order", bad);
	printf("ok   monotonic in size (%d parameter sets, random histories)\n", nsets);
}

static void test_bandwidth_bound(const struct chm_timing *sets, int nsets)
{
	int bad = 0, tested = 0;

	for (int s = 0; s < nsets; s++) {
		for (int w = 0; w < 3; w++) { /* 0 read, 1 write, 2 host */
			uint64_t bw;

			if (w == 2)
				bw = sets[s].dram_bw_bps && sets[s].link_bw_bps
				             ? (sets[s].dram_bw_bps < sets[s].link_bw_bps
				                        ? sets[s].dram_bw_bps
				                        : sets[s].link_bw_bps)
				             : (sets[s].dram_bw_bps | sets[s].link_bw_bps);
			else
				bw = w ? sets[s].ssd_write_bw_bps : sets[s].ssd_read_bw_bps;
			if (!bw)
				continue;
			for (int trial = 0; trial < 20; trial++) {
				struct chm_timing_state ts;
				uint64_t now = 0, t0, total = 0, last = 0;
				int n = 1 + (int)(rng() % 500);

				chm_timing_init(&ts, &sets[s]);
				warm(&ts, &now);
				t0 = now;
				for (int i = 0; i < n; i++) {
					uint64_t len = 1 + rng() % (1u << 20), t;

					/* submissions spread a little after t0 */
					uint64_t at = t0 + rng() % 1000;

					t = w == 2 ? chm_timing_host(&ts, at, len)
					           : chm_timing_ssd(&ts, w, at, len);
					total += len;
					if (t > last)
						last = t;
				}
				tested++;
				if (last < t0 + ns_for(total, bw)) {
					bad++;
					printf("     set %d kind %d: %llu bytes done at +%llu ns, bound %llu\n",
					       s, w, (unsigned long long)total,
					       (unsigned long long)(last - t0),
					       (unsigned long long)ns_for(total, bw));
				}
			}
		}
	}
	CHECK(tested > 0 && bad == 0, "%d of %d bursts beat total/bw", bad, tested);
	printf("ok   bandwidth-bounded: %d bursts (SSD read, SSD write, host) never beat total/bw\n",
	       tested);
}

static void test_parallelism_bound(void)
{
	static const uint32_t chans[] = {0, 1, 3, 16, 64, 100};
	static const int counts[] = {1, 2, 7, 16, 63, 64, 65, 200};
	const uint64_t lat = 50000, t0 = 1000;
	int bad = 0, exact_bad = 0;

	for (unsigned ci = 0; ci < sizeof(chans) / sizeof(chans[0]); ci++) {
		uint32_t eff = chans[ci] == 0 ? 1 : (chans[ci] > 64 ? 64 : chans[ci]);

		for (unsigned ni = 0; ni < sizeof(counts) / sizeof(counts[0]); ni++) {
			for (int withbw = 0; withbw < 2; withbw++) {
				struct chm_timing p;
				struct chm_timing_state ts;
				int n = counts[ni];
				uint64_t last = 0, bound = (uint64_t)((n + eff - 1) / eff) * lat;

				memset(&p, 0, sizeof(p));
				p.ssd_read_lat_ns = lat;
				p.ssd_channels = chans[ci];
				p.ssd_read_bw_bps = withbw ? 10000000000ull : 0;
				chm_timing_init(&ts, &p);
				for (int i = 0; i < n; i++) {
					uint64_t t = chm_timing_ssd(&ts, 0, t0, 4096);

					if (t > last)
						last = t;
				}
				if (last < t0 + bound) {
					bad++;
					printf("     c=%u n=%d: done +%llu < %llu\n", chans[ci], n,
					       (unsigned long long)(last - t0),
					       (unsigned long long)bound);
				}
				if (!withbw && last != t0 + bound) {
					exact_bad++;
					printf("     c=%u n=%d unlimited bw: done +%llu, expected %llu\n",
					       chans[ci], n, (unsigned long long)(last - t0),
					       (unsigned long long)bound);
				}
			}
		}
	}
	CHECK(bad == 0, "%d cases finished before ceil(n/c)*L", bad);
	CHECK(exact_bad == 0, "%d cases not exactly ceil(n/c)*L with unlimited bandwidth",
	      exact_bad);
	printf("ok   parallelism-bounded: n transfers on c channels >= ceil(n/c)*L "
	       "(c = 0->1, 1, 3, 16, 64, 100->64)\n");
}

static void test_single_transfer(void)
{
	struct chm_timing p;
	struct chm_timing_state ts;
	uint64_t t;

	/* lat + len * C / bw on one channel */
	memset(&p, 0, sizeof(p));
	p.ssd_read_lat_ns = 60000;
	p.ssd_read_bw_bps = 14000000000ull;
	p.ssd_channels = 16;
	chm_timing_init(&ts, &p);
	t = chm_timing_ssd(&ts, 0, 5000, 1u << 20);
	CHECK(t == 5000 + 60000 + ns_for((1u << 20) * 16ull, 14000000000ull),
	      "1 MiB read done at %llu", (unsigned long long)t);

	/* 1 TB read: len * C * 1e9 overflows 64 bits; the model must not */
	chm_timing_init(&ts, &p);
	t = chm_timing_ssd(&ts, 0, 0, 1000000000000ull);
	CHECK(t == 60000 + ns_for(16000000000000ull, 14000000000ull), "1 TB read done at %llu ns",
	      (unsigned long long)t);

	/* absurd sizes saturate instead of wrapping */
	p.ssd_read_bw_bps = 1;
	chm_timing_init(&ts, &p);
	t = chm_timing_ssd(&ts, 0, 1000, UINT64_MAX / 2);
	CHECK(t == UINT64_MAX, "saturating: %llu", (unsigned long long)t);

	/* zero bandwidth = unlimited, zero latency = none */
	memset(&p, 0, sizeof(p));
	p.ssd_write_lat_ns = 20000;
	chm_timing_init(&ts, &p);
	t = chm_timing_ssd(&ts, 1, 100, 1ull << 40);
	CHECK(t == 20100, "latency only: %llu", (unsigned long long)t);
	t = chm_timing_ssd(&ts, 0, 100, 1ull << 40);
	CHECK(t == 20100, "reads and writes share the one channel: %llu", (unsigned long long)t);
	p.ssd_channels = 2;
	chm_timing_init(&ts, &p);
	chm_timing_ssd(&ts, 1, 100, 4096);
	t = chm_timing_ssd(&ts, 0, 100, 1ull << 40);
	CHECK(t == 100, "no read parameters, free channel: %llu", (unsigned long long)t);

	/* host: max(dram, link) bound, link latency, serialised on the link */
	memset(&p, 0, sizeof(p));
	p.dram_bw_bps = 50000000000ull;
	p.link_bw_bps = 25000000000ull;
	p.link_lat_ns = 1500;
	chm_timing_init(&ts, &p);
	t = chm_timing_host(&ts, 0, 25000000);
	CHECK(t == 1000000 + 1500, "25 MB over 25 GB/s: %llu", (unsigned long long)t);
	t = chm_timing_host(&ts, 0, 25000000);
	CHECK(t == 2000000 + 1500, "second transfer serialised: %llu", (unsigned long long)t);
	p.dram_bw_bps = 5000000000ull;
	chm_timing_init(&ts, &p);
	t = chm_timing_host(&ts, 0, 25000000);
	CHECK(t == 5000000 + 1500, "DRAM slower than link: %llu", (unsigned long long)t);

	/* pure: the same state and request give the same answer */
	{
		struct chm_timing_state a, b;
		uint64_t now = 0;

		chm_timing_preset("gen5-tlc-200g", &p);
		chm_timing_init(&a, &p);
		warm(&a, &now);
		b = a;
		CHECK(chm_timing_ssd(&a, 0, now, 12345) == chm_timing_ssd(&b, 0, now, 12345) &&
		              memcmp(&a, &b, sizeof(a)) == 0,
		      "two copies of one state diverged");
	}
	printf("ok   single transfers: exact formula, 128-bit math, saturation, zero = "
	       "none/unlimited, host link, purity\n");
}

static void test_none(void)
{
	struct chm_timing p;
	struct chm_timing_state ts;
	int bad = 0;

	CHECK(chm_timing_preset("none", &p) == 0, "none preset");
	chm_timing_init(&ts, &p);
	CHECK(!ts.enabled, "none preset enabled");
	for (int i = 0; i < 1000; i++) {
		uint64_t now = rng(), len = rng() >> (rng() % 64);

		if (chm_timing_ssd(&ts, i & 1, now, len) != now ||
		    chm_timing_host(&ts, now, len) != now)
			bad++;
	}
	CHECK(bad == 0, "%d delays with the none preset", bad);
	chm_timing_init(&ts, NULL);
	CHECK(!ts.enabled && chm_timing_ssd(&ts, 0, 7, 1 << 20) == 7, "NULL params = none");
	memset(&p, 0, sizeof(p));
	p.link_lat_ns = 1;
	chm_timing_init(&ts, &p);
	CHECK(ts.enabled, "one non-zero parameter enables the model");
	printf("ok   none preset / zero parameters: no delay, enabled=false\n");
}

static void test_presets(void)
{
	struct chm_timing g, f, sentinel;
	uint64_t gen5_read, gen5_write;

	CHECK(chm_timing_preset("gen5-tlc-200g", &g) == 0, "gen5 preset");
	CHECK(chm_timing_preset("fpga-cxlhm", &f) == 0, "fpga preset");
	gen5_read = g.ssd_read_bw_bps;
	gen5_write = g.ssd_write_bw_bps;
	CHECK(gen5_read >= 12000000000ull && gen5_read <= 16000000000ull, "gen5 read bw %llu",
	      (unsigned long long)gen5_read);
	CHECK(gen5_write >= 8000000000ull && gen5_write <= 12000000000ull, "gen5 write bw %llu",
	      (unsigned long long)gen5_write);
	CHECK(g.ssd_read_lat_ns >= 40000 && g.ssd_read_lat_ns <= 100000, "gen5 read lat");
	CHECK(g.ssd_write_lat_ns > 0 && g.ssd_write_lat_ns < g.ssd_read_lat_ns, "gen5 write lat");
	CHECK(g.ssd_channels == 16, "gen5 channels %u", g.ssd_channels);
	CHECK(g.link_bw_bps == 25000000000ull, "200 Gb/s link = 25e9 B/s");
	CHECK(g.link_lat_ns > 0 && g.dram_bw_bps >= 40000000000ull, "gen5 link lat / DRAM bw");
	CHECK(f.ssd_read_bw_bps == 2 * gen5_read && f.ssd_write_bw_bps == 2 * gen5_write,
	      "fpga = 2x Gen5 bandwidth");
	CHECK(f.link_bw_bps == 25000000000ull && f.link_lat_ns > g.link_lat_ns,
	      "fpga link 200 Gb/s, slower hop");
	CHECK(f.dram_bw_bps >= 15000000000ull && f.dram_bw_bps <= 25000000000ull,
	      "fpga DDR4 ~20 GB/s");
	memset(&sentinel, 0xa5, sizeof(sentinel));
	CHECK(chm_timing_preset("gen5", &sentinel) == -ENOENT, "unknown preset");
	CHECK(chm_timing_preset("", &sentinel) == -ENOENT, "empty preset name");
	CHECK(chm_timing_preset("NONE", &sentinel) == -ENOENT, "names are case-sensitive");
	CHECK(((unsigned char *)&sentinel)[0] == 0xa5, "failed lookup wrote *out");
	CHECK(chm_timing_preset(NULL, &sentinel) == -EINVAL, "NULL name");
	CHECK(chm_timing_preset("none", NULL) == -EINVAL, "NULL out");
	printf("ok   presets: none, gen5-tlc-200g (%.0f/%.0f GB/s, %llu us), fpga-cxlhm "
	       "(%.0f/%.0f GB/s); unknown -ENOENT, NULL -EINVAL\n",
	       g.ssd_read_bw_bps / 1e9, g.ssd_write_bw_bps / 1e9,
	       (unsigned long long)(g.ssd_read_lat_ns / 1000), f.ssd_read_bw_bps / 1e9,
	       f.ssd_write_bw_bps / 1e9);
}

int main(void)
{
	struct chm_timing sets[16];
	int nsets = param_sets(sets, 16);

	test_presets();
	test_none();
	test_single_transfer();
	test_monotonic(sets, nsets);
	test_bandwidth_bound(sets, nsets);
	test_parallelism_bound();
	return check_summary();
}
