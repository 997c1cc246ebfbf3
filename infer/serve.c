// moe serve (infer/serve.h): the options, loading the checkpoint, the engine and the listener,
// and the shutdown on SIGTERM/SIGINT (the signals are blocked in every thread and taken by
// the main thread with sigwait, so no handler runs inside a request).
#include "infer/serve.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/checkpoint.h"
#include "data/tokenizer.h"
#include "infer/infer.h"
#include "infer/serve_engine.h"
#include "infer/serve_http.h"
#include "infer/serve_metrics.h"

static const char *const dtype_names[] = {"fp32", "bf16", NULL};

#define OPT(name, field, val, lo_, hi_, def_, help_)                                           \
    {                                                                                          \
        name, CLI_INT(moe_serve_opts, field), .value = val, .lo = lo_, .hi = hi_, .def = def_, \
                                              .help = help_                                    \
    }

static const cli_option serve_options[] = {
    {"--ckpt", CLI_STRING(moe_serve_opts, ckpt), .value = "DIR", .flags = CLI_REQUIRED,
     .help = "a checkpoint folder, RUN/ckpt/latest, or a Hugging Face folder"},
    {"--host", CLI_STRING(moe_serve_opts, host), .value = "ADDR", .def = "127.0.0.1",
     .help = "the IPv4 address to listen on (loopback by default; 0.0.0.0: every interface)"},
    OPT("--port", port, "PORT", 0, 65535, "8000", "the TCP port (0: any free one, printed)"),
    {"--api-key", CLI_STRING(moe_serve_opts, api_key), .value = "KEY",
     .help = "every route but /health needs 'Authorization: Bearer KEY' (else 401); default: "
             "$MOE_API_KEY when set, else no key"},
    {"--model-name", CLI_STRING(moe_serve_opts, model), .value = "NAME",
     .help = "the model id of /v1/models and the responses (default: the checkpoint folder's "
             "name)"},
    {"--device", CLI_STRING(moe_serve_opts, device), .value = "NAME", .def = "cpu",
     .help = "the backend to compute on"},
    {"--dtype", CLI_CHOICE(moe_serve_opts, dtype), .choices = dtype_names, .def = "fp32",
     .help = "bf16: bf16 GEMM operands, fp32 accumulation"},
    {"--deterministic", CLI_FLAG(moe_serve_opts, deterministic),
     .help = "batch invariance: a request's tokens do not depend on the other requests in its "
             "steps (row-invariant CPU kernels, slower); equal to moe generate --deterministic"},
    OPT("--max-seqs", max_seqs, "N", 1, 4096, "16", "sequences decoded together (KV-cache slots)"),
    OPT("--max-pos", max_pos, "N", 0, 1 << 24, "0",
        "positions per sequence: prompt + max_tokens (0: the model's max_position_embeddings)"),
    OPT("--kv-tokens", kv_tokens, "N", 0, 1LL << 40, "0",
        "the KV pool's token budget, reserved per request as prompt + max_tokens (0: "
        "max-seqs x max-pos); a request that does not fit now waits, one that never can gets 400"),
    OPT("--prefill-chunk", prefill_chunk, "C", 1, 1 << 20, "32",
        "prompt tokens of one request per step (a long prompt does not stall the others)"),
    OPT("--max-batch-tokens", max_batch_tokens, "T", 1, 1 << 20, "128",
        "rows (tokens) per forward step, decode rows first"),
    OPT("--max-queue", max_queue, "N", 0, 1 << 24, "64",
        "requests waiting beyond which new ones get 429 with Retry-After"),
    OPT("--max-expert-rows", max_expert_rows, "R", 0, 1 << 24, "0",
        "admission by expert load: a step takes at most R / rho rows, rho the hottest expert's "
        "rows per token of the recent steps, so its micro-batch stays near R (0: off)"),
    OPT("--max-tokens-limit", max_tokens, "N", 1, 1 << 24, "4096",
        "the largest max_tokens a request may ask (400 beyond)"),
    OPT("--max-body", max_body, "BYTES", 64, 1LL << 30, "1048576",
        "request bodies beyond this get 413"),
    OPT("--timeout", idle_timeout, "S", 1, 86400, "30",
        "a connection idle this long is closed (slow or stalled clients)"),
    OPT("--max-connections", max_connections, "N", 1, 65536, "256", "connections at once"),
    OPT("--shutdown-grace", grace, "S", 0, 86400, "10",
        "on SIGTERM/SIGINT: seconds in-flight requests may take to finish before they are cut"),
    OPT("--threads", threads, "N", 0, 1024, "0", "CPU threads of the kernels (0: automatic)"),
    {"--stats-out", CLI_STRING(moe_serve_opts, stats_out), .value = "FILE.jsonl",
     .help = "the --stats telemetry of every step as JSON lines, and its summary at shutdown"},
    OPT("--stats-window", stats_window, "W", 1, 1 << 20, "32",
        "steps per window of the hot-expert share (moe_expert_hot_share)"),
    {0}};

const cli_command moe_serve_cli = {
    .name = "moe serve",
    .about = "  An OpenAI-compatible completion server (POST /v1/completions, GET /v1/models,\n"
             "  /health, /metrics) with continuous batching on the training kernels; stops on\n"
             "  SIGTERM or SIGINT after the in-flight requests (docs/serve.md).\n",
    .options = serve_options,
    .value_error_exit = 1};

