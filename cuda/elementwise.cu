// Elementwise sums and reductions on the GPU, twin of layers/cpu/elementwise.c: add, and
// sum / sum_squares as a two-stage reduction in double of a fixed launch shape (a fixed order)
// to a pinned host double.
#include "cuda/cuda_kernels.cuh" // first: the C headers as C++
#include "cuda/reduce.cuh"

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
