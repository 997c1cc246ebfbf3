// moe serve: an OpenAI-compatible completion server on the training kernels (docs/serve.md).
// Continuous batching (infer/serve_engine.h), the HTTP side (infer/serve_http.h), the metrics
// (infer/serve_metrics.h); this file's part is the command line, the start and the shutdown.
#ifndef MOE_SERVE_H
#define MOE_SERVE_H

#include <stdint.h>

#include "cli/options.h"

typedef struct {
    const char *ckpt, *host, *api_key, *device, *model, *stats_out;
    int dtype, deterministic;
    int64_t port, max_seqs, kv_tokens, max_pos, prefill_chunk, max_batch_tokens, max_queue;
    int64_t max_expert_rows, max_tokens, max_body, idle_timeout, grace, stats_window;
    int64_t max_connections, threads;
} moe_serve_opts;

extern const cli_command moe_serve_cli;

// Serves until SIGTERM or SIGINT, then drains (at most --shutdown-grace seconds) and exits:
// 0 after a clean shutdown, 1 when it cannot start.
int moe_serve_run(const moe_serve_opts *o);

#endif
