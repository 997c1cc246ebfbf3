// Cross-entropy on the GPU, twin of layers/cpu/cross_entropy.c: one block per row, its
// logsumexp a block reduction (the max in real, the exponentials summed in double, as the CPU).
#include "cuda/cuda_kernels.cuh" // first: the C headers as C++
#include "cuda/reduce.cuh"

// logsumexp of the row: max in real, the exponentials summed in double (as the CPU).
static __device__ double row_lse(const real *z, int V) {
    real mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = op_max<real>::apply(mx, z[i]);
    mx = block_max(mx);
    double sum = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += (double)real_exp(z[i] - mx);
    sum = block_sum(sum);
    return mx + log(sum);
}
static __global__ void k_cross_entropy(real *losses, const real *logits, const int *targets,
                                       int V) {
    const real *z = logits + (size_t)blockIdx.x * V;
    const double lse = row_lse(z, V);
    if (threadIdx.x == 0) losses[blockIdx.x] = (real)(lse - z[targets[blockIdx.x]]);
}
static __global__ void k_cross_entropy_backward(real *dlogits, const real *logits,
                                                const int *targets, int V, real dloss) {
    const real *z = logits + (size_t)blockIdx.x * V;
    real *dz = dlogits + (size_t)blockIdx.x * V;
    const real lse = (real)row_lse(z, V);
    const int target = targets[blockIdx.x];
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const real g = dloss * real_exp(z[i] - lse);
        dz[i] = i == target ? g - dloss : g;
    }
}
void cuda_cross_entropy_forward(moe_backend *be, real *losses, const real *logits,
                                const int *targets, int T, int V) {
    if (T <= 0) return;
    k_cross_entropy<<<T, CUDA_THREADS, 0, cuda_stream(be)>>>(losses, logits, targets, V);
    CUDA_LAUNCHED(be, "k_cross_entropy");
}
void cuda_cross_entropy_backward(moe_backend *be, real *dlogits, const real *logits,
                                 const int *targets, int T, int V, real dloss) {
    if (T <= 0) return;
    k_cross_entropy_backward<<<T, CUDA_THREADS, 0, cuda_stream(be)>>>(dlogits, logits, targets, V,
                                                                      dloss);
    CUDA_LAUNCHED(be, "k_cross_entropy_backward");
}
