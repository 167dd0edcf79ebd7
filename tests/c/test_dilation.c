/*
 * test_dilation.c - time_dilation: the real clock runs the model D times slower.
 *
 * Checks, on the ghost backend in real time (completions at modeled times,
 * no disk to add noise): a direct-mode read whose modeled cost is one SSD
 * latency takes about D times that in wall time and the same cost on the
 * device clock, for D = 1 and D = 8; a fill the (pread) backend holds back
 * is recorded in the refill latency in device time; the device clock advances 1/D of the wall time;
 * and the option's refusals (0, above 1000000, D > 1 with clock=virtual,
 * a negative value) are -EINVAL with a detail naming time_dilation. Wall
 * bounds are one-sided where the machine's noise can only add time.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "chm.h"
#include "check.h"

#define LAT_NS 20000000ull /* the one modeled cost: 20 ms of SSD read latency */

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t dev_ns(chm_dev *dev)
{
	uint64_t t = 0;
	CHECK_RC(chm_clock_ns(dev, &t), 0);
	return t;
}

static void config(struct chm_config *c, const char *mode, const char *dilation)
{
	cfg_init(c, "backend", "ghost", "clock", "real", "mode", mode, "capacity", "1G", "dram",
	         "1M", "wbuf", "64K", "slot_size", "4K", "ssd_read_lat_ns", "20000000",
	         "time_dilation", dilation);
}

/* A direct read costs LAT_NS on the device clock and LAT_NS * d of wall. */
static void paced_read(unsigned d, const char *text)
{
	struct chm_config c;
	chm_dev *dev;
	static char buf[4096];
	config(&c, "direct", text);
	CHECK_RC(chm_dev_open(&c, &dev), 0);
	if (!dev)
		return;
	uint64_t w0 = mono_ns(), t0 = dev_ns(dev);
	CHECK_RC(chm_read(dev, 0, buf, sizeof(buf)), 0);
	uint64_t t1 = dev_ns(dev), w1 = mono_ns();
	uint64_t wall = w1 - w0, device = t1 - t0;
	/* pacing never completes early: the wall time is at least D times the
	 * cost (less the clock's truncation to whole device ns) */
	CHECK(wall + d >= LAT_NS * d, "D=%u: read took %llu wall ns, model %llu x %u", d,
	      (unsigned long long)wall, LAT_NS, d);
	CHECK(device + 1 >= LAT_NS, "D=%u: read took %llu device ns, model %llu", d,
	      (unsigned long long)device, LAT_NS);
	/* a noisy host adds wall time, and 1/D of it on the device clock */
	CHECK(wall < LAT_NS * d + 500000000ull, "D=%u: read took %llu wall ns", d,
	      (unsigned long long)wall);
	CHECK(device < LAT_NS + 500000000ull / d, "D=%u: read took %llu device ns", d,
	      (unsigned long long)device);
	printf("D=%u: a %llu ns read: %.1f ms wall, %.1f ms device\n", d, LAT_NS, wall / 1e6,
	       device / 1e6);
	chm_dev_close(dev);
}

/* The refill latency histogram is in device time too: a fill the backend
 * holds back SLOW ns of wall time (pread, a real file) records about SLOW / D. */
static int refill_latency(unsigned d, const char *text)
{
	const uint64_t slow = 80000000; /* 80 ms of wall time */
	struct chm_config c;
	struct scratch sc;
	chm_dev *dev = NULL;
	if (!scratch_make(&sc)) {
		printf("SKIP: no scratch directory under /tmp\n");
		return 77;
	}
	config(&c, "prefetch", text);
	cfg_set(&c, "backend", "pread");
	cfg_set(&c, "capacity", "1M");
	cfg_set(&c, "targets", sc.path);
	int rc = scratch_open(&sc, &c, &dev, "O_DIRECT on /tmp");
	if (rc)
		return rc;
	CHECK_RC(chm_fault_inject(dev, CHM_FAULT_SLOW, 0, slow), 0);
	chm_handle h;
	struct chm_view v;
	uint64_t w0 = mono_ns();
	CHECK_RC(chm_prefetch_object(dev, 0, 4096, 0, &h), 0);
	CHECK_RC(chm_prefetch_wait(dev, h, UINT64_MAX, &v), 0);
	uint64_t wall = mono_ns() - w0;
	CHECK_RC(chm_prefetch_release(dev, h), 0);
	struct chm_stats st;
	CHECK_RC(chm_stats(dev, &st), 0);
	CHECK(st.refill_lat_count == 1, "%llu fills recorded",
	      (unsigned long long)st.refill_lat_count);
	CHECK(st.refill_lat_sum_ns + 1 >= slow / d && st.refill_lat_sum_ns <= wall / d + 1,
	      "D=%u: a fill of %llu wall ns (of a %llu ns wait) recorded as %llu ns", d,
	      (unsigned long long)slow, (unsigned long long)wall,
	      (unsigned long long)st.refill_lat_sum_ns);
	CHECK(st.pacing_late_ns <= wall / d + 1, "D=%u: lateness %llu device ns in a %llu ns wait",
	      d, (unsigned long long)st.pacing_late_ns, (unsigned long long)wall);
	printf("D=%u: a fill held %.0f ms wall: refill latency %.2f ms device\n", d, slow / 1e6,
	       st.refill_lat_sum_ns / 1e6);
	chm_dev_close(dev);
	scratch_remove(&sc);
	return 0;
}

