// Dispatch on the GPU, twin of layers/cpu/dispatch.c: per-expert counts (and per sequence),
// the capacity decision, the grouping of kept assignments by expert, the row movements and the
// combine.
//
// Decisions are the CPU's, bit for bit: both order an expert's slots by token (a block-wide
// scan per expert here, a loop there) and keep by the same rank (cuda/bodies.h
// moe_hd_keep_rank: the CPU's stable merge sort by weight, or the position). Integer counts
// use integer atomics (exact, so still deterministic); no float atomics anywhere: a token's k
// contributions are summed by one thread in the order j = 0..k-1.
#include "cuda/cuda_kernels.cuh" // first: the C headers as C++
#include "cuda/bodies.h"
#include "cuda/reduce.cuh"
#include "layers/bf16.h"

static __global__ void k_count(int *counts, const int *idx, size_t n_slots, int stride_div, int k,
                               int E) {
    // slot s counts for expert idx[s] of group s / (k stride_div) (stride_div = seq_len, or
    // the whole group for plain counts)
    GRID_STRIDE(s, n_slots) {
        const size_t group = s / ((size_t)k * stride_div);
        atomicAdd(&counts[group * E + idx[s]], 1);
    }
}

void cuda_moe_dispatch_counts(moe_backend *be, int *counts, const int *topk_idx, int T, int k,
                              int E) {
    CUDA_CHECK(cudaMemsetAsync(counts, 0, (size_t)E * sizeof(int), cuda_stream(be)));
    const size_t n = (size_t)T * k;
    if (!n) return;
    k_count<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(counts, topk_idx, n,
                                                                              T, k, E);
    CUDA_LAUNCHED(be, "k_count");
}

void cuda_moe_seq_counts(moe_backend *be, int *seq_counts, const int *topk_idx, int T, int k, int E,
                         int seq_len) {
    const int B = T / seq_len;
    CUDA_CHECK(cudaMemsetAsync(seq_counts, 0, (size_t)B * E * sizeof(int), cuda_stream(be)));
    const size_t n = (size_t)B * seq_len * k; // the slots of whole sequences (as the CPU)
    if (!n) return;
    k_count<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(seq_counts, topk_idx,
                                                                              n, seq_len, k, E);
    CUDA_LAUNCHED(be, "k_count (seq)");
}

// The per-expert scans over all T k slots: one block per expert, as wide as a block goes (each
// pass of the block over the slots costs a scan and its barriers).
#define SCAN_THREADS 1024

static __global__ void k_fill_int(int *p, int v, size_t n) { GRID_STRIDE(i, n) p[i] = v; }

// One block per expert e: its slots in token order (list, written to this block's part of
// the scratch), then the rank of each; slots ranked at or beyond the capacity are dropped.
// Experts within the capacity return at once.
static __global__ void __launch_bounds__(SCAN_THREADS)
    k_capacity(int *keep, int *list_all, const int *idx, const real *weights, const int *counts,
               int n_slots, int E, int capacity, moe_drop_policy policy) {
    const int e = blockIdx.x;
    const int n = counts[e];
    if (n <= capacity) return; // uniform over the block
    __shared__ int start_s;
    if (threadIdx.x == 0) {
        int start = 0;
        for (int i = 0; i < e; i++) start += counts[i];
        start_s = start;
    }
    __syncthreads();
    int *list = list_all + start_s;
    int base = 0;
    for (int s0 = 0; s0 < n_slots; s0 += blockDim.x) {
        const int s = s0 + threadIdx.x;
        const int flag = s < n_slots && idx[s] == e;
        int total;
        const int pos = base + block_exclusive_scan(flag, &total);
        if (flag) list[pos] = s;
        base += total;
    }
    __syncthreads(); // the list is complete (and visible to the block)
    for (int pos = threadIdx.x; pos < n; pos += blockDim.x) {
        const int s = list[pos];
        if (moe_hd_keep_rank(s, pos, list, n, weights, policy) >= capacity) keep[s] = 0;
    }
}

