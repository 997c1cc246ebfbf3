// Causal multi-head self-attention with grouped-query heads, flash-style: nothing of size
// S x S is kept. Rows of qkv are [q (H heads) | k (KV heads) | v (KV heads)].
//
// forward:  S_ij = q_i . k_j / sqrt(hd) (j <= i), lse_i = log sum_j exp(S_ij),
//           P_ij = exp(S_ij - lse_i), o_i = sum_j P_ij v_j; keeps o and lse.
// backward: recomputes P = exp(S - lse) per query block, then (FlashAttention-2)
//           D_i = do_i . o_i (= rowsum(dP * P)), dP = do v^T, dv = P^T do,
//           dS = P * (dP - D), dq = dS k / sqrt(hd), dk = dS^T q / sqrt(hd);
//           a kv head sums over the H/KV query heads that share it.
// The exp loops vectorise: layers/cpu/ is compiled with -fno-trapping-math (CMakeLists.txt;
// measured at B=4, S=1024, H=4, hd=32: backward 153 -> 75 ms).
#include "layers/cpu/cblas.h"
#include <math.h>
#include <omp.h>
#include <string.h>

#include "layers/bf16.h"
#include "layers/cpu/cpu_backend.h"
#include "layers/cpu/cpu_kernels.h"
#include "layers/cpu/vec_math.h"
#include "layers/status.h"

#ifdef MOE_REAL_DOUBLE
#define cblas_gemm cblas_dgemm
#else
#define cblas_gemm cblas_sgemm
#endif

// A causal row's loops: entries (last, w) are set to -inf, so the loops run over [0, w)
// without a condition (vec_exp(-inf) = 0), w = last + 1 rounded up to 16 floats (a whole
// AVX-512 vector; at most len); entries from w on are simply 0. A loop to `last`, which ends
// anywhere, left a scalar remainder of up to 15 exps per row, a masked loop was split back
// into two by GCC, and a loop over the whole block computed its masked triangle (a quarter
// of the elementwise work at S = 256).
static int row_width(int last, int len) {
    const int w = (last + 16) & ~15;
    return w < len ? w : len;
}
static void mask_row(real *p, int last, int w) {
    for (int j = last + 1; j < w; j++) p[j] = -INFINITY;
}
static void zero_tail(real *p, int w, int len) {
    for (int j = w; j < len; j++) p[j] = 0;
}
static void zero_tail16(moe_bf16 *p, int w, int len) {
    for (int j = w; j < len; j++) p[j] = 0;
}

// A row's max over [0, w) and its exps: e_j = exp(s_j - mx) into e (fp32, may be s) and/or
// e16 (rounded to bf16), returning sum_j e_j. The loops vectorise: vec_exp instead of libm,
// and simd reductions (lane-wise partial sums, a fixed order); with AVX-512, 16 lanes by hand
// (vec_math.h: the sum's lanes then added pairwise, where `omp simd` added them one by one,
// which at these row lengths cost as much as the exps: bf16 forward 4.05-4.4 -> 3.1-3.3 ms a
// call at shakespeare's shape on one thread).
static real row_max(const real *s, int w) {
#ifdef MOE_VEC16
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < w; j += 16) {
        const __mmask16 k = vec_lanes16(j, w);
        m = _mm512_mask_max_ps(m, k, _mm512_maskz_loadu_ps(k, s + j), m);
    }
    return _mm512_reduce_max_ps(m);
#else
    real mx = s[0];
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < w; j++) mx = s[j] > mx ? s[j] : mx;
    return mx;
#endif
}

static real exp_sum(real *e, moe_bf16 *e16, const real *s, real mx, int w) {
#ifdef MOE_VEC16
    const __m512 m = _mm512_set1_ps(mx);
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < w; j += 16) {
        const __mmask16 k = vec_lanes16(j, w);
        const __m512 x = vec_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), m));
        acc = _mm512_mask_add_ps(acc, k, acc, x);
        if (e) _mm512_mask_storeu_ps(e + j, k, x);
        if (e16) _mm256_mask_storeu_epi16(e16 + j, k, vec_to_bf16_16_normal(x));
    }
    return _mm512_reduce_add_ps(acc);
#else
    real sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < w; j++) {
        const real x = vec_exp(s[j] - mx);
        sum += x;
        if (e) e[j] = x;
        if (e16) e16[j] = moe_f32_to_bf16((float)x);
    }
    return sum;
#endif
}

