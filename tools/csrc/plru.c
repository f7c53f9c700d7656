/* The prefix LRU tier (see plru.h) and the single-tier `lru` policy. */
#include "plru.h"

int plru_init(plru *t, sim_workspace *ws, int ref_buf, int kids_buf, int slot_buf,
              int heap_buf, int stack_buf, const sim_trace *trace, uint32_t capacity) {
    memset(t, 0, sizeof(*t));
    t->slot_of = ws_get(ws, ref_buf, (size_t)trace->n_nodes * sizeof(uint32_t), 1);
    if (kids_buf >= 0) {
        t->kids = ws_get(ws, kids_buf, (size_t)trace->n_nodes * sizeof(uint32_t), 1);
        if (!t->kids) return SIM_ENOMEM;
    }
    t->s = ws_get(ws, slot_buf, ((size_t)capacity + 1) * sizeof(plru_slot), 0);
    t->heap = ws_get(ws, heap_buf, ((size_t)capacity + 1) * sizeof(uint32_t), 0);
    t->stack = ws_get(ws, stack_buf, ((size_t)capacity + 2) * sizeof(uint32_t), 0);
    if (!t->slot_of || !t->s || !t->heap || !t->stack) return SIM_ENOMEM;
    t->parent = trace->parent;
    t->capacity = capacity;
    t->fresh = 1;
    return SIM_OK;
}

/* ---- the key-ordered list ---- */

static inline void list_unlink(plru *t, uint32_t slot) {
    plru_slot *x = &t->s[slot];
    if (x->prev) t->s[x->prev].next = x->next;
    else t->head = x->next;
    if (x->next) t->s[x->next].prev = x->prev;
    else t->tail = x->prev;
}

static inline void list_append(plru *t, uint32_t slot) {
    plru_slot *x = &t->s[slot];
    x->prev = t->tail;
    x->next = 0;
    if (t->tail) t->s[t->tail].next = slot;
    else t->head = slot;
    t->tail = slot;
}

/* ---- the heap of parked leaves (min by key; keys are unique) ---- */

static inline void heap_place(plru *t, uint32_t at, uint32_t slot) {
    t->heap[at] = slot;
    t->s[slot].prev = at;
}

static void heap_up(plru *t, uint32_t at) {
    uint32_t slot = t->heap[at], key = t->s[slot].key;
    while (at > 0) {
        uint32_t up = (at - 1) / 2;
        if (t->s[t->heap[up]].key <= key) break;
        heap_place(t, at, t->heap[up]);
        at = up;
    }
    heap_place(t, at, slot);
}

static void heap_down(plru *t, uint32_t at) {
    uint32_t slot = t->heap[at], key = t->s[slot].key;
    for (;;) {
        uint32_t child = 2 * at + 1;
        if (child >= t->heap_n) break;
        if (child + 1 < t->heap_n && t->s[t->heap[child + 1]].key < t->s[t->heap[child]].key)
            child++;
        if (t->s[t->heap[child]].key >= key) break;
        heap_place(t, at, t->heap[child]);
        at = child;
    }
    heap_place(t, at, slot);
}

static void heap_push(plru *t, uint32_t slot) {
    t->heap[t->heap_n] = slot;
    heap_up(t, t->heap_n++);
}

static void heap_remove(plru *t, uint32_t slot) {
    uint32_t at = t->s[slot].prev;
    uint32_t last = t->heap[--t->heap_n];
    if (last == slot) return;
    heap_place(t, at, last);
    heap_up(t, at);
    heap_down(t, t->s[last].prev);
}

/* The youngest-keyed unprotected slot of the heap: below an unprotected entry nothing is
 * younger, so only protected entries need their children searched. */
static uint32_t heap_min_unprotected(plru *t) {
    if (!t->heap_n) return 0;
    uint32_t top = t->heap[0];
    if (!(t->s[top].state & PL_PROT)) return top;
    uint32_t best = 0, sp = 0;
    t->stack[sp++] = 0;
    while (sp) {
        uint32_t at = t->stack[--sp], slot = t->heap[at];
        if (!(t->s[slot].state & PL_PROT)) {
            if (!best || t->s[slot].key < t->s[best].key) best = slot;
            continue;
        }
        if (2 * at + 1 < t->heap_n) t->stack[sp++] = 2 * at + 1;
        if (2 * at + 2 < t->heap_n) t->stack[sp++] = 2 * at + 2;
    }
    return best;
}

/* ---- the tier ---- */

static inline void set_where(plru_slot *x, uint32_t where) {
    x->state = (x->state & PL_PROT) | where;
}

