/* A prefix LRU tier: least-recently-touched leaf first, protected nodes never.
 *
 * Used alone for the `lru` policy and twice (DRAM, SSD) for `tiered`.
 *
 * The reference keeps every leaf in a heap keyed by its last touch. Keys come from one
 * clock, so a touched node always becomes the newest: a doubly linked list in key order
 * (append at the tail) serves almost every operation in O(1). The list holds every cached
 * node, leaf or not. A non-leaf met at the head while looking for a victim is "parked"
 * (unlinked); if it becomes a leaf again (its last cached child evicted) it enters a
 * small heap by key. The victim is the older of the list's first unprotected leaf and the
 * heap's youngest-keyed unprotected entry - the same node the reference picks, since keys
 * are unique.
 */
#ifndef KVSTORED_SIMCORE_PLRU_H
#define KVSTORED_SIMCORE_PLRU_H

#include "internal.h"

enum { PL_LIST = 0, PL_PARKED = 1, PL_HEAP = 2, PL_WHERE = 3, PL_PROT = 4 };

typedef struct {
    uint32_t node;
    uint32_t key;   /* the clock at the last touch */
    uint32_t prev;  /* list link, or the heap position when PL_HEAP */
    uint32_t next;  /* list link, or the free-list link when unused */
    uint32_t state; /* PL_LIST | PL_PARKED | PL_HEAP, plus PL_PROT */
    uint32_t kids;  /* cached children, when the tier keeps them in slots */
} plru_slot;

/* Children counts: a single tier keeps them in the slots (a node with a cached child is
 * always cached itself there), costing nothing per node; the tiers of `tiered` count the
 * children of nodes they do not hold too, so they keep one counter per node. */
typedef struct {
    uint32_t *slot_of;       /* per node: its slot, 0 when not cached */
    uint32_t *kids;          /* per node children counts, or NULL: in the slots */
    plru_slot *s;            /* [1..capacity]; 0 is the nil link */
    uint32_t *heap;          /* slots of parked leaves, min-heap by key */
    uint32_t *stack;         /* scratch for the protected-aware heap search */
    const uint32_t *parent;
    uint32_t capacity, used, fresh, free_head;
    uint32_t head, tail, heap_n, clock;
    uint64_t evictions;
} plru;

/* Set up an empty tier over n_nodes nodes; buffers come from the workspace. */
int plru_init(plru *t, sim_workspace *ws, int ref_buf, int kids_buf, int slot_buf,
              int heap_buf, int stack_buf, const sim_trace *trace, uint32_t capacity);

static inline uint32_t plru_slot_of(const plru *t, uint32_t node) {
    return t->slot_of[node];
}

/* The children counter of a node; `slot` is its slot (0 allowed only with per-node
 * counters). */
static inline uint32_t *plru_kids(plru *t, uint32_t node, uint32_t slot) {
    return t->kids ? &t->kids[node] : &t->s[slot].kids;
}

/* Refresh a cached node's recency. */
void plru_touch(plru *t, uint32_t slot);
/* Cache `node`; the caller has made room (used < capacity). */
void plru_insert(plru *t, uint32_t node);
/* Evict the least-recently-touched unprotected leaf; returns its node, 0 if none. */
uint32_t plru_evict(plru *t);

static inline void plru_protect(plru *t, uint32_t slot) {
    t->s[slot].state |= PL_PROT;
}
static inline void plru_unprotect(plru *t, uint32_t slot) {
    t->s[slot].state &= ~(uint32_t)PL_PROT;
}

#endif
