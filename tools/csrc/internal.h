/* Shared internals of simcore: the workspace, per-node references, and the replay frame. */
#ifndef KVSTORED_SIMCORE_INTERNAL_H
#define KVSTORED_SIMCORE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simcore.h"

/* Named scratch buffers: each engine asks for the ones it uses. */
enum ws_buffer {
    WS_REF_A, WS_REF_B,       /* slot of each node (u32), one array per tier */
    WS_KIDS_A, WS_KIDS_B,     /* children counts per node, for the tiers of `tiered` */
    WS_BYTES,                 /* one byte per node (fifo presence, ceiling) */
    WS_STAMP,                 /* u32 per node (s3fifo ghost stamps) */
    WS_SLOT_A, WS_SLOT_B,     /* slot arrays, capacity-sized */
    WS_HEAP_A, WS_HEAP_B,     /* heaps, capacity-sized */
    WS_STACK_A, WS_STACK_B,   /* search stacks, capacity-sized */
    WS_RING_A, WS_RING_B, WS_RING_C,
    WS_COUNT
};

struct sim_workspace {
    void *buf[WS_COUNT];
    size_t size[WS_COUNT];
};

/* A buffer of at least `bytes`, zeroed when `zero`; NULL when out of memory. */
void *ws_get(sim_workspace *ws, int which, size_t bytes, int zero);
/* Grow a buffer to `bytes`, keeping its contents; NULL when out of memory. */
void *ws_grow(sim_workspace *ws, int which, size_t bytes);

/* The slot pool of a policy's cache `c`: slots 1.. of `c->s` (0 is the nil link), `fresh`
 * the next never-used one (it starts at 1), `free_head` the freed ones, reused first. The
 * free list runs through the slot field `link`, which means something else while the
 * slot is in use. The caller never takes more slots than the array holds. */
#define SLOT_TAKE(c, link) \
    ((c)->free_head ? slot_pop(&(c)->free_head, (c)->s[(c)->free_head].link) : (c)->fresh++)
#define SLOT_GIVE(c, slot, link) \
    do { (c)->s[slot].link = (c)->free_head; (c)->free_head = (slot); } while (0)

static inline uint32_t slot_pop(uint32_t *head, uint32_t next) {
    uint32_t slot = *head;
    *head = next;
    return slot;
}

/* The per-request bookkeeping every policy shares: warm-up, measurement, progress. */
typedef struct {
    const sim_trace *t;
    const sim_params *p;
    sim_result *out;
    int filled; /* the cache reached its capacity during the warm-up */
} replay_frame;

/* Called before each request; returns SIM_OK, SIM_ECANCELED, or 1 when the run stops
 * here because the cache did not fill during the warm-up. */
static inline int frame_begin(replay_frame *f, int64_t r) {
    if (r >= f->t->warmup_requests && !f->filled && !f->p->full_run) {
        f->out->underfilled = 1;
        return 1;
    }
    if ((r & 1023) == 0) {
        if (f->p->progress) *f->p->progress = r;
        if (f->p->cancel && *f->p->cancel) return SIM_ECANCELED;
    }
    return SIM_OK;
}

/* The tokens of the measured requests, all of them: what hit rates divide by. */
static inline uint64_t measured_tokens(const sim_trace *t) {
    uint64_t total = 0;
    int64_t from = t->warmup_requests < t->n_req ? t->req_off[t->warmup_requests]
                                                 : t->req_off[t->n_req];
    for (int64_t i = from; i < t->req_off[t->n_req]; i++) total += t->tokens[i];
    return total;
}

/* The lookup of a policy without the trie rule (ceiling, fifo), whose cached blocks need
 * not be a prefix: request r's tokens, and those of its blocks before the first one not
 * `present` (one byte per node) as hits, go into `out` when r is measured. */
static inline void count_leading_hits(const sim_trace *t, int64_t r, const uint8_t *present,
                                      sim_result *out) {
    if (r < t->warmup_requests) return;
    int alive = 1;
    for (int64_t i = t->req_off[r]; i < t->req_off[r + 1]; i++) {
        int hit = present[t->node_of_event[i]];
        out->total_tokens += t->tokens[i];
        if (alive && hit) out->hit_tokens += t->tokens[i];
        if (!hit) alive = 0;
    }
}

