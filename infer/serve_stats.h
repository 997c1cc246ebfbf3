// Serving-side load telemetry (`moe generate --stats`, `moe eval --stats`): what a serving
// engineer sizes capacity from, the hot peaks rather than the mean.
//
// Per forward step (a prefill chunk, a decode step of all the sequences decoded together, an
// eval window): its latency, its tokens, and per MoE layer the hottest expert's share of the
// step's assignments, h = max_e c_e / sum_e c_e. Over windows of W steps: each expert's hit
// ratio (its share of the window's assignments), the window's hottest. The summary: latency
// P50/P95/P99 by kind of step; per layer the hottest share per step (mean, P99, max, and the
// spread of its window means: the time-window variation) and the hottest expert's hit ratio
// per window (min and max over windows, which expert); and the capacity factor a dropless
// server needs for the P99 step, cf = E * P99(h) (C = cf * tokens * k / E = the hottest
// expert's assignments). Numbers, JSON lines, and the summary as text.
#ifndef MOE_TRAIN_SERVE_STATS_H
#define MOE_TRAIN_SERVE_STATS_H

#include <stddef.h>
#include <stdio.h>

#include "layers/model.h"

typedef enum { MOE_SERVE_PREFILL = 0, MOE_SERVE_DECODE = 1, MOE_SERVE_EVAL = 2 } moe_serve_kind;

typedef struct moe_serve_stats {
    int L, E, k, window;
    FILE *jsonl; // one record per step, then the summary (NULL: none)
    // per step
    size_t n, cap;
    double *latency;     // [cap] seconds
    int *tokens;         // [cap]
    unsigned char *kind; // [cap] serve_kind
    double *hot;         // [cap][L] hottest share
    // per window
    long *win_hits; // [L][E] the current window's assignments
    int in_window;  // its steps so far
    size_t n_win, win_cap;
    double *win_ratio;         // [win_cap][L] the window's hottest expert's hit ratio
    int *win_expert;           // [win_cap][L] and which expert
    double *win_mean_hot;      // [win_cap][L] the mean hottest share of its steps
    double step_hot_sum[1024]; // (per layer, the current window's sum of h; L <= 1024)
} moe_serve_stats;

// For model m's layers and experts, windows of `window` steps; jsonl_path NULL: no file
// (else created, MOE_EIO naming it).
moe_status moe_serve_stats_init(moe_serve_stats *s, const moe_model *m, int window,
                                const char *jsonl_path);
// One forward step (a moe_model_infer call) of `tokens` tokens that took latency_s: reads
// m->step_hits (its routed counts per layer), summed over the ranks under expert parallelism
// (collective: every rank calls it).
moe_status moe_serve_stats_step(moe_serve_stats *s, const moe_model *m, moe_serve_kind kind,
                                int tokens, double latency_s);
// The summary to out (text) and, as a last {"summary": ...} record, to the JSON lines.
moe_status moe_serve_stats_finish(moe_serve_stats *s, FILE *out);
void moe_serve_stats_free(moe_serve_stats *s);

#endif
