/* test_regress_lru_ghost_replay.c - lru mode on the ghost backend in virtual
 * time replays a fixed mix of calls with exactly the same outcome as the
 * per-line code it was optimised from.
 *
 * A seeded sequence of whole-object reads and writes (most of them), partial
 * reads and writes at unaligned offsets inside lines, accesses larger than a
 * fill batch or than the whole cache, prefetch hints, flushes and clock
 * advances runs on three small devices (64 KiB lines, 1 MiB lines, and
 * 64 KiB lines with accesses spanning several fill batches). After every
 * call its return code, the device clock and the lru counters (hits,
 * misses, refills, dirty evictions, write-back bytes, valid and dirty
 * lines, SSD bytes read and written, read hits and misses, read waits) are
 * folded into a digest. The expected digests, final clocks and counters
 * below were computed by running this program against the per-line code of
 * commit 6ff730d (one hash lookup, one recency move and one timing-model
 * call per line), before the run batching; a change to any hit, miss,
 * eviction, write-back or simulated time shows up here. The digests were
 * recomputed once since, when read_wait_flush_ns became device time and
 * began counting reads behind an eager write-back the model had not
 * finished (it was 0 in every call here before); the final clocks and
 * counters are still those of 6ff730d.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chm.h"
#include "check.h"

struct scenario {
	const char *name;
	const char *line, *dram, *slot;
	uint64_t object;   /* bytes of a whole-object access */
	uint64_t nobjects; /* distinct objects (a few times the cache) */
	unsigned ops;
	/* expected (from commit 6ff730d) */
	uint64_t digest, clock_ns, hits, misses, refills, dirty_evictions, writeback_bytes;
};

static uint64_t fold(uint64_t h, uint64_t v)
{
	for (int i = 0; i < 8; i++) {
		h ^= (v >> (8 * i)) & 0xff;
		h *= 0x100000001b3ull; /* FNV-1a */
	}
	return h;
}

static uint64_t fold_state(uint64_t h, chm_dev *dev, int rc)
{
	struct chm_stats st;
	CHECK_RC(chm_stats(dev, &st), 0);
	const uint64_t v[] = {(uint64_t)(int64_t)rc,  st.clock_now_ns,      st.lru_hits,
	                      st.lru_misses,          st.lru_refills,       st.lru_dirty_evictions,
	                      st.lru_writeback_bytes, st.lru_lines_valid,   st.lru_lines_dirty,
	                      st.bytes_read_ssd,      st.bytes_written_ssd, st.read_hits,
	                      st.read_misses,         st.bytes_from_dram,   st.read_wait_flush_ns};
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		h = fold(h, v[i]);
	return h;
}