// One row of scores in place: softmax over columns 0..last, zero beyond (the causal mask);
// returns the row's log-sum-exp, max + log(sum exp(p - max)).
static real causal_softmax_row(real *p, int last, int len) {
    const int w = row_width(last, len);
    mask_row(p, last, w);
    const real mx = row_max(p, w), sum = exp_sum(p, NULL, p, mx, w), inv = 1 / sum;
#pragma omp simd
    for (int j = 0; j < w; j++) p[j] *= inv;
    zero_tail(p, w, len);
    return mx + real_log(sum);
}

// sum_c a_c b_c (FlashAttention-2's D_i = do_i . o_i), bf16 operands widened exactly; with
// AVX-512 in 16 lanes added pairwise at the end, as exp_sum.
static real dot(const real *a, const real *b, int n) {
#ifdef MOE_VEC16
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < n; c += 16) {
        const __mmask16 k = vec_lanes16(c, n);
        acc = _mm512_add_ps(
            acc, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, a + c), _mm512_maskz_loadu_ps(k, b + c)));
    }
    return _mm512_reduce_add_ps(acc);
#else
    real sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < n; c++) sum += a[c] * b[c];
    return sum;
#endif
}

static real dot_bf16(const moe_bf16 *a, const moe_bf16 *b, int n) {
#ifdef MOE_VEC16
    __m512 acc = _mm512_setzero_ps();
    for (int c = 0; c < n; c += 16) {
        const __mmask16 k = vec_lanes16(c, n);
        acc =
            _mm512_add_ps(acc, _mm512_mul_ps(vec_from_bf16_16(_mm256_maskz_loadu_epi16(k, a + c)),
                                             vec_from_bf16_16(_mm256_maskz_loadu_epi16(k, b + c))));
    }
    return _mm512_reduce_add_ps(acc);
#else
    real sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < n; c++) sum += moe_bf16_to_f32(a[c]) * moe_bf16_to_f32(b[c]);
    return sum;
#endif
}

// Causal attention works in blocks of query rows: rows [i0, i0+n) attend to columns [0, i0+n)
// only, so the GEMMs skip the masked upper triangle beyond each block (62.5% of the full
// S x S work when S is 4 blocks, 53% at 16; measured at S = 256, H = 6, hd = 32: fwd+bwd
// 7.6 -> 5.6 ms). Within a block the few masked entries are computed and then zeroed (the
// fp32 products of attention_gemm.c skip them by tiles of rows).
// A block's scores [n, cols] live in a per-thread slot of the scratch and are never kept:
// a slot is [2, ATTN_BLOCK, S] (P and dP of the backward; the forward uses the first half),
// and more below for each precision.
// One slot holds a whole row block, so each block is one GEMM per product (no online
// rescaling of partial outputs, which on the CPU would cut the GEMMs into ATTN_BLOCK^2
// pieces); scratch grows with threads x S, not with B H S^2.
#define ATTN_BLOCK 64

// Every slot begins with what it keeps across the blocks its thread runs in one call (reset as
// the call begins): the fp32 kernels' k^T and v^T of one kv head, columns [0, cols) packed
// from the rows at src. A thread's next block is mostly of the same kv head (a forward's next
// query block, a backward's next query head of the group), and packing k^T for each block
// again took 7% of fp32 attention's time (shakespeare's shape, Xeon).
typedef struct {
    const real *src;
    int cols;
} packed_rows;
typedef struct {
    packed_rows kt, vt;
} slot_head;
#define SLOT_HEAD_REALS 16 // sizeof(slot_head), rounded up to 64 bytes of floats
_Static_assert(sizeof(slot_head) <= SLOT_HEAD_REALS * sizeof(float), "slot_head");

// A thread's share of the scratch: its head, then `slot` reals, rounded up to 16 reals so that
// every head (pointers) and slot starts 64-byte aligned from the scratch's start.
static size_t stride_of(size_t slot) { return SLOT_HEAD_REALS + ((slot + 15) & ~(size_t)15); }

// The fp32 kernels' row stride for `cols` columns: whole 16-float vectors, and never a multiple
// of 128 floats. Rows 512 B apart (or 2^k times that) fall in the same few L1 sets: the rows
// of p that a tile of p v broadcasts from, the n rows p^T do reads down a column, the hd rows
// of k^T in q k^T. One thread, 64 x 2048 blocks, GFLOP/s, stride 2048 -> 2064: AVX-512 q k^T
// 111 -> 127, p v 135 -> 147, p^T do 113 -> 124; AVX2 67 -> 76, 80 -> 79, 67 -> 79.
static int ld_of(int cols) {
    const int ld = (cols + 15) & ~15;
    return ld % 128 ? ld : ld + 16;
}

