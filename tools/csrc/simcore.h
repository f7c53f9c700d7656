/* simcore: the compact replay core of the hit-rate simulator (kvstored.tools._simcore).
 *
 * The Python side parses a trace into numpy event arrays; this core turns the block ids
 * into prefix-trie nodes once, then replays the requests against one cache policy and one
 * capacity per call. Memory is the event arrays plus a few bytes per trie node plus state
 * proportional to the capacity; nothing else grows with the trace.
 *
 * The semantics are those of docs/simulator.md (the reference simulator's, restated):
 * prefix hits only, leaf-only eviction for lru and optimal, warm-up then measurement,
 * "underfilled" when the cache never filled during the warm-up.
 *
 * Every function is re-entrant: concurrent calls on different workspaces are safe, so the
 * Python side may run several capacities on several threads (cffi releases the GIL).
 */
#ifndef KVSTORED_SIMCORE_H
#define KVSTORED_SIMCORE_H

#include <stdint.h>

enum sim_policy {
    SIM_FIFO = 0,
    SIM_LRU = 1,
    SIM_OPTIMAL = 2,
    SIM_S3FIFO = 3,
    SIM_TIERED = 4,
};

enum sim_status {
    SIM_OK = 0,
    SIM_ENOMEM = -1,
    SIM_EINVAL = -2,
    SIM_ECANCELED = -3,
};

/* The replay input: borrowed arrays, none of which the core modifies. */
typedef struct {
    const uint32_t *node_of_event; /* n_events: the trie node of each block event */
    const uint32_t *parent;        /* n_nodes: parent[0] = 0 is the root */
    const uint32_t *next_use;      /* n_events: next request touching the node (optimal) */
    const uint32_t *tokens;        /* n_events: token weight of each block event */
    const int64_t *req_off;        /* n_req + 1: request r owns events [off[r], off[r+1]) */
    int64_t n_req;
    int64_t n_nodes;               /* trie nodes including the root */
    int64_t warmup_requests;       /* requests [0, warmup) warm the cache, unmeasured */
} sim_trace;

typedef struct {
    int32_t policy;                /* enum sim_policy */
    uint32_t capacity;             /* blocks; the DRAM tier for SIM_TIERED */
    uint32_t ssd_capacity;         /* SIM_TIERED: blocks on the SSD tier */
    int32_t write_through;         /* SIM_TIERED: 1 write-through, 0 offload-on-evict */
    int32_t promote;               /* SIM_TIERED: copy SSD prefix hits into DRAM */
    uint32_t small_capacity;       /* SIM_S3FIFO: target size of the small FIFO */
    volatile int32_t *cancel;      /* optional: a non-zero value stops the run */
    volatile int64_t *progress;    /* optional: requests replayed so far */
    int32_t full_run;              /* replay every request even when the cache never
                                      filled during the warm-up (underfilled is still
                                      reported) */
    uint64_t *request_hit_tokens;  /* optional, SIM_TIERED, n_req entries: prefix-hit
                                      tokens of every request, measured or not */
    uint64_t *request_ssd_hit_tokens; /* optional, SIM_TIERED: the part the SSD served */
    uint32_t promote_reads;        /* SIM_TIERED with promote: copy a block on its
                                      promote_reads-th SSD-served hit and every later
                                      one (0 and 1: the first), as the store counts */
    int32_t ssd_fifo;              /* SIM_TIERED: the SSD tier evicts in insertion order,
                                      no trie rule (the store's backends); 0: prefix LRU */
} sim_params;

typedef struct {
    uint64_t hit_tokens;           /* prefix-hit tokens of measured requests, all tiers */
    uint64_t total_tokens;         /* tokens of measured requests */
    uint64_t ssd_hit_tokens;       /* SIM_TIERED: the part of hit_tokens served by SSD */
    uint64_t evictions;            /* blocks evicted (from DRAM for SIM_TIERED) */
    uint64_t promotions;           /* SIM_TIERED: SSD hits copied into DRAM */
    uint64_t ssd_writes;           /* SIM_TIERED: blocks written to the SSD tier */
    int32_t underfilled;           /* the cache never filled during the warm-up */
} sim_result;

typedef struct sim_workspace sim_workspace;

/* Build the prefix trie: node_of_event[i] for every event and parent[] for every node.
 * ids are the block ids (any 64-bit values); parent must hold n_events + 1 entries.
 * Returns the number of nodes including the root, or a negative sim_status. */
int64_t sim_build_trie(const int64_t *ids, const int64_t *req_off, int64_t n_req,
                       uint32_t *node_of_event, uint32_t *parent);

/* next_use[i] = the index of the next request after the one owning event i that touches
 * the same node, or n_req + 1 when none does. Returns a sim_status. */
int sim_next_use(const uint32_t *node_of_event, const int64_t *req_off, int64_t n_req,
                 int64_t n_nodes, uint32_t *next_use);

/* The hit rate of an infinite cache: nodes join after their request. */
int sim_ceiling(const sim_trace *trace, sim_result *out);

/* Replay the trace against one policy and capacity. Returns a sim_status. */
int sim_run(sim_workspace *ws, const sim_trace *trace, const sim_params *params,
            sim_result *out);

/* Reuse gaps: event_gap[i] = the time of event i's request minus the time of the last
 * earlier request touching the same node (0 when time goes backwards), or -1 for a first
 * use; node_max_gap[n] = the longest gap of node n, or -1 when it was never reused.
 * event_gap holds one double per event, node_max_gap one per node. Returns a sim_status. */
int sim_reuse_gaps(const uint32_t *node_of_event, const int64_t *req_off, int64_t n_req,
                   const double *request_time, int64_t n_nodes, double *event_gap,
                   double *node_max_gap);

/* The interner of string block ids (intern.c). sim_intern keys n texts: text i is the
 * bytes text[ends[i-1] : ends[i]] (from 0 for i = 0). A decimal text
 * (-?(0|[1-9][0-9]*)) in [-2^62, 2^62) is its integer; any other text is base + its
 * index among the distinct texts in first-seen order. Returns n, or a negative
 * sim_status. sim_interner_name copies name `index` into out when cap allows and
 * returns its length. */
typedef struct sim_interner sim_interner;
sim_interner *sim_interner_new(void);
void sim_interner_free(sim_interner *x);
int64_t sim_interner_count(const sim_interner *x);
int64_t sim_interner_bytes(const sim_interner *x);
int64_t sim_intern(sim_interner *x, const char *text, const int64_t *ends, int64_t n,
                   int64_t base, int64_t *keys);
int64_t sim_interner_name(const sim_interner *x, int64_t index, char *out, int64_t cap);

/* Scratch memory reused across runs, so that repeated runs do not pay for fresh pages. */
sim_workspace *sim_workspace_new(void);
void sim_workspace_free(sim_workspace *ws);
/* Bytes the workspace holds now (for memory accounting). */
int64_t sim_workspace_bytes(const sim_workspace *ws);

#endif
