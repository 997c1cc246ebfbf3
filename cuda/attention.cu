// Causal GQA attention on the GPU, twin of layers/cpu/attention.c, flash-style: nothing of
// size S x S exists anywhere.
//
// Forward: one block per query row (sequence, head, i); keys in tiles of ATT_TILE, one
// thread per key of the tile: scores, then an online softmax (a running max m and sum l,
// cuda/bodies.h moe_hd_online_max) and the running output acc = sum_j exp(s_j - m) v_j, one
// thread per output column. o = acc / l, lse = m + log l. The same kernel attends over the KV
// cache in inference (positions pos0 + i, keys from the cache).
// Backward (FlashAttention-2's rule, P recomputed from lse): D_i = dO_i . o_i first; then dq
// with one block per query row over its keys, and dk, dv with one block per key row over the
// queries at or after it of every query head of its group. Each output element is written by
// one thread that sums in a fixed order: deterministic, no atomics.
// Correctness first: a dot product per thread over hd (keys read by rows, through the cache);
// no tensor cores. head_dim <= ATT_MAX_HD.
// bf16 (DESIGN.md §5b): the same kernels instantiated for moe_bf16 q, k, v (do, o): inputs
// widened exactly, everything computed in fp32, and what enters a product rounded once
// (rounded<T>): E = exp(s - m) in the forward's P V, P in dv, dS in dq and dk, the CPU
// kernels' rule (layers/cpu/attention.c).
#include <math.h>

#include "cuda/cuda_kernels.cuh" // first: the C headers as C++
#include "cuda/bodies.h"
#include "cuda/reduce.cuh"
#include "layers/bf16.h"

#define ATT_TILE 128 // keys (queries in dk/dv) per tile = threads per block
#define ATT_MAX_HD 256
#define ATT_COLS (ATT_MAX_HD / ATT_TILE) // output columns per thread

// An input element widened (exact), and a value as it enters a product: itself in fp32, its
// bf16 rounding in the bf16 kernels.
__device__ static inline real widen(real x) { return x; }
__device__ static inline real widen(moe_bf16 x) { return (real)moe_bf16_to_f32(x); }
template <typename T> __device__ static inline real rounded(real x) { return x; }
template <> __device__ inline real rounded<moe_bf16>(real x) {
    return (real)moe_bf16_to_f32(moe_f32_to_bf16((float)x));
}
// Dot products and dS over hd: fp32 operands run cuda/bodies.h's (the tested host bodies),
// others widen element by element in the same order.
__device__ static inline real dot_t(const real *a, const real *b, int n) {
    return moe_hd_dot(a, b, n);
}
template <typename A, typename B>
__device__ static inline real dot_t(const A *a, const B *b, int n) {
    real s = 0;
    for (int c = 0; c < n; c++) s += widen(a[c]) * widen(b[c]);
    return s;
}
__device__ static inline real attn_ds_t(real *p, const real *q, const real *k, const real *v,
                                        const real *dO, int hd, real scale, real lse, real D) {
    return moe_hd_attn_ds(p, q, k, v, dO, hd, scale, lse, D);
}
template <typename A, typename B>
__device__ static inline real attn_ds_t(real *p, const A *q, const B *k, const B *v, const A *dO,
                                        int hd, real scale, real lse, real D) {
    *p = real_exp(scale * dot_t(q, k, hd) - lse);
    return *p * (dot_t(dO, v, hd) - D) * scale;
}

// Where one block's rows are: the query row, its keys and values, its output.
template <typename T> struct att_rows_t {
    const T *q; // query rows [*, q_stride], head offset included
    const T *k, *v;
    real *out;
    real *lse;      // [B, H, S] or NULL (inference)
    int q_stride;   // between query rows
    int kv_stride;  // between key (value) rows
    int out_stride; // between output rows
    int n_rows;     // query rows per (sequence, head): S, or n
    int H, group, hd;
    int pos0;             // position of query row 0 (keys 0..pos0+i)
    size_t seq_q, seq_kv; // offset between sequences (0 in inference)
    size_t seq_out;
    real scale;
};
typedef att_rows_t<real> att_rows;

