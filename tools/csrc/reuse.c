/* Reuse gaps: for every block event whose node an earlier request touched, the time since
 * the last request that touched it; and for every node its longest such gap. One pass,
 * one double per node beyond the outputs. */
#include "internal.h"

int sim_reuse_gaps(const uint32_t *node_of_event, const int64_t *req_off, int64_t n_req,
                   const double *request_time, int64_t n_nodes, double *event_gap,
                   double *node_max_gap) {
    double *last = malloc((size_t)n_nodes * sizeof(double));
    if (!last) return SIM_ENOMEM;
    for (int64_t n = 0; n < n_nodes; n++) {
        last[n] = -1.0 / 0.0; /* never touched */
        node_max_gap[n] = -1.0;
    }
    for (int64_t r = 0; r < n_req; r++) {
        double now = request_time[r];
        for (int64_t i = req_off[r]; i < req_off[r + 1]; i++) {
            uint32_t node = node_of_event[i];
            double before = last[node];
            last[node] = now;
            if (before == -1.0 / 0.0) {
                event_gap[i] = -1.0;
                continue;
            }
            double gap = now - before;
            if (gap < 0) gap = 0; /* a trace whose time goes backwards */
            event_gap[i] = gap;
            if (gap > node_max_gap[node]) node_max_gap[node] = gap;
        }
    }
    free(last);
    return SIM_OK;
}
