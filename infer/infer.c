// eval and generate (see infer.h).
#include "infer/infer.h"

#include "layers/timing.h"
#include "infer/serve_stats.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/checkpoint.h"
#include "layers/rng.h"

moe_status infer_load(moe_model *m, moe_backend *be, const char *ckpt, int max_pos, int max_chunk) {
    return infer_load_parallel(m, be, NULL, ckpt, max_pos, max_chunk, MOE_DTYPE_F32);
}

moe_status infer_load_parallel(moe_model *m, moe_backend *be, moe_comm *ep, const char *ckpt,
                               int max_pos, int max_chunk, moe_dtype dtype) {
    return infer_load_batch(m, be, ep, ckpt, max_pos, max_chunk, dtype, 1);
}

moe_status infer_load_batch(moe_model *m, moe_backend *be, moe_comm *ep, const char *ckpt,
                            int max_pos, int max_chunk, moe_dtype dtype, int n_seqs) {
    char folder[2048];
    moe_status st = moe_checkpoint_resolve(folder, sizeof folder, ckpt);
    if (st) return st;
    moe_model_config cfg;
    if ((st = moe_hf_config_read(&cfg, folder))) return st;
    if ((st = moe_hf_check_sizes(folder, &cfg))) return st; // before allocating from config.json
    cfg.dtype = dtype;
    if (max_pos <= 0 || max_pos > cfg.max_seq_len) max_pos = cfg.max_seq_len;
    if (max_chunk > max_pos) max_chunk = max_pos;
    if (max_chunk < n_seqs) max_chunk = n_seqs < max_pos ? n_seqs : max_pos; // a decode step's rows
    if ((st = moe_model_create_inference_batch(m, be, &cfg, max_pos, max_chunk, n_seqs, ep)))
        return st;
    if ((st = moe_hf_load_weights(m, folder))) moe_model_destroy(m);
    return st;
}

// The first non-finite logit of rows [n, V], or -1. The weights are finite (checked at load),
// so one here is an activation that overflowed.
long infer_first_nonfinite(const real *logits, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(logits[i])) return (long)i;
    return -1;
}

moe_status moe_npy_write_f32(const char *path, const float *data, int rows, int cols) {
    char header[128];
    int n = snprintf(header, sizeof header,
                     "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }", rows, cols);
    // magic (6) + version (2) + header length (2) + header, padded with spaces to a
    // multiple of 64 and ended by '\n'
    int total = 10 + n + 1, pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) return moe_error(MOE_EIO, "%s: cannot write", path);
    unsigned short hlen = (unsigned short)(n + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hlen & 0xff, f);
    fputc(hlen >> 8, f);
    fwrite(header, 1, (size_t)n, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    size_t count = (size_t)rows * cols;
    int ok = fwrite(data, sizeof(float), count, f) == count;
    if (fclose(f) != 0 || !ok) return moe_error(MOE_EIO, "%s: write failed", path);
    return MOE_OK;
}

// The largest |w| of m's weights into *value, the tensor holding it into *name (NULL when
// out of memory): each tensor copied to the host in turn, on the error path only.
static void largest_weight(const moe_model *m, double *value, const char **name) {
    *value = -1, *name = NULL;
    size_t most = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const size_t n = (size_t)m->tensors[i].rows * (m->tensors[i].cols ? m->tensors[i].cols : 1);
        most = n > most ? n : most;
    }
    real *host = most ? malloc(most * sizeof(real)) : NULL;
    for (int i = 0; host && i < m->n_tensors; i++) {
        const moe_model_tensor *t = &m->tensors[i];
        const size_t n = (size_t)t->rows * (t->cols ? t->cols : 1);
        m->be->copy_to_host(m->be, host, m->params + t->offset, n * sizeof(real));
        for (size_t k = 0; k < n; k++)
            if (fabs((double)host[k]) > *value) *value = fabs((double)host[k]), *name = t->name;
    }
    free(host);
}

// A finite mean loss whose perplexity exp(loss) overflows a double (loss > log(DBL_MAX), about
// 709.78 nats/token) is no result: the weights are damaged (MOE_ENUMERIC naming the largest).
static moe_status check_perplexity(const moe_model *m, double loss) {
    if (moe_model_ce_is_result(loss)) return MOE_OK;
    double w;
    const char *name;
    largest_weight(m, &w, &name);
    if (!name)
        return moe_error(MOE_ENUMERIC,
                         "eval: the mean loss is %.3g nats/token: its perplexity overflows; the "
                         "checkpoint's weights look damaged",
                         loss);
    return moe_error(MOE_ENUMERIC,
                     "eval: the mean loss is %.3g nats/token: its perplexity overflows; the "
                     "checkpoint's weights look damaged (largest |w|: %.3g in %s)",
                     loss, w, name);
}

