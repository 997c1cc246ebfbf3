// The dense layers' per-row bodies shared by every backend (MOE_HD: the CPU compiles them as C,
// CUDA as __host__ __device__ functions), so that the q/k norm's rows, the gradient sums of the
// norm weight and of the linear biases, and the shared expert's sigmoid gate are one text:
// layers/cpu/rmsnorm.c, elementwise.c and their twins cuda/rmsnorm.cu, elementwise.cu call
// these per segment / per (chunk, column) / per token.
// Contracts: layers/backend.h (head_rmsnorm_forward/backward, bias_add/backward,
// sigmoid_gate_forward/backward); DESIGN.md §2.1.
#ifndef MOE_DENSE_ROWS_H
#define MOE_DENSE_ROWS_H

#include <math.h>
#include <stddef.h>

#include "layers/hd.h"
#include "layers/real.h"

// A weight or bias gradient sums over every token (or segment). Both backends cut the tokens
// into chunks of MOE_GRAD_CHUNK, sum each chunk per column in double in token order, then
// the chunks per column in chunk order, and add the total once: the same bits on every
// backend and thread count, no atomics.
#define MOE_GRAD_CHUNK 64
static inline int moe_grad_chunks(size_t n) {
    return (int)((n + MOE_GRAD_CHUNK - 1) / MOE_GRAD_CHUNK);
}
// Column i's total over chunks part[0..chunks) of rows of n doubles, in chunk order.
MOE_HD static inline double moe_grad_chunks_sum(const double *part, int chunks, int n, int i) {
    double acc = 0;
    for (int c = 0; c < chunks; c++) acc += part[(size_t)c * n + i];
    return acc;
}

// ---- q/k norm (head_rmsnorm): segment s = t * n_heads + h, the hd reals at t*stride + h*hd --
MOE_HD static inline size_t moe_head_segment(int s, int stride, int n_heads, int hd) {
    return (size_t)(s / n_heads) * stride + (size_t)(s % n_heads) * hd;
}
// One segment x [hd]: out = x r w; returns r = 1 / sqrt(mean_i x_i^2 + eps) (the sum of
// squares in double, in index order).
MOE_HD static inline real moe_head_rmsnorm_row(real *out, const real *x, const real *w, int hd,
                                               real eps) {
    double ss = 0;
    for (int i = 0; i < hd; i++) ss += (double)x[i] * x[i];
    const real r = (real)(1.0 / sqrt(ss / hd + eps));
    for (int i = 0; i < hd; i++) out[i] = x[i] * r * w[i];
    return r;
}
// Its input gradient, n = x r: dx = r (w g - n mean_i(w g n)) (the mean's sum in double). dx
// may be g: every g is read before the first dx is written.
MOE_HD static inline void moe_head_rmsnorm_backward_row(real *dx, const real *g, const real *x,
                                                        const real *w, real r, int hd) {
    double dot = 0;
    for (int i = 0; i < hd; i++) dot += (double)w[i] * g[i] * x[i] * r;
    const real mean = (real)(dot / hd);
    for (int i = 0; i < hd; i++) dx[i] = r * (w[i] * g[i] - x[i] * r * mean);
}
// The weight gradient's chunk c, column i: sum of dout * x * r over the segments of chunk c
// (of n_seg), in double, in segment order.
MOE_HD static inline double moe_head_rmsnorm_dweight_part(const real *dout, const real *inp,
                                                          const real *rstd, int stride, int n_heads,
                                                          int hd, int n_seg, int c, int i) {
    const int s1 = (c + 1) * MOE_GRAD_CHUNK < n_seg ? (c + 1) * MOE_GRAD_CHUNK : n_seg;
    double acc = 0;
    for (int s = c * MOE_GRAD_CHUNK; s < s1; s++) {
        const size_t o = moe_head_segment(s, stride, n_heads, hd) + i;
        acc += (double)dout[o] * inp[o] * rstd[s];
    }
    return acc;
}

// ---- linear bias: chunk c, column i of dbias: sum of dout[t, i] over the chunk's tokens -----
MOE_HD static inline double moe_bias_dbias_part(const real *dout, int T, int n, int c, int i) {
    const int t1 = (c + 1) * MOE_GRAD_CHUNK < T ? (c + 1) * MOE_GRAD_CHUNK : T;
    double acc = 0;
    for (int t = c * MOE_GRAD_CHUNK; t < t1; t++) acc += dout[(size_t)t * n + i];
    return acc;
}

// ---- the shared expert's gate (Qwen2-MoE): s = sigmoid(z) -----------------------------------
MOE_HD static inline real moe_sigmoid(real z) { return 1 / (1 + real_exp(-z)); }
// dz = s (1 - s) <dout, y>, the dot product summed in double
MOE_HD static inline real moe_sigmoid_gate_dz(real s, double dot) {
    return s * (1 - s) * (real)dot;
}

#endif
