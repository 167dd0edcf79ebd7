/* test_resident.c - the resident region (R1..R5 of fw_spec/resident.yaml):
 * a retained object is served again from DRAM with no SSD read and the right
 * bytes; one without CHM_PF_RETAIN is not; a resident hit needs no slot; a
 * write drops an unheld entry and leaves a held view as it was (then the
 * entry is dropped at release); LRU eviction among unheld entries; chm_resident_evict;
 * the config checks and the state names. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "chm.h"

#define KiB 1024ull
#define OBJ (16 * KiB)

static chm_dev *dev;

static struct chm_stats stats(void)
{
	struct chm_stats st;
	CHECK_RC(chm_stats(dev, &st), 0);
	return st;
}

static void fill_pattern(uint8_t *b, uint64_t addr, uint64_t len, uint8_t salt)
{
	for (uint64_t i = 0; i < len; i++)
		b[i] = (uint8_t)((addr + i) * 31 + salt);
}

static void put(uint64_t addr, uint8_t salt)
{
	static uint8_t b[OBJ];
	fill_pattern(b, addr, OBJ, salt);
	CHECK_RC(chm_write_object(dev, addr, b, OBJ, 0), 0);
}

/* Prefetches, waits and checks the bytes against salt; returns the handle
 * (unreleased) and the view. */
static chm_handle get(uint64_t addr, uint32_t flags, uint8_t salt, struct chm_view *v)
{
	static uint8_t want[OBJ];
	chm_handle h = 0;
	CHECK_RC(chm_prefetch_object(dev, addr, OBJ, flags, &h), 0);
	CHECK_RC(chm_prefetch_wait(dev, h, UINT64_MAX, v), 0);
	fill_pattern(want, addr, OBJ, salt);
	CHECK(v->len == OBJ && memcmp(v->data, want, OBJ) == 0, "bytes of %llu (salt %u)",
	      (unsigned long long)addr, salt);
	return h;
}

static void get_rel(uint64_t addr, uint32_t flags, uint8_t salt)
{
	struct chm_view v;
	CHECK_RC(chm_prefetch_release(dev, get(addr, flags, salt, &v)), 0);
}

static void test_retain_hit(void)
{
	for (uint64_t a = 0; a < 8 * OBJ; a += OBJ)
		put(a, 1);
	CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
	struct chm_stats s0 = stats();
	CHECK(s0.resident_entries_total == 4, "4 entries of 20K in 80K+, got %u",
	      s0.resident_entries_total);
	get_rel(0, CHM_PF_RETAIN, 1);
	get_rel(OBJ, 0, 1); /* not retained */
	struct chm_stats s1 = stats();
	CHECK(s1.resident_retained - s0.resident_retained == 1, "one retained");
	CHECK(s1.resident_entries_used == 1, "one entry used, got %u", s1.resident_entries_used);
	get_rel(0, 0, 1);   /* a hit without the flag too */
	get_rel(OBJ, 0, 1); /* a miss */
	struct chm_stats s2 = stats();
	CHECK(s2.resident_hits - s1.resident_hits == 1, "hit");
	CHECK(s2.resident_misses - s1.resident_misses == 1, "miss");
	CHECK(s2.bytes_read_ssd - s1.bytes_read_ssd == OBJ, "only the miss read the SSD: %llu",
	      (unsigned long long)(s2.bytes_read_ssd - s1.bytes_read_ssd));
	/* a part of a resident object is a hit too */
	chm_handle h;
	struct chm_view v;
	CHECK_RC(chm_prefetch_object(dev, 4 * KiB, 4 * KiB, 0, &h), 0);
	CHECK_RC(chm_prefetch_wait(dev, h, 0, &v), 0);
	CHECK(((const uint8_t *)v.data)[0] == (uint8_t)(4 * KiB * 31 + 1), "offset view");
	CHECK_RC(chm_prefetch_release(dev, h), 0);
	CHECK_RC(chm_prefetch_release(dev, h), -ESTALE);
	CHECK(stats().resident_hits - s2.resident_hits == 1, "sub-range hit");
}

/* A resident hit takes no slot: with every slot held and NOQUEUE, it is
 * still issued and staged at once. */
static void test_no_slot_needed(void)
{
	chm_handle hs[4];
	struct chm_view v;
	for (int i = 0; i < 4; i++)
		hs[i] = get((uint64_t)(2 + i) * OBJ, 0, 1, &v);
	chm_handle h;
	CHECK_RC(chm_prefetch_object(dev, 7 * OBJ, OBJ, CHM_PF_NOQUEUE, &h), -EAGAIN);
	h = get(0, CHM_PF_NOQUEUE, 1, &v);
	CHECK_RC(chm_prefetch_release(dev, h), 0);
	for (int i = 0; i < 4; i++)
		CHECK_RC(chm_prefetch_release(dev, hs[i]), 0);
}

/* R2: a write over an unheld entry drops it; over a held one the view
 * keeps its bytes and the entry is dropped at its last release. */
