/* The `tiered` policy: a DRAM prefix-LRU tier over an SSD tier, prefix-LRU or FIFO.
 *
 * - Lookup walks the request's blocks; a block is a hit while the prefix is unbroken and
 *   the block is cached in either tier. DRAM serves it when it holds it, else the SSD.
 *   A hit refreshes the block's recency in every LRU tier that holds it (the store keeps
 *   one recency per object, not per replica); a FIFO SSD keeps its insertion order.
 * - Insert: each tier takes the request's new blocks in order under its rules until it
 *   refuses one; a refusal by one tier does not stop the other. The LRU rules: make room
 *   by evicting a leaf of that tier, insert only under a parent cached in either tier.
 *   The FIFO rules (ssd_fifo, as the store's SSD backends evict: oldest write first,
 *   whatever hangs below it): make room by evicting the oldest block, insert any block.
 *   New blocks go into DRAM. In write-through mode every new block is also written to
 *   the SSD, whatever DRAM did with it, so the SSD sees every block even when DRAM is
 *   smaller than one request. In offload-on-evict mode a block reaches the SSD when DRAM
 *   evicts it (if the SSD does not hold it yet), or at once when DRAM refuses it.
 * - With promotion, a prefix hit served by the SSD is copied into DRAM (the SSD keeps
 *   its copy) once the block has been served by the SSD `promote_reads` times (the
 *   store's policy.promote_reads; 0 or 1: at once); without, SSD hits stay on the SSD.
 * - The LRU SSD evicts its least-recently-touched leaf (no cached child on the SSD) to
 *   make room; an offloaded block that finds nothing to evict is dropped.
 * - With no DRAM the policy is lru (or fifo) on the SSD; with no SSD it is exactly `lru`.
 * The cache counts as filled (for the warm-up rule) when DRAM fills, or the SSD when
 * there is no DRAM.
 */
#include "plru.h"

/* The FIFO SSD tier: a ring of nodes in insertion order and a presence byte per node. */
typedef struct {
    uint8_t *in;
    uint32_t *ring;
    uint32_t capacity, head, used;
} fifo_tier;

typedef struct {
    plru dram, ssd;
    fifo_tier fifo;
    int ssd_fifo;
    const sim_trace *t;
    int write_through;
    uint64_t ssd_writes;
} tiers;

static inline int ssd_has(const tiers *x, uint32_t node) {
    return x->ssd_fifo ? x->fifo.in[node] : plru_slot_of(&x->ssd, node) != 0;
}

static inline uint32_t ssd_used(const tiers *x) {
    return x->ssd_fifo ? x->fifo.used : x->ssd.used;
}

static inline uint32_t ssd_capacity(const tiers *x) {
    return x->ssd_fifo ? x->fifo.capacity : x->ssd.capacity;
}

static inline int cached(const tiers *x, uint32_t node) {
    return node == 0 || plru_slot_of(&x->dram, node) || ssd_has(x, node);
}

/* Make room for one block on the SSD; 0 when nothing can be evicted. */
static int ssd_make_room(tiers *x) {
    if (ssd_used(x) < ssd_capacity(x)) return 1;
    if (!ssd_capacity(x)) return 0;
    if (!x->ssd_fifo) return plru_evict(&x->ssd) != 0;
    fifo_tier *q = &x->fifo;
    q->in[q->ring[q->head]] = 0;
    q->head = q->head + 1 == q->capacity ? 0 : q->head + 1;
    q->used--;
    return 1;
}

/* Cache a block on the SSD; the caller made room. */
static void ssd_insert(tiers *x, uint32_t node) {
    if (x->ssd_fifo) {
        fifo_tier *q = &x->fifo;
        uint32_t tail = q->head + q->used;
        if (tail >= q->capacity) tail -= q->capacity;
        q->ring[tail] = node;
        q->in[node] = 1;
        q->used++;
    } else {
        plru_insert(&x->ssd, node);
    }
    x->ssd_writes++;
}

/* Write a block to the SSD tier, evicting if needed; a full tier of unevictable blocks
 * drops the write. */
static void ssd_offload(tiers *x, uint32_t node) {
    if (!ssd_capacity(x) || ssd_has(x, node)) return;
    if (ssd_make_room(x)) ssd_insert(x, node);
}

/* Put a block into DRAM with the lru rules; 0 means "stop inserting this request". */
static int dram_put(tiers *x, uint32_t node) {
    if (x->dram.used >= x->dram.capacity) {
        uint32_t victim = plru_evict(&x->dram);
        if (!victim) return 0;
        if (!x->write_through) ssd_offload(x, victim);
    }
    if (x->dram.used < x->dram.capacity && cached(x, x->t->parent[node])) {
        plru_insert(&x->dram, node);
        return 1;
    }
    return 0;
}

/* Put a block on the SSD with its tier's rules; 0 means "the SSD takes no more of this
 * request". */
static int ssd_put(tiers *x, uint32_t node) {
    if (!ssd_make_room(x)) return 0;
    if (x->ssd_fifo || cached(x, x->t->parent[node])) {
        ssd_insert(x, node);
        return 1;
    }
    return 0;
}

