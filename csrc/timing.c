/*
 * timing.c - the timing model: pure functions from (state, request) to a
 * completion time on the device clock, in ns.
 *
 * SSD. The drive has C = ssd_channels internal channels (0 means 1, at most
 * 64), shared by reads and writes. A transfer of len bytes submitted at now:
 *
 *   ch     = the channel that frees earliest
 *   start  = max(now, chan_free[ch])
 *   t_chan = start + lat + ceil(len * C / bw)     channel busy until t_chan
 *   t_pipe = max(now, pipe_free) + ceil(len / bw) pipe busy until t_pipe
 *   done   = max(t_chan, t_pipe)
 *
 * with lat/bw/pipe the read or the write ones. One channel moves bw / C
 * bytes/s, so C busy channels together move bw; the pipe holds the aggregate
 * bound on its own, whatever the channel history. The model is:
 *   - monotonic in size: for one state and now, done grows with len;
 *   - bandwidth-bounded: every transfer advances its pipe by len / bw from no
 *     earlier than its submission, so N bytes submitted from time T are
 *     never all done before T + N / bw;
 *   - parallelism-bounded: a transfer holds one channel for at least lat, so
 *     at most C transfers overlap their latency and n transfers submitted
 *     together finish no earlier than ceil(n / C) * lat later.
 * A single transfer only gets bw / C: line rate needs C transfers in flight,
 * as on a real drive that needs queue depth to reach its datasheet figure.
 *
 * Host. A DRAM->host transfer is bounded by the slower of the DRAM and link
 * bandwidths, serialised on the link, then delayed by link_lat_ns (which
 * does not hold the link: it is propagation, not occupancy):
 *
 *   start = max(now, link_free)
 *   link_free = start + max(ceil(len / dram_bw), ceil(len / link_bw))
 *   done = link_free + link_lat
 *
 * The link is full duplex: host->DRAM transfers (writes) run the same
 * formula on their own direction (link_in_free), so they never delay a
 * read's transfer and the other way round.
 *
 * Object. An object of len bytes moved to or from the SSD is split into
 * pieces of at most `piece` bytes (max_io for whole objects, the line in lru
 * mode), all submitted at the same now; it is done when its last piece is.
 * fw_spec/cost.yaml says which of these each command pays in each mode.
 *
 * A zero bandwidth is unlimited and a zero latency is none. Divisions round
 * up, so rounding never beats a bound; 128-bit intermediates and saturating
 * sums keep terabyte transfers exact.
 *
 * Locking: the state has its own mutex (ts->lock), taken inside each call,
 * so charging the model never needs the device lock and never waits behind
 * a copy. It is a leaf lock: nothing else is taken while it is held.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "dev.h"
#include "errdetail.h"

#define NS_PER_S 1000000000u
#define MAX_CHANNELS 64u

_Static_assert(sizeof(((struct chm_timing_state *)0)->chan_free_ns) ==
                       MAX_CHANNELS * sizeof(uint64_t),
               "chan_free_ns holds MAX_CHANNELS channels");

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

/* ceil(len * mult * 1e9 / bw) ns, 0 for unlimited bandwidth, saturating. */
static uint64_t xfer_ns(uint64_t len, uint64_t mult, uint64_t bw_bps)
{
	unsigned __int128 num, q;

	if (!bw_bps || !len)
		return 0;
	num = (unsigned __int128)len * mult * NS_PER_S;
	q = (num + bw_bps - 1) / bw_bps;
	return q > UINT64_MAX ? UINT64_MAX : (uint64_t)q;
}

static unsigned channels(const struct chm_timing_state *ts)
{
	unsigned c = ts->p.ssd_channels;

	if (c == 0)
		return 1;
	return c > MAX_CHANNELS ? MAX_CHANNELS : c;
}