// grid: (n_rows, H, B)
template <typename T> static __global__ void k_attention_forward(att_rows_t<T> a) {
    const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x, hd = a.hd;
    const int g = h / a.group, n_keys = a.pos0 + i + 1;
    __shared__ real q[ATT_MAX_HD], p[ATT_TILE];
    const T *qi = a.q + b * a.seq_q + (size_t)i * a.q_stride + (size_t)h * hd;
    const T *k = a.k + b * a.seq_kv + (size_t)g * hd, *v = a.v + b * a.seq_kv + (size_t)g * hd;
    for (int c = tid; c < hd; c += blockDim.x) q[c] = widen(qi[c]);
    __syncthreads();
    real m = -INFINITY, l = 0, acc[ATT_COLS] = {0};
    for (int j0 = 0; j0 < n_keys; j0 += ATT_TILE) {
        const int j = j0 + tid, n = n_keys - j0 < ATT_TILE ? n_keys - j0 : ATT_TILE;
        const real s = j < n_keys ? a.scale * dot_t(q, k + (size_t)j * a.kv_stride, hd) : -INFINITY;
        real alpha;
        const real mn = moe_hd_online_max(m, block_max(s), &alpha);
        const real pj = j < n_keys ? real_exp(s - mn) : 0;
        l = l * alpha + block_sum(pj);
        m = mn;
        p[tid] = rounded<T>(pj);
        __syncthreads();
        for (int cc = 0; cc < ATT_COLS; cc++) {
            const int c = tid + cc * ATT_TILE;
            if (c >= hd) break;
            real t = 0;
            for (int jj = 0; jj < n; jj++)
                t += p[jj] * widen(v[(size_t)(j0 + jj) * a.kv_stride + c]);
            acc[cc] = acc[cc] * alpha + t;
        }
        __syncthreads();
    }
    real *o = a.out + b * a.seq_out + (size_t)i * a.out_stride + (size_t)h * hd;
    for (int cc = 0; cc < ATT_COLS; cc++) {
        const int c = tid + cc * ATT_TILE;
        if (c < hd) o[c] = acc[cc] / l;
    }
    if (a.lse && tid == 0) a.lse[((size_t)b * a.H + h) * a.n_rows + i] = m + real_log(l);
}

static void check_hd(int hd) {
    if (hd > ATT_MAX_HD) moe_fatal("cuda attention: head_dim %d > %d", hd, ATT_MAX_HD);
}

template <typename T>
static void attention_forward(moe_backend *be, real *out, real *lse, const T *qkv,
                              moe_attention_shape sh) {
    const int B = sh.B, S = sh.S, H = sh.H, KV = sh.KV, hd = sh.hd;
    if (B <= 0 || S <= 0) return;
    check_hd(hd);
    const int row = (H + 2 * KV) * hd;
    att_rows_t<T> a = {};
    a.q = qkv, a.k = qkv + (size_t)H * hd, a.v = qkv + (size_t)(H + KV) * hd;
    a.out = out, a.lse = lse;
    a.q_stride = a.kv_stride = row, a.out_stride = H * hd;
    a.n_rows = S, a.H = H, a.group = H / KV, a.hd = hd, a.pos0 = 0;
    a.seq_q = a.seq_kv = (size_t)S * row, a.seq_out = (size_t)S * H * hd;
    a.scale = (real)(1.0 / sqrt((double)hd));
    k_attention_forward<T><<<dim3(S, H, B), ATT_TILE, 0, cuda_stream(be)>>>(a);
    CUDA_LAUNCHED(be, "k_attention_forward");
}
void cuda_attention_forward(moe_backend *be, real *out, real *lse, const real *qkv,
                            moe_attention_shape sh, real *scratch, size_t scratch_size) {
    (void)scratch, (void)scratch_size;
    attention_forward(be, out, lse, qkv, sh);
}
void cuda_attention_forward_bf16(moe_backend *be, real *out, real *lse, const moe_bf16 *qkv16,
                                 moe_attention_shape sh, real *scratch, size_t scratch_size) {
    (void)scratch, (void)scratch_size;
    attention_forward(be, out, lse, qkv16, sh);
}

size_t cuda_attention_scratch_size(moe_backend *be, int S, int hd) {
    (void)be, (void)S, (void)hd;
    return 1; // the kernels keep their tiles in shared memory; D lives in the backend's scratch
}

