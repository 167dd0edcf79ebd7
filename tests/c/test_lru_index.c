/* test_lru_index.c - lru mode's line index alone (csrc/lru_index.c): hash
 * lookup, recency order and victim choice, the free stack, the unclean FIFO
 * in write order, the evicted bitmap, per-state counts and the refusals of
 * init. A random walk over the legal operations is checked against a plain
 * model (arrays scanned in full) after every step. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chm.h"
#include "check.h"
#include "lru_index.h"
#include "states.h"

#define LINE 4096u
#define NLINES 8u
#define CAP (64ull * LINE)

static struct chm_lru_index x;

/* ---- the model: per line its address (or none), a recency stamp, and a
 * write stamp while unclean ---- */
static struct {
	bool bound;
	uint64_t addr, used, wseq;
	int state;
} m[NLINES];
static bool m_evicted[CAP / LINE];
static uint64_t clock_stamp, write_stamp;

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

/* The model's victim: a free line (the index's free stack top is then any
 * free line, so only "free" is compared), else the least recent CLEAN or
 * DIRTY line that is not busy. */
static int model_victim_lru(void)
{
	int best = -1;
	for (unsigned i = 0; i < NLINES; i++) {
		if (!m[i].bound || x.lines[i].busy)
			continue;
		if (m[i].state != CHM_LINE_CLEAN && m[i].state != CHM_LINE_DIRTY)
			continue;
		if (best < 0 || m[i].used < m[best].used)
			best = (int)i;
	}
	return best;
}

static void check_against_model(const char *step)
{
	unsigned nfree = 0, per[4] = {0};
	for (unsigned i = 0; i < NLINES; i++) {
		per[m[i].state]++;
		CHECK(x.lines[i].state == m[i].state, "%s: line %u state %d, model %d", step, i,
		      x.lines[i].state, m[i].state);
		CHECK(x.lines[i].hashed == m[i].bound, "%s: line %u hashed %d", step, i,
		      x.lines[i].hashed);
		if (m[i].bound) {
			CHECK(chm_lru_index_lookup(&x, m[i].addr) == &x.lines[i],
			      "%s: lookup of %llu misses line %u", step,
			      (unsigned long long)m[i].addr, i);
		} else {
			nfree++;
		}
	}
	for (unsigned k = 0; k < 4; k++)
		CHECK(x.count[k] == per[k], "%s: count[%u] %llu, model %u", step, k,
		      (unsigned long long)x.count[k], per[k]);
	/* an address no line holds is not found */
	for (uint64_t a = 0; a < CAP; a += LINE) {
		bool held = false;
		for (unsigned i = 0; i < NLINES; i++)
			held |= m[i].bound && m[i].addr == a;
		if (!held)
			CHECK(chm_lru_index_lookup(&x, a) == NULL, "%s: %llu found, not held", step,
			      (unsigned long long)a);
	}
	/* the free stack holds exactly the unbound lines */
	unsigned on_stack = 0;
	for (uint32_t i = x.free_head; i && on_stack <= NLINES; i = x.lines[i - 1].next) {
		CHECK(!m[i - 1].bound, "%s: bound line %u on the free stack", step, i - 1);
		on_stack++;
	}
	CHECK(on_stack == nfree, "%s: %u lines on the free stack, %u free", step, on_stack, nfree);
	/* the recency list is the bound lines, most recent first */
	unsigned on_list = 0;
	uint64_t last = UINT64_MAX;
	for (uint32_t i = x.mru; i && on_list <= NLINES; i = x.lines[i - 1].next) {
		CHECK(m[i - 1].bound && m[i - 1].used < last, "%s: recency order at line %u", step,
		      i - 1);
		last = m[i - 1].used;
		on_list++;
	}
	CHECK(on_list == NLINES - nfree, "%s: %u lines on the recency list", step, on_list);
	/* the unclean FIFO is the DIRTY/WRITING_BACK lines, oldest write first */
	unsigned unclean = 0, on_fifo = 0;
	for (unsigned i = 0; i < NLINES; i++)
		unclean += m[i].state == CHM_LINE_DIRTY || m[i].state == CHM_LINE_WRITING_BACK;
	uint64_t prev = 0;
	for (uint32_t i = x.dhead; i && on_fifo <= NLINES; i = x.lines[i - 1].dnext) {
		CHECK(m[i - 1].wseq > prev, "%s: FIFO out of write order at line %u", step, i - 1);
		CHECK(x.lines[i - 1].dseq > prev, "%s: dseq out of order at line %u", step, i - 1);
		prev = m[i - 1].wseq;
		on_fifo++;
	}
	CHECK(on_fifo == unclean, "%s: %u lines on the FIFO, %u unclean", step, on_fifo, unclean);
	/* the victim */
	struct lru_line *v = chm_lru_index_victim(&x);
	if (nfree) {
		CHECK(v && !m[chm_lru_index_of(&x, v)].bound, "%s: a free line is the victim",
		      step);
	} else {
		int want = model_victim_lru();
		CHECK(want < 0 ? v == NULL : v == &x.lines[want], "%s: victim %d, model %d", step,
		      v ? (int)chm_lru_index_of(&x, v) : -1, want);
	}
}

