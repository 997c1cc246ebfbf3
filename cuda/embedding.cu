// The token embedding on the GPU, twin of layers/cpu/embedding.c: the lookup, one thread per
// element, and the backward's scatter-add, summed without atomics in a fixed order: per
// (column, bucket of token ids) in token order, the CPU's sums exactly.
#include "cuda/cuda_kernels.cuh" // first: the C headers as C++

static __global__ void k_embedding(real *out, const int *tokens, const real *embed, size_t T,
                                   int d) {
    GRID_STRIDE(i, T * d) out[i] = embed[(size_t)tokens[i / d] * d + i % d];
}
void cuda_embedding_forward(moe_backend *be, real *out, const int *tokens, const real *embed, int T,
                            int d) {
    const size_t n = (size_t)T * d;
    if (!n) return;
    k_embedding<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(
        out, tokens, embed, (size_t)T, d);
    CUDA_LAUNCHED(be, "k_embedding");
}
// dembed[tok, i] += dout[t, i]: thread (column i, bucket b) adds, in token order, the tokens
// whose id % EMB_BUCKETS == b. Every (row, column) has one thread and sees its tokens in order:
// no races, no atomics, the CPU's sums bit for bit, and EMB_BUCKETS times the parallelism of a
// thread per column. The block's bucket shares tiles of token ids in shared memory.
#define EMB_BUCKETS 32
#define EMB_TILE 1024
static __global__ void k_embedding_backward(real *dembed, const real *dout, const int *tokens,
                                            int T, int d) {
    __shared__ int tile[EMB_TILE];
    const int i = blockIdx.x * blockDim.x + threadIdx.x, bucket = blockIdx.y;
    for (int t0 = 0; t0 < T; t0 += EMB_TILE) {
        const int n = T - t0 < EMB_TILE ? T - t0 : EMB_TILE;
        __syncthreads(); // the previous tile is no longer read
        for (int x = threadIdx.x; x < n; x += blockDim.x) tile[x] = tokens[t0 + x];
        __syncthreads();
        if (i < d)
            for (int x = 0; x < n; x++)
                if (tile[x] % EMB_BUCKETS == bucket)
                    dembed[(size_t)tile[x] * d + i] += dout[(size_t)(t0 + x) * d + i];
    }
}
void cuda_embedding_backward(moe_backend *be, real *dembed, const real *dout, const int *tokens,
                             int T, int d) {
    if (T <= 0 || d <= 0) return;
    k_embedding_backward<<<dim3((d + 127) / 128, EMB_BUCKETS), 128, 0, cuda_stream(be)>>>(
        dembed, dout, tokens, T, d);
    CUDA_LAUNCHED(be, "k_embedding_backward");
}
