// Load statistics from per-expert counts (host side, shared by every backend).
#include <math.h>

#include "layers/moe_stats.h"

void moe_router_bias_update(real *bias, const long *counts, int E, double rate) {
    double mean = 0;
    for (int e = 0; e < E; e++) mean += (double)counts[e] / E;
    for (int e = 0; e < E; e++) bias[e] += (real)(rate * ((mean > counts[e]) - (mean < counts[e])));
}

void moe_stats_from_counts(moe_stats *st, const int *routed, const int *kept, int E, int T,
                           int capacity) {
    long total = 0, total_kept = 0;
    int max_routed = 0;
    for (int e = 0; e < E; e++) {
        total += routed[e];
        total_kept += kept[e];
        if (routed[e] > max_routed) max_routed = routed[e];
    }
    double mean = (double)total / E, var = 0;
    for (int e = 0; e < E; e++) var += (routed[e] - mean) * (routed[e] - mean);
    var /= E;
    st->tokens = T;
    st->capacity = capacity;
    st->routed = routed;
    st->kept = kept;
    st->dropped = total - total_kept;
    st->max_over_mean = mean > 0 ? max_routed / mean : 0;
    st->cv = mean > 0 ? sqrt(var) / mean : 0;
}

void moe_load_summary(const long *c, int E, double *max_over_mean, double *cv, int *hot) {
    double sum = 0, var = 0;
    int h = 0;
    for (int e = 0; e < E; e++) {
        sum += c[e];
        if (c[e] > c[h]) h = e;
    }
    double mean = sum / E;
    for (int e = 0; e < E; e++) var += (c[e] - mean) * (c[e] - mean);
    *max_over_mean = mean > 0 ? c[h] / mean : 0;
    *cv = mean > 0 ? sqrt(var / E) / mean : 0;
    *hot = h;
}
