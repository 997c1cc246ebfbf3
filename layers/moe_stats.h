// A MoE layer forward's load statistics and the host-side helpers over per-expert counts that
// layers/moe_stats.c implements (shared by every backend; the trainer, `moe stats` and the
// smoke run read them too). Apart from layers/moe.h, which embeds moe_stats in the layer and
// includes this header, nothing of the layer is needed here.
#ifndef MOE_LAYER_STATS_H
#define MOE_LAYER_STATS_H

#include "layers/real.h"

// Load statistics of the last forward (host memory, owned by the layer).
typedef struct {
    int tokens;           // T
    int capacity;         // C, 0 when dropless
    const int *routed;    // [E] top-k assignments per expert, before dropping
    const int *kept;      // [E] assignments per expert after dropping
    long dropped;         // assignments dropped in all
    double max_over_mean; // max_e routed / mean_e routed
    double cv;            // std_e routed / mean_e routed (population std)
    double entropy;       // mean over tokens of the router entropy -sum_e p log p (nats)
    double aux;           // L_aux (already times aux_coef; HF's helper reports k times this)
    double seq_aux;       // L_seq (already times seq_aux_coef), 0 when off
    double z;             // L_z (already times z_coef)
    double logit_mean, logit_std, logit_max_abs, lse_mean; // router logit distribution
} moe_stats;

// Aux-loss-free balancing (DeepSeek-V3, DESIGN.md §3.9), after each optimizer step:
// bias[e] += rate * sign(mean(c) - c[e]) with c the step's routed counts (host arrays).
void moe_router_bias_update(real *bias, const long *counts, int E, double rate);

// max/mean and CV (std / mean) of E per-expert counts (summed over steps or micro-batches,
// hence long), 0 when every count is 0; *hot receives the first expert with the most.
void moe_load_summary(const long *counts, int E, double *max_over_mean, double *cv, int *hot);

// Host-side summary of per-expert counts; shared by every backend.
void moe_stats_from_counts(moe_stats *st, const int *routed, const int *kept, int E, int T,
                           int capacity);

#endif