/* ---- operations, applied to both ---- */

static bool op_fill(uint64_t addr) /* a miss that reads: takes the victim */
{
	struct lru_line *v = chm_lru_index_victim(&x);
	if (!v || v->state == CHM_LINE_DIRTY || chm_lru_index_lookup(&x, addr))
		return false;
	unsigned i = chm_lru_index_of(&x, v);
	if (v->state == CHM_LINE_CLEAN) {
		chm_lru_index_evict(&x, v);
		m_evicted[m[i].addr / LINE] = true;
		m[i].bound = false;
		m[i].state = CHM_LINE_INVALID;
	} else {
		CHECK(chm_lru_index_free_pop(&x) == v, "free pop is the victim");
	}
	bool was = chm_lru_index_test_clear_evicted(&x, addr);
	CHECK(was == m_evicted[addr / LINE], "evicted bit of %llu: %d", (unsigned long long)addr,
	      was);
	m_evicted[addr / LINE] = false;
	chm_lru_index_bind(&x, v, addr);
	chm_lru_index_set(&x, v, CHM_LINE_CLEAN);
	m[i] = (typeof(m[i])){
	        .bound = true, .addr = addr, .used = ++clock_stamp, .state = CHM_LINE_CLEAN};
	return true;
}

static void op_touch(unsigned i)
{
	if (!m[i].bound)
		return;
	chm_lru_index_touch(&x, &x.lines[i]);
	m[i].used = ++clock_stamp;
}

static void op_write(unsigned i) /* a write hit on a CLEAN line */
{
	if (!m[i].bound || m[i].state != CHM_LINE_CLEAN)
		return;
	chm_lru_index_dirty(&x, &x.lines[i]);
	m[i].state = CHM_LINE_DIRTY;
	m[i].wseq = ++write_stamp;
	op_touch(i);
}

static void op_writeback(unsigned i, bool ok) /* DIRTY -> WRITING_BACK -> CLEAN | DIRTY */
{
	if (m[i].state != CHM_LINE_DIRTY)
		return;
	chm_lru_index_set(&x, &x.lines[i], CHM_LINE_WRITING_BACK);
	m[i].state = CHM_LINE_WRITING_BACK;
	check_against_model("writeback started");
	if (ok) {
		chm_lru_index_set(&x, &x.lines[i], CHM_LINE_CLEAN);
		chm_lru_index_fifo_remove(&x, &x.lines[i]);
		m[i].state = CHM_LINE_CLEAN;
		m[i].wseq = 0;
	} else { /* stays on the FIFO, in its place */
		chm_lru_index_set(&x, &x.lines[i], CHM_LINE_DIRTY);
		m[i].state = CHM_LINE_DIRTY;
	}
}

