/* The `s3fifo` policy: S3-FIFO (Yang et al., SOSP '23) adapted to the prefix rule.
 *
 * S3-FIFO keeps a small FIFO S (10% of the blocks by default), a main FIFO M and a ghost
 * FIFO G of recently evicted ids. New blocks enter S, or M when G remembers them. A hit
 * sets a 2-bit frequency. At the head of S, a block seen again moves to M, others leave
 * (into G). At the head of M, a block seen again gets its frequency decremented and goes
 * round again; others leave.
 *
 * The prefix adaptation, so that every cached block stays reachable:
 * - only leaves (no cached child) sit in S and M; a block that gains a child leaves its
 *   queue, and when its last child is evicted it re-enters M at the head, since it is
 *   older than anything queued - a cold chain unwinds leaf by leaf;
 * - a block is inserted only under a cached parent (as for lru);
 * - blocks on the path of the request being inserted are never evicted: at the head of
 *   S they move to M, at the head of M they go round.
 * Queue entries are (slot, generation) pairs; a stale entry is skipped when it surfaces.
 */
#include "internal.h"

enum { Q_NONE = 0, Q_SMALL = 1, Q_MAIN = 2 };

typedef struct {
    uint32_t node;
    uint32_t gen;   /* bumped whenever the slot leaves a queue or is freed */
    uint8_t freq;   /* 0..3 */
    uint8_t queue;  /* Q_NONE for non-leaves */
    uint8_t prot;
    uint32_t free_next;
    uint32_t kids;  /* cached children (a node with one is always cached itself) */
} s3_slot;

typedef struct {
    uint32_t slot, gen;
} s3_entry;

typedef struct {
    s3_entry *e;
    uint64_t head, count, mask; /* capacity = mask + 1, a power of two */
    int buf;
} s3_deque;

typedef struct {
    uint32_t *slot_of;      /* per node, 0 when not cached */
    s3_slot *s;
    uint32_t *stamp;        /* per node: the ghost entry remembering it, 0 if none */
    s3_entry *ghost;        /* ring of (node, stamp) */
    uint32_t ghost_cap, ghost_head, ghost_n, ghost_clock;
    s3_deque small, main;
    uint32_t count[3];      /* valid entries per queue */
    const uint32_t *parent;
    uint32_t capacity, small_target, used, fresh, free_head;
    uint64_t evictions;
    sim_workspace *ws;
} s3_cache;

static int deque_init(s3_cache *c, s3_deque *d, int buf, uint64_t want) {
    uint64_t size = 16;
    while (size < want) size <<= 1;
    d->e = ws_get(c->ws, buf, size * sizeof(s3_entry), 0);
    d->head = d->count = 0;
    d->mask = size - 1;
    d->buf = buf;
    return d->e ? SIM_OK : SIM_ENOMEM;
}

/* Double the ring, unwrapping it so that the head is at 0. */
static int deque_grow(s3_cache *c, s3_deque *d) {
    uint64_t size = d->mask + 1;
    s3_entry *e = ws_grow(c->ws, d->buf, 2 * size * sizeof(s3_entry));
    if (!e) return SIM_ENOMEM;
    /* Entries [head, size) stay; entries [0, head) move to [size, size + head). */
    memcpy(e + size, e, d->head * sizeof(s3_entry));
    d->e = e;
    d->mask = 2 * size - 1;
    return SIM_OK;
}

static int deque_push(s3_cache *c, s3_deque *d, s3_entry x, int front) {
    if (d->count > d->mask && deque_grow(c, d) != SIM_OK) return SIM_ENOMEM;
    if (front) {
        d->head = (d->head - 1) & d->mask;
        d->e[d->head] = x;
    } else {
        d->e[(d->head + d->count) & d->mask] = x;
    }
    d->count++;
    return SIM_OK;
}

static s3_entry deque_pop(s3_deque *d) {
    s3_entry x = d->e[d->head];
    d->head = (d->head + 1) & d->mask;
    d->count--;
    return x;
}

static int enqueue(s3_cache *c, uint32_t slot, int queue, int front) {
    s3_slot *x = &c->s[slot];
    x->gen++;
    x->queue = (uint8_t)queue;
    c->count[queue]++;
    s3_entry e = {slot, x->gen};
    return deque_push(c, queue == Q_SMALL ? &c->small : &c->main, e, front);
}

static void dequeue(s3_cache *c, uint32_t slot) {
    s3_slot *x = &c->s[slot];
    if (x->queue == Q_NONE) return;
    c->count[x->queue]--;
    x->queue = Q_NONE;
    x->gen++;
}

static void ghost_remember(s3_cache *c, uint32_t node) {
    if (c->ghost_n == c->ghost_cap) {
        s3_entry old = c->ghost[c->ghost_head];
        if (c->stamp[old.slot] == old.gen) c->stamp[old.slot] = 0;
        c->ghost_head = c->ghost_head + 1 == c->ghost_cap ? 0 : c->ghost_head + 1;
        c->ghost_n--;
    }
    if (++c->ghost_clock == 0) c->ghost_clock = 1;
    uint32_t at = c->ghost_head + c->ghost_n;
    if (at >= c->ghost_cap) at -= c->ghost_cap;
    c->ghost[at] = (s3_entry){node, c->ghost_clock};
    c->ghost_n++;
    c->stamp[node] = c->ghost_clock;
}

