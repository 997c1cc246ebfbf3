// The engine of `moe serve`: continuous batching over the KV-cache slots of one inference
// model (moe_model_create_inference_batch), on its own thread.
//
// Every engine step is one forward (moe_model_decode_batch) of the rows of all active requests
// together: one row per decoding request (its last token), then prompt rows of the requests
// still prefilling, up to --prefill-chunk per request and --max-batch-tokens in all, so a long
// prompt is cut into chunks interleaved with the others' decode steps. Every MoE layer routes
// all of the step's rows together. Requests join a step as soon as a slot and their KV tokens
// are free and leave it when they finish; one that cannot fit yet waits in the queue.
//
// Admission by expert load (--max-expert-rows R): the step takes at most R / rho rows, where
// rho is the hottest expert's rows per token of the recent steps (an exponential average,
// the max over layers of max_e c_e / tokens), so the hot expert's micro-batch (the step's
// clock) stays near R; decoding requests beyond that wait a step, new ones stay queued.
#ifndef MOE_SERVE_ENGINE_H
#define MOE_SERVE_ENGINE_H

#include <pthread.h>
#include <stdint.h>

#include "infer/serve_metrics.h"
#include "infer/serve_stats.h"
#include "layers/model.h"

// SERVE_NEW: made, not (or not successfully) submitted: the engine holds no reference
typedef enum { SERVE_NEW = 0, SERVE_QUEUED, SERVE_PREFILL, SERVE_DECODE, SERVE_DONE } serve_state;
typedef enum {
    SERVE_FINISH_NONE = 0,
    SERVE_FINISH_STOP,      // a stop string
    SERVE_FINISH_LENGTH,    // max_tokens, or the sequence's KV positions
    SERVE_FINISH_CANCELLED, // the client went away
    SERVE_FINISH_SHUTDOWN,  // the server stopped before it finished
    SERVE_FINISH_ERROR,     // the forward failed (message in error)
} serve_finish;

// One completion (one prompt of a request). The HTTP side makes it and reads it; the engine
// fills it. Everything below `state` is guarded by the engine's mutex.
typedef struct serve_seq {
    int *prompt, n_prompt; // token ids (owned)
    int max_tokens;
    double temperature, top_p;
    int top_k;
    uint64_t rng;         // the sampler's state (seeded by the request's seed)
    char **stop;          // stop strings (borrowed from the request; n_stop of them)
    int n_stop, stop_max; // stop_max: the longest's bytes
    double t_arrival;     // moe_clock_s() when submitted
    // engine state
    serve_state state;
    serve_finish finish;
    int slot, fed;   // KV slot; prompt tokens fed so far
    int pos;         // the next position to feed
    int last;        // the last sampled token (fed at pos by the next decode step)
    int reserved;    // KV tokens reserved (prompt + max_tokens, at most max_pos)
    int *out, n_out; // generated tokens ([max_tokens])
    char *text;      // their text (n_text bytes; truncated before a stop string)
    size_t n_text;
    double t_first, t_last; // the first and the latest token's time
    int refs;               // holders: the HTTP side, the engine
    char error[256];
    struct serve_seq *next; // the queue
} serve_seq;

typedef struct {
    int max_seqs;         // KV slots
    int kv_tokens;        // token budget of the KV pool
    int max_pos;          // positions per sequence
    int prefill_chunk;    // prompt rows per request per step
    int max_batch_tokens; // rows per step
    int max_queue;        // waiting requests beyond which submit refuses
    int max_expert_rows;  // 0: off
    int stats_window;     // steps per window of the hot-share telemetry
    int hf_tok;           // decode with the folder's tokenizer.json (else bytes)
    const char *tok_dir;
} serve_engine_opts;

typedef struct serve_engine {
    moe_model *m;
    serve_engine_opts o;
    pthread_mutex_t mu;
    pthread_cond_t work; // the engine waits for requests
    pthread_cond_t done; // waiters: a sequence advanced or finished
    pthread_t thread;
    int running, stopping, draining;
    serve_seq *queue_head, *queue_tail;
    int n_queued;
    serve_seq **active; // [max_seqs] by slot (NULL: free)
    int n_active, kv_used;
    double rho; // the hottest expert's rows per token (exponential average)
    long steps;
    serve_metrics *metrics;
    moe_serve_stats stats;                // the --stats telemetry: one code path for both
    real *logits;                         // host [V]
    void *cand;                           // the sampler's scratch
    int *rows_tok, *rows_slot, *rows_pos; // [max_batch_tokens]
    serve_seq **rows_seq;                 // [max_batch_tokens] whose row it is
    int *rows_sample;                     // [max_batch_tokens] 1: sample after this row
} serve_engine;

// The model must have been loaded for max_seqs sequences of max_pos positions and chunks of at
// least max_batch_tokens rows. metrics: where the engine records (shared with /metrics).
moe_status serve_engine_start(serve_engine *e, moe_model *m, const serve_engine_opts *o,
                              serve_metrics *metrics, const char *stats_out);
// Hands a sequence to the engine (which takes a reference): 0, or the HTTP status of the
// refusal with its reason in why: 400 when it can never fit, 429 when the queue is full, 503
// when the server is draining.
int serve_engine_submit(serve_engine *e, serve_seq *s, char *why, size_t why_size);
// A new sequence (refs 1: the caller's) of n_prompt ids (copied), or NULL (out of memory).
serve_seq *serve_seq_new(const int *prompt, int n_prompt, int max_tokens);
// The client went away: the engine frees its slot at the next step.
void serve_engine_cancel(serve_engine *e, serve_seq *s);
// Drops a holder's reference (frees the sequence at the last).
void serve_engine_release(serve_engine *e, serve_seq *s);
// Refuse new requests; wait up to grace_s for the active and queued ones to finish; end the
// rest (SERVE_FINISH_SHUTDOWN) and stop the thread. Prints the --stats summary to out.
void serve_engine_stop(serve_engine *e, double grace_s, FILE *stats_out);
// A seconds estimate for Retry-After: the queue's tokens over the recent rate (at least 1).
int serve_engine_retry_after(serve_engine *e);

#endif