static void op_drop(unsigned i) /* a failed fill gives its line back */
{
	if (!m[i].bound || m[i].state != CHM_LINE_CLEAN)
		return;
	chm_lru_index_set(&x, &x.lines[i], CHM_LINE_INVALID);
	chm_lru_index_unbind(&x, &x.lines[i]);
	m[i].bound = false;
	m[i].state = CHM_LINE_INVALID;
}

static void test_refusals(void)
{
	struct chm_lru_index y;
	CHECK_RC(chm_lru_index_init(&y, 0, 4, CAP), -EINVAL);
	CHECK_RC(chm_lru_index_init(&y, 3000, 4, CAP), -EINVAL); /* not a power of two */
	CHECK_RC(chm_lru_index_init(&y, LINE, 0, CAP), -EINVAL);
	CHECK_RC(chm_lru_index_init(&y, LINE, UINT32_MAX, CAP), -EINVAL);
	CHECK_RC(chm_lru_index_init(&y, LINE, 1, 0), 0); /* an empty address space */
	CHECK(chm_lru_index_victim(&y) == &y.lines[0], "the one free line is the victim");
	chm_lru_index_fini(&y);
	CHECK(y.lines == NULL && y.htab == NULL, "fini clears the index");
}

static void test_lru_order(void)
{
	CHECK_RC(chm_lru_index_init(&x, LINE, NLINES, CAP), 0);
	memset(m, 0, sizeof(m));
	memset(m_evicted, 0, sizeof(m_evicted));
	check_against_model("empty");
	for (unsigned k = 0; k < NLINES; k++)
		CHECK(op_fill((uint64_t)k * LINE), "fill %u", k);
	check_against_model("full");
	/* line of address 0 is least recent; touching it makes 1 the victim */
	struct lru_line *l0 = chm_lru_index_lookup(&x, 0);
	CHECK(chm_lru_index_victim(&x) == l0, "the oldest line is the victim");
	chm_lru_index_touch(&x, l0);
	m[chm_lru_index_of(&x, l0)].used = ++clock_stamp;
	CHECK(chm_lru_index_victim(&x) == chm_lru_index_lookup(&x, LINE), "then the next");
	/* a busy line is passed over */
	chm_lru_index_lookup(&x, LINE)->busy = true;
	CHECK(chm_lru_index_victim(&x) == chm_lru_index_lookup(&x, 2 * LINE), "busy skipped");
	chm_lru_index_lookup(&x, LINE)->busy = false;
	/* evicting and refilling counts the refill */
	CHECK(op_fill(100 * LINE % CAP), "fill over the LRU line");
	CHECK(op_fill(LINE), "address 1 again");
	CHECK(!m_evicted[1], "its evicted bit is consumed");
	check_against_model("refilled");
	chm_lru_index_fini(&x);
}

static void test_random_walk(void)
{
	CHECK_RC(chm_lru_index_init(&x, LINE, NLINES, CAP), 0);
	memset(m, 0, sizeof(m));
	memset(m_evicted, 0, sizeof(m_evicted));
	for (unsigned step = 0; step < 20000; step++) {
		unsigned i = (unsigned)(rng() % NLINES);
		switch (rng() % 6) {
		case 0:
		case 1: op_fill((rng() % (CAP / LINE)) * LINE); break;
		case 2: op_touch(i); break;
		case 3: op_write(i); break;
		case 4: op_writeback(i, rng() % 4 != 0); break;
		default: op_drop(i); break;
		}
		check_against_model("random step");
		if (failures)
			break;
	}
	chm_lru_index_fini(&x);
}

int main(void)
{
	test_refusals();
	test_lru_order();
	test_random_walk();
	printf("lru index: refusals, LRU order, busy victims, refills, 20000 random steps\n");
	return check_summary();
}