void chm_timing_init(struct chm_timing_state *ts, const struct chm_timing *p)
{
	memset(ts, 0, sizeof(*ts));
	/* a statically initialised mutex needs no destroy: the state can be
	 * dropped with its device (or the stack frame of a test) */
	ts->lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
	if (p)
		ts->p = *p;
	ts->enabled = ts->p.ssd_read_lat_ns || ts->p.ssd_write_lat_ns || ts->p.ssd_read_bw_bps ||
	              ts->p.ssd_write_bw_bps || ts->p.ssd_channels || ts->p.dram_bw_bps ||
	              ts->p.link_bw_bps || ts->p.link_lat_ns;
}

/* The channel that frees earliest, the lowest-numbered one on a tie, as one
 * scan in channel order finds it. The earliest time is taken first with
 * four independent running minima, then its first channel: one chain of
 * compare-and-select over every channel is a serial dependency that costs
 * more than the rest of a transfer's arithmetic. */
static unsigned earliest_channel(const uint64_t *free_ns, unsigned c)
{
	uint64_t m0 = free_ns[0], m1 = m0, m2 = m0, m3 = m0;
	unsigned i = 1;

	for (; i + 4 <= c; i += 4) {
		m0 = free_ns[i] < m0 ? free_ns[i] : m0;
		m1 = free_ns[i + 1] < m1 ? free_ns[i + 1] : m1;
		m2 = free_ns[i + 2] < m2 ? free_ns[i + 2] : m2;
		m3 = free_ns[i + 3] < m3 ? free_ns[i + 3] : m3;
	}
	for (; i < c; i++)
		m0 = free_ns[i] < m0 ? free_ns[i] : m0;
	m0 = m1 < m0 ? m1 : m0;
	m2 = m3 < m2 ? m3 : m2;
	m0 = m2 < m0 ? m2 : m0;
	for (i = 0; free_ns[i] != m0; i++)
		;
	return i;
}

/* One SSD transfer; ts->lock held. */
static uint64_t ssd_locked(struct chm_timing_state *ts, int write, uint64_t now_ns, uint64_t len)
{
	uint64_t lat = write ? ts->p.ssd_write_lat_ns : ts->p.ssd_read_lat_ns;
	uint64_t bw = write ? ts->p.ssd_write_bw_bps : ts->p.ssd_read_bw_bps;
	uint64_t *pipe = write ? &ts->ssd_write_free_ns : &ts->ssd_read_free_ns;
	unsigned c = channels(ts), ch = 0;
	uint64_t start, t_chan, t_pipe;

	if (!ts->enabled)
		return now_ns;
	ch = earliest_channel(ts->chan_free_ns, c);
	start = max_u64(now_ns, ts->chan_free_ns[ch]);
	t_chan = sat_add(sat_add(start, lat), xfer_ns(len, c, bw));
	ts->chan_free_ns[ch] = t_chan;
	t_pipe = sat_add(max_u64(now_ns, *pipe), xfer_ns(len, 1, bw));
	*pipe = t_pipe;
	return max_u64(t_chan, t_pipe);
}

uint64_t chm_timing_ssd(struct chm_timing_state *ts, int write, uint64_t now_ns, uint64_t len)
{
	uint64_t done;

	if (!ts->enabled)
		return now_ns;
	pthread_mutex_lock(&ts->lock);
	done = ssd_locked(ts, write, now_ns, len);
	pthread_mutex_unlock(&ts->lock);
	return done;
}

/* Channel a frees before channel b: earlier, or as early and lower-numbered
 * (the order in which one scan picks channels). */
static bool chan_before(const uint64_t *free_ns, unsigned a, unsigned b)
{
	return free_ns[a] < free_ns[b] || (free_ns[a] == free_ns[b] && a < b);
}

/* Slot j after slot h of a ring of c slots (h, j < c). */
static inline unsigned ring_at(unsigned h, unsigned j, unsigned c)
{
	return h + j >= c ? h + j - c : h + j;
}

/*
 * n transfers at one now, as n ssd_locked() calls: each takes the channel
 * that frees earliest (lowest-numbered on a tie). The channels are kept in
 * that order in a ring, earliest first: a pick takes the head, and the
 * channel, now busy until later, goes back in order, which for equal
 * transfers is nearly always the tail, so a pick costs O(1) instead of a
 * scan of C. Same channel, same times, call for call.
 */