static void protect_path(tiers *x, int64_t lo, int64_t hi, int on) {
    for (int64_t i = lo; i < hi; i++) {
        uint32_t node = x->t->node_of_event[i];
        uint32_t d = plru_slot_of(&x->dram, node);
        uint32_t s = x->ssd_fifo ? 0 : plru_slot_of(&x->ssd, node);
        if (on) {
            if (d) plru_protect(&x->dram, d);
            if (s) plru_protect(&x->ssd, s);
        } else {
            if (d) plru_unprotect(&x->dram, d);
            if (s) plru_unprotect(&x->ssd, s);
        }
    }
}

int run_tiered(sim_workspace *ws, replay_frame *f) {
    const sim_trace *t = f->t;
    const sim_params *p = f->p;
    tiers x;
    memset(&x, 0, sizeof(x));
    x.t = t;
    x.write_through = p->write_through;
    x.ssd_fifo = p->ssd_fifo != 0;
    int rc = plru_init(&x.dram, ws, WS_REF_A, WS_KIDS_A, WS_SLOT_A, WS_HEAP_A, WS_STACK_A,
                       t, p->capacity);
    if (rc) return rc;
    if (x.ssd_fifo) {
        x.fifo.capacity = p->ssd_capacity;
        x.fifo.in = ws_get(ws, WS_BYTES, (size_t)t->n_nodes, 1);
        x.fifo.ring = ws_get(ws, WS_RING_A, ((size_t)p->ssd_capacity + 1) * sizeof(uint32_t),
                             0);
        if (!x.fifo.in || !x.fifo.ring) return SIM_ENOMEM;
    } else {
        rc = plru_init(&x.ssd, ws, WS_REF_B, WS_KIDS_B, WS_SLOT_B, WS_HEAP_B, WS_STACK_B, t,
                       p->ssd_capacity);
        if (rc) return rc;
    }
    if (!p->capacity && !p->ssd_capacity) return SIM_EINVAL;
    uint64_t promotions = 0;
    /* SSD-served hits per node, counted only when a promotion needs more than one. */
    uint32_t *ssd_reads = NULL;
    if (p->promote && p->promote_reads > 1) {
        ssd_reads = ws_get(ws, WS_STAMP, (size_t)t->n_nodes * sizeof(uint32_t), 1);
        if (!ssd_reads) return SIM_ENOMEM;
    }
    for (int64_t r = 0; r < t->n_req; r++) {
        rc = frame_begin(f, r);
        if (rc) return rc < 0 ? rc : SIM_OK;
        int measured = r >= t->warmup_requests;
        int64_t lo = t->req_off[r], hi = t->req_off[r + 1], first_miss = hi;
        for (int64_t i = lo; i < hi; i++) {
            uint32_t node = t->node_of_event[i];
            if (measured) f->out->total_tokens += t->tokens[i];
            if (first_miss < hi) continue;
            uint32_t d = plru_slot_of(&x.dram, node);
            int on_ssd = ssd_has(&x, node);
            if (!d && !on_ssd) {
                first_miss = i;
                continue;
            }
            if (measured) {
                f->out->hit_tokens += t->tokens[i];
                if (!d) f->out->ssd_hit_tokens += t->tokens[i];
            }
            if (p->request_hit_tokens) {
                p->request_hit_tokens[r] += t->tokens[i];
                if (!d && p->request_ssd_hit_tokens) p->request_ssd_hit_tokens[r] += t->tokens[i];
            }
            if (d) plru_touch(&x.dram, d);
            if (on_ssd && !x.ssd_fifo) plru_touch(&x.ssd, plru_slot_of(&x.ssd, node));
            if (!d && ssd_reads && ssd_reads[node] < UINT32_MAX) ssd_reads[node]++;
        }
        protect_path(&x, lo, hi, 1);
        /* Each tier takes the request's blocks in order until it refuses one; a refusal
         * by one tier does not stop the other. */
        int dram_open = p->capacity > 0, ssd_open = p->ssd_capacity > 0;
        for (int64_t i = lo; i < hi && (dram_open || ssd_open); i++) {
            uint32_t node = t->node_of_event[i];
            int in_dram = plru_slot_of(&x.dram, node) != 0;
            int in_ssd = ssd_has(&x, node);
            if (!in_dram && !in_ssd) {
                int placed = 0;
                if (dram_open) {
                    if (dram_put(&x, node)) placed = 1;
                    else dram_open = 0;
                }
                /* write-through: every new block; offload: one DRAM could not take */
                if (ssd_open && (x.write_through || !placed)) {
                    if (ssd_put(&x, node)) placed = 1;
                    else ssd_open = 0;
                }
                if (!placed) break;
            } else if (!in_dram && dram_open && p->promote && i < first_miss
                       && (!ssd_reads || ssd_reads[node] >= p->promote_reads)) {
                if (dram_put(&x, node)) promotions++;
                else dram_open = 0;
            }
            if (!measured && (p->capacity ? x.dram.used >= x.dram.capacity
                                          : ssd_used(&x) >= ssd_capacity(&x)))
                f->filled = 1;
        }
        protect_path(&x, lo, hi, 0);
    }
    f->out->evictions = x.dram.evictions;
    f->out->promotions = promotions;
    f->out->ssd_writes = x.ssd_writes;
    return frame_end(f);
}