/* The list's first unprotected leaf, parking the non-leaves met on the way. */
static uint32_t list_first_evictable(plru *t) {
    uint32_t at = t->head;
    while (at) {
        plru_slot *x = &t->s[at];
        uint32_t next = x->next;
        if (*plru_kids(t, x->node, at)) {
            list_unlink(t, at);
            set_where(x, PL_PARKED);
        } else if (!(x->state & PL_PROT)) {
            return at;
        }
        at = next;
    }
    return 0;
}

void plru_touch(plru *t, uint32_t slot) {
    plru_slot *x = &t->s[slot];
    x->key = ++t->clock;
    uint32_t where = x->state & PL_WHERE;
    if (where == PL_LIST) {
        if (t->tail == slot) return;
        list_unlink(t, slot);
    } else if (where == PL_HEAP) {
        heap_remove(t, slot);
    }
    list_append(t, slot);
    set_where(x, PL_LIST);
}

void plru_insert(plru *t, uint32_t node) {
    uint32_t slot = SLOT_TAKE(t, next);
    plru_slot *x = &t->s[slot];
    x->node = node;
    x->key = ++t->clock;
    x->state = PL_LIST;
    x->kids = 0;
    list_append(t, slot);
    t->slot_of[node] = slot;
    t->used++;
    uint32_t up = t->parent[node];
    if (!up) return;
    uint32_t up_slot = t->slot_of[up];
    if (!t->kids && !up_slot) return; /* cannot happen in a single tier */
    if ((*plru_kids(t, up, up_slot))++ == 0 && up_slot) {
        plru_slot *px = &t->s[up_slot];
        if ((px->state & PL_WHERE) == PL_HEAP) {
            heap_remove(t, up_slot);
            set_where(px, PL_PARKED);
        }
    }
}

uint32_t plru_evict(plru *t) {
    uint32_t a = list_first_evictable(t);
    uint32_t b = heap_min_unprotected(t);
    uint32_t victim;
    if (!a && !b) return 0;
    if (a && (!b || t->s[a].key < t->s[b].key)) {
        victim = a;
        list_unlink(t, a);
    } else {
        victim = b;
        heap_remove(t, b);
    }
    uint32_t node = t->s[victim].node;
    t->slot_of[node] = 0;
    SLOT_GIVE(t, victim, next);
    t->used--;
    t->evictions++;
    uint32_t up = t->parent[node];
    if (!up) return node;
    uint32_t up_slot = t->slot_of[up];
    if (!t->kids && !up_slot) return node; /* cannot happen in a single tier */
    if (--(*plru_kids(t, up, up_slot)) == 0 && up_slot) {
        plru_slot *px = &t->s[up_slot];
        if ((px->state & PL_WHERE) == PL_PARKED) {
            set_where(px, PL_HEAP);
            heap_push(t, up_slot);
        }
    }
    return node;
}

/* ---- the `lru` policy ---- */

/* The steps of trie_replay (internal.h): the cached prefix hits, refreshed root to leaf,
 * and is protected while the rest is inserted (a touch does not look at protection). */
static void lru_hit(void *cache, const sim_trace *t, int64_t i) {
    plru *tier = cache;
    uint32_t slot = tier->slot_of[t->node_of_event[i]];
    plru_touch(tier, slot);
    plru_protect(tier, slot);
}

static int lru_full(const void *cache) {
    const plru *tier = cache;
    return tier->used >= tier->capacity;
}

static int lru_evict(void *cache, const sim_trace *t, int64_t i) {
    (void)t, (void)i;
    return plru_evict(cache) != 0;
}

static int lru_insert(void *cache, const sim_trace *t, int64_t i) {
    plru_insert(cache, t->node_of_event[i]);
    return SIM_OK;
}

static void lru_unprotect(void *cache, const sim_trace *t, int64_t i) {
    plru *tier = cache;
    plru_unprotect(tier, tier->slot_of[t->node_of_event[i]]);
}

static const trie_policy lru = {lru_hit, lru_full, lru_evict, lru_insert, lru_unprotect};

int run_lru(sim_workspace *ws, replay_frame *f) {
    const sim_trace *t = f->t;
    plru tier;
    int rc = plru_init(&tier, ws, WS_REF_A, -1, WS_SLOT_A, WS_HEAP_A, WS_STACK_A, t,
                       f->p->capacity);
    if (rc) return rc;
    rc = trie_replay(f, &lru, &tier, tier.slot_of);
    f->out->evictions = tier.evictions;
    return rc;
}