// The fp32 kernels' slot: P and dP (dS) [2, ATTN_BLOCK, ld], then k^T and v^T [2, hd, ld],
// ld = ld_of(S).
static size_t slot_reals(int S, int hd) {
    return (2 * (size_t)ATTN_BLOCK + 2 * (size_t)hd) * (size_t)ld_of(S);
}

// The bf16 kernels' slot: P and dP (dS) in fp32 as above, their bf16 roundings [2, ATTN_BLOCK,
// S] (half as many reals), and the emulated bf16 GEMM's widened operands (the largest of the
// block's GEMMs: [n, hd] x [cols, hd], [n, cols] x [cols, hd], [n, cols]^T x [n, hd]).
static size_t ws_reals(int S, int hd) {
    size_t w = cpu_gemm_bf16_ws(ATTN_BLOCK, S, hd), w2 = cpu_gemm_bf16_ws(ATTN_BLOCK, hd, S),
           w3 = cpu_gemm_bf16_ws(S, hd, ATTN_BLOCK);
    w = w2 > w ? w2 : w;
    return w3 > w ? w3 : w;
}
static size_t slot16_reals(int S, int hd) { return (size_t)3 * ATTN_BLOCK * S + ws_reals(S, hd); }

size_t cpu_attention_scratch_size(moe_backend *be, int S, int hd) {
    const size_t a = slot_reals(S, hd), b = slot16_reals(S, hd);
    return (size_t)((const cpu_state *)be->state)->threads * stride_of(a > b ? a : b);
}

// Thread t's slot: its head, then `slot` reals.
static slot_head *head_at(real *scratch, size_t slot, int t) {
    return (slot_head *)(scratch + (size_t)t * stride_of(slot));
}

// Threads for a loop over `tasks`: at most one per slot (its head and `slot` reals) of the
// scratch; 1 below the fork threshold (the `if` of the loop then runs it on the calling
// thread, slot 0). Each slot's head is reset.
static int attention_threads(real *scratch, size_t scratch_size, size_t slot, int S,
                             const char *who) {
    const size_t slots = scratch_size / stride_of(slot);
    if (slots < 1)
        moe_fatal("%s: scratch of %zu reals is below one slot (%zu) for S = %d", who, scratch_size,
                  stride_of(slot), S);
    const int nt = slots < (size_t)omp_get_max_threads() ? (int)slots : omp_get_max_threads();
    for (int t = 0; t < nt; t++) {
        slot_head *h = head_at(scratch, slot, t);
        h->kt.src = h->vt.src = NULL, h->kt.cols = h->vt.cols = 0;
    }
    return nt;
}

// ---- the task loops, shared by both precisions -------------------------------------------

typedef struct {
    int B, S, H, KV, hd;
    int row;    // (H + 2 KV) hd, the length of a qkv row
    real scale; // hd^-1/2
} attn_shape;

static attn_shape shape_of(moe_attention_shape sh) {
    const attn_shape a = {sh.B,
                          sh.S,
                          sh.H,
                          sh.KV,
                          sh.hd,
                          (sh.H + 2 * sh.KV) * sh.hd,
                          (real)(1.0 / sqrt((double)sh.hd))};
    return a;
}

// One query block of one head, as element offsets: q of the block's rows and k, v of its kv
// head from the sequence's first row (into qkv rows, and into dqkv for their gradients); o of
// the block's rows (into out and dout rows [T, H hd]); l of its first row (into lse). Rows
// i0 .. i0+n-1 attend to the columns [0, cols).
typedef struct {
    size_t q, k, v, o, l;
    int i0, n, cols;
} attn_block;

static attn_block block_at(const attn_shape *a, int b, int h, int i0) {
    attn_block k;
    k.i0 = i0, k.n = a->S - i0 < ATTN_BLOCK ? a->S - i0 : ATTN_BLOCK, k.cols = i0 + k.n;
    k.q = ((size_t)b * a->S + i0) * a->row + (size_t)h * a->hd;
    k.k = (size_t)b * a->S * a->row + (size_t)(a->H + h / (a->H / a->KV)) * a->hd;
    k.v = k.k + (size_t)a->KV * a->hd;
    k.o = ((size_t)b * a->S + i0) * a->H * a->hd + (size_t)h * a->hd;
    k.l = ((size_t)b * a->H + h) * a->S + i0;
    return k;
}

// The work of one block, on the calling thread's slot of the scratch (head: its head).
typedef void (*block_fn)(const void *ctx, const attn_shape *a, const attn_block *k, slot_head *head,
                         real *slot);

static int worth_threads(const attn_shape *a) {
    return cpu_parallel_worth((size_t)a->B * a->H * a->S * a->S * a->hd);
}