void cuda_attention_cached_forward(moe_backend *be, real *out, real *scratch, const real *qkv,
                                   const real *k_cache, const real *v_cache, int n, int pos0, int H,
                                   int KV, int hd) {
    (void)scratch;
    if (n <= 0) return;
    check_hd(hd);
    att_rows a = {}; // one sequence: its n new query rows over the cache's pos0 + n keys
    a.q = qkv, a.k = k_cache, a.v = v_cache, a.out = out, a.lse = NULL;
    a.q_stride = (H + 2 * KV) * hd, a.kv_stride = KV * hd, a.out_stride = H * hd;
    a.n_rows = n, a.H = H, a.group = H / KV, a.hd = hd, a.pos0 = pos0;
    a.scale = (real)(1.0 / sqrt((double)hd));
    k_attention_forward<real><<<dim3(n, H, 1), ATT_TILE, 0, cuda_stream(be)>>>(a);
    CUDA_LAUNCHED(be, "k_attention_forward (cached)");
}

static __global__ void k_kv_append(real *k_cache, real *v_cache, const real *qkv, size_t n,
                                   int pos0, int H, int KV, int hd) {
    const size_t row = (size_t)(H + 2 * KV) * hd, kv = (size_t)KV * hd;
    GRID_STRIDE(x, n * kv) {
        const size_t i = x / kv, c = x % kv;
        const real *k = qkv + i * row + (size_t)H * hd;
        k_cache[(pos0 + i) * kv + c] = k[c];
        v_cache[(pos0 + i) * kv + c] = k[kv + c];
    }
}
void cuda_kv_cache_append(moe_backend *be, real *k_cache, real *v_cache, const real *qkv, int n,
                          int pos0, int H, int KV, int hd) {
    const size_t total = (size_t)n * KV * hd;
    if (!total) return;
    k_kv_append<<<cuda_grid(total, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(
        k_cache, v_cache, qkv, (size_t)n, pos0, H, KV, hd);
    CUDA_LAUNCHED(be, "k_kv_append");
}

// ---- backward ----------------------------------------------------------------------------
// D [B, H, S]: D_i = dO_i . o_i; one block of 32 threads per row. grid (S, H, B)
template <typename T>
static __global__ void k_attention_D(real *D, const T *dout, const T *out, int S, int H, int hd) {
    const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const size_t at = ((size_t)b * S + i) * H * hd + (size_t)h * hd;
    real s = 0;
    for (int c = threadIdx.x; c < hd; c += blockDim.x)
        s += widen(dout[at + c]) * widen(out[at + c]);
    s = block_sum(s);
    if (threadIdx.x == 0) D[((size_t)b * H + h) * S + i] = s;
}

template <typename T> struct att_back {
    real *dqkv;
    const T *dout, *qkv;
    const real *lse, *D;
    int S, H, KV, hd, row;
    real scale;
};

// dq_i = sum_{j <= i} ds_ij k_j, ds_ij = P_ij (dP_ij - D_i) scale. grid (S, H, B)
template <typename T> static __global__ void k_attention_dq(att_back<T> a) {
    const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x, hd = a.hd;
    const int g = h / (a.H / a.KV);
    __shared__ real q[ATT_MAX_HD], dO[ATT_MAX_HD], ds[ATT_TILE];
    const size_t base = (size_t)b * a.S * a.row;
    const T *qi = a.qkv + base + (size_t)i * a.row + (size_t)h * hd;
    const T *k = a.qkv + base + (size_t)(a.H + g) * hd, *v = k + (size_t)a.KV * hd;
    const T *dOi = a.dout + ((size_t)b * a.S + i) * a.H * hd + (size_t)h * hd;
    for (int c = tid; c < hd; c += blockDim.x) q[c] = widen(qi[c]), dO[c] = widen(dOi[c]);
    const size_t li = ((size_t)b * a.H + h) * a.S + i;
    const real lse = a.lse[li], D = a.D[li];
    __syncthreads();
    real acc[ATT_COLS] = {0};
    for (int j0 = 0; j0 <= i; j0 += ATT_TILE) {
        const int j = j0 + tid, n = i + 1 - j0 < ATT_TILE ? i + 1 - j0 : ATT_TILE;
        real d = 0, p;
        if (j <= i)
            d = attn_ds_t(&p, (const real *)q, k + (size_t)j * a.row, v + (size_t)j * a.row,
                          (const real *)dO, hd, a.scale, lse, D);
        ds[tid] = rounded<T>(d);
        __syncthreads();
        for (int cc = 0; cc < ATT_COLS; cc++) {
            const int c = tid + cc * ATT_TILE;
            if (c >= hd) break;
            for (int jj = 0; jj < n; jj++)
                acc[cc] += ds[jj] * widen(k[(size_t)(j0 + jj) * a.row + c]);
        }
        __syncthreads();
    }
    real *dq = a.dqkv + base + (size_t)i * a.row + (size_t)h * hd;
    for (int cc = 0; cc < ATT_COLS; cc++) {
        const int c = tid + cc * ATT_TILE;
        if (c < hd) dq[c] = acc[cc];
    }
}

// dv_j = sum_h sum_{i >= j} P_ij dO_i,  dk_j = sum_h sum_{i >= j} ds_ij q_i over the group's
// query heads h in order. grid (S, KV, B)
template <typename T> static __global__ void k_attention_dkv(att_back<T> a) {
    const int j = blockIdx.x, g = blockIdx.y, b = blockIdx.z, tid = threadIdx.x, hd = a.hd;
    const int group = a.H / a.KV;
    __shared__ real kj[ATT_MAX_HD], vj[ATT_MAX_HD], p[ATT_TILE], ds[ATT_TILE];
    const size_t base = (size_t)b * a.S * a.row;
    const T *kr = a.qkv + base + (size_t)j * a.row + (size_t)(a.H + g) * hd;
    for (int c = tid; c < hd; c += blockDim.x)
        kj[c] = widen(kr[c]), vj[c] = widen(kr[(size_t)a.KV * hd + c]);
    __syncthreads();
    real dk[ATT_COLS] = {0}, dv[ATT_COLS] = {0};
    for (int h = g * group; h < (g + 1) * group; h++) {
        const T *q = a.qkv + base + (size_t)h * hd;
        const T *dO = a.dout + (size_t)b * a.S * a.H * hd + (size_t)h * hd;
        const real *lse = a.lse + ((size_t)b * a.H + h) * a.S,
                   *D = a.D + ((size_t)b * a.H + h) * a.S;
        for (int i0 = j; i0 < a.S; i0 += ATT_TILE) {
            const int i = i0 + tid, n = a.S - i0 < ATT_TILE ? a.S - i0 : ATT_TILE;
            real pi = 0, d = 0;
            if (i < a.S)
                d = attn_ds_t(&pi, q + (size_t)i * a.row, (const real *)kj, (const real *)vj,
                              dO + (size_t)i * a.H * hd, hd, a.scale, lse[i], D[i]);
            p[tid] = rounded<T>(pi), ds[tid] = rounded<T>(d);
            __syncthreads();
            for (int cc = 0; cc < ATT_COLS; cc++) {
                const int c = tid + cc * ATT_TILE;
                if (c >= hd) break;
                for (int ii = 0; ii < n; ii++) {
                    dv[cc] += p[ii] * widen(dO[(size_t)(i0 + ii) * a.H * hd + c]);
                    dk[cc] += ds[ii] * widen(q[(size_t)(i0 + ii) * a.row + c]);
                }
            }
            __syncthreads();
        }
    }
    real *dkr = a.dqkv + base + (size_t)j * a.row + (size_t)(a.H + g) * hd;
    for (int cc = 0; cc < ATT_COLS; cc++) {
        const int c = tid + cc * ATT_TILE;
        if (c < hd) dkr[c] = dk[cc], dkr[(size_t)a.KV * hd + c] = dv[cc];
    }
}

template <typename T>
static void attention_backward(moe_backend *be, real *dqkv, const T *dout, const T *qkv,
                               const T *out, const real *lse, moe_attention_shape sh) {
    const int B = sh.B, S = sh.S, H = sh.H, KV = sh.KV, hd = sh.hd;
    if (B <= 0 || S <= 0) return;
    check_hd(hd);
    cudaStream_t st = cuda_stream(be);
    real *D = (real *)cuda_work(be, (size_t)B * H * S * sizeof(real));
    k_attention_D<T><<<dim3(S, H, B), 32, 0, st>>>(D, dout, out, S, H, hd);
    CUDA_LAUNCHED(be, "k_attention_D");
    att_back<T> a = {
        dqkv, dout, qkv, lse, D, S, H, KV, hd, (H + 2 * KV) * hd, (real)(1.0 / sqrt((double)hd))};
    k_attention_dq<T><<<dim3(S, H, B), ATT_TILE, 0, st>>>(a);
    CUDA_LAUNCHED(be, "k_attention_dq");
    k_attention_dkv<T><<<dim3(S, KV, B), ATT_TILE, 0, st>>>(a);
    CUDA_LAUNCHED(be, "k_attention_dkv");
}
void cuda_attention_backward(moe_backend *be, real *dqkv, const real *dout, const real *qkv,
                             const real *out, const real *lse, moe_attention_shape sh,
                             real *scratch, size_t scratch_size) {
    (void)scratch, (void)scratch_size;
    attention_backward(be, dqkv, dout, qkv, out, lse, sh);
}
void cuda_attention_backward_bf16(moe_backend *be, real *dqkv, const moe_bf16 *dout16,
                                  const moe_bf16 *qkv16, const moe_bf16 *out16, const real *lse,
                                  moe_attention_shape sh, real *scratch, size_t scratch_size) {
    (void)scratch, (void)scratch_size;
    attention_backward(be, dqkv, dout16, qkv16, out16, lse, sh);
}

// ---- model.attention = "cudnn" -----------------------------------------------------------
// The bf16 entries through cuDNN's fused attention (cuda/attention_cudnn.cpp): q, k, v, o and
// do are read in bf16 where moe.c keeps them; cuDNN writes o and dq, dk, dv in bf16, widened
// here into the contract's fp32 out and dqkv. So out holds bf16-rounded values (the bf16
// o-projection rounds its input to bf16 anyway) and dqkv is rounded once more than the native
// twin's; lse is cuDNN's fp32 softmax statistics, log sum_j exp(S_ij) as the contract's.
#ifdef MOE_CUDNN
#include "cuda/attention_cudnn.h"

static cudnn_attention *cudnn_of(moe_backend *be) { return cuda_state_of(be)->cudnn; }

static void cudnn_attention_forward_entry(moe_backend *be, real *out, real *lse,
                                          const moe_bf16 *qkv16, moe_attention_shape sh,
                                          real *scratch, size_t scratch_size) {
    (void)scratch, (void)scratch_size;
    if (sh.B <= 0 || sh.S <= 0) return;
    const size_t n = (size_t)sh.B * sh.S * sh.H * sh.hd;
    moe_bf16 *o16 = (moe_bf16 *)cuda_work(be, n * sizeof(moe_bf16));
    char err[1024];
    if (cuda_cudnn_attention_forward(cudnn_of(be), o16, lse, qkv16, sh.B, sh.S, sh.H, sh.KV, sh.hd,
                                     err, sizeof err))
        moe_fatal("%s", err);
    cuda_from_bf16(be, out, o16, n);
}

static void cudnn_attention_backward_entry(moe_backend *be, real *dqkv, const moe_bf16 *dout16,
                                           const moe_bf16 *qkv16, const moe_bf16 *out16,
                                           const real *lse, moe_attention_shape sh, real *scratch,
                                           size_t scratch_size) {
    (void)scratch, (void)scratch_size;
    if (sh.B <= 0 || sh.S <= 0) return;
    const size_t n = (size_t)sh.B * sh.S * (sh.H + 2 * sh.KV) * sh.hd;
    moe_bf16 *dqkv16 = (moe_bf16 *)cuda_work(be, n * sizeof(moe_bf16));
    char err[1024];
    if (cuda_cudnn_attention_backward(cudnn_of(be), dqkv16, dout16, qkv16, out16, lse, sh.B, sh.S,
                                      sh.H, sh.KV, sh.hd, err, sizeof err))
        moe_fatal("%s", err);
    cuda_from_bf16(be, dqkv, dqkv16, n);
}

moe_status cuda_cudnn_enable(moe_backend *be) {
    char err[512];
    cuda_state *s = cuda_state_of(be);
    s->cudnn = cuda_cudnn_attention_create(s->stream, err, sizeof err);
    if (!s->cudnn) return moe_error(MOE_EINVAL, "model.attention = \"cudnn\": %s", err);
    be->attention_forward_bf16 = cudnn_attention_forward_entry;
    be->attention_backward_bf16 = cudnn_attention_backward_entry;
    return MOE_OK;
}
void cuda_cudnn_destroy(cudnn_attention *a) { cuda_cudnn_attention_destroy(a); }
const char *cuda_cudnn_describe(cudnn_attention *a) { return cuda_cudnn_attention_describe(a); }
#else
moe_status cuda_cudnn_enable(moe_backend *be) {
    (void)be;
    return moe_error(MOE_EINVAL,
                     "model.attention = \"cudnn\": this build has no cuDNN attention (configure "
                     "with -DMOE_CUDNN=ON where cuDNN 9 and the cudnn-frontend headers are "
                     "installed: docs/gpu.md); model.attention = \"native\" runs without it");
}
void cuda_cudnn_destroy(struct cudnn_attention *a) { (void)a; }
const char *cuda_cudnn_describe(struct cudnn_attention *a) {
    (void)a;
    return "native";
}
#endif