/* clock_ns advances (wall / D): exact up to the truncation to whole ns. */
static void clock_rate(unsigned d, const char *text)
{
	struct chm_config c;
	chm_dev *dev;
	config(&c, "direct", text);
	CHECK_RC(chm_dev_open(&c, &dev), 0);
	if (!dev)
		return;
	uint64_t t0 = dev_ns(dev), w0 = mono_ns();
	struct timespec nap = {.tv_sec = 0, .tv_nsec = 100000000}; /* 100 ms */
	nanosleep(&nap, NULL);
	uint64_t w1 = mono_ns(), t1 = dev_ns(dev);
	struct chm_stats st;
	CHECK_RC(chm_stats(dev, &st), 0);
	uint64_t t2 = dev_ns(dev);
	/* [t0, t1] holds [w0, w1], and the stats' clock is the same clock */
	CHECK((t1 - t0) * d + d >= w1 - w0, "D=%u: clock moved %llu ns in %llu wall ns", d,
	      (unsigned long long)(t1 - t0), (unsigned long long)(w1 - w0));
	CHECK((t1 - t0) * d <= (w1 - w0) + 100000000ull,
	      "D=%u: clock moved %llu ns in %llu wall ns", d, (unsigned long long)(t1 - t0),
	      (unsigned long long)(w1 - w0));
	CHECK(st.clock_now_ns >= t1 && st.clock_now_ns <= t2,
	      "stats clock %llu not in [%llu, %llu]", (unsigned long long)st.clock_now_ns,
	      (unsigned long long)t1, (unsigned long long)t2);
	printf("D=%u: %.1f ms wall moved the device clock %.2f ms\n", d, (w1 - w0) / 1e6,
	       (t1 - t0) / 1e6);
	chm_dev_close(dev);
}

static void refused(const char *clock, const char *value, const char *why)
{
	struct chm_config c;
	char err[256] = "";
	chm_dev *dev = NULL;
	cfg_init(&c, "backend", "ghost", "clock", clock);
	int rc = chm_config_set(&c, "time_dilation", value, err, sizeof(err));
	if (rc == 0) {
		CHECK_RC(chm_config_validate(&c, err, sizeof(err)), -EINVAL);
		CHECK_RC(chm_dev_open_err(&c, &dev, NULL, 0), -EINVAL);
		CHECK(dev == NULL);
	} else {
		CHECK_RC(rc, -EINVAL);
	}
	CHECK(strstr(err, "time_dilation") && strstr(err, value) && strstr(err, why),
	      "time_dilation=%s clock=%s: reason '%s'", value, clock, err);
	CHECK(strstr(chm_last_error_detail(-EINVAL), "time_dilation"), "detail '%s'",
	      chm_last_error_detail(-EINVAL));
}

int main(void)
{
	paced_read(1, "1");
	paced_read(8, "8");
	int rc = refill_latency(8, "8");
	if (rc)
		return rc;
	clock_rate(1, "1");
	clock_rate(16, "16");
	refused("real", "0", "1..1000000");
	refused("real", "1000001", "1..1000000");
	refused("virtual", "2", "clock=real");
	refused("real", "-1", "unsigned");

	struct chm_config c;
	chm_config_init(&c);
	CHECK(c.time_dilation == 1, "default %u", c.time_dilation);
	char text[32];
	CHECK_RC(chm_config_get(&c, "time_dilation", text, sizeof(text)), 1);
	cfg_set(&c, "backend", "ghost");
	cfg_set(&c, "clock", "virtual");
	CHECK_RC(chm_config_validate(&c, NULL, 0), 0); /* D = 1 is every clock's */
	return check_summary();
}