// The forward: one task per (sequence, head, query block); each owns its rows of out and lse.
static void forward_tasks(const attn_shape *a, real *scratch, size_t scratch_size, size_t slot,
                          const char *who, block_fn fn, const void *ctx) {
    const int nt = attention_threads(scratch, scratch_size, slot, a->S, who);
    const int nb = (a->S + ATTN_BLOCK - 1) / ATTN_BLOCK;
#pragma omp parallel for collapse(3) schedule(dynamic, 1) num_threads(nt) if (worth_threads(a))
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < a->H; h++)
            for (int blk = 0; blk < nb; blk++) {
                const attn_block k = block_at(a, b, h, blk * ATTN_BLOCK);
                slot_head *head = head_at(scratch, slot, omp_get_thread_num());
                fn(ctx, a, &k, head, (real *)head + SLOT_HEAD_REALS);
            }
}

// The backward: one task per (sequence, kv head); it zeroes dk and dv of that head and the
// blocks of its query heads sum into them in a fixed order (no races, no atomics).
static void backward_tasks(const attn_shape *a, real *dqkv, real *scratch, size_t scratch_size,
                           size_t slot, const char *who, block_fn fn, const void *ctx) {
    const int nt = attention_threads(scratch, scratch_size, slot, a->S, who), group = a->H / a->KV;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nt) if (worth_threads(a))
    for (int b = 0; b < a->B; b++)
        for (int g = 0; g < a->KV; g++) {
            const attn_block first = block_at(a, b, g * group, 0);
            for (int t = 0; t < a->S; t++) {
                memset(dqkv + first.k + (size_t)t * a->row, 0, (size_t)a->hd * sizeof(real));
                memset(dqkv + first.v + (size_t)t * a->row, 0, (size_t)a->hd * sizeof(real));
            }
            for (int h = g * group; h < (g + 1) * group; h++)
                for (int i0 = 0; i0 < a->S; i0 += ATTN_BLOCK) {
                    const attn_block k = block_at(a, b, h, i0);
                    slot_head *head = head_at(scratch, slot, omp_get_thread_num());
                    fn(ctx, a, &k, head, (real *)head + SLOT_HEAD_REALS);
                }
        }
}

// ---- fp32 --------------------------------------------------------------------------------

// The forward writes out and lse_out; the backward reads dout, o and lse, writes dqkv.
typedef struct {
    real *out, *lse_out, *dqkv;
    const real *qkv, *dout, *o, *lse;
} tensors32;

// b^T [hd, ld_of(S)] of the rows from b in *bt, its columns [0, cols) packed, those of earlier
// blocks of the same kv head kept (p's head, slot_head).
static const real *packed_t(packed_rows *pk, real *bt, const real *b, const attn_shape *a,
                            int cols) {
    if (pk->src != b) pk->src = b, pk->cols = 0;
    if (pk->cols < cols) {
        cpu_attention_transpose(bt, ld_of(a->S), b, a->row, pk->cols, cols, a->hd);
        pk->cols = cols;
    }
    return bt;
}

// p [n, cols] = scale * q_block k^T; softmax row by row; o_block = p v
// (attention_gemm.c's products: the causal triangle skipped)
static void forward_block32(const void *ctx, const attn_shape *a, const attn_block *k,
                            slot_head *head, real *p) {
    const tensors32 *t = ctx;
    const int n = k->n, cols = k->cols, hd = a->hd, row = a->row, ld = ld_of(cols),
              ldS = ld_of(a->S);
    const real *kt = packed_t(&head->kt, p + (size_t)2 * ATTN_BLOCK * ldS, t->qkv + k->k, a, cols);
    cpu_attention_gemm(CPU_ATTN_CAUSAL_COLS, k->i0, n, cols, hd, a->scale, t->qkv + k->q,
                       (size_t)row, 1, kt, ldS, 0, p, ld);
    for (int i = 0; i < n; i++)
        t->lse_out[k->l + i] = causal_softmax_row(p + (size_t)i * ld, k->i0 + i, cols);
    cpu_attention_gemm(CPU_ATTN_CAUSAL_L_HI, k->i0, n, hd, cols, 1, p, (size_t)ld, 1, t->qkv + k->v,
                       row, 0, t->out + k->o, a->H * hd);
}

void cpu_attention_forward(moe_backend *be, real *out, real *lse, const real *qkv,
                           moe_attention_shape sh, real *scratch, size_t scratch_size) {
    CPU_KERNEL(be);
    const attn_shape a = shape_of(sh);
    const tensors32 t = {out, lse, NULL, qkv, NULL, NULL, NULL};
    forward_tasks(&a, scratch, scratch_size, slot_reals(sh.S, sh.hd), "attention_forward",
                  forward_block32, &t);
}

