/* The prefix trie: block ids -> trie nodes, and the next-use index for Belady. */
#include "internal.h"

/* A 64-bit finaliser (the murmur3 mix): trie keys are (parent, id) pairs whose ids are
 * often small consecutive integers, so they need real mixing before masking. */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static inline uint64_t edge_hash(uint32_t parent, int64_t id) {
    return mix64((uint64_t)id + (uint64_t)parent * 0x9e3779b97f4a7c15ULL);
}

/* Open addressing over node indices (0 = empty: the root is never a key). The keys live
 * in parent[] and key_id[], so a slot costs 4 bytes and the load stays at most 1/2. */
typedef struct {
    uint32_t *slots;
    uint64_t mask;
} edge_table;

static int table_alloc(edge_table *t, uint64_t size) {
    t->slots = calloc(size, sizeof(uint32_t));
    t->mask = size - 1;
    return t->slots ? SIM_OK : SIM_ENOMEM;
}

static int table_grow(edge_table *t, const uint32_t *parent, const int64_t *key_id,
                      uint32_t n_nodes) {
    edge_table bigger;
    if (table_alloc(&bigger, (t->mask + 1) * 2) != SIM_OK) return SIM_ENOMEM;
    for (uint32_t node = 1; node < n_nodes; node++) {
        uint64_t h = edge_hash(parent[node], key_id[node]) & bigger.mask;
        while (bigger.slots[h]) h = (h + 1) & bigger.mask;
        bigger.slots[h] = node;
    }
    free(t->slots);
    *t = bigger;
    return SIM_OK;
}

int64_t sim_build_trie(const int64_t *ids, const int64_t *req_off, int64_t n_req,
                       uint32_t *node_of_event, uint32_t *parent) {
    int64_t n_events = req_off[n_req];
    if (n_events < 0 || n_events >= (int64_t)UINT32_MAX - 1) return SIM_EINVAL;
    /* key_id is indexed by node; malloc of a large block maps pages lazily, so only the
     * nodes actually created cost memory. */
    int64_t *key_id = malloc(((size_t)n_events + 1) * sizeof(int64_t));
    if (!key_id) return SIM_ENOMEM;
    edge_table table;
    /* Sized for as many nodes as half the events (no rehash for most traces); grows by
     * doubling past that. */
    uint64_t size = 1u << 16;
    while (size < (uint64_t)n_events) size <<= 1;
    if (table_alloc(&table, size) != SIM_OK) {
        free(key_id);
        return SIM_ENOMEM;
    }
    uint32_t n_nodes = 1;
    parent[0] = 0;
    key_id[0] = 0;
    for (int64_t r = 0; r < n_req; r++) {
        uint32_t at = 0;
        for (int64_t i = req_off[r]; i < req_off[r + 1]; i++) {
            int64_t id = ids[i];
            uint64_t h = edge_hash(at, id) & table.mask;
            uint32_t node;
            while ((node = table.slots[h]) != 0) {
                if (parent[node] == at && key_id[node] == id) break;
                h = (h + 1) & table.mask;
            }
            if (!node) {
                node = n_nodes++;
                parent[node] = at;
                key_id[node] = id;
                table.slots[h] = node;
                if ((uint64_t)n_nodes * 2 > table.mask + 1 &&
                    table_grow(&table, parent, key_id, n_nodes) != SIM_OK) {
                    free(table.slots);
                    free(key_id);
                    return SIM_ENOMEM;
                }
            }
            node_of_event[i] = node;
            at = node;
        }
    }
    free(table.slots);
    free(key_id);
    return n_nodes;
}

int sim_next_use(const uint32_t *node_of_event, const int64_t *req_off, int64_t n_req,
                 int64_t n_nodes, uint32_t *next_use) {
    if (n_req + 1 >= (int64_t)UINT32_MAX) return SIM_EINVAL;
    uint32_t never = (uint32_t)(n_req + 1);
    uint32_t *last_use = malloc((size_t)n_nodes * sizeof(uint32_t));
    if (!last_use) return SIM_ENOMEM;
    for (int64_t n = 0; n < n_nodes; n++) last_use[n] = never;
    /* Backwards: read every event's next use before this request records itself, so a
     * request never counts as its own next use. */
    for (int64_t r = n_req - 1; r >= 0; r--) {
        for (int64_t i = req_off[r]; i < req_off[r + 1]; i++) {
            next_use[i] = last_use[node_of_event[i]];
        }
        for (int64_t i = req_off[r]; i < req_off[r + 1]; i++) {
            last_use[node_of_event[i]] = (uint32_t)r;
        }
    }
    free(last_use);
    return SIM_OK;
}
