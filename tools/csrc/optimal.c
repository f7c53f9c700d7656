/* The `optimal` policy: Belady on leaves, with bypass.
 *
 * A node's key is the index of the next request that touches it. Leaves sit in a max-heap
 * by (key, node); the reference uses a lazy heap with stale entries, this one is indexed
 * (each leaf once, moved in place when its key changes), which keeps it as small as the
 * cache and makes the choice identical: the unprotected leaf with the largest (key, node).
 */
#include "internal.h"

enum { OPT_IN_HEAP = 1, OPT_PROT = 2 };

typedef struct {
    uint32_t node;
    uint32_t key;   /* next use */
    uint32_t pos;   /* heap position when OPT_IN_HEAP; free-list link when unused */
    uint32_t state;
    uint32_t kids;  /* cached children (a node with one is always cached itself) */
} opt_slot;

typedef struct {
    uint32_t key, node, slot; /* key and node copied in for cache-friendly comparisons */
} opt_entry;

typedef struct {
    uint32_t *slot_of;   /* per node, 0 when not cached */
    opt_slot *s;
    opt_entry *heap;
    uint32_t *stack;
    const uint32_t *parent;
    uint32_t capacity, used, fresh, free_head, heap_n;
    uint64_t evictions;
} opt_cache;

/* Does entry a leave before entry b? Farther next use first, then the larger node. */
static inline int before(const opt_entry *a, const opt_entry *b) {
    return a->key > b->key || (a->key == b->key && a->node > b->node);
}

static inline void heap_place(opt_cache *c, uint32_t at, opt_entry e) {
    c->heap[at] = e;
    c->s[e.slot].pos = at;
}

static void heap_up(opt_cache *c, uint32_t at) {
    opt_entry e = c->heap[at];
    while (at > 0) {
        uint32_t up = (at - 1) / 2;
        if (!before(&e, &c->heap[up])) break;
        heap_place(c, at, c->heap[up]);
        at = up;
    }
    heap_place(c, at, e);
}

static void heap_down(opt_cache *c, uint32_t at) {
    opt_entry e = c->heap[at];
    for (;;) {
        uint32_t child = 2 * at + 1;
        if (child >= c->heap_n) break;
        if (child + 1 < c->heap_n && before(&c->heap[child + 1], &c->heap[child])) child++;
        if (!before(&c->heap[child], &e)) break;
        heap_place(c, at, c->heap[child]);
        at = child;
    }
    heap_place(c, at, e);
}

static void heap_push(opt_cache *c, uint32_t slot) {
    opt_slot *x = &c->s[slot];
    x->state |= OPT_IN_HEAP;
    c->heap[c->heap_n] = (opt_entry){x->key, x->node, slot};
    heap_up(c, c->heap_n++);
}

static void heap_remove(opt_cache *c, uint32_t slot) {
    opt_slot *x = &c->s[slot];
    uint32_t at = x->pos;
    x->state &= ~(uint32_t)OPT_IN_HEAP;
    opt_entry last = c->heap[--c->heap_n];
    if (last.slot == slot) return;
    heap_place(c, at, last);
    heap_up(c, at);
    heap_down(c, c->s[last.slot].pos);
}

static void set_key(opt_cache *c, uint32_t slot, uint32_t key) {
    opt_slot *x = &c->s[slot];
    if (x->key == key) return;
    x->key = key;
    if (x->state & OPT_IN_HEAP) {
        c->heap[x->pos].key = key;
        heap_up(c, x->pos);
        heap_down(c, x->pos);
    }
}

static void insert(opt_cache *c, uint32_t node, uint32_t key) {
    uint32_t slot = SLOT_TAKE(c, pos);
    opt_slot *x = &c->s[slot];
    x->node = node;
    x->key = key;
    x->state = 0;
    x->kids = 0;
    c->slot_of[node] = slot;
    c->used++;
    heap_push(c, slot);
    uint32_t up = c->parent[node];
    if (up) {
        opt_slot *px = &c->s[c->slot_of[up]];
        if (px->kids++ == 0 && (px->state & OPT_IN_HEAP)) heap_remove(c, c->slot_of[up]);
    }
}