static void backward_block32(const void *ctx, const attn_shape *a, const attn_block *k,
                             slot_head *head, real *p) {
    const tensors32 *t = ctx;
    const int n = k->n, cols = k->cols, hd = a->hd, row = a->row, orow = a->H * hd, i0 = k->i0,
              ld = ld_of(cols), ldS = ld_of(a->S);
    const real *q = t->qkv + k->q, *kk = t->qkv + k->k, *v = t->qkv + k->v, *dO = t->dout + k->o;
    real *ds = p + (size_t)ATTN_BLOCK * ldS, *bt = p + (size_t)2 * ATTN_BLOCK * ldS;
    const real *kt = packed_t(&head->kt, bt, kk, a, cols),
               *vt = packed_t(&head->vt, bt + (size_t)hd * ldS, v, a, cols);
    // p [n, cols] = exp(scale * q_block k^T - lse), 0 beyond the diagonal
    cpu_attention_gemm(CPU_ATTN_CAUSAL_COLS, i0, n, cols, hd, a->scale, q, (size_t)row, 1, kt, ldS,
                       0, p, ld);
    for (int i = 0; i < n; i++) {
        const int last = i0 + i, w = row_width(last, cols);
        real *pi = p + (size_t)i * ld;
        mask_row(pi, last, w);
        exp_sum(pi, NULL, pi, t->lse[k->l + i], w);
        zero_tail(pi, w, cols);
    }
    // dp = dO v^T; dv += p^T dO (over the block's columns)
    cpu_attention_gemm(CPU_ATTN_CAUSAL_COLS, i0, n, cols, hd, 1, dO, (size_t)orow, 1, vt, ldS, 0,
                       ds, ld);
    cpu_attention_gemm(CPU_ATTN_CAUSAL_L_LO, i0, cols, hd, n, 1, p, 1, (size_t)ld, dO, orow, 1,
                       t->dqkv + k->v, row);
    // ds = p * (dp - D) * scale, D_i = dO_i . o_i; masked entries have p = 0
    for (int i = 0; i < n; i++) {
        const real *oi = t->o + k->o + (size_t)i * orow, *dOi = dO + (size_t)i * orow,
                   *pi = p + (size_t)i * ld;
        real *dsi = ds + (size_t)i * ld;
        const real D = dot(dOi, oi, hd);
        const int w = row_width(i0 + i, cols);
#pragma omp simd
        for (int j = 0; j < w; j++) dsi[j] = pi[j] * (dsi[j] - D) * a->scale;
        zero_tail(dsi, w, cols);
    }
    // dq = ds k; dk += ds^T q
    cpu_attention_gemm(CPU_ATTN_CAUSAL_L_HI, i0, n, hd, cols, 1, ds, (size_t)ld, 1, kk, row, 0,
                       t->dqkv + k->q, row);
    cpu_attention_gemm(CPU_ATTN_CAUSAL_L_LO, i0, cols, hd, n, 1, ds, 1, (size_t)ld, q, row, 1,
                       t->dqkv + k->k, row);
}

void cpu_attention_backward(moe_backend *be, real *dqkv, const real *dout, const real *qkv,
                            const real *out, const real *lse, moe_attention_shape sh, real *scratch,
                            size_t scratch_size) {
    CPU_KERNEL(be);
    const attn_shape a = shape_of(sh);
    const tensors32 t = {NULL, NULL, dqkv, qkv, dout, out, lse};
    backward_tasks(&a, dqkv, scratch, scratch_size, slot_reals(sh.S, sh.hd), "attention_backward",
                   backward_block32, &t);
}

// ---- bf16 (DESIGN.md §5b) ------------------------------------------------------------
// The same blocks with q, k, v (and do, o) read as bf16 and every product a bf16 GEMM with
// fp32 accumulation (cpu_gemm_bf16), as FlashAttention-2 runs in bf16 on a GPU: scores,
// softmax statistics, D and dS are fp32; what enters a GEMM is rounded once (E = exp(S - m)
// unnormalised, P and dS of the backward).

// One row of scores: e_j = exp(s_j - max) for j <= last, rounded into e16 (0 beyond: the
// causal mask); *inv = 1 / sum_j e_j over the unrounded e_j; returns max + log(sum).
// The mask as causal_softmax_row's (s is overwritten beyond last).
static real exp_row_bf16(moe_bf16 *e16, real *inv, real *s, int last, int len) {
    const int w = row_width(last, len);
    mask_row(s, last, w);
    const real mx = row_max(s, w), sum = exp_sum(NULL, e16, s, mx, w);
    zero_tail16(e16, w, len);
    *inv = 1 / sum;
    return mx + real_log(sum);
}

