/* Reuse gaps: for every block event whose node an earlier request touched, the time since
 * that request, binned. One pass and one double per node. */
#include "internal.h"

int sim_reuse_gaps(const uint32_t *node_of_event, const int64_t *req_off, int64_t n_req,
                   const double *request_time, int64_t n_nodes, const double *edges,
                   int64_t n_edges, uint64_t *counts) {
    if (n_edges < 2) return SIM_EINVAL;
    double *last = malloc((size_t)n_nodes * sizeof(double));
    if (!last) return SIM_ENOMEM;
    for (int64_t n = 0; n < n_nodes; n++) last[n] = -1.0 / 0.0; /* never touched */
    memset(counts, 0, (size_t)(n_edges - 1) * sizeof(uint64_t));
    for (int64_t r = 0; r < n_req; r++) {
        double now = request_time[r];
        for (int64_t i = req_off[r]; i < req_off[r + 1]; i++) {
            uint32_t node = node_of_event[i];
            double before = last[node];
            last[node] = now;
            if (before == -1.0 / 0.0) continue;
            double gap = now - before;
            /* the last bin whose left edge is <= gap; gaps outside [edges[0], edges[-1])
             * go to the first or last bin */
            int64_t lo = 0, hi = n_edges - 2;
            while (lo < hi) {
                int64_t mid = (lo + hi + 1) / 2;
                if (edges[mid] <= gap) lo = mid;
                else hi = mid - 1;
            }
            counts[lo]++;
        }
    }
    free(last);
    return SIM_OK;
}