static void run(const struct scenario *sc)
{
	struct chm_config c;
	chm_dev *dev;
	cfg_init(&c, "backend", "ghost", "clock", "virtual", "timing", "fpga-cxlhm", "mode", "lru",
	         "capacity", "16T", "dram", sc->dram, "lru_line", sc->line, "slot_size", sc->slot,
	         "slots", "2");
	int rc = chm_dev_open(&c, &dev);
	CHECK(rc == 0, "%s: open: %s", sc->name, chm_strerror(rc));
	if (rc)
		return;

	const uint64_t obj = sc->object, big = 4 * obj;
	char *buf = malloc(big); /* the ghost backend never touches it */
	uint64_t seed = 0x243f6a8885a308d3ull, h = 0xcbf29ce484222325ull;
	/* objects sit spread over the first 2 TiB, some past 8 TiB */
	const uint64_t stride = (2ull << 40) / sc->nobjects / obj * obj;
	for (unsigned op = 0; op < sc->ops; op++) {
		uint64_t r = check_rng(&seed), kind = r % 100;
		/* skewed: 3/4 of the accesses go to a sixteenth of the objects */
		uint64_t o = (r >> 8) % (r & 0xc0 ? sc->nobjects / 16 : sc->nobjects);
		uint64_t addr = o * stride + ((r >> 40) & 1 ? (8ull << 40) : 0);
		uint64_t off = ((r >> 20) % (obj / 4096)) * 4096;
		if (kind < 40) {
			rc = chm_read(dev, addr, buf, obj);
		} else if (kind < 78) {
			rc = chm_write_object(dev, addr, NULL, obj, 0);
		} else if (kind < 84) { /* partial read, unaligned inside a line */
			rc = chm_read(dev, addr + off + 512, buf, obj / 3 + 1000);
		} else if (kind < 90) { /* partial write, 4 KiB aligned */
			rc = chm_write_object(dev, addr + off, NULL, obj / 2 + 4096, 0);
		} else if (kind < 93) { /* larger than a batch, or the cache */
			rc = (r >> 30) & 1 ? chm_read(dev, addr, buf, big)
			                   : chm_write_object(dev, addr, NULL, big, 0);
		} else if (kind < 96) { /* a prefetch hint fills the cache */
			chm_handle hd;
			struct chm_view v;
			rc = chm_prefetch_object(dev, addr, obj, 0, &hd);
			if (rc == 0) {
				rc = chm_prefetch_wait(dev, hd, UINT64_MAX, &v);
				CHECK_RC(chm_prefetch_release(dev, hd), 0);
			}
		} else if (kind < 98) {
			rc = chm_flush(dev, UINT64_MAX);
		} else {
			uint64_t now;
			CHECK_RC(chm_clock_ns(dev, &now), 0);
			rc = chm_advance_clock(dev, now + (r >> 50) * 1000);
		}
		CHECK(rc == 0, "%s: op %u (kind %llu) returned %d (%s)", sc->name, op,
		      (unsigned long long)kind, rc, chm_strerror(rc));
		h = fold_state(h, dev, rc);
	}
	CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
	h = fold_state(h, dev, 0);

	struct chm_stats st;
	CHECK_RC(chm_stats(dev, &st), 0);
	printf("%s: digest 0x%016llx clock %llu ns, hits %llu misses %llu refills %llu, "
	       "dirty evictions %llu, written back %llu bytes\n",
	       sc->name, (unsigned long long)h, (unsigned long long)st.clock_now_ns,
	       (unsigned long long)st.lru_hits, (unsigned long long)st.lru_misses,
	       (unsigned long long)st.lru_refills, (unsigned long long)st.lru_dirty_evictions,
	       (unsigned long long)st.lru_writeback_bytes);
	CHECK(st.clock_now_ns == sc->clock_ns, "%s: clock %llu, want %llu", sc->name,
	      (unsigned long long)st.clock_now_ns, (unsigned long long)sc->clock_ns);
	CHECK(st.lru_hits == sc->hits && st.lru_misses == sc->misses &&
	              st.lru_refills == sc->refills,
	      "%s: hits/misses/refills %llu/%llu/%llu, want %llu/%llu/%llu", sc->name,
	      (unsigned long long)st.lru_hits, (unsigned long long)st.lru_misses,
	      (unsigned long long)st.lru_refills, (unsigned long long)sc->hits,
	      (unsigned long long)sc->misses, (unsigned long long)sc->refills);
	CHECK(st.lru_dirty_evictions == sc->dirty_evictions &&
	              st.lru_writeback_bytes == sc->writeback_bytes,
	      "%s: dirty evictions %llu, written back %llu, want %llu, %llu", sc->name,
	      (unsigned long long)st.lru_dirty_evictions,
	      (unsigned long long)st.lru_writeback_bytes, (unsigned long long)sc->dirty_evictions,
	      (unsigned long long)sc->writeback_bytes);
	CHECK(st.lru_lines_dirty == 0, "%s: %llu lines dirty after flush", sc->name,
	      (unsigned long long)st.lru_lines_dirty);
	CHECK(h == sc->digest, "%s: digest 0x%016llx, want 0x%016llx (a call's outcome changed)",
	      sc->name, (unsigned long long)h, (unsigned long long)sc->digest);
	chm_dev_close(dev);
	free(buf);
}

int main(void)
{
	static const struct scenario scs[] = {
	        {"64K lines", "64K", "32M", "4M", 4u << 20, 64, 1500, 0x5ced270431b86c63ull,
	         640794940, 39318, 54037, 22861, 0, 2946236416ull},
	        {"1M lines", "1M", "64M", "16M", 16u << 20, 32, 1000, 0x259920c6be148300ull,
	         1405027351, 6785, 8933, 3813, 0, 7950303232ull},
	        {"64K lines, batches", "64K", "96M", "64M", 64u << 20, 16, 200,
	         0x90a53736e4e964d9ull, 1040843803, 48561, 145681, 63986, 5120, 6308888576ull},
	};
	for (size_t i = 0; i < sizeof(scs) / sizeof(scs[0]); i++)
		run(&scs[i]);
	printf("%d checks, %d failures\n", checks, failures);
	return failures ? 1 : 0;
}
