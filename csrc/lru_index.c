/* lru_index.c - the line index of lru mode: a hash table from line address
 * to line, the recency list (MRU first), the free stack of INVALID lines, the
 * unclean FIFO of DIRTY/WRITING_BACK lines ordered by the sequence number of
 * their oldest unflushed write, and a bitmap of the line-sized chunks of the
 * address space that were evicted (so a miss on one counts as an
 * LRU-induced refill). Lines are referred to by index+1 (0 = none).
 *
 * The hash chains are doubly linked and the table has two buckets a line,
 * so that a miss mostly finds an empty bucket and an eviction walks nothing.
 *
 * Invariants: a line is hashed iff it is on the recency list iff it names an
 * address; an unhashed line is INVALID and on the free stack; a line is on
 * the unclean FIFO iff it is DIRTY or WRITING_BACK; count[] is the number
 * of lines per state. Pure data structure: no locks, no I/O, calls only the
 * state table. Tested alone by tests/c/test_lru_index.c.
 */
#include <errno.h>
#include <stdlib.h>

#include "counters.h"
#include "lru_index.h"
#include "states.h"

/* ---- states ---- */

_Static_assert(CHM_LINE_WRITING_BACK + 1 == 4, "count[] and legal[] hold every line state");

/* The state table as a matrix, filled once at init from chm_line_transitions
 * (a change is checked against it at every line, a table search each time
 * would cost more than the change). */
static void legal_init(struct chm_lru_index *x)
{
	for (int f = 0; f < 4; f++)
		for (int t = 0; t < 4; t++)
			x->legal[f][t] = chm_transition_legal(
			        chm_line_transitions, CHM_NTRANS(chm_line_transitions), f, t);
}

void chm_lru_index_set(struct chm_lru_index *x, struct lru_line *l, int to)
{
	int from = l->state;
	if ((unsigned)to >= 4 || !x->legal[from][to])
		chm_illegal_transition("chm_line_transitions", from, to, __FILE__, __LINE__);
	x->count[from]--;
	l->state = to;
	x->count[to]++;
	/* the mirrors are stored from the exact counts (only this file writes
	 * them, under the caller's lock): a plain store, not an atomic add */
	bool valid_from = from != CHM_LINE_INVALID, valid_to = to != CHM_LINE_INVALID;
	bool dirty_from = from == CHM_LINE_DIRTY || from == CHM_LINE_WRITING_BACK;
	bool dirty_to = to == CHM_LINE_DIRTY || to == CHM_LINE_WRITING_BACK;
	if (x->n_valid && valid_from != valid_to)
		chm_ctr_set(x->n_valid, x->nlines - x->count[CHM_LINE_INVALID]);
	if (x->n_dirty && dirty_from != dirty_to)
		chm_ctr_set(x->n_dirty, x->count[CHM_LINE_DIRTY] + x->count[CHM_LINE_WRITING_BACK]);
}

/* ---- hash table ---- */

/* Runs of 64 consecutive lines (an object's) share one hashed group and sit
 * in consecutive buckets, so a large access walks the table sequentially
 * instead of missing the cache at every line; groups are spread by a
 * multiplicative hash. */
#define HGROUP_BITS 6u

static inline uint32_t hslot(const struct chm_lru_index *x, uint64_t addr)
{
	uint64_t b = addr >> x->shift;
	uint64_t g = (b >> HGROUP_BITS) * 0x9e3779b97f4a7c15ull;
	uint64_t mask = (1ull << x->hbits) - 1;
	return (uint32_t)(((g >> (64 - x->hbits)) + (b & ((1u << HGROUP_BITS) - 1))) & mask);
}

struct lru_line *chm_lru_index_lookup(struct chm_lru_index *x, uint64_t addr)
{
	for (uint32_t i = x->htab[hslot(x, addr)]; i; i = x->lines[i - 1].hnext)
		if (x->lines[i - 1].addr == addr)
			return &x->lines[i - 1];
	return NULL;
}

/* Chains are doubly linked, so that removing a line (every eviction) does
 * not walk its chain. */
static void hash_insert(struct chm_lru_index *x, struct lru_line *l)
{
	uint32_t *h = &x->htab[hslot(x, l->addr)];
	uint32_t me = chm_lru_index_of(x, l) + 1;
	l->hnext = *h;
	l->hprev = 0;
	if (*h)
		x->lines[*h - 1].hprev = me;
	*h = me;
	l->hashed = true;
}

static void hash_remove(struct chm_lru_index *x, struct lru_line *l)
{
	if (l->hprev)
		x->lines[l->hprev - 1].hnext = l->hnext;
	else
		x->htab[hslot(x, l->addr)] = l->hnext;
	if (l->hnext)
		x->lines[l->hnext - 1].hprev = l->hprev;
	l->hnext = l->hprev = 0;
	l->hashed = false;
}

/* ---- recency list and free stack ---- */

static void rec_unlink(struct chm_lru_index *x, struct lru_line *l)
{
	if (l->prev)
		x->lines[l->prev - 1].next = l->next;
	else
		x->mru = l->next;
	if (l->next)
		x->lines[l->next - 1].prev = l->prev;
	else
		x->lru = l->prev;
	l->prev = l->next = 0;
}

static void rec_push_mru(struct chm_lru_index *x, struct lru_line *l)
{
	uint32_t me = chm_lru_index_of(x, l) + 1;
	l->prev = 0;
	l->next = x->mru;
	if (x->mru)
		x->lines[x->mru - 1].prev = me;
	else
		x->lru = me;
	x->mru = me;
}

