// The kernel interface: one table of function pointers that every layer calls.
//
// The CPU implementation (layers/cpu/, OpenMP + OpenBLAS) is the reference; a CUDA
// implementation (cuda/) fills the same table with kernels of the same names and
// argument order, and is tested op by op against the CPU one.
//
// Conventions (llm.c style): outputs first, then inputs, then sizes.
// Matrices are row-major. `y = x W^T` with W stored [out, in].
// All pointers are device pointers of the backend unless the comment says "host".
// Integer index arrays are `int` (32-bit); sizes fit comfortably (T*k*d < 2^31).
// "+=" in a comment means the kernel accumulates into its output.
#ifndef MOE_BACKEND_H
#define MOE_BACKEND_H

#include <stddef.h>

#include "layers/real.h"

// How an expert that receives more than `capacity` assignments picks the ones it keeps.
typedef enum {
    MOE_DROP_PROBS = 0,    // keep the largest combine weights (ties: earlier token)
    MOE_DROP_POSITION = 1, // keep the first ones in token order
} moe_drop_policy;

typedef struct moe_backend {
    const char *name;

    // ---- memory ---------------------------------------------------------
    void *(*alloc)(size_t bytes); // zero-filled; NULL on failure
    void (*free)(void *ptr);
    void (*copy_to_device)(void *dst, const void *host_src, size_t bytes);
    void (*copy_to_host)(void *host_dst, const void *src, size_t bytes);
    void (*zero)(void *ptr, size_t bytes);

    // ---- dense GEMM -----------------------------------------------------
    // c[m,n] = op(a) @ op(b) + beta * c, op(a) is [m,kd], op(b) is [kd,n].
    // a is stored [m,kd] (or [kd,m] if trans_a); b is stored [kd,n] (or [n,kd] if trans_b).
    void (*matmul)(real *c, const real *a, const real *b, int m, int n, int kd,
                   int trans_a, int trans_b, real beta);

    // ---- grouped expert GEMMs --------------------------------------------
    // Rows are grouped by expert: expert e owns rows [offsets[e], offsets[e+1]).
    // `offsets` is a HOST array of n_experts+1 ints. weight is [E, n_out, n_in].
    // out[r,:] = inp[r,:] @ weight[e]^T            out [N, n_out], inp [N, n_in]
    void (*expert_matmul_forward)(real *out, const real *inp, const real *weight,
                                  const int *offsets, int n_experts, int n_out, int n_in);
    // dinp[r,:] (= or +=) dout[r,:] @ weight[e]     dinp [N, n_in], dout [N, n_out]
    void (*expert_matmul_backward_input)(real *dinp, const real *dout, const real *weight,
                                         const int *offsets, int n_experts, int n_out,
                                         int n_in, int accumulate);
    // dweight[e] += dout[rows_e]^T @ inp[rows_e]    dweight [E, n_out, n_in]
    void (*expert_matmul_backward_weight)(real *dweight, const real *dout, const real *inp,
                                          const int *offsets, int n_experts, int n_out,
                                          int n_in);

    // ---- router ----------------------------------------------------------
    // p = softmax(logits) per token, lse = logsumexp(logits); top-k of p in descending
    // order (ties: lower expert index first); weights = p_sel / sum(p_sel) when
    // norm_topk_prob, else p_sel.
    // probs [T,E], lse [T], topk_idx [T,k], weights [T,k]; logits [T,E]
    void (*router_softmax_topk)(real *probs, real *lse, int *topk_idx, real *weights,
                                const real *logits, int T, int E, int k, int norm_topk_prob);

    // counts[e] = number of top-k assignments to expert e.   counts [E]; topk_idx [T,k]
    void (*moe_dispatch_counts)(int *counts, const int *topk_idx, int T, int k, int E);

    // keep[t,j] = 1 if assignment (t,j) survives the capacity limit, else 0.
    // capacity <= 0 keeps everything. scratch [2*T*k] ints.
    void (*moe_capacity_keep)(int *keep, int *scratch, const int *topk_idx,
                              const real *weights, const int *counts, int T, int k, int E,
                              int capacity, moe_drop_policy policy);

    // Groups kept assignments by expert, in token order within an expert:
    // offsets[e] = first row of expert e (offsets[E] = rows in all),
    // assign_row[t,j] = row of assignment (t,j) or -1 if dropped, row_token[row] = t.
    // offsets [E+1]; assign_row [T,k]; row_token [T*k] (first offsets[E] used)
    void (*moe_permute_index)(int *offsets, int *assign_row, int *row_token,
                              const int *topk_idx, const int *keep, int T, int k, int E);

    // ---- data movement ---------------------------------------------------
    // xp[r,:] = x[row_token[r],:]                          xp [N,d]; x [T,d]
    void (*moe_permute)(real *xp, const real *x, const int *row_token, int N, int d);
    // out[t,:] = sum_j weights[t,j] * y[assign_row[t,j],:] (kept only)   out [T,d]; y [N,d]
    void (*moe_combine_forward)(real *out, const real *y, const real *weights,
                                const int *assign_row, int T, int k, int d);
    // dy[r,:] = weights[t,j] * dout[t,:]; dweights[t,j] = dout[t,:] . y[r,:] (0 if dropped)
    void (*moe_combine_backward)(real *dy, real *dweights, const real *dout, const real *y,
                                 const real *weights, const int *assign_row, int T, int k,
                                 int d);
    // dx[t,:] += sum_j dxp[assign_row[t,j],:] (kept only)     dx [T,d]; dxp [N,d]
    void (*moe_unpermute_add)(real *dx, const real *dxp, const int *assign_row, int T, int k,
                              int d);

    // ---- SwiGLU ----------------------------------------------------------
    // Rows of h13 [N, 2ff] are [h1 | h3]. act = silu(h1) * h3, silu(a) = a * sigmoid(a).
    // act [N, ff]; h13 [N, 2ff]
    void (*swiglu_forward)(real *act, const real *h13, int N, int ff);
    // dh13 = [dh1 | dh3]: dh1 = dact * h3 * silu'(h1), dh3 = dact * silu(h1),
    // silu'(a) = s * (1 + a * (1 - s)), s = sigmoid(a).   dh13 [N, 2ff]; dact [N, ff]
    void (*swiglu_backward)(real *dh13, const real *dact, const real *h13, int N, int ff);

    // ---- router losses ---------------------------------------------------
    // out[0] = L_aux = aux_coef * E * sum_e f_e P_e,  f_e = counts[e]/(k*T), P_e = mean_t p_e
    // out[1] = L_z   = z_coef * mean_t lse(t)^2
    // out[2] = mean router entropy = mean_t -sum_e p_e log p_e
    void (*router_losses)(real *out, const real *probs, const real *lse, const int *counts,
                          int T, int E, int k, real aux_coef, real z_coef);

    // Gradient of the layer's loss w.r.t. the router logits:
    //   dp[t,sel_j] from dweights through the (optional) top-k renormalisation,
    //   + dloss * aux_coef*E*f_e/T (aux, through P only), then softmax backward,
    //   + dloss * (2*z_coef/T) * lse(t) * p_e(t) (z-loss).
    // dlogits [T,E] (written); dweights [T,k]; probs [T,E]; lse [T]; topk_idx, weights [T,k]
    void (*router_backward)(real *dlogits, const real *dweights, const real *probs,
                            const real *lse, const int *topk_idx, const real *weights,
                            const int *counts, int T, int E, int k, int norm_topk_prob,
                            real aux_coef, real z_coef, real dloss);

    // ---- dense model layers ----------------------------------------------
    // out[t,:] = embed[tokens[t],:]                      out [T,d]; embed [V,d]
    void (*embedding_forward)(real *out, const int *tokens, const real *embed, int T, int d);
    // dembed[tokens[t],:] += dout[t,:]
    void (*embedding_backward)(real *dembed, const real *dout, const int *tokens, int T, int d);

    // out = inp * rstd * weight, rstd[t] = 1 / sqrt(mean_i inp[t,i]^2 + eps)
    // out [T,d]; rstd [T]; inp [T,d]; weight [d]
    void (*rmsnorm_forward)(real *out, real *rstd, const real *inp, const real *weight, int T,
                            int d, real eps);
    // dinp += rstd * (w*dout - n * mean_i(w*dout*n)), n = inp*rstd; dweight += sum_t dout*n
    void (*rmsnorm_backward)(real *dinp, real *dweight, const real *dout, const real *inp,
                             const real *weight, const real *rstd, int T, int d);

    // Rotary embedding, HF rotate_half convention, on the first n_rot heads of each row of
    // n_heads heads of size hd (the q and k heads of a qkv row; v is copied unchanged).
    // Token t has position pos0 + t % S. For i < hd/2, (a, b) = (x[i], x[i+hd/2]):
    //   a' = a cos - b sin, b' = b cos + a sin,  angle = pos * theta^(-2i/hd)
    // inverse=1 rotates by -angle (the backward). out, inp [T, n_heads*hd];
    // cos, sin [max_pos, hd/2]
    void (*rope)(real *out, const real *inp, const real *cos, const real *sin, int T, int S,
                 int pos0, int n_rot, int n_heads, int hd, int inverse);

    // Causal self-attention with GQA on rows qkv [T = B*S, (H + 2KV)*hd] = [q | k | v];
    // query head h uses kv head h / (H/KV). att [B,H,S,S] = softmax(q k^T hd^-1/2) (saved
    // for backward), out [T, H*hd] = att v.
    void (*attention_forward)(real *out, real *att, const real *qkv, int B, int S, int H,
                              int KV, int hd);
    // dqkv [T, (H+2KV)*hd] (written); datt [B,H,S,S] scratch
    void (*attention_backward)(real *dqkv, real *datt, const real *dout, const real *qkv,
                               const real *att, int B, int S, int H, int KV, int hd);

    // Attention of n new tokens of one sequence, at positions pos0..pos0+n-1, over a KV cache
    // that already holds positions 0..pos0+n-1 (the new ones included): causal, GQA.
    // out [n, H*hd]; q = the q part of qkv rows [n, (H+2KV)*hd]; k_cache, v_cache
    // [>= pos0+n, KV*hd]; scratch [H, n, pos0+n]
    void (*attention_cached_forward)(real *out, real *scratch, const real *qkv,
                                     const real *k_cache, const real *v_cache, int n, int pos0,
                                     int H, int KV, int hd);
    // Copies the k and v parts of qkv rows [n, (H+2KV)*hd] into the caches at rows
    // pos0..pos0+n-1 (k_cache, v_cache [max_pos, KV*hd]).
    void (*kv_cache_append)(real *k_cache, real *v_cache, const real *qkv, int n, int pos0,
                            int H, int KV, int hd);

    // losses[t] = logsumexp(logits[t]) - logits[t, targets[t]]     logits [T,V]
    void (*cross_entropy_forward)(real *losses, const real *logits, const int *targets, int T,
                                  int V);
    // dlogits[t,:] = dloss * (softmax(logits[t]) - onehot(targets[t]))
    void (*cross_entropy_backward)(real *dlogits, const real *logits, const int *targets, int T,
                                   int V, real dloss);

    // ---- elementwise and reductions --------------------------------------
    // out = a + b (out may alias a or b)                                 all [n]
    void (*add)(real *out, const real *a, const real *b, size_t n);
    // out[0] = sum_i x[i]^2 (accumulated in double); NaN/Inf propagate
    void (*sum_squares)(double *host_out, const real *x, size_t n);

    // ---- optimizer updates (optim/ decides what to call with what) --------
    // AdamW (decoupled weight decay, as torch.optim.AdamW), with g = grad_scale * grads:
    //   p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    //   p -= lr * (m / bc1) / (sqrt(v / bc2) + eps),  bc1 = 1 - b1^t, bc2 = 1 - b2^t
    void (*adamw_update)(real *params, real *m, real *v, const real *grads, size_t n, real lr,
                         real beta1, real beta2, real eps, real weight_decay, real bc1,
                         real bc2, real grad_scale);
    // SGD without momentum: p -= lr * grad_scale * g
    void (*sgd_update)(real *params, const real *grads, size_t n, real lr, real grad_scale);
} moe_backend;

// The CPU reference backend (always built).
const moe_backend *moe_backend_cpu(void);

#endif
