/* The `tiered` policy: a DRAM prefix-LRU tier over an SSD prefix-LRU tier.
 *
 * - Lookup walks the request's blocks; a block is a hit while the prefix is unbroken and
 *   the block is cached in either tier. DRAM serves it when it holds it, else the SSD.
 *   A hit refreshes the block's recency in every tier that holds it (the store keeps
 *   one recency per object, not per replica).
 * - Insert: each tier takes the request's new blocks in order under the lru rules (make
 *   room by evicting a leaf of that tier, insert only under a parent cached in either
 *   tier) until it refuses one; a refusal by one tier does not stop the other.
 *   New blocks go into DRAM. In write-through mode every new block is also written to
 *   the SSD, whatever DRAM did with it, so the SSD sees every block even when DRAM is
 *   smaller than one request. In offload-on-evict mode a block reaches the SSD when DRAM
 *   evicts it (if the SSD does not hold it yet), or at once when DRAM refuses it.
 * - With promotion, a prefix hit served by the SSD is copied into DRAM (the SSD keeps
 *   its copy); without, SSD hits stay on the SSD.
 * - The SSD tier evicts its least-recently-touched leaf (no cached child on the SSD) to
 *   make room; an offloaded block that finds nothing to evict is dropped.
 * - With no DRAM the policy is lru on the SSD; with no SSD it is exactly `lru`.
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
static void ssd_offload(tiers *x, uint32_t node) {
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
        if (!x->write_through) ssd_offload(x, victim);
    }
    if (x->dram.used < x->dram.capacity && cached(x, x->t->parent[node])) {
        plru_insert(&x->dram, node);
        return 1;
    }
    return 0;
}

/* Put a block on the SSD with the lru rules (make room, then insert only under a parent
 * cached in either tier); 0 means "the SSD takes no more of this request". */
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
            if (p->request_hit_tokens) {
                p->request_hit_tokens[r] += t->tokens[i];
                if (!d && p->request_ssd_hit_tokens) p->request_ssd_hit_tokens[r] += t->tokens[i];
            }
            if (d) plru_touch(&x.dram, d);
            if (s) plru_touch(&x.ssd, s);
        }
        protect_path(&x, lo, hi, 1);
        /* Each tier takes the request's blocks in order until it refuses one (lru rules);
         * a refusal by one tier does not stop the other. */
        int dram_open = p->capacity > 0, ssd_open = p->ssd_capacity > 0;
        for (int64_t i = lo; i < hi && (dram_open || ssd_open); i++) {
            uint32_t node = t->node_of_event[i];
            int in_dram = plru_slot_of(&x.dram, node) != 0;
            int in_ssd = plru_slot_of(&x.ssd, node) != 0;
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
            } else if (!in_dram && dram_open && p->promote && i < first_miss) {
                if (dram_put(&x, node)) promotions++;
                else dram_open = 0;
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
