/* The `tiered` policy: a DRAM prefix-LRU tier over an SSD prefix-LRU tier.
 *
 * - Lookup walks the request's blocks; a block is a hit while the prefix is unbroken and
 *   the block is cached in either tier. DRAM serves it when it holds it, else the SSD.
 *   A hit refreshes the block's recency in every tier that holds it (the store keeps
 *   one recency per object, not per replica).
 * - New blocks go into DRAM under the lru rules (evict a DRAM leaf when full, insert only
 *   under a parent cached in either tier, stop the request otherwise). In write-through
 *   mode they are also written to the SSD at once; in offload-on-evict mode a block is
 *   written to the SSD when DRAM evicts it (if the SSD does not hold it yet).
 * - With promotion, a prefix hit served by the SSD is copied into DRAM (the SSD keeps
 *   its copy); without, SSD hits stay on the SSD.
 * - The SSD tier evicts its least-recently-touched leaf (no cached child on the SSD) to
 *   make room; when it cannot, the incoming block is simply not written.
 * - With no DRAM, blocks are written straight to the SSD under the lru rules; with no SSD
 *   the policy is exactly `lru`.
 * The cache counts as filled (for the warm-up rule) when DRAM fills, or the SSD when
 * there is no DRAM.
 */
#include "plru.h"

typedef struct {
    plru dram, ssd;
    const sim_trace *t;
    int write_through;
    uint64_t ssd_writes;
} tiers;

static inline int cached(const tiers *x, uint32_t node) {
    return node == 0 || plru_slot_of(&x->dram, node) || plru_slot_of(&x->ssd, node);
}

/* Write a block to the SSD tier, evicting an SSD leaf if needed; a full tier of
 * unevictable blocks drops the write. */
static void ssd_write(tiers *x, uint32_t node) {
    if (!x->ssd.capacity || plru_slot_of(&x->ssd, node)) return;
    if (x->ssd.used >= x->ssd.capacity && !plru_evict(&x->ssd)) return;
    plru_insert(&x->ssd, node);
    x->ssd_writes++;
}

/* Put a block into DRAM with the lru rules; 0 means "stop inserting this request". */
static int dram_put(tiers *x, uint32_t node) {
    if (x->dram.used >= x->dram.capacity) {
        uint32_t victim = plru_evict(&x->dram);
        if (!victim) return 0;
        if (!x->write_through) ssd_write(x, victim);
    }
    if (x->dram.used < x->dram.capacity && cached(x, x->t->parent[node])) {
        plru_insert(&x->dram, node);
        return 1;
    }
    return 0;
}

/* With no DRAM tier, new blocks go straight to the SSD with the lru rules. */
static int ssd_put(tiers *x, uint32_t node) {
    if (x->ssd.used >= x->ssd.capacity && !plru_evict(&x->ssd)) return 0;
    if (x->ssd.used < x->ssd.capacity && cached(x, x->t->parent[node])) {
        plru_insert(&x->ssd, node);
        x->ssd_writes++;
        return 1;
    }
    return 0;
}

static void protect_path(tiers *x, int64_t lo, int64_t hi, int on) {
    for (int64_t i = lo; i < hi; i++) {
        uint32_t node = x->t->node_of_event[i];
        uint32_t d = plru_slot_of(&x->dram, node), s = plru_slot_of(&x->ssd, node);
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
    int rc = plru_init(&x.dram, ws, WS_REF_A, WS_KIDS_A, WS_SLOT_A, WS_HEAP_A, WS_STACK_A,
                       t, p->capacity);
    if (!rc) rc = plru_init(&x.ssd, ws, WS_REF_B, WS_KIDS_B, WS_SLOT_B, WS_HEAP_B,
                            WS_STACK_B, t, p->ssd_capacity);
    if (rc) return rc;
    if (!p->capacity && !p->ssd_capacity) return SIM_EINVAL;
    plru *fill = p->capacity ? &x.dram : &x.ssd;
    uint64_t promotions = 0;
    for (int64_t r = 0; r < t->n_req; r++) {
        rc = frame_begin(f, r);
        if (rc) return rc < 0 ? rc : SIM_OK;
        int measured = r >= t->warmup_requests;
        int64_t lo = t->req_off[r], hi = t->req_off[r + 1], first_miss = hi;
        for (int64_t i = lo; i < hi; i++) {
            uint32_t node = t->node_of_event[i];
            if (measured) f->out->total_tokens += t->tokens[i];
            if (first_miss < hi) continue;
            uint32_t d = plru_slot_of(&x.dram, node), s = plru_slot_of(&x.ssd, node);
            if (!d && !s) {
                first_miss = i;
                continue;
            }
            if (measured) {
                f->out->hit_tokens += t->tokens[i];
                if (!d) f->out->ssd_hit_tokens += t->tokens[i];
            }
            if (d) plru_touch(&x.dram, d);
            if (s) plru_touch(&x.ssd, s);
        }
        protect_path(&x, lo, hi, 1);
        for (int64_t i = lo; i < hi; i++) {
            uint32_t node = t->node_of_event[i];
            if (plru_slot_of(&x.dram, node)) continue;
            if (plru_slot_of(&x.ssd, node)) {
                if (!p->promote || i >= first_miss || !p->capacity) continue;
                if (!dram_put(&x, node)) break;
                promotions++;
            } else if (!p->capacity) {
                if (!ssd_put(&x, node)) break;
            } else {
                if (!dram_put(&x, node)) break;
                if (x.write_through) ssd_write(&x, node);
            }
            if (fill->used >= fill->capacity && !measured) f->filled = 1;
        }
        protect_path(&x, lo, hi, 0);
    }
    f->out->evictions = x.dram.evictions;
    f->out->promotions = promotions;
    f->out->ssd_writes = x.ssd_writes;
    return frame_end(f);
}