// As tensors32, with the backend's state for its bf16 GEMM path.
typedef struct {
    const cpu_state *st;
    real *out, *lse_out, *dqkv;
    const moe_bf16 *qkv, *dout, *o;
    const real *lse;
} tensors16;

// The AMX forward's softmax (cpu_amx_attention_forward_block) of rows r0 .. of block k.
typedef struct {
    const tensors16 *t;
    const attn_block *k;
} softmax_ctx;

#ifndef MOE_REAL_DOUBLE
static void softmax_rows16(const void *ctx, float *s, int lds, moe_bf16 *e16, int lde, float *inv,
                           int r0, int rows) {
    const softmax_ctx *x = ctx;
    for (int r = 0; r < rows; r++)
        x->t->lse_out[x->k->l + r0 + r] = exp_row_bf16(
            e16 + (size_t)r * lde, inv + r, s + (size_t)r * lds, x->k->i0 + r0 + r, x->k->cols);
}
#endif

// On the AMX path: the block in one call, the scores and the output never stored to memory
// in fp32 (the same bits); 0 elsewhere.
static int forward_amx(const tensors16 *t, const attn_shape *a, const attn_block *k) {
#ifdef MOE_REAL_DOUBLE
    (void)t, (void)a, (void)k;
    return 0;
#else
    if (t->st->bf16_native != CPU_BF16_AMX || t->st->row_invariant) return 0;
    const softmax_ctx ctx = {t, k};
    const cpu_amx_attn_fwd x = {.n = k->n,
                                .cols = k->cols,
                                .hd = a->hd,
                                .scale = a->scale,
                                .q = t->qkv + k->q,
                                .ldq = a->row,
                                .k = t->qkv + k->k,
                                .v = t->qkv + k->v,
                                .ldk = a->row,
                                .out = t->out + k->o,
                                .ldo = a->H * a->hd,
                                .softmax = softmax_rows16,
                                .ctx = &ctx};
    return cpu_amx_attention_forward_block(&x);
#endif
}

// p [n, cols] = scale * q_block k^T; e16 = bf16(exp(p - max)); o = (e16 v) / sum
static void forward_block16(const void *ctx, const attn_shape *a, const attn_block *k,
                            slot_head *head, real *p) {
    (void)head;
    const tensors16 *t = ctx;
    if (forward_amx(t, a, k)) return;
    const int n = k->n, cols = k->cols, hd = a->hd, row = a->row, orow = a->H * hd;
    moe_bf16 *e16 = (moe_bf16 *)(p + (size_t)2 * ATTN_BLOCK * a->S);
    real *ws = p + (size_t)3 * ATTN_BLOCK * a->S, *o = t->out + k->o, inv[ATTN_BLOCK];
    cpu_gemm_bf16(t->st, ws, 0, 1, n, cols, hd, a->scale, t->qkv + k->q, row, t->qkv + k->k, row, 0,
                  p, cols);
    for (int i = 0; i < n; i++)
        t->lse_out[k->l + i] =
            exp_row_bf16(e16 + (size_t)i * cols, inv + i, p + (size_t)i * cols, k->i0 + i, cols);
    cpu_gemm_bf16(t->st, ws, 0, 0, n, hd, cols, 1, e16, cols, t->qkv + k->v, row, 0, o, orow);
    for (int i = 0; i < n; i++)
#pragma omp simd
        for (int c = 0; c < hd; c++) o[(size_t)i * orow + c] *= inv[i];
}

void cpu_attention_forward_bf16(moe_backend *be, real *out, real *lse, const moe_bf16 *qkv16,
                                moe_attention_shape sh, real *scratch, size_t scratch_size) {
    CPU_KERNEL(be);
    const attn_shape a = shape_of(sh);
    const tensors16 t = {be->state, out, lse, NULL, qkv16, NULL, NULL, NULL};
    forward_tasks(&a, scratch, scratch_size, slot16_reals(sh.S, sh.hd), "attention_forward_bf16",
                  forward_block16, &t);
}

// D_i = dO_i . o_i of the block's row i (FlashAttention-2's rowsum(dP * P)), both bf16,
// summed in fp32
static real row_D(const tensors16 *t, const attn_shape *a, const attn_block *k, int i) {
    const size_t at = k->o + (size_t)i * a->H * a->hd;
    return dot_bf16(t->dout + at, t->o + at, a->hd);
}

