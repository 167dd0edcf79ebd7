/*
 * test_timing_ios.c - chm_timing_ssd_ios() is n chm_timing_ssd() calls.
 *
 * Checks: on random parameters (1 to 64 channels, with and without
 * latency and bandwidth, the presets) and random states (earlier transfers
 * at earlier and later times, so that some channels are idle and some
 * busy, with ties), a batch of n transfers at one now (mixed reads and
 * writes, runs of equal lengths and odd ones, n from 0 to 300) gives every
 * io the completion time the same transfers get one chm_timing_ssd() call
 * at a time, returns the latest, and leaves the model in the same state
 * (every channel, both pipes).
 */
#include <stdio.h>
#include <string.h>

#include "dev.h"
#include "check.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rng(void)
{
	return check_rng(&rng_state);
}

static struct chm_timing random_params(unsigned k)
{
	struct chm_timing t = {0};
	if (k % 5 == 0) {
		chm_timing_preset(k % 10 ? "gen5-tlc-200g" : "fpga-cxlhm", &t);
		return t;
	}
	t.ssd_read_lat_ns = rng() % 3 ? rng() % 100000 : 0;
	t.ssd_write_lat_ns = rng() % 3 ? rng() % 50000 : 0;
	t.ssd_read_bw_bps = rng() % 4 ? 1000000000ull + rng() % 30000000000ull : 0;
	t.ssd_write_bw_bps = rng() % 4 ? 1000000000ull + rng() % 20000000000ull : 0;
	t.ssd_channels = (uint32_t)(rng() % 66); /* 0 (= 1) to 65 (= 64) */
	t.link_bw_bps = 25000000000ull;
	return t;
}

static uint32_t random_len(void)
{
	static const uint32_t lens[] = {4096, 65536, 1u << 20, 4u << 20};
	return rng() % 8 ? lens[rng() % 4] : (uint32_t)(4096 * (1 + rng() % 1024));
}

int main(void)
{
	static struct chm_io ios[300];
	unsigned batches = 0;

	for (unsigned k = 0; k < 400; k++) {
		struct chm_timing p = random_params(k);
		struct chm_timing_state a, b;
		chm_timing_init(&a, &p);
		uint64_t now = rng() % 1000000;
		for (unsigned w = 0; w < rng() % 200; w++) { /* a history */
			chm_timing_ssd(&a, (int)(rng() % 2), now, random_len());
			now += rng() % 3 ? rng() % 20000 : 0;
		}
		b = a;
		for (unsigned r = 0; r < 6; r++) {
			unsigned n = (unsigned)(rng() % 4 ? rng() % 300 : rng() % 9);
			int op = (int)(rng() % 2);
			uint32_t len = random_len();
			for (unsigned i = 0; i < n; i++) {
				if (rng() % 10 == 0) { /* an odd one inside a run */
					op = (int)(rng() % 2);
					len = random_len();
				}
				memset(&ios[i], 0, sizeof(ios[i]));
				ios[i].op = op ? CHM_IO_WRITE : CHM_IO_READ;
				ios[i].len = len;
			}
			uint64_t latest = now, want[300];
			for (unsigned i = 0; i < n; i++) {
				want[i] = chm_timing_ssd(&a, ios[i].op == CHM_IO_WRITE, now,
				                         ios[i].len);
				latest = want[i] > latest ? want[i] : latest;
			}
			uint64_t got = chm_timing_ssd_ios(&b, now, ios, n);
			unsigned bad = 0;
			for (unsigned i = 0; i < n; i++)
				bad += ios[i].model_done_ns != want[i];
			CHECK(bad == 0, "params %u batch %u: %u of %u completions differ", k, r,
			      bad, n);
			CHECK(got == latest, "params %u batch %u: latest %llu, want %llu", k, r,
			      (unsigned long long)got, (unsigned long long)latest);
			CHECK(memcmp(a.chan_free_ns, b.chan_free_ns, sizeof(a.chan_free_ns)) == 0 &&
			              a.ssd_read_free_ns == b.ssd_read_free_ns &&
			              a.ssd_write_free_ns == b.ssd_write_free_ns,
			      "params %u batch %u: the model's state differs", k, r);
			now += rng() % 2 ? rng() % 100000 : 0;
			batches++;
		}
	}
	printf("%u batches, %d checks, %d failures\n", batches, checks, failures);
	return failures ? 1 : 0;
}