void cuda_moe_capacity_keep(moe_backend *be, int *keep, int *scratch, const int *topk_idx,
                            const real *weights, const int *counts, int T, int k, int E,
                            int capacity, moe_drop_policy policy) {
    const size_t n = (size_t)T * k;
    if (!n) return;
    k_fill_int<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(keep, 1, n);
    CUDA_LAUNCHED(be, "k_fill_int");
    if (capacity <= 0) return;
    k_capacity<<<E, SCAN_THREADS, 0, cuda_stream(be)>>>(keep, scratch, topk_idx, weights, counts,
                                                        (int)n, E, capacity, policy);
    CUDA_LAUNCHED(be, "k_capacity");
}

static __global__ void k_kept_counts(int *offsets, const int *idx, const int *keep, size_t n) {
    GRID_STRIDE(s, n) if (keep[s]) atomicAdd(&offsets[idx[s] + 1], 1);
}
static __global__ void k_prefix(int *offsets, int E) { // one thread: E + 1 integers
    if (blockIdx.x == 0 && threadIdx.x == 0)
        for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
}
// One block per expert: its slots in token order get consecutive rows from offsets[e].
static __global__ void __launch_bounds__(SCAN_THREADS)
    k_assign_rows(int *assign_row, int *row_token, const int *offsets, const int *idx,
                  const int *keep, int n_slots, int k) {
    const int e = blockIdx.x;
    int row = offsets[e];
    for (int s0 = 0; s0 < n_slots; s0 += blockDim.x) {
        const int s = s0 + threadIdx.x;
        const int mine = s < n_slots && idx[s] == e;
        const int kept = mine && keep[s];
        int total;
        const int r = row + block_exclusive_scan(kept, &total);
        if (kept) {
            assign_row[s] = r;
            row_token[r] = s / k;
        } else if (mine) {
            assign_row[s] = -1;
        }
        row += total;
    }
}

void cuda_moe_permute_index(moe_backend *be, int *offsets, int *assign_row, int *row_token,
                            const int *topk_idx, const int *keep, int T, int k, int E) {
    cudaStream_t st = cuda_stream(be);
    const size_t n = (size_t)T * k;
    CUDA_CHECK(cudaMemsetAsync(offsets, 0, (size_t)(E + 1) * sizeof(int), st));
    if (!n) return;
    k_kept_counts<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, st>>>(offsets, topk_idx, keep, n);
    CUDA_LAUNCHED(be, "k_kept_counts");
    k_prefix<<<1, 32, 0, st>>>(offsets, E);
    CUDA_LAUNCHED(be, "k_prefix");
    k_assign_rows<<<E, SCAN_THREADS, 0, st>>>(assign_row, row_token, offsets, topk_idx, keep,
                                              (int)n, k);
    CUDA_LAUNCHED(be, "k_assign_rows");
}

// A row kernel's store: fp32 as is, bf16 rounded (the bf16 layer's twins of permute and
// combine backward are these kernels with bf16 outputs).
__device__ inline void store_row_elem(real *p, real v) { *p = v; }
__device__ inline void store_row_elem(moe_bf16 *p, real v) { *p = moe_f32_to_bf16((float)v); }

template <typename Out>
static __global__ void k_gather_rows(Out *xp, const real *x, const int *row_token, size_t N,
                                     int d) {
    GRID_STRIDE(i, N * d) {
        const size_t r = i / d, c = i % d;
        store_row_elem(&xp[i], x[(size_t)row_token[r] * d + c]);
    }
}

template <typename Out>
static void gather_rows(moe_backend *be, Out *xp, const real *x, const int *row_token, int N,
                        int d) {
    const size_t n = (size_t)N * d;
    if (!n) return;
    k_gather_rows<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(
        xp, x, row_token, (size_t)N, d);
    CUDA_LAUNCHED(be, "k_gather_rows");
}

void cuda_moe_permute(moe_backend *be, real *xp, const real *x, const int *row_token, int N,
                      int d) {
    gather_rows(be, xp, x, row_token, N, d);
}

void cuda_moe_permute_bf16(moe_backend *be, moe_bf16 *xe16, const real *x, const int *row_token,
                           int N, int d) {
    gather_rows(be, xe16, x, row_token, N, d);
}