void chm_lru_index_touch(struct chm_lru_index *x, struct lru_line *l)
{
	if (x->mru != chm_lru_index_of(x, l) + 1) {
		rec_unlink(x, l);
		rec_push_mru(x, l);
	}
}

void chm_lru_index_free_push(struct chm_lru_index *x, struct lru_line *l)
{
	l->prev = 0;
	l->next = x->free_head;
	x->free_head = chm_lru_index_of(x, l) + 1;
}

/* Gives an INVALID line its address: hashed, most recent. */
void chm_lru_index_bind(struct chm_lru_index *x, struct lru_line *l, uint64_t addr)
{
	l->addr = addr;
	hash_insert(x, l);
	rec_push_mru(x, l);
}

/* An INVALID hashed line goes back to the free stack. */
void chm_lru_index_unbind(struct chm_lru_index *x, struct lru_line *l)
{
	hash_remove(x, l);
	rec_unlink(x, l);
	chm_lru_index_free_push(x, l);
}

static void mark_evicted(struct chm_lru_index *x, uint64_t addr)
{
	uint64_t b = addr >> x->shift;
	x->evicted[b / 64] |= 1ull << (b % 64);
}

bool chm_lru_index_test_clear_evicted(struct chm_lru_index *x, uint64_t addr)
{
	uint64_t b = addr >> x->shift, m = 1ull << (b % 64);
	bool was = x->evicted[b / 64] & m;
	x->evicted[b / 64] &= ~m;
	return was;
}

/* CLEAN -> INVALID: the line forgets its address. */
void chm_lru_index_evict(struct chm_lru_index *x, struct lru_line *l)
{
	chm_lru_index_set(x, l, CHM_LINE_INVALID);
	mark_evicted(x, l->addr);
	hash_remove(x, l);
	rec_unlink(x, l);
}

/* ---- unclean FIFO ---- */

static void fifo_append(struct chm_lru_index *x, struct lru_line *l)
{
	uint32_t me = chm_lru_index_of(x, l) + 1;
	l->dseq = ++x->seq;
	l->dnext = 0;
	l->dprev = x->dtail;
	if (x->dtail)
		x->lines[x->dtail - 1].dnext = me;
	else
		x->dhead = me;
	x->dtail = me;
}

void chm_lru_index_fifo_remove(struct chm_lru_index *x, struct lru_line *l)
{
	if (l->dprev)
		x->lines[l->dprev - 1].dnext = l->dnext;
	else
		x->dhead = l->dnext;
	if (l->dnext)
		x->lines[l->dnext - 1].dprev = l->dprev;
	else
		x->dtail = l->dprev;
	l->dprev = l->dnext = 0;
}

/* A write made l (CLEAN or INVALID, bytes already in place) DIRTY. */
void chm_lru_index_dirty(struct chm_lru_index *x, struct lru_line *l)
{
	chm_lru_index_set(x, l, CHM_LINE_DIRTY);
	fifo_append(x, l);
}

/* ---- victims and pending addresses ---- */

/* The line a miss would take, without taking it: a free line, else the
 * least recent CLEAN or DIRTY line nobody is working on. */
struct lru_line *chm_lru_index_victim(struct chm_lru_index *x)
{
	if (x->free_head)
		return chm_lru_index_at(x, x->free_head);
	for (uint32_t i = x->lru; i; i = x->lines[i - 1].prev) {
		struct lru_line *l = &x->lines[i - 1];
		if (!l->busy && (l->state == CHM_LINE_CLEAN || l->state == CHM_LINE_DIRTY))
			return l;
	}
	return NULL;
}

struct lru_line *chm_lru_index_free_pop(struct chm_lru_index *x)
{
	struct lru_line *l = chm_lru_index_at(x, x->free_head);
	if (l) {
		x->free_head = l->next;
		l->next = 0;
	}
	return l;
}

int chm_lru_index_init(struct chm_lru_index *x, uint64_t line, uint32_t nlines, uint64_t capacity)
{
	if (!line || (line & (line - 1)) || !nlines || nlines == UINT32_MAX)
		return -EINVAL;
	*x = (struct chm_lru_index){.line = line, .nlines = nlines};
	x->shift = (unsigned)__builtin_ctzll(line);
	x->lines = calloc(nlines, sizeof(*x->lines));
	if (!x->lines)
		goto err_lines;
	/* at least two buckets a line: most misses find an empty bucket and
	 * touch no line */
	for (x->hbits = 4; (1ull << x->hbits) < 2ull * nlines; x->hbits++)
		;
	x->htab = calloc(1ull << x->hbits, sizeof(*x->htab));
	if (!x->htab)
		goto err_htab;
	uint64_t chunks = (capacity + line - 1) / line;
	x->evicted = calloc((chunks + 63) / 64 ? (chunks + 63) / 64 : 1, sizeof(*x->evicted));
	if (!x->evicted)
		goto err_evicted;
	for (uint32_t i = nlines; i-- > 0;) {
		x->lines[i].state = CHM_LINE_INVALID;
		chm_lru_index_free_push(x, &x->lines[i]);
	}
	x->count[CHM_LINE_INVALID] = nlines;
	legal_init(x);
	return 0;

err_evicted:
	free(x->htab);
err_htab:
	free(x->lines);
err_lines:
	*x = (struct chm_lru_index){0};
	return -ENOMEM;
}

void chm_lru_index_fini(struct chm_lru_index *x)
{
	free(x->evicted);
	free(x->htab);
	free(x->lines);
	*x = (struct chm_lru_index){0};
}
