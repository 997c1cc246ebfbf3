// The per-element and per-row bodies of the CUDA kernels whose parallel decomposition differs
// from the CPU's loops, as MOE_HD functions valid in C11 and CUDA C++. The kernels call them
// per thread; tests/cuda/test_cuda_bodies.c (plain C, every CI, no GPU) composes them the way
// the kernels do and compares with the CPU twins on random inputs (odd sizes, ties, experts
// without tokens). The router's rows are shared with the CPU itself (layers/router_rows.h).
#ifndef MOE_CUDA_BODIES_H
#define MOE_CUDA_BODIES_H

#include <stddef.h>

#include "layers/backend.h"
#include "layers/hd.h"
#include "layers/real.h"

// ---- capacity (DESIGN.md §3.3) ---------------------------------------------------------
// Slot `s` of expert e, at position `pos` among e's slots in token order, with e's slots in
// token order in list[0..n): its rank in the order the expert keeps them. position: pos.
// probs: a stable sort by weight, largest first (the CPU's merge sort): the slots with a larger
// weight, plus the earlier ones with an equal weight.
MOE_HD static inline int moe_hd_keep_rank(int s, int pos, const int *list, int n,
                                          const real *weights, moe_drop_policy policy) {
    if (policy == MOE_DROP_POSITION) return pos;
    const real w = weights[s];
    int rank = 0;
    for (int i = 0; i < n; i++) {
        const real v = weights[list[i]];
        rank += v > w || (v == w && i < pos);
    }
    return rank;
}

// ---- combine (DESIGN.md §3.5), one output element --------------------------------------
// out[t,i] = sum_j w[t,j] y[row(t,j), i] over kept j, in the order j = 0..k-1 (as the CPU).
MOE_HD static inline real moe_hd_combine_elem(const real *y, const real *w, const int *rows, int k,
                                              int d, int i) {
    real o = 0;
    for (int j = 0; j < k; j++)
        if (rows[j] >= 0) o += w[j] * y[(size_t)rows[j] * d + i];
    return o;
}
// dx[t,i] += sum_j dxp[row(t,j), i] over kept j (j = 0..k-1): the unpermute's element.
MOE_HD static inline real moe_hd_unpermute_elem(real acc, const real *dxp, const int *rows, int k,
                                                int d, int i) {
    for (int j = 0; j < k; j++)
        if (rows[j] >= 0) acc += dxp[(size_t)rows[j] * d + i];
    return acc;
}

// ---- SwiGLU, one element ---------------------------------------------------------------
MOE_HD static inline real moe_hd_swiglu(real h1, real h3) { return h1 / (1 + real_exp(-h1)) * h3; }
// dh1 = g h3 silu'(h1), dh3 = g silu(h1); silu'(a) = s (1 + a (1 - s)), s = sigmoid(a)
MOE_HD static inline void moe_hd_swiglu_backward(real *dh1, real *dh3, real g, real h1, real h3) {
    const real s = 1 / (1 + real_exp(-h1));
    *dh1 = g * h3 * s * (1 + h1 * (1 - s));
    *dh3 = g * h1 * s;
}

// ---- RoPE, one pair (HF rotate_half): (a, b) -> (a c - b s, b c + a s), s = sign * sin -----
MOE_HD static inline void moe_hd_rope_pair(real *oa, real *ob, real a, real b, real c, real s) {
    *oa = a * c - b * s;
    *ob = b * c + a * s;
}

// ---- AdamW, one parameter (torch.optim.AdamW: decoupled decay first) ----------------------
MOE_HD static inline void moe_hd_adamw(real *p, real *m, real *v, real grad, moe_adamw_hparams h) {
    const real g = h.grad_scale * grad;
    const real decayed = *p - h.lr * h.weight_decay * *p;
    *m = h.beta1 * *m + (1 - h.beta1) * g;
    *v = h.beta2 * *v + (1 - h.beta2) * g * g;
    *p = decayed - h.lr * (*m / h.bc1) / ((real)sqrt(*v / h.bc2) + h.eps);
}

// ---- online softmax (attention, cross-entropy) -------------------------------------------
// A running (max m, sum l of exp(x - m)) meets a tile with maximum tile_max: the new max, and
// *scale = exp(m_old - m_new) by which the old sum and accumulators are multiplied.
// m = -INFINITY (nothing seen) gives scale 0.
MOE_HD static inline real moe_hd_online_max(real m, real tile_max, real *scale) {
    const real mn = tile_max > m ? tile_max : m;
    *scale = m == -INFINITY ? 0 : real_exp(m - mn);
    return mn;
}

// ---- attention backward, one (query i, key j) pair (FlashAttention-2's rule) -------------
MOE_HD static inline real moe_hd_dot(const real *a, const real *b, int n) {
    real s = 0;
    for (int c = 0; c < n; c++) s += a[c] * b[c];
    return s;
}
// *p = P_ij = exp(scale q.k - lse_i); returns dS_ij = P_ij (dO_i . v_j - D_i) scale, the
// factor of k_j in dq_i and of q_i in dk_j (dv_j takes P_ij dO_i). q, k, v, dO [hd].
MOE_HD static inline real moe_hd_attn_ds(real *p, const real *q, const real *k, const real *v,
                                         const real *dO, int hd, real scale, real lse, real D) {
    *p = real_exp(scale * moe_hd_dot(q, k, hd) - lse);
    return *p * (moe_hd_dot(dO, v, hd) - D) * scale;
}

#endif
