// Prometheus text exposition (format 0.0.4) of serve_metrics: # HELP, # TYPE, then samples;
// histograms as _bucket{le=...} (cumulative), _sum and _count.
#include "infer/serve_metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double latency_le[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                    0.5,   1,      2.5,   5,    10,    30,   60,  120};
static const double rows_le[] = {0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};

static void hist_init(serve_hist *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    h->le = le, h->n = n;
}

int serve_metrics_init(serve_metrics *mt, int L, int E, const int *is_moe) {
    memset(mt, 0, sizeof *mt);
    mt->L = L, mt->E = E, mt->is_moe = is_moe;
    const int nl = (int)(sizeof latency_le / sizeof latency_le[0]);
    hist_init(&mt->ttft, latency_le, nl);
    hist_init(&mt->itl, latency_le, nl);
    hist_init(&mt->e2e, latency_le, nl);
    hist_init(&mt->step, latency_le, nl);
    hist_init(&mt->expert_s, latency_le, nl);
    hist_init(&mt->hot_expert_s, latency_le, nl);
    hist_init(&mt->expert_rows, rows_le, (int)(sizeof rows_le / sizeof rows_le[0]));
    mt->routed = calloc((size_t)L * E, sizeof *mt->routed);
    mt->hot_share = calloc((size_t)L, sizeof(double));
    mt->hot_change = calloc((size_t)L, sizeof(double));
    if (!mt->routed || !mt->hot_share || !mt->hot_change || pthread_mutex_init(&mt->mu, NULL)) {
        free(mt->routed), free(mt->hot_share), free(mt->hot_change);
        return -1;
    }
    return 0;
}

void serve_metrics_free(serve_metrics *mt) {
    free(mt->routed), free(mt->hot_share), free(mt->hot_change);
    pthread_mutex_destroy(&mt->mu);
}

void serve_hist_observe(serve_hist *h, double v) {
    for (int i = 0; i < h->n; i++)
        if (v <= h->le[i]) h->bucket[i]++;
    h->sum += v, h->count++;
}

void serve_metrics_reject(serve_metrics *mt, serve_reject why) {
    pthread_mutex_lock(&mt->mu);
    mt->rejected[why]++;
    pthread_mutex_unlock(&mt->mu);
}

// A growing text buffer.
typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k >= 0 && (size_t)k < b->cap - b->n) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap * 2 + (k > 0 ? (size_t)k : 0) + 4096;
        char *p = realloc(b->p, cap);
        if (!p || k < 0) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
}

