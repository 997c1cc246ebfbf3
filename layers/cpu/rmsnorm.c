// RMSNorm: out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps); and the q/k norm
// (head_rmsnorm), the same on segments of hd reals inside longer rows.
//
// RMSNorm's row sums are simd reductions (lane-wise partial sums in double, added in a fixed order:
// the same bits on every run and thread count) so that the loops vectorise; the weight
// gradient sums rows in fixed blocks of RMS_BLOCK tokens, row by row (contiguous, unlike a
// walk down each column), then the blocks' partial sums in block order.
#include <math.h>
#include <stdlib.h>

#include "layers/cpu/cpu_kernels.h"
#include "layers/dense_rows.h"
#include "layers/status.h"

#define RMS_BLOCK 64

void cpu_rmsnorm_forward(moe_backend *be, real *out, real *rstd, const real *inp,
                         const real *weight, int T, int d, real eps) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * d))
    for (int t = 0; t < T; t++) {
        const real *x = inp + (size_t)t * d;
        real *o = out + (size_t)t * d;
        double ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int i = 0; i < d; i++) ss += (double)x[i] * x[i];
        real r = (real)(1.0 / sqrt(ss / d + eps));
        for (int i = 0; i < d; i++) o[i] = x[i] * r * weight[i];
        rstd[t] = r;
    }
}

// With n = x * rstd and g = w * dout:
//   dx = rstd * (g - n * mean_i(g_i n_i)),   dw = sum_t dout * n
void cpu_rmsnorm_backward(moe_backend *be, real *dinp, real *dweight, const real *dout,
                          const real *inp, const real *weight, const real *rstd, int T, int d) {
    CPU_KERNEL(be);
    const int nb = (T + RMS_BLOCK - 1) / RMS_BLOCK;
    real *part = malloc((size_t)nb * d * sizeof(real)); // block b's sum of dout * n
    if (!part) moe_fatal("rmsnorm_backward: out of memory (%d x %d partial sums)", nb, d);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * d))
    for (int b = 0; b < nb; b++) {
        real *acc = part + (size_t)b * d;
        for (int i = 0; i < d; i++) acc[i] = 0;
        const int t1 = (b + 1) * RMS_BLOCK < T ? (b + 1) * RMS_BLOCK : T;
        for (int t = b * RMS_BLOCK; t < t1; t++) {
            const real *x = inp + (size_t)t * d, *g = dout + (size_t)t * d;
            real *dx = dinp + (size_t)t * d;
            const real r = rstd[t];
            double dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int i = 0; i < d; i++) dot += (double)weight[i] * g[i] * x[i] * r;
            const real mean = (real)(dot / d);
            for (int i = 0; i < d; i++) {
                dx[i] += r * (weight[i] * g[i] - x[i] * r * mean);
                acc[i] += g[i] * x[i] * r;
            }
        }
    }
    for (int b = 1; b < nb; b++) // weight gradient: the blocks' sums in order, then added once
        for (int i = 0; i < d; i++) part[i] += part[(size_t)b * d + i];
    for (int i = 0; i < d; i++) dweight[i] += part[i];
    free(part);
}

// q/k norm: one segment per iteration, layers/dense_rows.h's row bodies (CUDA runs the same
// ones, a thread per segment).
void cpu_head_rmsnorm_forward(moe_backend *be, real *out, real *rstd, const real *inp,
                              const real *weight, int T, int stride, int n_heads, int hd,
                              real eps) {
    CPU_KERNEL(be);
    const int n_seg = T * n_heads;
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)n_seg * hd))
    for (int s = 0; s < n_seg; s++) {
        const size_t o = moe_head_segment(s, stride, n_heads, hd);
        rstd[s] = moe_head_rmsnorm_row(out + o, inp + o, weight, hd, eps);
    }
}

// Per chunk of MOE_GRAD_CHUNK segments: its weight-gradient partials (read from dout before
// the chunk's dinp overwrites it: dinp may be dout), then its rows; then the chunks' partials
// per column in chunk order (dense_rows.h: CUDA's sums, bit for bit).
void cpu_head_rmsnorm_backward(moe_backend *be, real *dinp, real *dweight, const real *dout,
                               const real *inp, const real *weight, const real *rstd, int T,
                               int stride, int n_heads, int hd) {
    CPU_KERNEL(be);
    const int n_seg = T * n_heads, nb = moe_grad_chunks((size_t)(n_seg > 0 ? n_seg : 0));
    if (nb == 0 || hd <= 0) return;
    double *part = malloc((size_t)nb * hd * sizeof(double));
    if (!part) moe_fatal("head_rmsnorm_backward: out of memory (%d x %d partial sums)", nb, hd);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)n_seg * hd))
    for (int b = 0; b < nb; b++) {
        for (int i = 0; i < hd; i++)
            part[(size_t)b * hd + i] =
                moe_head_rmsnorm_dweight_part(dout, inp, rstd, stride, n_heads, hd, n_seg, b, i);
        const int s1 = (b + 1) * MOE_GRAD_CHUNK < n_seg ? (b + 1) * MOE_GRAD_CHUNK : n_seg;
        for (int s = b * MOE_GRAD_CHUNK; s < s1; s++) {
            const size_t o = moe_head_segment(s, stride, n_heads, hd);
            moe_head_rmsnorm_backward_row(dinp + o, dout + o, inp + o, weight, rstd[s], hd);
        }
    }
    for (int i = 0; i < hd; i++) dweight[i] += (real)moe_grad_chunks_sum(part, nb, hd, i);
    free(part);
}