moe_status infer_eval(moe_model *m, const moe_token_file *tf, int seq_len, long max_windows,
                      const char *logits_npy, double *loss, long *n_tokens,
                      moe_serve_stats *stats) {
    const int V = m->cfg.vocab_size;
    if (seq_len < 1 || seq_len > m->max_seq)
        return moe_error(MOE_EINVAL, "eval: --seq-len %d outside [1, %d]", seq_len, m->max_seq);
    if (tf->vocab_size > (uint32_t)V)
        return moe_error(MOE_EINVAL, "%s: token vocabulary %u exceeds the model's %d", tf->path,
                         tf->vocab_size, V);
    long windows = tf->count > 0 ? (long)((tf->count - 1) / (uint64_t)seq_len) : 0;
    if (windows < 1)
        return moe_error(MOE_EINVAL, "%s: %llu tokens, fewer than one window of %d + 1", tf->path,
                         (unsigned long long)tf->count, seq_len);
    if (max_windows > 0 && windows > max_windows) windows = max_windows;
    int *inputs = malloc((size_t)seq_len * sizeof(int));
    real *logits = NULL; // host copy of a window's logits: only for the .npy or an error message
    if (!inputs) return moe_error(MOE_ENOMEM, "eval: out of memory");
    moe_backend *be = m->be;
    moe_status st = MOE_OK;
    double sum = 0;
    // expert parallelism: rank r takes windows r, r+R, ...; every rank makes the same number
    // of forwards (the MoE layers exchange rows), a rank past the end repeats window 0 and
    // does not count it
    const int R = m->ep ? m->ep->size : 1, rank = m->ep ? m->ep->rank : 0;
    const long rounds = (windows + R - 1) / R;
    for (long k = 0; k < rounds && !st; k++) {
        const long w = k * R + rank, counted = w < windows;
        const uint32_t *win = tf->tokens + (size_t)(counted ? w : 0) * seq_len;
        for (int t = 0; t < seq_len; t++) inputs[t] = (int)win[t + 1]; // the targets
        be->copy_to_device(be, m->targets, inputs, (size_t)seq_len * sizeof(int));
        for (int t = 0; t < seq_len; t++) inputs[t] = (int)win[t];
        const double t0 = moe_clock_s();
        if ((st = moe_model_infer(m, inputs, seq_len, 0))) break;
        if (m->be->synchronize) m->be->synchronize(m->be);
        if (stats &&
            (st = moe_serve_stats_step(stats, m, MOE_SERVE_EVAL, seq_len, moe_clock_s() - t0)))
            break;
        // CE_t = logsumexp(z_t) - z_t[target] on the device; the window's sum comes back
        double window_sum;
        be->cross_entropy_forward(be, m->losses, m->logits, m->targets, seq_len, V);
        be->sum(be, &window_sum, m->losses, (size_t)seq_len);
        if (counted) sum += window_sum;
        long bad_rank = !isfinite(window_sum); // all ranks stop together
        if (m->ep) m->ep->allreduce_sum_long(m->ep, &bad_rank, 1);
        if (bad_rank && isfinite(window_sum)) {
            st = moe_error(MOE_ENUMERIC, "eval: another rank's logits are not finite");
            break;
        }
        if (!isfinite(window_sum) || (w == 0 && logits_npy)) {
            if (!logits && !(logits = malloc((size_t)seq_len * V * sizeof(real)))) {
                st = moe_error(MOE_ENOMEM, "eval: out of memory");
                break;
            }
            be->copy_to_host(be, logits, m->logits, (size_t)seq_len * V * sizeof(real));
        }
        long bad = isfinite(window_sum) ? -1 : infer_first_nonfinite(logits, (size_t)seq_len * V);
        if (bad >= 0) {
            st = moe_error(MOE_ENUMERIC,
                           "eval: non-finite logit (%g) in window %ld at position %ld, "
                           "token id %ld: the forward overflowed (the weights are finite)",
                           (double)logits[bad], w, bad / V, bad % V);
            break;
        }
        if (w == 0 && logits_npy) st = moe_npy_write_f32(logits_npy, logits, seq_len, V);
    }
    free(inputs), free(logits);
    if (m->ep) m->ep->allreduce_sum_double(m->ep, &sum, 1);
    *n_tokens = windows * seq_len;
    *loss = sum / (double)*n_tokens;
    if (!st && !isfinite(*loss)) // finite logits give a finite loss; never print nan
        st = moe_error(MOE_ENUMERIC, "eval: the mean cross-entropy is not finite (%g)", *loss);
    return st ? st : check_perplexity(m, *loss);
}