static void head(buf *b, const char *name, const char *type, const char *help) {
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void hist(buf *b, const char *name, const char *help, const serve_hist *h) {
    head(b, name, "histogram", help);
    for (int i = 0; i < h->n; i++)
        put(b, "%s_bucket{le=\"%g\"} %ld\n", name, h->le[i], h->bucket[i]);
    put(b, "%s_bucket{le=\"+Inf\"} %ld\n%s_sum %.9g\n%s_count %ld\n", name, h->count, name, h->sum,
        name, h->count);
}

static const char *const finish_names[6] = {"none",      "stop",     "length",
                                            "cancelled", "shutdown", "error"};
static const char *const reject_names[SERVE_REJECT_N] = {
    "queue_full", "too_long", "bad_request", "too_large", "unauthorized", "draining"};

char *serve_metrics_render(serve_metrics *mt, const char *model, size_t *n) {
    buf b = {0};
    pthread_mutex_lock(&mt->mu);
    hist(&b, "moe_request_ttft_seconds", "Time from a request's arrival to its first token.",
         &mt->ttft);
    hist(&b, "moe_request_inter_token_seconds", "Time between two tokens of a request.", &mt->itl);
    hist(&b, "moe_request_e2e_seconds", "Time from a request's arrival to its last token.",
         &mt->e2e);
    head(&b, "moe_queue_length", "gauge", "Requests waiting for a KV slot or for expert budget.");
    put(&b, "moe_queue_length %d\n", mt->queue);
    head(&b, "moe_active_sequences", "gauge",
         "Sequences holding a KV slot (prefilling or decoding).");
    put(&b, "moe_active_sequences %d\n", mt->active);
    head(&b, "moe_kv_tokens_used", "gauge", "KV-cache tokens reserved by active sequences.");
    put(&b, "moe_kv_tokens_used %d\n", mt->kv_used);
    head(&b, "moe_kv_tokens_budget", "gauge", "KV-cache tokens the pool holds (--kv-tokens).");
    put(&b, "moe_kv_tokens_budget %d\n", mt->kv_budget);
    head(&b, "moe_requests_total", "counter", "Completions accepted (one per prompt).");
    put(&b, "moe_requests_total %ld\n", mt->requests);
    head(&b, "moe_requests_finished_total", "counter", "Completions finished, by reason.");
    for (int i = 1; i < 6; i++)
        put(&b, "moe_requests_finished_total{reason=\"%s\"} %ld\n", finish_names[i],
            mt->finished[i]);
    head(&b, "moe_requests_rejected_total", "counter", "Requests refused, by reason.");
    for (int i = 0; i < SERVE_REJECT_N; i++)
        put(&b, "moe_requests_rejected_total{reason=\"%s\"} %ld\n", reject_names[i],
            mt->rejected[i]);
    head(&b, "moe_prompt_tokens_total", "counter", "Prompt tokens prefilled.");
    put(&b, "moe_prompt_tokens_total %ld\n", mt->prompt_tokens);
    head(&b, "moe_generated_tokens_total", "counter", "Tokens generated.");
    put(&b, "moe_generated_tokens_total %ld\n", mt->generated_tokens);
    head(&b, "moe_expert_routed_tokens_total", "counter",
         "Token assignments routed to each expert of each MoE layer.");
    for (int l = 0; l < mt->L; l++)
        for (int e = 0; mt->is_moe[l] && e < mt->E; e++)
            put(&b, "moe_expert_routed_tokens_total{layer=\"%d\",expert=\"%d\"} %ld\n", l, e,
                mt->routed[(size_t)l * mt->E + e]);
    head(&b, "moe_expert_hot_share", "gauge",
         "Each MoE layer's hottest expert's share of the assignments, mean over the last "
         "window of steps (--stats-window).");
    for (int l = 0; mt->windows && l < mt->L; l++)
        if (mt->is_moe[l])
            put(&b, "moe_expert_hot_share{layer=\"%d\"} %.6g\n", l, mt->hot_share[l]);
    head(&b, "moe_expert_hot_share_change", "gauge",
         "Routing jitter: the hot share's change from the window before to the last.");
    for (int l = 0; mt->windows > 1 && l < mt->L; l++)
        if (mt->is_moe[l])
            put(&b, "moe_expert_hot_share_change{layer=\"%d\"} %.6g\n", l, mt->hot_change[l]);
    hist(&b, "moe_expert_rows_per_step",
         "Rows (token assignments) of one expert in one step, every expert of every MoE layer.",
         &mt->expert_rows);
    hist(&b, "moe_step_seconds", "Time of one forward step (decode rows and prefill chunks).",
         &mt->step);
    hist(&b, "moe_step_expert_seconds", "Time of a step's expert phase (GEMMs and SwiGLU).",
         &mt->expert_s);
    hist(&b, "moe_step_hot_expert_seconds",
         "The slowest (hottest) expert's GEMM time in a step, estimated: the expert phase's time "
         "times the hottest expert's share of the rows (the max over layers).",
         &mt->hot_expert_s);
    head(&b, "moe_model_info", "gauge", "The model served.");
    put(&b, "moe_model_info{model=\"%s\"} 1\n", model);
    pthread_mutex_unlock(&mt->mu);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *n = b.n;
    return b.p;
}
