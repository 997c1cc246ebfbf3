// Inference mode: eval and generate, on the same layer code and kernels as training
// (moe_model_infer: forward only, dropless, KV cache, nothing kept for a backward).
#ifndef MOE_INFER_H
#define MOE_INFER_H

#include <stdint.h>

#include "data/token_file.h"
#include "layers/model.h"

struct moe_serve_stats; // infer/serve_stats.h

// Loads a checkpoint (a step folder, a `latest` file, or any HF Mixtral folder) into an
// inference model with a KV cache of max_pos positions (0: the config's
// max_position_embeddings) and chunks of at most max_chunk tokens, on backend be (the model
// uses it, the caller still owns it).
moe_status infer_load(moe_model *m, moe_backend *be, const char *ckpt, int max_pos, int max_chunk);
// The same with the experts spread over the ranks of ep (mpirun -np R moe eval; NULL: one
// rank) and the GEMMs in dtype (moe eval/generate --dtype; the weights load in fp32 either way).
moe_status infer_load_parallel(moe_model *m, moe_backend *be, moe_comm *ep, const char *ckpt,
                               int max_pos, int max_chunk, moe_dtype dtype);
// The same with a KV cache for n_seqs sequences (infer_generate_batch); chunks hold at least
// n_seqs rows (one decode step of all of them).
moe_status infer_load_batch(moe_model *m, moe_backend *be, moe_comm *ep, const char *ckpt,
                            int max_pos, int max_chunk, moe_dtype dtype, int n_seqs);

// Mean cross-entropy over the windows of tf: window i = tokens [i*S, i*S + S], inputs its
// first S, targets its last S (at most max_windows windows; 0 = all). If logits_npy is not
// NULL, the logits of the first window's inputs ([S, V] float32) go there as a .npy file.
// stats: serving telemetry of each window's forward (infer/serve_stats.h), NULL: none.
// MOE_ENUMERIC for a non-finite logit or mean loss, and for a mean loss whose perplexity
// exp(loss) overflows a double (> 709.78 nats/token: damaged weights; the message names the
// largest |w| and its tensor).
moe_status infer_eval(moe_model *m, const moe_token_file *tf, int seq_len, long max_windows,
                      const char *logits_npy, double *loss, long *n_tokens,
                      struct moe_serve_stats *stats);

typedef struct {
    double temperature; // 0: greedy
    int top_k;          // 0: off
    double top_p;       // 1: off
    uint64_t seed;
    int prefill_chunk; // prompt tokens per forward (bounds the activation memory)
    struct moe_serve_stats
        *stats; // serving telemetry of each forward (infer/serve_stats.h), or NULL
} moe_sampling;

// Prefill the prompt in chunks, then decode n_new tokens one at a time with the KV cache.
// out receives the n_new tokens; *n_out how many were made (fewer if the cache fills).
moe_status infer_generate(moe_model *m, const int *prompt, int n_prompt, int n_new,
                          const moe_sampling *s, int *out, int *n_out);

// Batched generation: B prompts (host [n_prompts[b]] each) prefilled into their own KV-cache
// slots, then decoded together: each step samples every sequence's next token (sequence b
// with its own RNG seeded seed + b) and makes one forward of the B tokens, so every MoE layer
// routes them together. outs[b] [n_new] receives sequence b's tokens, n_outs[b] how many
// (fewer when a cache fills).
moe_status infer_generate_batch(moe_model *m, const int *const *prompts, const int *n_prompts,
                                int B, int n_new, const moe_sampling *s, int **outs, int *n_outs);

// The sampler of infer_generate: softmax(logits / temperature) restricted to the top_k most
// likely (0: all) and to the smallest set whose probability reaches top_p (1: all); greedy (the
// first largest logit) when temperature <= 0. rng: the sequence's state (seeded by its seed);
// scratch: infer_sample_scratch_bytes(V) bytes.
int infer_sample(const real *logits, int V, double temperature, int top_k, double top_p,
                 uint64_t *rng, void *scratch);
size_t infer_sample_scratch_bytes(int V);
// The index of the first non-finite value of logits [n], -1 when all are finite.
long infer_first_nonfinite(const real *logits, size_t n);

// Writes a float32 2-D array as a NumPy .npy file (format 1.0).
moe_status moe_npy_write_f32(const char *path, const float *data, int rows, int cols);

#endif