void cuda_moe_copy_chunks(moe_backend *be, real *dst, const real *src, const moe_row_chunk *chunks,
                          int n_chunks, int d) {
    for (int c = 0; c < n_chunks; c++) // host chunks: one device copy per block of rows
        if (chunks[c].rows > 0)
            CUDA_CHECK(cudaMemcpyAsync(dst + (size_t)chunks[c].dst * d,
                                       src + (size_t)chunks[c].src * d,
                                       (size_t)chunks[c].rows * d * sizeof(real),
                                       cudaMemcpyDeviceToDevice, cuda_stream(be)));
}

static __global__ void k_combine(real *out, const real *y, const real *weights,
                                 const int *assign_row, size_t T, int k, int d) {
    GRID_STRIDE(i, T * d) {
        const size_t t = i / d;
        out[i] = moe_hd_combine_elem(y, weights + t * k, assign_row + t * k, k, d, (int)(i % d));
    }
}

void cuda_moe_combine_forward(moe_backend *be, real *out, const real *y, const real *weights,
                              const int *assign_row, int T, int k, int d) {
    const size_t n = (size_t)T * d;
    if (!n) return;
    k_combine<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(
        out, y, weights, assign_row, (size_t)T, k, d);
    CUDA_LAUNCHED(be, "k_combine");
}

// One block per slot (t, j): dy[r,:] = w dout[t,:], dweights = dout[t,:] . y[r,:] (a block sum
// in a fixed order).
template <typename Out>
static __global__ void k_combine_backward(Out *dy, real *dweights, const real *dout, const real *y,
                                          const real *weights, const int *assign_row, int k,
                                          int d) {
    const size_t s = blockIdx.x;
    const int r = assign_row[s];
    if (r < 0) {
        if (threadIdx.x == 0) dweights[s] = 0;
        return; // uniform over the block
    }
    const real *g = dout + (s / k) * d, *yr = y + (size_t)r * d;
    Out *dyr = dy + (size_t)r * d;
    const real w = weights[s];
    real dot = 0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        dot += g[i] * yr[i];
        store_row_elem(&dyr[i], w * g[i]);
    }
    dot = block_sum(dot);
    if (threadIdx.x == 0) dweights[s] = dot;
}

template <typename Out>
static void combine_backward(moe_backend *be, Out *dy, real *dweights, const real *dout,
                             const real *y, const real *weights, const int *assign_row, int T,
                             int k, int d) {
    const size_t n = (size_t)T * k;
    if (!n) return;
    k_combine_backward<<<(unsigned)n, 128, 0, cuda_stream(be)>>>(dy, dweights, dout, y, weights,
                                                                 assign_row, k, d);
    CUDA_LAUNCHED(be, "k_combine_backward");
}

void cuda_moe_combine_backward(moe_backend *be, real *dy, real *dweights, const real *dout,
                               const real *y, const real *weights, const int *assign_row, int T,
                               int k, int d) {
    combine_backward(be, dy, dweights, dout, y, weights, assign_row, T, k, d);
}

void cuda_moe_combine_backward_bf16(moe_backend *be, moe_bf16 *dy16, real *dweights,
                                    const real *dout, const real *y, const real *weights,
                                    const int *assign_row, int T, int k, int d) {
    combine_backward(be, dy16, dweights, dout, y, weights, assign_row, T, k, d);
}

static __global__ void k_unpermute_add(real *dx, const real *dxp, const int *assign_row, size_t T,
                                       int k, int d) {
    GRID_STRIDE(i, T * d) {
        const size_t t = i / d;
        dx[i] = moe_hd_unpermute_elem(dx[i], dxp, assign_row + t * k, k, d, (int)(i % d));
    }
}

void cuda_moe_unpermute_add(moe_backend *be, real *dx, const real *dxp, const int *assign_row,
                            int T, int k, int d) {
    const size_t n = (size_t)T * d;
    if (!n) return;
    k_unpermute_add<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(
        dx, dxp, assign_row, (size_t)T, k, d);
    CUDA_LAUNCHED(be, "k_unpermute_add");
}