// The checkpoint folder's last path component ("runs/x/ckpt/step_100" -> "step_100"); a
// `latest` pointer is resolved first.
static void model_name(char *out, size_t n, const char *folder) {
    const char *b = strrchr(folder, '/');
    b = b && b[1] ? b + 1 : folder;
    const size_t k = strlen(b) < n - 1 ? strlen(b) : n - 1;
    memcpy(out, b, k);
    out[k] = 0;
    for (char *p = out; *p; p++)
        if (*p == '"' || *p == '\\' || *p == '\n') *p = '_'; // a label value
}

int moe_serve_run(const moe_serve_opts *o) {
    // the signals: blocked here, so every thread made below inherits the mask
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM), sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN); // a client gone mid-write: an error return, not a signal

    char folder[MOE_PATH_MAX + 64], name[256];
    if (moe_checkpoint_resolve(folder, sizeof folder, o->ckpt)) {
        fprintf(stderr, "moe serve: %s\n", moe_last_error());
        return 1;
    }
    model_name(name, sizeof name, folder);
    const int hf_tok = moe_tokenizer_has_hf(folder) && !moe_tokenizer_is_byte_hf(folder);
    const moe_backend_options bo = {.threads = (int)o->threads, .row_invariant = o->deterministic};
    moe_backend *be;
    if (moe_backend_create(&be, o->device, &bo)) {
        fprintf(stderr, "moe serve: --device %s: %s\n", o->device, moe_last_error());
        return 1;
    }
    moe_model m;
    const int max_seqs = (int)o->max_seqs;
    if (infer_load_batch(&m, be, NULL, o->ckpt, (int)o->max_pos, (int)o->max_batch_tokens,
                         o->dtype ? MOE_DTYPE_BF16 : MOE_DTYPE_F32, max_seqs)) {
        fprintf(stderr, "moe serve: %s\n", moe_last_error());
        moe_backend_destroy(be);
        return 1;
    }
    moe_model_refresh_bf16(&m);
    if (!hf_tok && m.cfg.vocab_size < 256) {
        fprintf(stderr,
                "moe serve: the model's vocabulary (%d) is not the byte tokenizer's 256 "
                "and %s has no tokenizer.json\n",
                m.cfg.vocab_size, folder);
        return 1;
    }
    const int L = m.cfg.n_layers;
    int *is_moe = malloc((size_t)L * sizeof(int));
    serve_metrics mt;
    if (!is_moe || serve_metrics_init(&mt, L, m.cfg.moe.n_experts, is_moe)) {
        fprintf(stderr, "moe serve: out of memory\n");
        return 1;
    }
    for (int l = 0; l < L; l++) is_moe[l] = moe_model_layer_is_moe(&m.cfg, l);
    serve_engine_opts eo = {.max_seqs = max_seqs,
                            .max_pos = m.max_pos,
                            .kv_tokens = o->kv_tokens ? (int)o->kv_tokens : max_seqs * m.max_pos,
                            .prefill_chunk = (int)o->prefill_chunk,
                            .max_batch_tokens = m.max_seq,
                            .max_queue = (int)o->max_queue,
                            .max_expert_rows = (int)o->max_expert_rows,
                            .stats_window = (int)o->stats_window,
                            .hf_tok = hf_tok,
                            .tok_dir = folder};
    serve_engine e;
    if (serve_engine_start(&e, &m, &eo, &mt, o->stats_out)) {
        fprintf(stderr, "moe serve: %s\n", moe_last_error());
        return 1;
    }
    const char *key = o->api_key ? o->api_key : getenv("MOE_API_KEY");
    serve_http_opts ho = {.host = o->host,
                          .port = (int)o->port,
                          .api_key = key && *key ? key : NULL,
                          .model = o->model ? o->model : name,
                          .max_body = (size_t)o->max_body,
                          .idle_timeout_s = (int)o->idle_timeout,
                          .max_connections = (int)o->max_connections,
                          .limits = {.max_tokens_limit = (int)o->max_tokens,
                                     .default_max_tokens = 16,
                                     .max_prompts = max_seqs > 64 ? max_seqs : 64,
                                     .max_prompt_bytes = (size_t)o->max_body,
                                     .max_stop = 4},
                          .hf_tok = hf_tok,
                          .tok_dir = folder};
    serve_http *h = serve_http_start(&ho, &e, &mt);
    if (!h) {
        fprintf(stderr, "moe serve: %s\n", moe_last_error());
        serve_engine_stop(&e, 0, NULL);
        return 1;
    }
    fprintf(stderr, "moe serve: %s on %s; %d sequences x %d positions, KV pool %d tokens, %s%s%s\n",
            ho.model, be->describe(be), max_seqs, m.max_pos, eo.kv_tokens,
            o->deterministic ? "deterministic, " : "", ho.api_key ? "API key required, " : "",
            eo.max_expert_rows ? "admission by expert load" : "no admission by expert load");
    printf("moe serve: listening on http://%s:%d\n", o->host, serve_http_port(h));
    fflush(stdout);

    int sig = 0;
    while (sigwait(&sigs, &sig) == EINTR) {}
    fprintf(stderr, "moe serve: %s: draining (at most %lld s)\n",
            sig == SIGTERM ? "SIGTERM" : "SIGINT", (long long)o->grace);
    serve_http_drain(h);
    serve_engine_stop(&e, (double)o->grace, o->stats_out ? stderr : NULL);
    serve_http_stop(h);
    fprintf(stderr, "moe serve: stopped\n");
    moe_model_destroy(&m);
    moe_backend_destroy(be);
    serve_metrics_free(&mt);
    free(is_moe);
    return 0;
}
