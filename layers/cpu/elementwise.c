// Elementwise sums and reductions; the linear biases and the shared expert's sigmoid gate.
#include <stdlib.h>

#include "layers/cpu/cpu_kernels.h"
#include "layers/dense_rows.h"

void cpu_add(moe_backend *be, real *out, const real *a, const real *b, size_t n) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

// sum x_i^2 in double, in a fixed order whatever the thread count: blocks of SQ_BLOCK values,
// each summed in SQ_LANES interleaved lanes (lane l: i = l mod SQ_LANES, so the compiler keeps
// the lanes in one vector register and the loop runs at memory speed, not at the latency of
// one chain of adds), the lanes then the tail added in order, then the blocks in order.
#define SQ_LANES 8
#define SQ_BLOCK 8192

static double sum_squares_block(const real *x, size_t n) {
    double lane[SQ_LANES] = {0};
    size_t i = 0;
    for (; i + SQ_LANES <= n; i += SQ_LANES)
        for (int l = 0; l < SQ_LANES; l++) lane[l] += (double)x[i + l] * x[i + l];
    double acc = 0;
    for (int l = 0; l < SQ_LANES; l++) acc += lane[l];
    for (; i < n; i++) acc += (double)x[i] * x[i];
    return acc;
}

void cpu_sum_squares(moe_backend *be, double *host_out, const real *x, size_t n) {
    CPU_KERNEL(be);
    const size_t blocks = (n + SQ_BLOCK - 1) / SQ_BLOCK;
    double small[64], *part = blocks <= 64 ? small : malloc(blocks * sizeof(double));
    if (!part) moe_fatal("cpu: sum_squares: cannot allocate %zu partial sums", blocks);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t b = 0; b < blocks; b++) {
        const size_t lo = b * SQ_BLOCK, len = n - lo < SQ_BLOCK ? n - lo : SQ_BLOCK;
        part[b] = sum_squares_block(x + lo, len);
    }
    double acc = 0;
    for (size_t b = 0; b < blocks; b++) acc += part[b];
    if (part != small) free(part);
    *host_out = acc;
}

// Serial, in index order: the loss of a step is a sum of at most a few thousand per-token
// values, and the same order on every thread count keeps resumed runs bit-exact.
void cpu_sum(moe_backend *be, double *host_out, const real *x, size_t n) {
    CPU_KERNEL(be);
    double acc = 0;
    for (size_t i = 0; i < n; i++) acc += x[i];
    *host_out = acc;
}

void cpu_bias_add(moe_backend *be, real *out, const real *bias, int T, int n) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * n))
    for (int t = 0; t < T; t++) {
        real *o = out + (size_t)t * n;
        for (int i = 0; i < n; i++) o[i] += bias[i];
    }
}

// dbias += sum_t dout: per chunk of MOE_GRAD_CHUNK tokens a partial per column in double, then
// the chunks per column in chunk order (layers/dense_rows.h: CUDA's sums, bit for bit).
void cpu_bias_backward(moe_backend *be, real *dbias, const real *dout, int T, int n) {
    CPU_KERNEL(be);
    const int nb = moe_grad_chunks((size_t)(T > 0 ? T : 0));
    if (nb == 0 || n <= 0) return;
    double *part = malloc((size_t)nb * n * sizeof(double));
    if (!part) moe_fatal("bias_backward: out of memory (%d x %d partial sums)", nb, n);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * n))
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < n; i++) part[(size_t)b * n + i] = moe_bias_dbias_part(dout, T, n, b, i);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)nb * n))
    for (int i = 0; i < n; i++) dbias[i] += (real)moe_grad_chunks_sum(part, nb, n, i);
    free(part);
}

void cpu_sigmoid_gate_forward(moe_backend *be, real *out, const real *z, const real *y, int T,
                              int d) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * d))
    for (int t = 0; t < T; t++) {
        const real s = moe_sigmoid(z[t]), *yt = y + (size_t)t * d;
        real *o = out + (size_t)t * d;
        for (int i = 0; i < d; i++) o[i] += s * yt[i];
    }
}

// dy = s dout, dz = s (1 - s) <dout, y> (the dot product in double, lane-wise as rmsnorm's
// row sums; read before dy is written)
void cpu_sigmoid_gate_backward(moe_backend *be, real *dy, real *dz, const real *dout, const real *z,
                               const real *y, int T, int d) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * d))
    for (int t = 0; t < T; t++) {
        const real s = moe_sigmoid(z[t]), *g = dout + (size_t)t * d, *yt = y + (size_t)t * d;
        real *dyt = dy + (size_t)t * d;
        double dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int i = 0; i < d; i++) dot += (double)g[i] * yt[i];
        for (int i = 0; i < d; i++) dyt[i] = s * g[i];
        dz[t] = moe_sigmoid_gate_dz(s, dot);
    }
}
