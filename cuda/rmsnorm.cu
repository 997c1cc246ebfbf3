// RMSNorm on the GPU, twin of layers/cpu/rmsnorm.c: one block per row, the row statistic a
// block reduction in double (a fixed shape: the same bits every run); the weight gradient,
// which every token adds to, per column over chunks of 64 tokens, then over the chunks in
// order (no atomics). The q/k norm (head_rmsnorm) runs the CPU's own bodies
// (layers/dense_rows.h): one thread per segment, its weight gradient per (chunk, column).
#include "cuda/cuda_kernels.cuh" // first: the C headers as C++
#include "cuda/reduce.cuh"
extern "C" {
#include "layers/dense_rows.h"
}

static __global__ void k_rmsnorm(real *out, real *rstd, const real *inp, const real *weight, int d,
                                 real eps) {
    const real *x = inp + (size_t)blockIdx.x * d;
    real *o = out + (size_t)blockIdx.x * d;
    double ss = 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += (double)x[i] * x[i];
    ss = block_sum(ss);
    const real r = (real)(1.0 / sqrt(ss / d + eps));
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = x[i] * r * weight[i];
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}
void cuda_rmsnorm_forward(moe_backend *be, real *out, real *rstd, const real *inp,
                          const real *weight, int T, int d, real eps) {
    if (T <= 0) return;
    k_rmsnorm<<<T, CUDA_THREADS, 0, cuda_stream(be)>>>(out, rstd, inp, weight, d, eps);
    CUDA_LAUNCHED(be, "k_rmsnorm");
}
static __global__ void k_rmsnorm_backward_input(real *dinp, const real *dout, const real *inp,
                                                const real *weight, const real *rstd, int d) {
    const size_t off = (size_t)blockIdx.x * d;
    const real *x = inp + off, *g = dout + off;
    real *dx = dinp + off;
    const real r = rstd[blockIdx.x];
    double dot = 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) dot += (double)weight[i] * g[i] * x[i] * r;
    dot = block_sum(dot);
    const real mean = (real)(dot / d);
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        dx[i] += r * (weight[i] * g[i] - x[i] * r * mean);
}
// dweight: the tokens in chunks of RMS_CHUNK, a partial sum per (chunk, column) in token
// order, then per column the chunks in order: deterministic, and T / RMS_CHUNK blocks of
// parallelism instead of one thread per column walking all T tokens.
#define RMS_CHUNK 64
static __global__ void k_rmsnorm_weight_partial(real *part, const real *dout, const real *inp,
                                                const real *rstd, int T, int d) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;
    if (i >= d) return;
    const int t1 = (c + 1) * RMS_CHUNK < T ? (c + 1) * RMS_CHUNK : T;
    real acc = 0;
    for (int t = c * RMS_CHUNK; t < t1; t++)
        acc += dout[(size_t)t * d + i] * inp[(size_t)t * d + i] * rstd[t];
    part[(size_t)c * d + i] = acc;
}
static __global__ void k_rmsnorm_weight_sum(real *dweight, const real *part, int chunks, int d) {
    GRID_STRIDE(i, (size_t)d) {
        real acc = 0;
        for (int c = 0; c < chunks; c++) acc += part[(size_t)c * d + i];
        dweight[i] += acc;
    }
}
void cuda_rmsnorm_backward(moe_backend *be, real *dinp, real *dweight, const real *dout,
                           const real *inp, const real *weight, const real *rstd, int T, int d) {
    if (T <= 0) return;
    k_rmsnorm_backward_input<<<T, CUDA_THREADS, 0, cuda_stream(be)>>>(dinp, dout, inp, weight, rstd,
                                                                      d);
    CUDA_LAUNCHED(be, "k_rmsnorm_backward_input");
    const int chunks = (T + RMS_CHUNK - 1) / RMS_CHUNK;
    real *part = (real *)cuda_work(be, (size_t)chunks * d * sizeof(real));
    k_rmsnorm_weight_partial<<<dim3((d + 127) / 128, chunks), 128, 0, cuda_stream(be)>>>(
        part, dout, inp, rstd, T, d);
    CUDA_LAUNCHED(be, "k_rmsnorm_weight_partial");
    k_rmsnorm_weight_sum<<<cuda_grid((size_t)d, 128), 128, 0, cuda_stream(be)>>>(dweight, part,
                                                                                 chunks, d);
    CUDA_LAUNCHED(be, "k_rmsnorm_weight_sum");
}