static void test_writes(void)
{
	put(0, 2); /* entry of 0 unheld: dropped */
	struct chm_stats s0 = stats();
	CHECK(s0.resident_invalidated == 1, "dropped by the write");
	get_rel(0, CHM_PF_RETAIN, 2); /* a miss with the new bytes, retained again */
	CHECK(stats().resident_hits == s0.resident_hits, "no hit on a dropped entry");
	get_rel(0, 0, 2);
	CHECK(stats().resident_hits - s0.resident_hits == 1, "retained again, served");
	struct chm_view v;
	chm_handle h = get(0, 0, 2, &v);
	put(0, 3); /* held: its view is a snapshot */
	uint8_t want[OBJ];
	fill_pattern(want, 0, OBJ, 2);
	CHECK(memcmp(v.data, want, OBJ) == 0, "W11: the held view did not change");
	struct chm_stats s1 = stats();
	CHECK(s1.resident_invalidated - s0.resident_invalidated == 1, "entry went stale");
	CHECK(s1.resident_entries_used == 1, "a stale entry is still used while held");
	get_rel(0, 0, 3); /* stale: no hit, the new bytes from the SSD + log */
	CHECK(stats().resident_hits == s1.resident_hits, "no hit on a stale entry");
	CHECK_RC(chm_prefetch_release(dev, h), 0);
	CHECK(stats().resident_entries_used == 0, "stale entry dropped at the last release");
	/* a retain of a slot a write made stale while held is refused */
	h = get(OBJ, CHM_PF_RETAIN, 1, &v);
	put(OBJ, 4);
	struct chm_stats s2 = stats();
	CHECK_RC(chm_prefetch_release(dev, h), 0);
	CHECK(stats().resident_skipped - s2.resident_skipped == 1, "stale slot not retained");
	get_rel(OBJ, 0, 4);
	CHECK(stats().resident_hits == s2.resident_hits, "and not served");
	CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
}

static void test_eviction(void)
{
	CHECK_RC(chm_resident_evict(dev, 0, 8 * OBJ), 0); /* nothing resident */
	for (uint64_t i = 0; i < 5; i++)                  /* 5 objects into 4 entries: 0 goes */
		get_rel(i * OBJ, CHM_PF_RETAIN, i == 0 ? 3 : (i == 1 ? 4 : 1));
	struct chm_stats s0 = stats();
	CHECK(s0.resident_entries_used == 4, "full");
	CHECK(s0.resident_evictions >= 1, "an eviction counted");
	get_rel(0, 0, 3);
	CHECK(stats().resident_hits == s0.resident_hits, "LRU victim was object 0");
	get_rel(4 * OBJ, 0, 1);
	CHECK(stats().resident_hits - s0.resident_hits == 1, "newest stays");
	/* a held entry is never the victim */
	struct chm_view v;
	chm_handle h = get(OBJ, 0, 4, &v); /* hit, held */
	for (uint64_t i = 5; i < 8; i++)
		get_rel(i * OBJ, CHM_PF_RETAIN, 1);
	put(7 * OBJ, 1); /* drops the entry of 7 */
	struct chm_stats s1 = stats();
	get_rel(OBJ, 0, 4);
	CHECK(stats().resident_hits - s1.resident_hits == 1, "held entry survived evictions");
	CHECK_RC(chm_resident_evict(dev, OBJ, 1), 1); /* held: goes stale */
	get_rel(OBJ, 0, 4);
	CHECK(stats().resident_hits - s1.resident_hits == 1, "evicted: no more hits");
	CHECK_RC(chm_prefetch_release(dev, h), 0);
	CHECK_RC(chm_resident_evict(dev, 0, 8 * OBJ), 2); /* 5 and 6 */
	CHECK(stats().resident_entries_used == 0, "all out");
	CHECK_RC(chm_resident_evict(dev, 0, 0), -EINVAL);
	CHECK_RC(chm_resident_evict(dev, 16 << 20, 1), -EINVAL);
	CHECK_RC(chm_resident_evict(NULL, 0, 1), -EINVAL);
	CHECK_RC(chm_flush(dev, UINT64_MAX), 0);
}

static void test_config(void)
{
	struct chm_config c;
	char err[256];
	cfg_init(&c, "backend", "ghost", "capacity", "1G", "dram", "1M", "wbuf", "256K", "resident",
	         "768K");
	CHECK_RC(chm_config_validate(&c, err, sizeof(err)), -EINVAL);
	cfg_set(&c, "resident", "512K");
	cfg_set(&c, "slot_size", "4K");
	CHECK_RC(chm_config_validate(&c, err, sizeof(err)), 0);
	cfg_set(&c, "mode", "lru");
	CHECK_RC(chm_config_validate(&c, err, sizeof(err)), -EINVAL);
	CHECK(strstr(err, "resident") != NULL, "message names the option: %s", err);
	CHECK(strcmp(chm_state_name(CHM_STATE_RESIDENT, 3), "stale") == 0, "state name");
	CHECK(chm_state_name(CHM_STATE_RESIDENT, 4) == NULL, "no state 4");
	CHECK_RC(chm_prefetch_object(dev, 0, OBJ, 4, &(chm_handle){0}), -EINVAL);
}

int main(void)
{
	struct scratch sc;
	if (!scratch_make(&sc))
		return 77;
	struct chm_config c;
	cfg_init(&c, "backend", "pread", "targets", sc.path, "capacity", "16M", "dram", "1M",
	         "wbuf", "512K");
	cfg_set(&c, "resident", "80K"); /* 4 entries of 16K + 4K */
	cfg_set(&c, "slot_size", "16K");
	cfg_set(&c, "slots", "4");
	int status = scratch_open(&sc, &c, &dev, "no O_DIRECT in /tmp");
	if (status)
		return status;
	test_retain_hit();
	test_no_slot_needed();
	test_writes();
	test_eviction();
	test_config();
	chm_dev_close(dev);
	scratch_remove(&sc);
	return check_summary();
}