typedef struct {
    double p;
    int id;
} candidate;

static int by_prob_desc(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

size_t infer_sample_scratch_bytes(int V) { return (size_t)V * sizeof(candidate); }

int infer_sample(const real *logits, int V, double temperature, int top_k, double top_p,
                 uint64_t *rng, void *scratch) {
    candidate *c = scratch;
    int best = 0;
    for (int i = 1; i < V; i++) best = logits[i] > logits[best] ? i : best;
    if (temperature <= 0) return best;
    double sum = 0;
    for (int i = 0; i < V; i++) {
        c[i].p = exp((logits[i] - logits[best]) / temperature);
        c[i].id = i;
        sum += c[i].p;
    }
    qsort(c, (size_t)V, sizeof *c, by_prob_desc);
    int n = top_k > 0 && top_k < V ? top_k : V;
    double kept = 0;
    for (int i = 0; i < n; i++) {
        kept += c[i].p / sum;
        if (kept >= top_p) {
            n = i + 1;
            break;
        }
    }
    double total = 0;
    for (int i = 0; i < n; i++) total += c[i].p;
    double u = moe_uniform01(moe_splitmix64(rng)) * total;
    for (int i = 0; i < n; i++) {
        u -= c[i].p;
        if (u < 0) return c[i].id;
    }
    return c[n - 1].id;
}

static int sample(const real *logits, int V, const moe_sampling *s, uint64_t *rng, candidate *c) {
    return infer_sample(logits, V, s->temperature, s->top_k, s->top_p, rng, c);
}

// moe_model_infer, timed into the serving telemetry when there is one.
static moe_status observed_infer(moe_model *m, const int *tokens, int n, int pos0,
                                 moe_serve_stats *stats, moe_serve_kind kind) {
    const double t0 = moe_clock_s();
    moe_status st = moe_model_infer(m, tokens, n, pos0);
    if (st || !stats) return st;
    if (m->be->synchronize) m->be->synchronize(m->be);
    return moe_serve_stats_step(stats, m, kind, n, moe_clock_s() - t0);
}

moe_status infer_generate(moe_model *m, const int *prompt, int n_prompt, int n_new,
                          const moe_sampling *s, int *out, int *n_out) {
    const int V = m->cfg.vocab_size;
    *n_out = 0;
    if (n_prompt < 1) return moe_error(MOE_EINVAL, "generate: the prompt is empty");
    if (n_prompt > m->max_pos)
        return moe_error(MOE_EINVAL, "generate: the prompt has %d tokens, the KV cache %d",
                         n_prompt, m->max_pos);
    int chunk =
        s->prefill_chunk > 0 && s->prefill_chunk < m->max_seq ? s->prefill_chunk : m->max_seq;
    moe_status st = MOE_OK;
    int pos = 0;
    for (; pos < n_prompt && !st; pos += chunk) {
        int n = n_prompt - pos < chunk ? n_prompt - pos : chunk;
        st = observed_infer(m, prompt + pos, n, pos, s->stats, MOE_SERVE_PREFILL);
        if (!st && pos + n == n_prompt && n > 1) // keep the last row: the next token's distribution
            m->be->copy_on_device(m->be, m->logits, m->logits + (size_t)(n - 1) * V,
                                  (size_t)V * sizeof(real));
    }
    if (st) return st;
    pos = n_prompt;
    memset(m->expert_hits, 0, (size_t)m->cfg.n_layers * m->cfg.moe.n_experts * sizeof(long));
    real *logits = malloc((size_t)V * sizeof(real));
    candidate *cand = malloc((size_t)V * sizeof(candidate));
    if (!logits || !cand) {
        free(logits), free(cand);
        return moe_error(MOE_ENOMEM, "generate: out of memory");
    }
    uint64_t rng = s->seed;
    for (int i = 0; i < n_new && !st; i++) {
        m->be->copy_to_host(m->be, logits, m->logits, (size_t)V * sizeof(real));
        long bad = infer_first_nonfinite(logits, (size_t)V);
        if (bad >= 0) {
            st = moe_error(MOE_ENUMERIC,
                           "generate: non-finite logit (%g) for token id %ld at "
                           "position %d: the forward overflowed (the weights are finite)",
                           (double)logits[bad], bad, pos);
            break;
        }
        int next = sample(logits, V, s, &rng, cand);
        out[(*n_out)++] = next;
        if (pos >= m->max_pos || i + 1 == n_new) break; // the cache is full, or done
        st = observed_infer(m, &next, 1, pos++, s->stats, MOE_SERVE_DECODE);
    }
    free(logits), free(cand);
    return st;
}

moe_status infer_generate_batch(moe_model *m, const int *const *prompts, const int *n_prompts,
                                int B, int n_new, const moe_sampling *s, int **outs, int *n_outs) {
    const int V = m->cfg.vocab_size;
    if (B < 1 || B > m->n_seqs || B > m->max_seq)
        return moe_error(MOE_EINVAL, "generate: a batch of %d sequences exceeds the KV cache's %d",
                         B, m->n_seqs);
    real *last = malloc((size_t)B * V * sizeof(real)); // each sequence's next-token logits
    candidate *cand = malloc((size_t)V * sizeof(candidate));
    int *tok = malloc((size_t)B * sizeof(int)), *slots = malloc((size_t)B * sizeof(int)),
        *pos = malloc((size_t)B * sizeof(int));
    uint64_t *rng = malloc((size_t)B * sizeof(uint64_t));
    moe_status st = last && cand && tok && slots && pos && rng
                        ? MOE_OK
                        : moe_error(MOE_ENOMEM, "generate: out of memory");
    const int chunk =
        s->prefill_chunk > 0 && s->prefill_chunk < m->max_seq ? s->prefill_chunk : m->max_seq;
    for (int b = 0; b < B && !st; b++) { // prefill each prompt into its own cache slot
        n_outs[b] = 0, slots[b] = b, pos[b] = n_prompts[b];
        rng[b] = s->seed + (uint64_t)b; // sequence b samples as a lone run with seed + b would
        if (n_prompts[b] < 1 || n_prompts[b] >= m->max_pos)
            st = moe_error(MOE_EINVAL, "generate: prompt %d has %d tokens, the KV cache %d", b + 1,
                           n_prompts[b], m->max_pos);
        for (int p = 0; p < n_prompts[b] && !st; p += chunk) {
            const int n = n_prompts[b] - p < chunk ? n_prompts[b] - p : chunk;
            const double t0 = moe_clock_s();
            st = moe_model_infer_slot(m, b, prompts[b] + p, n, p);
            if (!st && s->stats) {
                if (m->be->synchronize) m->be->synchronize(m->be);
                st = moe_serve_stats_step(s->stats, m, MOE_SERVE_PREFILL, n, moe_clock_s() - t0);
            }
            if (!st && p + n == n_prompts[b])
                m->be->copy_to_host(m->be, last + (size_t)b * V, m->logits + (size_t)(n - 1) * V,
                                    (size_t)V * sizeof(real));
        }
    }
    memset(m->expert_hits, 0, (size_t)m->cfg.n_layers * m->cfg.moe.n_experts * sizeof(long));
    for (int i = 0; i < n_new && !st; i++) {
        for (int b = 0; b < B && !st; b++) {
            const real *lg = last + (size_t)b * V;
            long bad = infer_first_nonfinite(lg, (size_t)V);
            if (bad >= 0) {
                st = moe_error(MOE_ENUMERIC, "generate: non-finite logit (%g) in sequence %d",
                               (double)lg[bad], b + 1);
                break;
            }
            outs[b][n_outs[b]++] = tok[b] = sample(lg, V, s, &rng[b], cand);
        }
        int full = 0;
        for (int b = 0; b < B; b++) full |= pos[b] >= m->max_pos;
        if (st || full || i + 1 == n_new) break; // done, or a cache is full
        const double t0 = moe_clock_s();
        st = moe_model_decode_batch(m, tok, B, slots, pos);
        if (!st && s->stats) {
            if (m->be->synchronize) m->be->synchronize(m->be);
            st = moe_serve_stats_step(s->stats, m, MOE_SERVE_DECODE, B, moe_clock_s() - t0);
        }
        if (!st) m->be->copy_to_host(m->be, last, m->logits, (size_t)B * V * sizeof(real));
        for (int b = 0; b < B; b++) pos[b]++;
    }
    free(last), free(cand), free(tok), free(slots), free(pos), free(rng);
    return st;
}
