// The dense model's kernels on the GPU: embedding, RMSNorm, RoPE, cross-entropy, the
// elementwise sums and reductions, and the optimizer updates. Row statistics are block
// reductions in double (fixed shape: the same bits every run). Gradients that many tokens add
// to are summed in a fixed order, never with atomics: the embedding table per (column, bucket
// of token ids) in token order (the CPU's sums exactly), the RMSNorm weight per column over
// chunks of 64 tokens, then over the chunks in order.
#include "cuda/cuda_kernels.cuh" // first: the C headers as C++
#include "cuda/bodies.h"
#include "cuda/reduce.cuh"
#include "layers/bf16.h"

#define GRID_STRIDE(i, n)                                                   \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

// ---- embedding -------------------------------------------------------------------------
__global__ void k_embedding(real *out, const int *tokens, const real *embed, size_t T, int d) {
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
__global__ void k_embedding_backward(real *dembed, const real *dout, const int *tokens, int T,
                                     int d) {
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

// ---- RMSNorm: one block per row ----------------------------------------------------------
__global__ void k_rmsnorm(real *out, real *rstd, const real *inp, const real *weight, int d,
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
__global__ void k_rmsnorm_backward_input(real *dinp, const real *dout, const real *inp,
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
__global__ void k_rmsnorm_weight_partial(real *part, const real *dout, const real *inp,
                                         const real *rstd, int T, int d) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;
    if (i >= d) return;
    const int t1 = (c + 1) * RMS_CHUNK < T ? (c + 1) * RMS_CHUNK : T;
    real acc = 0;
    for (int t = c * RMS_CHUNK; t < t1; t++)
        acc += dout[(size_t)t * d + i] * inp[(size_t)t * d + i] * rstd[t];
    part[(size_t)c * d + i] = acc;
}
__global__ void k_rmsnorm_weight_sum(real *dweight, const real *part, int chunks, int d) {
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

// ---- RoPE: one thread per rotated pair, then the unrotated heads copied -------------------
__global__ void k_rope(real *out, const real *inp, const real *cos, const real *sin, size_t T,
                       int S, int pos0, int n_rot, int n_heads, int hd, real sign) {
    const int half = hd / 2;
    const size_t row = (size_t)n_heads * hd;
    GRID_STRIDE(p, T * n_rot * half) {
        const size_t t = p / ((size_t)n_rot * half);
        const int h = (int)(p / half % n_rot), i = (int)(p % half);
        const size_t pos = (size_t)pos0 + t % S;
        const real *x = inp + t * row + (size_t)h * hd;
        real *o = out + t * row + (size_t)h * hd;
        const real a = x[i], b = x[i + half];
        moe_hd_rope_pair(&o[i], &o[i + half], a, b, cos[pos * half + i],
                         sign * sin[pos * half + i]);
    }
    if (out != inp) {
        const size_t rest = row - (size_t)n_rot * hd;
        GRID_STRIDE(p, T * rest) {
            const size_t at = p / rest * row + (size_t)n_rot * hd + p % rest;
            out[at] = inp[at];
        }
    }
}
void cuda_rope(moe_backend *be, real *out, const real *inp, const real *cos, const real *sin, int T,
               int S, int pos0, int n_rot, int n_heads, int hd, int inverse) {
    const size_t n = (size_t)T * n_heads * hd;
    if (!n) return;
    k_rope<<<cuda_grid(n / 2 + 1, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(
        out, inp, cos, sin, (size_t)T, S, pos0, n_rot, n_heads, hd, inverse ? -1.0f : 1.0f);
    CUDA_LAUNCHED(be, "k_rope");
}

// ---- cross-entropy: one block per row ----------------------------------------------------
// logsumexp of the row: max in real, the exponentials summed in double (as the CPU).
__device__ double row_lse(const real *z, int V) {
    real mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = op_max<real>::apply(mx, z[i]);
    mx = block_max(mx);
    double sum = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += (double)real_exp(z[i] - mx);
    sum = block_sum(sum);
    return mx + log(sum);
}
__global__ void k_cross_entropy(real *losses, const real *logits, const int *targets, int V) {
    const real *z = logits + (size_t)blockIdx.x * V;
    const double lse = row_lse(z, V);
    if (threadIdx.x == 0) losses[blockIdx.x] = (real)(lse - z[targets[blockIdx.x]]);
}
__global__ void k_cross_entropy_backward(real *dlogits, const real *logits, const int *targets,
                                         int V, real dloss) {
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

// ---- elementwise and reductions --------------------------------------------------------
__global__ void k_add(real *out, const real *a, const real *b, size_t n) {
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}
void cuda_add(moe_backend *be, real *out, const real *a, const real *b, size_t n) {
    if (!n) return;
    k_add<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(out, a, b, n);
    CUDA_LAUNCHED(be, "k_add");
}

// bf16 conversions: layers/bf16.h's bodies (round to nearest even on the bits, quiet NaN
// with its sign), so the CPU's and the GPU's bf16 values are the same bits.
__global__ void k_to_bf16(moe_bf16 *out, const real *in, size_t n) {
    GRID_STRIDE(i, n) out[i] = moe_f32_to_bf16((float)in[i]);
}
__global__ void k_from_bf16(real *out, const moe_bf16 *in, size_t n) {
    GRID_STRIDE(i, n) out[i] = (real)moe_bf16_to_f32(in[i]);
}
void cuda_to_bf16(moe_backend *be, moe_bf16 *out, const real *in, size_t n) {
    if (!n) return;
    k_to_bf16<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(out, in, n);
    CUDA_LAUNCHED(be, "k_to_bf16");
}
void cuda_from_bf16(moe_backend *be, real *out, const moe_bf16 *in, size_t n) {
    if (!n) return;
    k_from_bf16<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(out, in, n);
    CUDA_LAUNCHED(be, "k_from_bf16");
}

#define SUM_BLOCKS 256
// Stage 1: block b's grid-stride partial (of x or x^2) in double; stage 2: one block sums the
// partials. A fixed shape, so a fixed order.
__global__ void k_partial_sums(double *part, const real *x, size_t n, int squares) {
    double acc = 0;
    GRID_STRIDE(i, n) acc += squares ? (double)x[i] * x[i] : (double)x[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}
__global__ void k_final_sum(double *out, const double *part, int n) {
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

// ---- optimizer updates -------------------------------------------------------------------
__global__ void k_adamw(real *params, moe_bf16 *params16, real *m, real *v, const real *grads,
                        size_t n, real lr, real beta1, real beta2, real eps, real weight_decay,
                        real bc1, real bc2, real grad_scale) {
    GRID_STRIDE(i, n) {
        moe_hd_adamw(&params[i], &m[i], &v[i], grads[i], lr, beta1, beta2, eps, weight_decay, bc1,
                     bc2, grad_scale);
        if (params16) params16[i] = moe_f32_to_bf16((float)params[i]);
    }
}
void cuda_adamw_update(moe_backend *be, real *params, moe_bf16 *params16, real *m, real *v,
                       const real *grads, size_t n, real lr, real beta1, real beta2, real eps,
                       real weight_decay, real bc1, real bc2, real grad_scale) {
    if (!n) return;
    k_adamw<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(
        params, params16, m, v, grads, n, lr, beta1, beta2, eps, weight_decay, bc1, bc2,
        grad_scale);
    CUDA_LAUNCHED(be, "k_adamw");
}
__global__ void k_sgd(real *params, moe_bf16 *params16, const real *grads, size_t n, real lr,
                      real grad_scale) {
    GRID_STRIDE(i, n) {
        params[i] -= lr * grad_scale * grads[i];
        if (params16) params16[i] = moe_f32_to_bf16((float)params[i]);
    }
}
void cuda_sgd_update(moe_backend *be, real *params, moe_bf16 *params16, const real *grads, size_t n,
                     real lr, real grad_scale) {
    if (!n) return;
    k_sgd<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(params, params16, grads,
                                                                            n, lr, grad_scale);
    CUDA_LAUNCHED(be, "k_sgd");
}