/* The first unprotected entry in leaving order; only protected entries are searched
 * below, since nothing below an unprotected entry leaves before it. */
static uint32_t first_unprotected(opt_cache *c) {
    if (!c->heap_n) return UINT32_MAX;
    if (!(c->s[c->heap[0].slot].state & OPT_PROT)) return 0;
    uint32_t best = UINT32_MAX, sp = 0;
    c->stack[sp++] = 0;
    while (sp) {
        uint32_t at = c->stack[--sp];
        if (!(c->s[c->heap[at].slot].state & OPT_PROT)) {
            if (best == UINT32_MAX || before(&c->heap[at], &c->heap[best])) best = at;
            continue;
        }
        if (2 * at + 1 < c->heap_n) c->stack[sp++] = 2 * at + 1;
        if (2 * at + 2 < c->heap_n) c->stack[sp++] = 2 * at + 2;
    }
    return best;
}

/* Evict for a newcomer whose next use is `candidate`; returns the victim, 0 when nothing
 * may leave (all protected, or bypass: the best victim is needed no later than the
 * newcomer). */
static uint32_t evict(opt_cache *c, uint32_t candidate) {
    uint32_t at = first_unprotected(c);
    if (at == UINT32_MAX || c->heap[at].key <= candidate) return 0;
    uint32_t slot = c->heap[at].slot, node = c->heap[at].node;
    heap_remove(c, slot);
    c->slot_of[node] = 0;
    SLOT_GIVE(c, slot, pos);
    c->used--;
    c->evictions++;
    uint32_t up = c->parent[node];
    if (up) {
        uint32_t up_slot = c->slot_of[up];
        if (--c->s[up_slot].kids == 0) heap_push(c, up_slot);
    }
    return node;
}

/* The steps of trie_replay (internal.h); a key is the next use, t->next_use[i]. */
static void opt_hit(void *cache, const sim_trace *t, int64_t i) {
    opt_cache *c = cache;
    uint32_t slot = c->slot_of[t->node_of_event[i]];
    set_key(c, slot, t->next_use[i]);
    c->s[slot].state |= OPT_PROT;
}

static int opt_full(const void *cache) {
    const opt_cache *c = cache;
    return c->used >= c->capacity;
}

static int opt_evict(void *cache, const sim_trace *t, int64_t i) {
    return evict(cache, t->next_use[i]) != 0;
}

static int opt_insert(void *cache, const sim_trace *t, int64_t i) {
    insert(cache, t->node_of_event[i], t->next_use[i]);
    return SIM_OK;
}

static void opt_unprotect(void *cache, const sim_trace *t, int64_t i) {
    opt_cache *c = cache;
    c->s[c->slot_of[t->node_of_event[i]]].state &= ~(uint32_t)OPT_PROT;
}

static const trie_policy optimal = {opt_hit, opt_full, opt_evict, opt_insert, opt_unprotect};

int run_optimal(sim_workspace *ws, replay_frame *f) {
    const sim_trace *t = f->t;
    opt_cache c = {0};
    c.capacity = f->p->capacity;
    c.parent = t->parent;
    c.fresh = 1;
    c.slot_of = ws_get(ws, WS_REF_A, (size_t)t->n_nodes * sizeof(uint32_t), 1);
    c.s = ws_get(ws, WS_SLOT_A, ((size_t)c.capacity + 1) * sizeof(opt_slot), 0);
    c.heap = ws_get(ws, WS_HEAP_A, ((size_t)c.capacity + 1) * sizeof(opt_entry), 0);
    c.stack = ws_get(ws, WS_STACK_A, ((size_t)c.capacity + 2) * sizeof(uint32_t), 0);
    if (!c.slot_of || !c.s || !c.heap || !c.stack) return SIM_ENOMEM;
    int rc = trie_replay(f, &optimal, &c, c.slot_of);
    f->out->evictions = c.evictions;
    return rc;
}