// On the AMX path: p16 and ds16 of the block straight from the tiles of S and dP
// (cpu_amx_attention_scores_bwd, the same bits); 0 elsewhere (the loops below do it).
static int softmax_backward_amx(const tensors16 *t, const attn_shape *a, const attn_block *k,
                                moe_bf16 *p16, moe_bf16 *ds16) {
#ifdef MOE_REAL_DOUBLE // (the f64 build's bf16 GEMMs are the emulated path's)
    (void)t, (void)a, (void)k, (void)p16, (void)ds16;
    return 0;
#else
    if (t->st->bf16_native != CPU_BF16_AMX || t->st->row_invariant) return 0;
    real D[ATTN_BLOCK];
    for (int i = 0; i < k->n; i++) D[i] = row_D(t, a, k, i);
    const cpu_amx_attn_bwd x = {.n = k->n,
                                .cols = k->cols,
                                .hd = a->hd,
                                .i0 = k->i0,
                                .scale = a->scale,
                                .q = t->qkv + k->q,
                                .dO = t->dout + k->o,
                                .ldq = a->row,
                                .ldo = a->H * a->hd,
                                .k = t->qkv + k->k,
                                .v = t->qkv + k->v,
                                .ldk = a->row,
                                .lse = t->lse + k->l,
                                .D = D,
                                .p16 = p16,
                                .ds16 = ds16,
                                .ld16 = k->cols};
    return cpu_amx_attention_scores_bwd(&x);
#endif
}

static void backward_block16(const void *ctx, const attn_shape *a, const attn_block *k,
                             slot_head *head, real *p) {
    (void)head;
    const tensors16 *t = ctx;
    const int n = k->n, cols = k->cols, hd = a->hd, row = a->row, orow = a->H * hd;
    const moe_bf16 *q = t->qkv + k->q, *kk = t->qkv + k->k, *v = t->qkv + k->v,
                   *dO = t->dout + k->o;
    real *ds = p + (size_t)ATTN_BLOCK * a->S, *ws = p + (size_t)3 * ATTN_BLOCK * a->S;
    moe_bf16 *p16 = (moe_bf16 *)(p + (size_t)2 * ATTN_BLOCK * a->S),
             *ds16 = p16 + (size_t)ATTN_BLOCK * a->S;
    if (!softmax_backward_amx(t, a, k, p16, ds16)) {
        // p [n, cols] = exp(scale * q_block k^T - lse), 0 beyond the diagonal; p16 = bf16(p)
        cpu_gemm_bf16(t->st, ws, 0, 1, n, cols, hd, a->scale, q, row, kk, row, 0, p, cols);
        for (int i = 0; i < n; i++) {
            const int last = k->i0 + i, w = row_width(last, cols);
            real *pi = p + (size_t)i * cols;
            moe_bf16 *pi16 = p16 + (size_t)i * cols;
            mask_row(pi, last, w);
            exp_sum(pi, pi16, pi, t->lse[k->l + i], w);
            zero_tail16(pi16, w, cols);
        }
        // dp = dO v^T; ds16 = bf16(p * (dp - D) * scale), D_i = dO_i . o_i (both bf16, summed
        // in fp32); masked entries have p = 0
        cpu_gemm_bf16(t->st, ws, 0, 1, n, cols, hd, 1, dO, orow, v, row, 0, ds, cols);
        for (int i = 0; i < n; i++) {
            const real *pi = p + (size_t)i * cols, *dsi = ds + (size_t)i * cols;
            moe_bf16 *dsi16 = ds16 + (size_t)i * cols;
            const int w = row_width(k->i0 + i, cols);
            const real D = row_D(t, a, k, i);
#pragma omp simd
            for (int j = 0; j < w; j++)
                dsi16[j] = moe_f32_to_bf16((float)(pi[j] * (dsi[j] - D) * a->scale));
            zero_tail16(dsi16, w, cols);
        }
    }
    // dv += p16^T dO
    cpu_gemm_bf16(t->st, ws, 1, 0, cols, hd, n, 1, p16, cols, dO, orow, 1, t->dqkv + k->v, row);
    // dq = ds16 k; dk += ds16^T q
    cpu_gemm_bf16(t->st, ws, 0, 0, n, hd, cols, 1, ds16, cols, kk, row, 0, t->dqkv + k->q, row);
    cpu_gemm_bf16(t->st, ws, 1, 0, cols, hd, n, 1, ds16, cols, q, row, 1, t->dqkv + k->k, row);
}

