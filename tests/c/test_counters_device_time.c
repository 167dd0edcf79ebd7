/* test_counters_device_time.c - the duration counters in device time.
 *
 * In virtual time a fill's I/O completes before the clock moves, so a
 * refill latency taken as "clock at completion - clock at issue" was 0, and
 * read_wait_flush_ns summed host nanoseconds (different on every run, for
 * identical simulated results). Both are device time now: a fill's latency
 * ends when the model's completion does, and a read that overlapped a flush
 * batch (prefetch mode) or write-back I/O (lru mode: its own dirty victims',
 * or an eager write-back the model has not finished) counts its device
 * duration.
 *
 * A prefetch that waited in the refill queue for a slot adds that wait
 * (issue to fill start, device time) to refill_queue_wait_ns.
 *
 * Every figure is written out by hand from a timing model with one SSD
 * channel, whole-object I/Os (max_io 1M) and an unlimited link and DRAM:
 *
 *   SSD write of 1 MiB: 100 us latency + 1,048,576 B / 1e9 B/s = 1,148,576 ns
 *   SSD read of 1 MiB:   50 us latency + 1,048,576 B / 2e9 B/s =   574,288 ns
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chm.h"
#include "check.h"

#define MiB (1ull << 20)
#define WR_NS 1148576ull
#define RD_NS 574288ull

static chm_dev *open_dev(const char *mode)
{
	struct chm_config c;
	chm_config_init(&c);
	cfg_set(&c, "backend", "ghost");
	cfg_set(&c, "clock", "virtual");
	cfg_set(&c, "capacity", "1G");
	cfg_set(&c, "mode", mode);
	cfg_set(&c, "max_io", "1M");
	cfg_set(&c, "ssd_channels", "1");
	cfg_set(&c, "ssd_read_lat_ns", "50000");
	cfg_set(&c, "ssd_write_lat_ns", "100000");
	cfg_set(&c, "ssd_read_bw_bps", "2000000000");
	cfg_set(&c, "ssd_write_bw_bps", "1000000000");
	if (strcmp(mode, "prefetch") == 0) {
		cfg_set(&c, "dram", "16M");
		cfg_set(&c, "wbuf", "4M");
		cfg_set(&c, "slot_size", "1M");
	} else {
		cfg_set(&c, "dram", "1M");
		cfg_set(&c, "lru_line", "1M");
	}
	chm_dev *dev = NULL;
	CHECK_RC(chm_dev_open(&c, &dev), 0);
	return dev;
}

static void prefetch_mode(void)
{
	static char buf[1 << 20];
	struct chm_stats st;
	chm_handle h;
	struct chm_view v;
	chm_dev *dev = open_dev("prefetch");
	if (!dev)
		return;
	/* t=0: a write is admitted at once (link unlimited) and its flush batch
	 * starts at once, holding the one channel until WR_NS */
	CHECK_RC(chm_write_object(dev, 0, buf, MiB, 0), 0);
	chm_stats(dev, &st);
	CHECK(st.clock_now_ns == 0, "clock %llu after the write",
	      (unsigned long long)st.clock_now_ns);
	/* t=0: a fill of another object waits for the channel: ready at
	 * WR_NS + RD_NS; it overlapped the batch */
	CHECK_RC(chm_prefetch_object(dev, 16 * MiB, MiB, 0, &h), 0);
	CHECK_RC(chm_prefetch_wait(dev, h, UINT64_MAX, &v), 0);
	CHECK_RC(chm_prefetch_release(dev, h), 0);
	chm_stats(dev, &st);
	CHECK(st.clock_now_ns == WR_NS + RD_NS, "clock %llu after the first fill",
	      (unsigned long long)st.clock_now_ns);
	CHECK(st.refill_lat_count == 1 && st.refill_lat_sum_ns == WR_NS + RD_NS,
	      "first fill: %llu fills, %llu ns (want 1, %llu)",
	      (unsigned long long)st.refill_lat_count, (unsigned long long)st.refill_lat_sum_ns,
	      WR_NS + RD_NS);
	CHECK(st.read_wait_flush_ns == WR_NS + RD_NS, "read_wait_flush_ns %llu (want %llu)",
	      (unsigned long long)st.read_wait_flush_ns, WR_NS + RD_NS);
	CHECK(st.flush_batches == 1, "%llu batches", (unsigned long long)st.flush_batches);
	/* the flush is done: a second fill runs alone, RD_NS, no flush wait */
	uint64_t t = st.clock_now_ns;
	CHECK_RC(chm_prefetch_object(dev, 32 * MiB, MiB, 0, &h), 0);
	CHECK_RC(chm_prefetch_wait(dev, h, UINT64_MAX, &v), 0);
	CHECK_RC(chm_prefetch_release(dev, h), 0);
	chm_stats(dev, &st);
	CHECK(st.clock_now_ns == t + RD_NS, "clock moved %llu by the second fill",
	      (unsigned long long)(st.clock_now_ns - t));
	CHECK(st.refill_lat_count == 2 && st.refill_lat_sum_ns == WR_NS + 2 * RD_NS,
	      "two fills: %llu, %llu ns (want 2, %llu)", (unsigned long long)st.refill_lat_count,
	      (unsigned long long)st.refill_lat_sum_ns, WR_NS + 2 * RD_NS);
	CHECK(st.read_wait_flush_ns == WR_NS + RD_NS, "read_wait_flush_ns %llu after a lone fill",
	      (unsigned long long)st.read_wait_flush_ns);
	/* the histogram: [2^10, 2^11) us holds the first, [2^9, 2^10) the second */
	CHECK(st.refill_lat_hist[10] == 1 && st.refill_lat_hist[9] == 1,
	      "histogram buckets 9, 10: %llu, %llu", (unsigned long long)st.refill_lat_hist[9],
	      (unsigned long long)st.refill_lat_hist[10]);
	chm_dev_close(dev);
}

