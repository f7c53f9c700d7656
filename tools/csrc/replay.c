/* The workspace, the dispatcher, and the two policies without a trie rule: the ceiling
 * (an infinite cache) and fifo. */
#include "internal.h"

sim_workspace *sim_workspace_new(void) {
    return calloc(1, sizeof(sim_workspace));
}

void sim_workspace_free(sim_workspace *ws) {
    if (!ws) return;
    for (int i = 0; i < WS_COUNT; i++) free(ws->buf[i]);
    free(ws);
}

int64_t sim_workspace_bytes(const sim_workspace *ws) {
    int64_t total = 0;
    for (int i = 0; i < WS_COUNT; i++) total += (int64_t)ws->size[i];
    return total;
}

void *ws_get(sim_workspace *ws, int which, size_t bytes, int zero) {
    if (bytes == 0) bytes = 1;
    if (ws->size[which] < bytes) {
        free(ws->buf[which]);
        ws->buf[which] = malloc(bytes);
        ws->size[which] = ws->buf[which] ? bytes : 0;
        if (!ws->buf[which]) return NULL;
    }
    if (zero) memset(ws->buf[which], 0, bytes);
    return ws->buf[which];
}

void *ws_grow(sim_workspace *ws, int which, size_t bytes) {
    if (ws->size[which] >= bytes) return ws->buf[which];
    void *bigger = realloc(ws->buf[which], bytes);
    if (!bigger) return NULL;
    ws->buf[which] = bigger;
    ws->size[which] = bytes;
    return bigger;
}

int sim_ceiling(const sim_trace *t, sim_result *out) {
    memset(out, 0, sizeof(*out));
    uint8_t *seen = calloc((size_t)t->n_nodes, 1);
    if (!seen) return SIM_ENOMEM;
    for (int64_t r = 0; r < t->n_req; r++) {
        count_leading_hits(t, r, seen, out);
        /* Nodes join after their request: a block repeated within it does not hit. */
        int64_t lo = t->req_off[r], hi = t->req_off[r + 1];
        for (int64_t i = lo; i < hi; i++) seen[t->node_of_event[i]] = 1;
    }
    free(seen);
    return SIM_OK;
}

/* fifo: a queue in insertion order; no trie rule, so orphans are inserted too. The queue
 * holds exactly the cached nodes, so a ring of `capacity` entries suffices. */
int run_fifo(sim_workspace *ws, replay_frame *f) {
    const sim_trace *t = f->t;
    uint32_t cap = f->p->capacity;
    uint8_t *in = ws_get(ws, WS_BYTES, (size_t)t->n_nodes, 1);
    uint32_t *ring = ws_get(ws, WS_RING_A, (size_t)cap * sizeof(uint32_t), 0);
    if (!in || !ring) return SIM_ENOMEM;
    uint32_t head = 0, used = 0;
    for (int64_t r = 0; r < t->n_req; r++) {
        int rc = frame_begin(f, r);
        if (rc) return rc < 0 ? rc : SIM_OK;
        int measured = r >= t->warmup_requests;
        count_leading_hits(t, r, in, f->out);
        int64_t lo = t->req_off[r], hi = t->req_off[r + 1];
        for (int64_t i = lo; i < hi; i++) {
            uint32_t node = t->node_of_event[i];
            if (in[node]) continue;
            if (used >= cap) {
                in[ring[head]] = 0;
                head = head + 1 == cap ? 0 : head + 1;
                used--;
                f->out->evictions++;
            }
            uint32_t tail = head + used;
            if (tail >= cap) tail -= cap;
            ring[tail] = node;
            in[node] = 1;
            used++;
            if (used >= cap && !measured) f->filled = 1;
        }
    }
    return frame_end(f);
}

int sim_run(sim_workspace *ws, const sim_trace *t, const sim_params *p, sim_result *out) {
    memset(out, 0, sizeof(*out));
    if (!ws || !t || !p || (p->capacity == 0 && p->policy != SIM_TIERED)) return SIM_EINVAL;
    if (p->policy == SIM_OPTIMAL && !t->next_use) return SIM_EINVAL;
    replay_frame frame = {t, p, out, 0};
    switch (p->policy) {
    case SIM_FIFO: return run_fifo(ws, &frame);
    case SIM_LRU: return run_lru(ws, &frame);
    case SIM_OPTIMAL: return run_optimal(ws, &frame);
    case SIM_S3FIFO: return run_s3fifo(ws, &frame);
    case SIM_TIERED: return run_tiered(ws, &frame);
    default: return SIM_EINVAL;
    }
}
