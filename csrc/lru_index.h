/* lru_index.h - the line index of lru mode (lru_index.c): which line holds
 * which address, in which recency order, which lines are free and which are
 * unclean in write order. No locking of its own (lru.c holds dev->lock). */
#ifndef CHM_LRU_INDEX_H
#define CHM_LRU_INDEX_H

#include <stdbool.h>
#include <stdint.h>

struct lru_line {
	uint64_t addr; /* device address of byte 0 (hashed lines) */
	uint64_t dseq; /* DIRTY/WRITING_BACK: oldest unflushed write */
	int state;     /* enum chm_line_state */
	bool busy;     /* being filled or evicted: others wait (lru.c's) */
	bool hashed;
	uint32_t hnext, hprev; /* hash chain (index+1; 0 = end, or the bucket) */
	uint32_t prev, next;   /* recency list, or free stack (next only) */
	uint32_t dprev, dnext; /* unclean FIFO */
};

struct chm_lru_index {
	uint64_t line;  /* bytes per line, a power of two */
	unsigned shift; /* log2(line) */
	uint32_t nlines;
	struct lru_line *lines;
	uint32_t *htab; /* index+1 */
	unsigned hbits;
	uint32_t mru, lru; /* recency list ends (index+1) */
	uint32_t free_head;
	uint32_t dhead, dtail; /* unclean FIFO, oldest first (index+1) */
	uint64_t seq;          /* last dseq handed out */
	uint64_t *evicted;     /* one bit per line-sized chunk of the address space */
	uint64_t count[4];     /* lines per state */
	bool legal[4][4];      /* derived: [from][to] is in chm_line_transitions */
	/* optional mirrors, kept with relaxed atomics for lock-free readers:
	 * lines not INVALID, lines DIRTY or WRITING_BACK (NULL: none) */
	uint64_t *n_valid, *n_dirty;
};

/* nlines INVALID lines on the free stack, for an address space of capacity
 * bytes. line must be a power of two. Returns 0, -EINVAL or -ENOMEM. */
int chm_lru_index_init(struct chm_lru_index *x, uint64_t line, uint32_t nlines, uint64_t capacity);
void chm_lru_index_fini(struct chm_lru_index *x);

static inline uint32_t chm_lru_index_of(const struct chm_lru_index *x, const struct lru_line *l)
{
	return (uint32_t)(l - x->lines);
}

/* The line of index+1 i1, NULL for 0. */
static inline struct lru_line *chm_lru_index_at(struct chm_lru_index *x, uint32_t i1)
{
	return i1 ? &x->lines[i1 - 1] : NULL;
}

/* A legal state change (states.h's line table), counted per state. */
void chm_lru_index_set(struct chm_lru_index *x, struct lru_line *l, int to);
/* The hashed line of line address addr, or NULL. */
struct lru_line *chm_lru_index_lookup(struct chm_lru_index *x, uint64_t addr);
/* Most recently used now. */
void chm_lru_index_touch(struct chm_lru_index *x, struct lru_line *l);
/* Free stack (INVALID, unhashed lines). pop returns NULL when empty. */
void chm_lru_index_free_push(struct chm_lru_index *x, struct lru_line *l);
struct lru_line *chm_lru_index_free_pop(struct chm_lru_index *x);
/* Gives an INVALID line its address: hashed, most recent. */
void chm_lru_index_bind(struct chm_lru_index *x, struct lru_line *l, uint64_t addr);
/* An INVALID hashed line goes back to the free stack. */
void chm_lru_index_unbind(struct chm_lru_index *x, struct lru_line *l);
/* CLEAN -> INVALID: the line forgets its address, which is marked evicted. */
void chm_lru_index_evict(struct chm_lru_index *x, struct lru_line *l);
/* Whether addr's line was evicted since it was last brought in; clears it. */
bool chm_lru_index_test_clear_evicted(struct chm_lru_index *x, uint64_t addr);
/* A write made l (CLEAN or INVALID, bytes in place) DIRTY: it joins the
 * unclean FIFO with a new sequence number. */
void chm_lru_index_dirty(struct chm_lru_index *x, struct lru_line *l);
/* Leaves the unclean FIFO (written back). */
void chm_lru_index_fifo_remove(struct chm_lru_index *x, struct lru_line *l);
/* The line a miss would take, without taking it: the free stack's top, else
 * the least recent CLEAN or DIRTY line that is not busy; NULL if none. */
struct lru_line *chm_lru_index_victim(struct chm_lru_index *x);

#endif /* CHM_LRU_INDEX_H */