/* One slot: a second prefetch waits in the refill queue until the first is
 * released, and that wait is device time too. */
static void refill_queue(void)
{
	struct chm_config c;
	struct chm_stats st;
	chm_handle a, b;
	struct chm_view v;
	chm_dev *dev = NULL;
	chm_config_init(&c);
	cfg_set(&c, "backend", "ghost");
	cfg_set(&c, "clock", "virtual");
	cfg_set(&c, "capacity", "1G");
	cfg_set(&c, "mode", "prefetch");
	cfg_set(&c, "dram", "16M");
	cfg_set(&c, "wbuf", "4M");
	cfg_set(&c, "slot_size", "1M");
	cfg_set(&c, "slots", "1");
	cfg_set(&c, "max_io", "1M");
	cfg_set(&c, "ssd_channels", "1");
	cfg_set(&c, "ssd_read_lat_ns", "50000");
	cfg_set(&c, "ssd_read_bw_bps", "2000000000");
	CHECK_RC(chm_dev_open(&c, &dev), 0);
	if (!dev)
		return;
	/* t=0: a fills at once, ready at RD_NS; b queues */
	CHECK_RC(chm_prefetch_object(dev, 0, MiB, 0, &a), 0);
	CHECK_RC(chm_prefetch_object(dev, 16 * MiB, MiB, 0, &b), 0);
	CHECK_RC(chm_prefetch_wait(dev, a, UINT64_MAX, &v), 0);
	/* released at RD_NS: b's fill starts then, ready at 2 RD_NS */
	CHECK_RC(chm_prefetch_release(dev, a), 0);
	CHECK_RC(chm_prefetch_wait(dev, b, UINT64_MAX, &v), 0);
	CHECK_RC(chm_prefetch_release(dev, b), 0);
	chm_stats(dev, &st);
	CHECK(st.prefetch_queued == 1, "%llu queued", (unsigned long long)st.prefetch_queued);
	CHECK(st.refill_queue_wait_ns == RD_NS, "refill_queue_wait_ns %llu (want %llu)",
	      (unsigned long long)st.refill_queue_wait_ns, RD_NS);
	CHECK(st.refill_lat_count == 2 && st.refill_lat_sum_ns == 2 * RD_NS,
	      "fills %llu, %llu ns (want 2, %llu: the queue wait is not the fill's)",
	      (unsigned long long)st.refill_lat_count, (unsigned long long)st.refill_lat_sum_ns,
	      2 * RD_NS);
	CHECK(st.clock_now_ns == 2 * RD_NS, "clock %llu", (unsigned long long)st.clock_now_ns);
	chm_dev_close(dev);
}

static void lru_mode(void)
{
	static char buf[1 << 20];
	struct chm_stats st;
	chm_dev *dev = open_dev("lru");
	if (!dev)
		return;
	/* one 1 MiB line: writing line 0 makes it dirty and (virtual time)
	 * writes it back eagerly at the end of the write, charging the one
	 * channel until WR_NS without moving the clock; reading line 1 at 0
	 * evicts the clean line and its fill waits for the channel */
	CHECK_RC(chm_write_object(dev, 0, buf, MiB, 0), 0);
	chm_stats(dev, &st);
	uint64_t t = st.clock_now_ns, w0 = st.read_wait_flush_ns;
	CHECK(t == 0 && w0 == 0, "clock %llu, read_wait_flush_ns %llu after a write",
	      (unsigned long long)t, (unsigned long long)w0);
	CHECK(st.lru_writeback_bytes == MiB, "%llu bytes written back",
	      (unsigned long long)st.lru_writeback_bytes);
	CHECK_RC(chm_read(dev, MiB, buf, MiB), 0);
	chm_stats(dev, &st);
	CHECK(st.clock_now_ns == t + WR_NS + RD_NS, "the read took %llu ns (want %llu)",
	      (unsigned long long)(st.clock_now_ns - t), WR_NS + RD_NS);
	CHECK(st.read_wait_flush_ns == WR_NS + RD_NS, "read_wait_flush_ns %llu (want %llu)",
	      (unsigned long long)st.read_wait_flush_ns, WR_NS + RD_NS);
	/* with the write-back done, a miss waits for nothing */
	t = st.clock_now_ns;
	CHECK_RC(chm_read(dev, 2 * MiB, buf, MiB), 0);
	chm_stats(dev, &st);
	CHECK(st.clock_now_ns == t + RD_NS, "a lone miss took %llu ns",
	      (unsigned long long)(st.clock_now_ns - t));
	CHECK(st.read_wait_flush_ns == WR_NS + RD_NS, "read_wait_flush_ns %llu after a lone miss",
	      (unsigned long long)st.read_wait_flush_ns);
	chm_dev_close(dev);
}

int main(void)
{
	prefetch_mode();
	refill_queue();
	lru_mode();
	printf("refill latency, refill queue wait and read wait behind flushes in device time "
	       "checked\n");
	return check_summary();
}
