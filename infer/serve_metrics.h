// The metrics of `moe serve` in Prometheus' text format (GET /metrics): the request latencies,
// the queue and the KV pool, tokens, rejections, and the MoE ones an on-call engineer reads
// for a hot expert. Each metric is documented in docs/serve.md. The hot-expert share and its
// change come from the --stats telemetry (infer/serve_stats.c): one code path for both.
#ifndef MOE_SERVE_METRICS_H
#define MOE_SERVE_METRICS_H

#include <pthread.h>
#include <stddef.h>

#define SERVE_HIST_MAX 20

// A cumulative histogram of fixed bucket bounds (le), plus the sum and the count.
typedef struct {
    int n;            // bounds
    const double *le; // [n] increasing
    long bucket[SERVE_HIST_MAX];
    double sum;
    long count;
} serve_hist;

typedef enum {
    SERVE_REJECT_QUEUE_FULL = 0, // 429
    SERVE_REJECT_TOO_LONG,       // 400: can never fit the KV cache
    SERVE_REJECT_BAD_REQUEST,    // 400/422: the body
    SERVE_REJECT_TOO_LARGE,      // 413
    SERVE_REJECT_UNAUTHORIZED,   // 401
    SERVE_REJECT_DRAINING,       // 503: shutting down
    SERVE_REJECT_N
} serve_reject;

typedef struct serve_metrics {
    pthread_mutex_t mu;
    int L, E;
    const int *is_moe;         // [L] 1: an MoE layer (its experts' series are exported)
    serve_hist ttft, itl, e2e; // seconds: to the first token, between tokens, whole request
    serve_hist step, expert_s; // seconds: a forward step; its expert phase (GEMMs + SwiGLU)
    serve_hist hot_expert_s;   // seconds: the hottest expert's estimated GEMM time per step
    serve_hist expert_rows;    // rows of one expert in one step (every expert, every layer)
    long prompt_tokens, generated_tokens, requests;
    long finished[6]; // by serve_finish
    long rejected[SERVE_REJECT_N];
    int queue, active, kv_used, kv_budget;
    long *routed;                   // [L, E] routed tokens
    double *hot_share, *hot_change; // [L] the window's hottest share and its change
    int windows;                    // windows closed so far (hot_* are valid when > 0)
} serve_metrics;

int serve_metrics_init(serve_metrics *mt, int L, int E, const int *is_moe);
void serve_metrics_free(serve_metrics *mt);
// Adds v to h (the caller holds mt->mu).
void serve_hist_observe(serve_hist *h, double v);
void serve_metrics_reject(serve_metrics *mt, serve_reject why);
// The exposition text (malloc'd, *n bytes); NULL when out of memory.
char *serve_metrics_render(serve_metrics *mt, const char *model, size_t *n);

#endif