static __global__ void k_head_rmsnorm(real *out, real *rstd, const real *inp, const real *weight,
                                      size_t n_seg, int stride, int n_heads, int hd, real eps) {
    GRID_STRIDE(s, n_seg) {
        const size_t o = moe_head_segment((int)s, stride, n_heads, hd);
        rstd[s] = moe_head_rmsnorm_row(out + o, inp + o, weight, hd, eps);
    }
}
void cuda_head_rmsnorm_forward(moe_backend *be, real *out, real *rstd, const real *inp,
                               const real *weight, int T, int stride, int n_heads, int hd,
                               real eps) {
    const size_t n_seg = (size_t)T * n_heads;
    if (T <= 0 || n_heads <= 0 || hd <= 0) return;
    k_head_rmsnorm<<<cuda_grid(n_seg, 128), 128, 0, cuda_stream(be)>>>(
        out, rstd, inp, weight, n_seg, stride, n_heads, hd, eps);
    CUDA_LAUNCHED(be, "k_head_rmsnorm");
}
static __global__ void k_head_rmsnorm_backward_input(real *dinp, const real *dout, const real *inp,
                                                     const real *weight, const real *rstd,
                                                     size_t n_seg, int stride, int n_heads,
                                                     int hd) {
    GRID_STRIDE(s, n_seg) {
        const size_t o = moe_head_segment((int)s, stride, n_heads, hd);
        moe_head_rmsnorm_backward_row(dinp + o, dout + o, inp + o, weight, rstd[s], hd);
    }
}
// part [chunks, hd]: one thread per (chunk, column), adjacent threads on adjacent columns
static __global__ void k_head_rmsnorm_weight_partial(double *part, const real *dout,
                                                     const real *inp, const real *rstd, int chunks,
                                                     int stride, int n_heads, int hd, int n_seg) {
    GRID_STRIDE(j, (size_t)chunks * hd) {
        part[j] = moe_head_rmsnorm_dweight_part(dout, inp, rstd, stride, n_heads, hd, n_seg,
                                                (int)(j / hd), (int)(j % hd));
    }
}
// The weight partials first: they read dout, which the input gradient may overwrite (in place).
void cuda_head_rmsnorm_backward(moe_backend *be, real *dinp, real *dweight, const real *dout,
                                const real *inp, const real *weight, const real *rstd, int T,
                                int stride, int n_heads, int hd) {
    if (T <= 0 || n_heads <= 0 || hd <= 0) return;
    const int n_seg = T * n_heads, chunks = moe_grad_chunks((size_t)n_seg);
    double *part = (double *)cuda_work(be, (size_t)chunks * hd * sizeof(double));
    k_head_rmsnorm_weight_partial<<<cuda_grid((size_t)chunks * hd, 128), 128, 0, cuda_stream(be)>>>(
        part, dout, inp, rstd, chunks, stride, n_heads, hd, n_seg);
    CUDA_LAUNCHED(be, "k_head_rmsnorm_weight_partial");
    k_head_rmsnorm_backward_input<<<cuda_grid((size_t)n_seg, 128), 128, 0, cuda_stream(be)>>>(
        dinp, dout, inp, weight, rstd, (size_t)n_seg, stride, n_heads, hd);
    CUDA_LAUNCHED(be, "k_head_rmsnorm_backward_input");
    cuda_grad_chunks_add(be, dweight, part, chunks, hd);
}