uint64_t chm_timing_ssd_ios(struct chm_timing_state *ts, uint64_t now_ns, struct chm_io *ios,
                            unsigned n)
{
	uint64_t done = now_ns, *f = ts->chan_free_ns;
	uint8_t ring[MAX_CHANNELS];
	unsigned c, head = 0;

	if (!ts->enabled) {
		for (unsigned i = 0; i < n; i++)
			ios[i].model_done_ns = now_ns;
		return now_ns;
	}
	pthread_mutex_lock(&ts->lock);
	c = channels(ts);
	if (n < 8) { /* too few to pay for the sort */
		for (unsigned i = 0; i < n; i++) {
			ios[i].model_done_ns =
			        ssd_locked(ts, ios[i].op == CHM_IO_WRITE, now_ns, ios[i].len);
			done = max_u64(done, ios[i].model_done_ns);
		}
		pthread_mutex_unlock(&ts->lock);
		return done;
	}
	for (unsigned i = 0; i < c; i++) { /* insertion sort, earliest first */
		unsigned j = i;
		for (; j > 0 && chan_before(f, (unsigned)i, ring[j - 1]); j--)
			ring[j] = ring[j - 1];
		ring[j] = (uint8_t)i;
	}
	/* the transfer times of the last (op, len) seen: a batch is mostly
	 * lines of one size */
	int last_write = -1;
	uint32_t last_len = 0;
	uint64_t x_chan = 0, x_pipe = 0;
	for (unsigned i = 0; i < n; i++) {
		int write = ios[i].op == CHM_IO_WRITE;
		uint64_t lat = write ? ts->p.ssd_write_lat_ns : ts->p.ssd_read_lat_ns;
		uint64_t bw = write ? ts->p.ssd_write_bw_bps : ts->p.ssd_read_bw_bps;
		uint64_t *pipe = write ? &ts->ssd_write_free_ns : &ts->ssd_read_free_ns;
		if (write != last_write || ios[i].len != last_len) {
			last_write = write;
			last_len = ios[i].len;
			x_chan = xfer_ns(last_len, c, bw);
			x_pipe = xfer_ns(last_len, 1, bw);
		}
		unsigned ch = ring[head];
		uint64_t start = max_u64(now_ns, f[ch]);
		uint64_t t_chan = sat_add(sat_add(start, lat), x_chan);
		f[ch] = t_chan;
		/* the others follow the new head in order; ch goes back in
		 * after the last of them it does not come before (the tail,
		 * the slot it left, unless another channel frees later) */
		head = ring_at(head, 1, c);
		unsigned j = c - 1;
		for (; j > 0 && chan_before(f, ch, ring[ring_at(head, j - 1, c)]); j--)
			ring[ring_at(head, j, c)] = ring[ring_at(head, j - 1, c)];
		ring[ring_at(head, j, c)] = (uint8_t)ch;
		uint64_t t_pipe = sat_add(max_u64(now_ns, *pipe), x_pipe);
		*pipe = t_pipe;
		ios[i].model_done_ns = max_u64(t_chan, t_pipe);
		done = max_u64(done, ios[i].model_done_ns);
	}
	pthread_mutex_unlock(&ts->lock);
	return done;
}

uint64_t chm_timing_ssd_object(struct chm_timing_state *ts, int write, uint64_t now_ns,
                               uint64_t len, uint64_t piece)
{
	uint64_t done = now_ns;

	if (!ts->enabled || !len)
		return now_ns;
	if (!piece)
		piece = len;
	pthread_mutex_lock(&ts->lock);
	while (len) {
		uint64_t n = len < piece ? len : piece;
		done = max_u64(done, ssd_locked(ts, write, now_ns, n));
		len -= n;
	}
	pthread_mutex_unlock(&ts->lock);
	return done;
}