/* Request r as a policy with the trie rule (see below) replays it: its events are
 * [lo, hi), the cached prefix of them [lo, k). */
typedef struct {
    int64_t lo, k, hi;
    int measured;
} trie_request;

/* Begin request r (what frame_begin returns) and look it up: k is its first event whose
 * node has no slot; the prefix's tokens count as hits when r is measured. */
static inline int trie_lookup(replay_frame *f, const uint32_t *slot_of, int64_t r,
                              trie_request *q) {
    int rc = frame_begin(f, r);
    if (rc) return rc;
    const sim_trace *t = f->t;
    int64_t k = t->req_off[r], hi = t->req_off[r + 1];
    int measured = r >= t->warmup_requests;
    *q = (trie_request){k, k, hi, measured};
    for (; k < hi && slot_of[t->node_of_event[k]]; k++)
        if (measured) f->out->hit_tokens += t->tokens[k];
    q->k = k;
    return SIM_OK;
}

/* Called after the last request. */
static inline int frame_end(replay_frame *f) {
    if (f->p->progress) *f->p->progress = f->t->n_req;
    if (!f->filled || f->out->total_tokens == 0) f->out->underfilled = 1;
    return SIM_OK;
}

/* Single-tier policies with the trie rule (lru, optimal, s3fifo) keep every cached
 * node's parent cached, so a request's cached nodes are always a prefix of its path:
 * their replay loop (trie_replay, the one they share) stops the lookup at the first miss
 * and inserts from there on, and a new node's parent is either that prefix (protected)
 * or the node inserted just before. A policy gives the loop its steps; `c` is its cache
 * and `i` the event at hand, whose node is t->node_of_event[i]. */
typedef struct {
    /* Event i's node is in the request's cached prefix: refresh it and protect it. */
    void (*hit)(void *c, const sim_trace *t, int64_t i);
    /* Every slot is taken: an insert needs an eviction first. */
    int (*full)(const void *c);
    /* Make room for event i's node: 1 when a node left, 0 when none may, < 0 an error. */
    int (*evict)(void *c, const sim_trace *t, int64_t i);
    /* Cache event i's node: SIM_OK or an error. */
    int (*insert)(void *c, const sim_trace *t, int64_t i);
    /* The request is done: its prefix's event i is no longer protected. */
    void (*unprotect)(void *c, const sim_trace *t, int64_t i);
} trie_policy;

/* Replays the whole trace through policy `p` over cache `c`, whose per-node slots (0: not
 * cached) are `slot_of`. `p` is a constant the compiler sees, so the steps are inlined. */
static inline int trie_replay(replay_frame *f, const trie_policy *p, void *c,
                              const uint32_t *slot_of) {
    const sim_trace *t = f->t;
    f->out->total_tokens = measured_tokens(t);
    for (int64_t r = 0; r < t->n_req; r++) {
        trie_request q;
        int rc = trie_lookup(f, slot_of, r, &q);
        if (rc) return rc < 0 ? rc : SIM_OK;
        for (int64_t i = q.lo; i < q.k; i++) p->hit(c, t, i);
        for (int64_t i = q.k; i < q.hi; i++) {
            if (p->full(c)) {
                rc = p->evict(c, t, i);
                if (rc < 0) return rc;
                /* nothing may leave, or this node's parent (inserted just before) left */
                if (!rc || (i > q.k && !slot_of[t->node_of_event[i - 1]])) break;
            }
            rc = p->insert(c, t, i);
            if (rc) return rc;
            if (!q.measured && p->full(c)) f->filled = 1;
        }
        for (int64_t i = q.lo; i < q.k; i++) p->unprotect(c, t, i);
    }
    return frame_end(f);
}

int run_fifo(sim_workspace *ws, replay_frame *f);
int run_lru(sim_workspace *ws, replay_frame *f);
int run_optimal(sim_workspace *ws, replay_frame *f);
int run_s3fifo(sim_workspace *ws, replay_frame *f);
int run_tiered(sim_workspace *ws, replay_frame *f);

#endif