void cpu_attention_backward_bf16(moe_backend *be, real *dqkv, const moe_bf16 *dout16,
                                 const moe_bf16 *qkv16, const moe_bf16 *out16, const real *lse,
                                 moe_attention_shape sh, real *scratch, size_t scratch_size) {
    CPU_KERNEL(be);
    const attn_shape a = shape_of(sh);
    const tensors16 t = {be->state, NULL, NULL, dqkv, qkv16, dout16, out16, lse};
    backward_tasks(&a, dqkv, scratch, scratch_size, slot16_reals(sh.S, sh.hd),
                   "attention_backward_bf16", backward_block16, &t);
}

void cpu_kv_cache_append(moe_backend *be, real *k_cache, real *v_cache, const real *qkv, int n,
                         int pos0, int H, int KV, int hd) {
    CPU_KERNEL(be);
    const int row = (H + 2 * KV) * hd, kv = KV * hd;
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)n * KV * hd))
    for (int i = 0; i < n; i++) {
        const real *k = qkv + (size_t)i * row + (size_t)H * hd;
        memcpy(k_cache + (size_t)(pos0 + i) * kv, k, (size_t)kv * sizeof(real));
        memcpy(v_cache + (size_t)(pos0 + i) * kv, k + kv, (size_t)kv * sizeof(real));
    }
}

// The row-invariant cached attention (cpu_state.row_invariant) of one query row of one head at
// position pos, with plain loops: scores p_j = scale * (q . k_j) for j <= pos (each dot product
// a sum in hd order; ATTN_RI_COLS of them at a time, independent sums), causal_softmax_row
// over exactly those pos + 1 scores (its width then depends on pos alone, not on the length
// the call's last row needs), then o = sum_j p_j v_j in j order. The row's bits depend on its
// q, its position and the cache, not on n, len or the other rows of the call.
#define ATTN_RI_COLS 8
static void cached_row(real *o, real *p, const real *q, const real *k, const real *v, int pos,
                       int kv, int hd, real scale) {
    for (int j0 = 0; j0 <= pos; j0 += ATTN_RI_COLS) {
        const int nj = pos + 1 - j0 < ATTN_RI_COLS ? pos + 1 - j0 : ATTN_RI_COLS;
        real s[ATTN_RI_COLS] = {0};
        for (int c = 0; c < hd; c++)
            for (int j = 0; j < nj; j++) s[j] += q[c] * k[(size_t)(j0 + j) * kv + c];
        for (int j = 0; j < nj; j++) p[j0 + j] = scale * s[j];
    }
    causal_softmax_row(p, pos, pos + 1);
    for (int c = 0; c < hd; c++) o[c] = 0;
    for (int j = 0; j <= pos; j++) {
        const real pj = p[j], *vj = v + (size_t)j * kv;
        for (int c = 0; c < hd; c++) o[c] += pj * vj[c];
    }
}

void cpu_attention_cached_forward(moe_backend *be, real *out, real *scratch, const real *qkv,
                                  const real *k_cache, const real *v_cache, int n, int pos0, int H,
                                  int KV, int hd) {
    CPU_KERNEL(be);
    const int row = (H + 2 * KV) * hd, group = H / KV, len = pos0 + n, kv = KV * hd;
    const real scale = (real)(1.0 / sqrt((double)hd));
    if (((const cpu_state *)be->state)->row_invariant) { // row i of head h: scratch row h n + i
#pragma omp parallel for collapse(2) \
    schedule(static) if (cpu_parallel_worth((size_t)H * n * len * hd))
        for (int h = 0; h < H; h++)
            for (int i = 0; i < n; i++) {
                const size_t kvo = (size_t)(h / group) * hd;
                cached_row(out + (size_t)i * H * hd + (size_t)h * hd,
                           scratch + ((size_t)h * n + i) * len,
                           qkv + (size_t)i * row + (size_t)h * hd, k_cache + kvo, v_cache + kvo,
                           pos0 + i, kv, hd, scale);
            }
        return;
    }
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)H * n * (pos0 + n) * hd))
    for (int h = 0; h < H; h++) {
        const real *q = qkv + (size_t)h * hd;
        const real *k = k_cache + (size_t)(h / group) * hd, *v = v_cache + (size_t)(h / group) * hd;
        real *p = scratch + (size_t)h * n * len;
        // p [n, len] = scale * q k^T; query i sits at position pos0 + i
        cblas_gemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, len, hd, scale, q, row, k, kv, 0, p,
                   len);
        for (int i = 0; i < n; i++) causal_softmax_row(p + (size_t)i * len, pos0 + i, len);
        cblas_gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hd, len, 1, p, len, v, kv, 0,
                   out + (size_t)h * hd, H * hd);
    }
}