/* One direction of the host link; ts->lock held. */
static uint64_t host_locked(struct chm_timing_state *ts, uint64_t *free_ns, uint64_t now_ns,
                            uint64_t len)
{
	uint64_t busy;

	busy = max_u64(xfer_ns(len, 1, ts->p.dram_bw_bps), xfer_ns(len, 1, ts->p.link_bw_bps));
	*free_ns = sat_add(max_u64(now_ns, *free_ns), busy);
	return sat_add(*free_ns, ts->p.link_lat_ns);
}

uint64_t chm_timing_host(struct chm_timing_state *ts, uint64_t now_ns, uint64_t len)
{
	uint64_t done;

	if (!ts->enabled)
		return now_ns;
	pthread_mutex_lock(&ts->lock);
	done = host_locked(ts, &ts->link_free_ns, now_ns, len);
	pthread_mutex_unlock(&ts->lock);
	return done;
}

uint64_t chm_timing_host_in(struct chm_timing_state *ts, uint64_t now_ns, uint64_t len)
{
	uint64_t done;

	if (!ts->enabled)
		return now_ns;
	pthread_mutex_lock(&ts->lock);
	done = host_locked(ts, &ts->link_in_free_ns, now_ns, len);
	pthread_mutex_unlock(&ts->lock);
	return done;
}

uint64_t chm_timing_read_busy_until(struct chm_timing_state *ts)
{
	uint64_t t;

	pthread_mutex_lock(&ts->lock);
	t = ts->ssd_read_free_ns;
	pthread_mutex_unlock(&ts->lock);
	return t;
}

/*
 * Presets. Figures are assumptions of datasheet class, not measurements:
 *
 * gen5-tlc-200g: one PCIe 5.0 x4 enterprise TLC SSD as vendors specify the
 *   class: ~14 GB/s sequential read, ~10 GB/s sequential write, ~60 us
 *   random read latency (TLC page read plus controller), ~20 us write
 *   latency (absorbed by the SLC cache / controller buffer), 16 channels
 *   (the common controller width). Host link 200 Gb/s = 25e9 B/s (line
 *   rate, protocol overhead ignored), ~1.5 us link latency (one RDMA/CXL hop
 *   class). Device DRAM 50 GB/s (about two DDR5 channels).
 *
 * fpga-cxlhm: the paper's FPGA prototype: two Gen5 1 TB SSDs (twice the
 *   Gen5 bandwidth and channels, same latencies), 64 GB internal DRAM (a
 *   pool size, set with dram_bytes, not here) on the FPGA's DDR4
 *   controllers, ~20 GB/s (DDR4-2400 x64 is 19.2 GB/s), behind a 200 Gb/s
 *   RDMA link with ~3 us latency (FPGA RDMA stack).
 */
static const struct {
	const char *name;
	struct chm_timing t;
} presets[] = {
        {"none", {0}},
        {"gen5-tlc-200g",
         {
                 .ssd_read_lat_ns = 60000,
                 .ssd_write_lat_ns = 20000,
                 .ssd_read_bw_bps = 14000000000ull,
                 .ssd_write_bw_bps = 10000000000ull,
                 .ssd_channels = 16,
                 .dram_bw_bps = 50000000000ull,
                 .link_bw_bps = 25000000000ull,
                 .link_lat_ns = 1500,
         }},
        {"fpga-cxlhm",
         {
                 .ssd_read_lat_ns = 60000,
                 .ssd_write_lat_ns = 20000,
                 .ssd_read_bw_bps = 28000000000ull,
                 .ssd_write_bw_bps = 20000000000ull,
                 .ssd_channels = 32,
                 .dram_bw_bps = 20000000000ull,
                 .link_bw_bps = 25000000000ull,
                 .link_lat_ns = 3000,
         }},
};

int chm_timing_preset(const char *name, struct chm_timing *out)
{
	chm_detail_clear(); /* this call sets none: no earlier reason may stay */
	if (!name || !out)
		return -EINVAL;
	for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
		if (strcmp(presets[i].name, name) == 0) {
			*out = presets[i].t;
			return 0;
		}
	}
	return -ENOENT;
}
