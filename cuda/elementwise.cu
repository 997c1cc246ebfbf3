// Elementwise sums and reductions on the GPU, twin of layers/cpu/elementwise.c: add, and
// sum / sum_squares as a two-stage reduction in double of a fixed launch shape (a fixed order)
// to a pinned host double; the linear biases (the gradient per (chunk, column), then the chunks
// in order: layers/dense_rows.h, the CPU's sums) and the shared expert's sigmoid gate.
#include "cuda/cuda_kernels.cuh" // first: the C headers as C++
#include "cuda/reduce.cuh"
extern "C" {
#include "layers/dense_rows.h"
}

static __global__ void k_add(real *out, const real *a, const real *b, size_t n) {
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}
void cuda_add(moe_backend *be, real *out, const real *a, const real *b, size_t n) {
    if (!n) return;
    k_add<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(out, a, b, n);
    CUDA_LAUNCHED(be, "k_add");
}

#define SUM_BLOCKS 256
// Stage 1: block b's grid-stride partial (of x or x^2) in double; stage 2: one block sums the
// partials. A fixed shape, so a fixed order.
static __global__ void k_partial_sums(double *part, const real *x, size_t n, int squares) {
    double acc = 0;
    GRID_STRIDE(i, n) acc += squares ? (double)x[i] * x[i] : (double)x[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}
static __global__ void k_final_sum(double *out, const double *part, int n) {
    double acc = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += part[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) *out = acc;
}
static void reduce_to_host(moe_backend *be, double *host_out, const real *x, size_t n,
                           int squares) {
    cuda_state *s = cuda_state_of(be);
    double *part = (double *)cuda_work(be, (SUM_BLOCKS + 1) * sizeof(double));
    k_partial_sums<<<SUM_BLOCKS, CUDA_THREADS, 0, s->stream>>>(part, x, n, squares);
    CUDA_LAUNCHED(be, "k_partial_sums");
    k_final_sum<<<1, CUDA_THREADS, 0, s->stream>>>(part + SUM_BLOCKS, part, SUM_BLOCKS);
    CUDA_LAUNCHED(be, "k_final_sum");
    CUDA_CHECK(cudaMemcpyAsync(s->host_sum, part + SUM_BLOCKS, sizeof(double),
                               cudaMemcpyDeviceToHost, s->stream));
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    *host_out = *s->host_sum;
}
void cuda_sum_squares(moe_backend *be, double *host_out, const real *x, size_t n) {
    reduce_to_host(be, host_out, x, n, 1);
}
void cuda_sum(moe_backend *be, double *host_out, const real *x, size_t n) {
    reduce_to_host(be, host_out, x, n, 0);
}

static __global__ void k_grad_chunks_add(real *grad, const double *part, int chunks, int n) {
    GRID_STRIDE(i, (size_t)n) grad[i] += (real)moe_grad_chunks_sum(part, chunks, n, (int)i);
}
void cuda_grad_chunks_add(moe_backend *be, real *grad, const double *part, int chunks, int n) {
    if (n <= 0) return;
    k_grad_chunks_add<<<cuda_grid((size_t)n, 128), 128, 0, cuda_stream(be)>>>(grad, part, chunks,
                                                                              n);
    CUDA_LAUNCHED(be, "k_grad_chunks_add");
}

static __global__ void k_bias_add(real *out, const real *bias, size_t total, int n) {
    GRID_STRIDE(j, total) out[j] += bias[j % n];
}
void cuda_bias_add(moe_backend *be, real *out, const real *bias, int T, int n) {
    const size_t total = (size_t)T * n;
    if (T <= 0 || n <= 0) return;
    k_bias_add<<<cuda_grid(total, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(out, bias,
                                                                                     total, n);
    CUDA_LAUNCHED(be, "k_bias_add");
}
static __global__ void k_bias_partial(double *part, const real *dout, int T, int n, int chunks) {
    GRID_STRIDE(j, (size_t)chunks * n) {
        part[j] = moe_bias_dbias_part(dout, T, n, (int)(j / n), (int)(j % n));
    }
}
void cuda_bias_backward(moe_backend *be, real *dbias, const real *dout, int T, int n) {
    if (T <= 0 || n <= 0) return;
    const int chunks = moe_grad_chunks((size_t)T);
    double *part = (double *)cuda_work(be, (size_t)chunks * n * sizeof(double));
    k_bias_partial<<<cuda_grid((size_t)chunks * n, 128), 128, 0, cuda_stream(be)>>>(part, dout, T,
                                                                                    n, chunks);
    CUDA_LAUNCHED(be, "k_bias_partial");
    cuda_grad_chunks_add(be, dbias, part, chunks, n);
}

static __global__ void k_sigmoid_gate(real *out, const real *z, const real *y, size_t total,
                                      int d) {
    GRID_STRIDE(j, total) out[j] += moe_sigmoid(z[j / d]) * y[j];
}
void cuda_sigmoid_gate_forward(moe_backend *be, real *out, const real *z, const real *y, int T,
                               int d) {
    const size_t total = (size_t)T * d;
    if (T <= 0 || d <= 0) return;
    k_sigmoid_gate<<<cuda_grid(total, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(out, z, y,
                                                                                         total, d);
    CUDA_LAUNCHED(be, "k_sigmoid_gate");
}
// One block per token: <dout, y> a block reduction in double (read before dy is written).
static __global__ void k_sigmoid_gate_backward(real *dy, real *dz, const real *dout, const real *z,
                                               const real *y, int d) {
    const size_t off = (size_t)blockIdx.x * d;
    const real *g = dout + off, *yt = y + off;
    const real s = moe_sigmoid(z[blockIdx.x]);
    double dot = 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) dot += (double)g[i] * yt[i];
    dot = block_sum(dot);
    for (int i = threadIdx.x; i < d; i += blockDim.x) dy[off + i] = s * g[i];
    if (threadIdx.x == 0) dz[blockIdx.x] = moe_sigmoid_gate_dz(s, dot);
}
void cuda_sigmoid_gate_backward(moe_backend *be, real *dy, real *dz, const real *dout,
                                const real *z, const real *y, int T, int d) {
    if (T <= 0) return;
    k_sigmoid_gate_backward<<<T, CUDA_THREADS, 0, cuda_stream(be)>>>(dy, dz, dout, z, y, d);
    CUDA_LAUNCHED(be, "k_sigmoid_gate_backward");
}