static int insert(s3_cache *c, uint32_t node) {
    uint32_t slot = SLOT_TAKE(c, free_next);
    s3_slot *x = &c->s[slot];
    x->node = node;
    x->freq = 0;
    x->prot = 0;
    x->queue = Q_NONE;
    x->kids = 0;
    c->slot_of[node] = slot;
    c->used++;
    int queue = Q_SMALL;
    if (c->stamp[node]) {
        queue = Q_MAIN;
        c->stamp[node] = 0;
    }
    uint32_t up = c->parent[node];
    if (up) {
        uint32_t up_slot = c->slot_of[up];
        if (c->s[up_slot].kids++ == 0) dequeue(c, up_slot);
    }
    return enqueue(c, slot, queue, 0);
}

/* Free a slot whose node leaves the cache; its parent may become a leaf again. */
static int release(s3_cache *c, uint32_t slot, int from_small) {
    s3_slot *x = &c->s[slot];
    uint32_t node = x->node;
    dequeue(c, slot);
    x->gen++;
    c->slot_of[node] = 0;
    SLOT_GIVE(c, slot, free_next);
    c->used--;
    c->evictions++;
    if (from_small) ghost_remember(c, node);
    uint32_t up = c->parent[node];
    if (up) {
        uint32_t up_slot = c->slot_of[up];
        if (--c->s[up_slot].kids == 0) return enqueue(c, up_slot, Q_MAIN, 1);
    }
    return SIM_OK;
}

/* Evict one block; 1 when done, 0 when nothing may leave, <0 on error. The step budget
 * bounds the rounds: each step promotes, decrements a frequency or evicts, and protected
 * blocks are the only ones that can go round for free. */
static int evict(s3_cache *c) {
    uint64_t budget = 5 * ((uint64_t)c->count[Q_SMALL] + c->count[Q_MAIN]) + 16;
    while (budget--) {
        int use_small = c->count[Q_SMALL] &&
                        (c->count[Q_SMALL] >= c->small_target || !c->count[Q_MAIN]);
        if (!use_small && !c->count[Q_MAIN]) return 0;
        s3_deque *d = use_small ? &c->small : &c->main;
        s3_entry e;
        do {
            e = deque_pop(d);
        } while (c->s[e.slot].gen != e.gen);
        s3_slot *x = &c->s[e.slot];
        c->count[x->queue]--;
        x->queue = Q_NONE;
        int rc;
        if (use_small) {
            if (x->prot || x->freq) {
                x->freq = 0;
                rc = enqueue(c, e.slot, Q_MAIN, 0);
            } else {
                rc = release(c, e.slot, 1);
                if (rc == SIM_OK) return 1;
            }
        } else if (x->prot || x->freq) {
            if (!x->prot) x->freq--;
            rc = enqueue(c, e.slot, Q_MAIN, 0);
        } else {
            rc = release(c, e.slot, 0);
            if (rc == SIM_OK) return 1;
        }
        if (rc != SIM_OK) return rc;
    }
    return 0;
}

/* The steps of trie_replay (internal.h). */
static void s3_hit(void *cache, const sim_trace *t, int64_t i) {
    s3_cache *c = cache;
    s3_slot *x = &c->s[c->slot_of[t->node_of_event[i]]];
    if (x->freq < 3) x->freq++;
    x->prot = 1;
}

static int s3_full(const void *cache) {
    const s3_cache *c = cache;
    return c->used >= c->capacity;
}

static int s3_evict(void *cache, const sim_trace *t, int64_t i) {
    (void)t, (void)i;
    return evict(cache);
}

static int s3_insert(void *cache, const sim_trace *t, int64_t i) {
    return insert(cache, t->node_of_event[i]) == SIM_OK ? SIM_OK : SIM_ENOMEM;
}

static void s3_unprotect(void *cache, const sim_trace *t, int64_t i) {
    s3_cache *c = cache;
    c->s[c->slot_of[t->node_of_event[i]]].prot = 0;
}

static const trie_policy s3fifo = {s3_hit, s3_full, s3_evict, s3_insert, s3_unprotect};

int run_s3fifo(sim_workspace *ws, replay_frame *f) {
    const sim_trace *t = f->t;
    s3_cache c;
    memset(&c, 0, sizeof(c));
    c.ws = ws;
    c.capacity = f->p->capacity;
    c.small_target = f->p->small_capacity ? f->p->small_capacity : 1;
    c.parent = t->parent;
    c.fresh = 1;
    c.ghost_cap = c.capacity > c.small_target ? c.capacity - c.small_target : 1;
    c.slot_of = ws_get(ws, WS_REF_A, (size_t)t->n_nodes * sizeof(uint32_t), 1);
    c.stamp = ws_get(ws, WS_STAMP, (size_t)t->n_nodes * sizeof(uint32_t), 1);
    c.s = ws_get(ws, WS_SLOT_A, ((size_t)c.capacity + 1) * sizeof(s3_slot), 1);
    c.ghost = ws_get(ws, WS_RING_C, (size_t)c.ghost_cap * sizeof(s3_entry), 0);
    if (!c.slot_of || !c.stamp || !c.s || !c.ghost) return SIM_ENOMEM;
    if (deque_init(&c, &c.small, WS_RING_A, c.small_target * 2ull) ||
        deque_init(&c, &c.main, WS_RING_B, (uint64_t)c.capacity + 1))
        return SIM_ENOMEM;
    int rc = trie_replay(f, &s3fifo, &c, c.slot_of);
    f->out->evictions = c.evictions;
    return rc;
}
