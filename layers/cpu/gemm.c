// Dense and grouped (per-expert) GEMMs on the BLAS (MOE_BLAS: OpenBLAS, BLIS or MKL), and the
// grouped GEMMs' loop over experts that the bf16 twins (gemm_bf16.c) share.
//
// The grouped GEMM is one GEMM per expert over its contiguous rows. With at least four
// experts per thread the experts are spread over the OpenMP threads and each call runs on one
// thread (OpenBLAS's OpenMP build and oneDNN do that inside a parallel region): measured 3-5%
// faster than threading every call, on both benchmark shapes (bf16 on oneDNN, Xeon with AMX:
// 107-111 against 119-122 ms a shakespeare step). With fewer experts, the library threads
// each call. Experts with no rows are skipped.
#include "layers/cpu/cblas.h"
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/bf16.h"
#include "layers/cpu/cpu_kernels.h"

#ifdef MOE_REAL_DOUBLE
#define cblas_gemm cblas_dgemm
#else
#define cblas_gemm cblas_sgemm
#endif

// ---- the path: the BLAS, or oneDNN's sgemm ---------------------------------------------------
// oneDNN's JIT sgemm runs the model's shapes faster than OpenBLAS's SkylakeX kernels on an
// Intel CPU with AVX-512: a 2-core Xeon (AMX), GFLOP/s on scripts/bench_blas's groups,
// shakespeare experts 256 -> 344, shakespeare dense 252 -> 337; the fp32 shakespeare step
// 170-175 -> 145-149 ms (docs/measurements/2026-12-06-huge-pages-xeon.md). On AMD (Zen 3-5)
// the two were within 5-16% per GEMM, and no faster in training: the BLAS stays there.
// Attention's 64-row blocks are not GEMMs of this file: moe's own products in registers
// (attention_gemm.c; the BLAS where the build has neither AVX2 + FMA nor AVX-512), as
// oneDNN's per-call cost is the larger at those shapes.

int cpu_intel_avx512(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_is("intel") && __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

static void onednn_line(cpu_state *s, const cpu_onednn *o, const char *why) {
    snprintf(s->fp32_line, sizeof s->fp32_line, "fp32: %s dnnl_sgemm%s", o->name, why);
}

moe_status cpu_fp32_select(cpu_state *s) {
    const char *env = getenv("MOE_FP32_GEMM");
    const int automatic = !env || !*env || !strcmp(env, "auto");
    s->fp32_onednn = NULL, s->fp32_line[0] = 0;
    if (!automatic && strcmp(env, "blas") && strcmp(env, "onednn"))
        return moe_error(MOE_EINVAL, "MOE_FP32_GEMM='%s': expected auto, blas or onednn", env);
    if (s->row_invariant || (automatic && !cpu_intel_avx512()) || (env && !strcmp(env, "blas")))
        return MOE_OK; // (row-invariant: cpu_gemm_ordered, whatever MOE_FP32_GEMM says)
    const cpu_onednn *o = cpu_onednn_load();
    if (!o->sgemm) {
        if (automatic) return MOE_OK;
        return moe_error(MOE_EINVAL, "MOE_FP32_GEMM=onednn: %s%s", o->name,
                         o->loaded ? ", whose dnnl_sgemm failed its probe" : "");
    }
    s->fp32_onednn = o->sgemm;
    onednn_line(s, o, automatic ? "" : " (MOE_FP32_GEMM)");
    return MOE_OK;
}

int cpu_backend_set_fp32_gemm(moe_backend *be, int onednn) {
    cpu_state *s = be->state;
    const cpu_onednn *o = onednn ? cpu_onednn_load() : NULL;
    if (onednn && !o->sgemm) return 0;
    s->fp32_onednn = onednn ? o->sgemm : NULL;
    if (onednn)
        onednn_line(s, o, " (set)");
    else
        s->fp32_line[0] = 0;
    return 1;
}

// c [m, n] = alpha op(a) op(b) + beta c on the state's path.
static void gemm(const cpu_state *s, int trans_a, int trans_b, int m, int n, int kd, real alpha,
                 const real *a, int lda, const real *b, int ldb, real beta, real *c, int ldc) {
    if (m == 0 || n == 0) return;
    if (kd == 0) { // c = beta c here: a CBLAS wants lda >= max(1, k) (BLIS refuses 0), oneDNN k > 0
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                c[(size_t)i * ldc + j] = beta == 0 ? 0 : beta * c[(size_t)i * ldc + j];
        return;
    }
#ifndef MOE_REAL_DOUBLE
    if (s->fp32_onednn) {
        const int e = s->fp32_onednn(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, kd, alpha, a,
                                     lda, b, ldb, beta, c, ldc);
        if (e) moe_fatal("cpu: %s failed (status %d) on %dx%dx%d", s->fp32_line, e, m, n, kd);
        return;
    }
#else
    (void)s; // the f64 build: the BLAS's dgemm only
#endif
    cblas_gemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
               trans_b ? CblasTrans : CblasNoTrans, m, n, kd, alpha, a, lda, b, ldb, beta, c, ldc);
}

// ---- the ordered GEMM: row-invariant fp32, and gemm_bf16.c's reference path -------------------
// c [m, n] = alpha op(a) op(b) + beta c, every output one sum in l order, (0 + p_0) + p_1 + ...
// with p_l = op(a)[i,l] op(b)[l,j] rounded (no FMA: the C code is -ffp-contract=off; bf16
// operands are widened exactly, and their products are exact): a row's result depends on that
// row alone, whatever m (a BLAS picks other kernels, and other sums, for other row counts).
// beta = 0 does not read c. A task is a tile of RI_ROWS x RI_COLS outputs; it copies RI_DEPTH
// rows of op(b)'s tile at a time into bt (contiguous, so the inner loop runs over columns and
// vectorises; each column's running sum still takes its terms in l order). Tiles are spread
// over the threads, never k.
#define RI_ROWS 8
#define RI_COLS 64
#define RI_DEPTH 64

static inline real elem(int bf16, const void *p, size_t i) {
    return bf16 ? moe_bf16_to_f32(((const moe_bf16 *)p)[i]) : ((const real *)p)[i];
}

void cpu_gemm_ordered(int bf16, int trans_a, int trans_b, int m, int n, int kd, real alpha,
                      const void *a, int lda, const void *b, int ldb, real beta, real *c, int ldc) {
    if (m == 0 || n == 0) return;
    const int nj = (n + RI_COLS - 1) / RI_COLS, ni = (m + RI_ROWS - 1) / RI_ROWS;
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && \
                                              cpu_parallel_worth((size_t)m * n * kd))
    for (int t = 0; t < ni * nj; t++) {
        const int i0 = t / nj * RI_ROWS, j0 = t % nj * RI_COLS;
        const int nr = m - i0 < RI_ROWS ? m - i0 : RI_ROWS,
                  nc = n - j0 < RI_COLS ? n - j0 : RI_COLS;
        real acc[RI_ROWS][RI_COLS], bt[RI_DEPTH][RI_COLS];
        for (int r = 0; r < nr; r++)
            for (int jj = 0; jj < nc; jj++) acc[r][jj] = 0;
        for (int l0 = 0; l0 < kd; l0 += RI_DEPTH) {
            const int nl = kd - l0 < RI_DEPTH ? kd - l0 : RI_DEPTH;
            if (trans_b) // b [n, kd]
                for (int jj = 0; jj < nc; jj++)
                    for (int l = 0; l < nl; l++)
                        bt[l][jj] = elem(bf16, b, (size_t)(j0 + jj) * ldb + l0 + l);
            else // b [kd, n]
                for (int l = 0; l < nl; l++)
                    for (int jj = 0; jj < nc; jj++)
                        bt[l][jj] = elem(bf16, b, (size_t)(l0 + l) * ldb + j0 + jj);
            for (int r = 0; r < nr; r++)
                for (int l = 0; l < nl; l++) {
                    const size_t i = (size_t)(i0 + r), k = (size_t)(l0 + l);
                    const real x = elem(bf16, a, trans_a ? k * lda + i : i * lda + k);
                    for (int jj = 0; jj < nc; jj++) acc[r][jj] += x * bt[l][jj];
                }
        }
        for (int r = 0; r < nr; r++) {
            real *out = c + (size_t)(i0 + r) * ldc + j0;
            for (int jj = 0; jj < nc; jj++)
                out[jj] = beta == 0 ? alpha * acc[r][jj] : alpha * acc[r][jj] + beta * out[jj];
        }
    }
}

void cpu_matmul(moe_backend *be, real *c, const real *a, const real *b, int m, int n, int kd,
                int trans_a, int trans_b, real beta) {
    CPU_KERNEL(be);
    int lda = trans_a ? m : kd;
    int ldb = trans_b ? kd : n;
    if (((const cpu_state *)be->state)->row_invariant)
        cpu_gemm_ordered(0, trans_a, trans_b, m, n, kd, 1, a, lda, b, ldb, beta, c, n);
    else
        gemm(be->state, trans_a, trans_b, m, n, kd, 1, a, lda, b, ldb, beta, c, n);
}

// ---- the grouped GEMMs' loop (fp32 here, bf16 in gemm_bf16.c) ------------------------------

// The order in which the grouped GEMMs hand their experts to the threads: most rows first
// (longest-processing-time first), so that the dynamic schedule ends balanced when routing is
// skewed (real text at initialisation: max/mean 3; measured on the bf16 shakespeare step:
// experts 37.3 -> 35.7 ms). Each expert's GEMM writes its own rows, so the order changes no
// result. Beyond EXPERT_ORDER_MAX experts: the natural order.
#define EXPERT_ORDER_MAX 1024
static void largest_first(int *order, const int *offsets, int n_experts) {
    for (int t = 0; t < n_experts; t++) {
        const int rows = offsets[t + 1] - offsets[t]; // insertion sort, stable
        int u = t;
        for (; u > 0 && offsets[order[u - 1] + 1] - offsets[order[u - 1]] < rows; u--)
            order[u] = order[u - 1];
        order[u] = t;
    }
}

// Expert e's GEMM of the pass.
static void expert_gemm(cpu_expert_pass pass, real *c, const char *xb, const char *yb, size_t elem,
                        const int *offsets, int e, int n_out, int n_in, int accumulate,
                        cpu_expert_gemm_fn gemm_e, void *ctx) {
    const int rows = offsets[e + 1] - offsets[e];
    const size_t r0 = (size_t)offsets[e], we = (size_t)e * n_out * n_in;
    if (pass == CPU_EXPERT_FORWARD) // out_e [rows, n_out] = inp_e [rows, n_in] @ w_e^T
        gemm_e(ctx, 0, 1, rows, n_out, n_in, xb + r0 * n_in * elem, n_in, yb + we * elem, n_in, 0,
               c + r0 * n_out, n_out);
    else if (pass == CPU_EXPERT_BACKWARD_INPUT) // dinp_e (+)= dout_e [rows, n_out] @ w_e
        gemm_e(ctx, 0, 0, rows, n_in, n_out, xb + r0 * n_out * elem, n_out, yb + we * elem, n_in,
               accumulate ? 1 : 0, c + r0 * n_in, n_in);
    else if (rows) // dw_e [n_out, n_in] += dout_e^T [n_out, rows] @ inp_e [rows, n_in]
        gemm_e(ctx, 1, 0, n_out, n_in, rows, xb + r0 * n_out * elem, n_out, yb + r0 * n_in * elem,
               n_in, 1, c + we, n_in);
}

void cpu_expert_gemms(cpu_expert_pass pass, real *c, const void *x, const void *y, size_t elem,
                      const int *offsets, int n_experts, int n_out, int n_in, int accumulate,
                      cpu_expert_gemm_fn gemm_e, void *ctx) {
    int order[EXPERT_ORDER_MAX];
    const int ordered = n_experts <= EXPERT_ORDER_MAX;
    if (ordered) largest_first(order, offsets, n_experts);
    const char *xb = x, *yb = y;
    // Not one loop with `omp parallel for if (...)`: a GEMM called inside that region when the
    // condition is false runs on one thread (the region is inactive, but the libraries see
    // its level and do not thread): measured with 4 experts on 2 threads, a shakespeare step
    // took 262 ms fp32 and 208 ms bf16 that way, 183 and 113 ms with the libraries threading.
    if (n_experts >= 4 * omp_get_max_threads()) {
#pragma omp parallel for schedule(dynamic, 1)
        for (int t = 0; t < n_experts; t++)
            expert_gemm(pass, c, xb, yb, elem, offsets, ordered ? order[t] : t, n_out, n_in,
                        accumulate, gemm_e, ctx);
    } else {
        for (int t = 0; t < n_experts; t++)
            expert_gemm(pass, c, xb, yb, elem, offsets, ordered ? order[t] : t, n_out, n_in,
                        accumulate, gemm_e, ctx);
    }
}

// One fp32 expert GEMM (ctx: the backend's state, for row_invariant).
static void expert_gemm32(void *ctx, int trans_a, int trans_b, int m, int n, int kd, const void *a,
                          int lda, const void *b, int ldb, real beta, real *c, int ldc) {
    if (((const cpu_state *)ctx)->row_invariant)
        cpu_gemm_ordered(0, trans_a, trans_b, m, n, kd, 1, a, lda, b, ldb, beta, c, ldc);
    else
        gemm(ctx, trans_a, trans_b, m, n, kd, 1, a, lda, b, ldb, beta, c, ldc);
}

void cpu_expert_matmul_forward(moe_backend *be, real *out, const real *inp, const real *weight,
                               const int *offsets, int n_experts, int n_out, int n_in) {
    CPU_KERNEL(be);
    cpu_expert_gemms(CPU_EXPERT_FORWARD, out, inp, weight, sizeof(real), offsets, n_experts, n_out,
                     n_in, 0, expert_gemm32, be->state);
}

void cpu_expert_matmul_backward_input(moe_backend *be, real *dinp, const real *dout,
                                      const real *weight, const int *offsets, int n_experts,
                                      int n_out, int n_in, int accumulate) {
    CPU_KERNEL(be);
    cpu_expert_gemms(CPU_EXPERT_BACKWARD_INPUT, dinp, dout, weight, sizeof(real), offsets,
                     n_experts, n_out, n_in, accumulate, expert_gemm32, be->state);
}

void cpu_expert_matmul_backward_weight(moe_backend *be, real *dweight, const real *dout,
                                       const real *inp, const int *offsets, int n_experts,
                                       int n_out, int n_in) {
    CPU_KERNEL(be);
    cpu_expert_gemms(CPU_EXPERT_BACKWARD_WEIGHT, dweight, dout, inp, sizeof(real), offsets,
                     n_experts, n_out, n_in, 0, expert_gemm32, be->state);
}

// ---- an expert's GEMM, then a row kernel on its output rows ---------------------------------
// The SwiGLU right after each expert's GEMM, on the same thread, while the expert's rows are in
// cache: measured on a 2-core Xeon, the SwiGLU over the whole of h13 reads it back from memory
// (12 MiB a layer at shakespeare's size) at a quarter to a third of its in-cache speed. Each call of
// the GEMM and of the row kernel is the one the two separate kernels make, so the results are
// theirs, bit for bit.

void cpu_expert_gemm_then_rows(void *ctx, int trans_a, int trans_b, int m, int n, int kd,
                               const void *a, int lda, const void *b, int ldb, real beta, real *c,
                               int ldc) {
    const cpu_gemm_then_rows *x = ctx;
    x->gemm(x->gemm_ctx, trans_a, trans_b, m, n, kd, a, lda, b, ldb, beta, c, ldc);
    x->rows(x->rows_ctx, (size_t)(c - x->c0) / x->c_row, m); // the expert's first row
}

// The fp32 SwiGLU kernels' arguments, at the pass's first row.
typedef struct {
    real *out;
    const real *in, *h13;
    int ff;
} swiglu_rows_args;

static void swiglu_fwd_rows(const void *ctx, size_t r, int n) {
    const swiglu_rows_args *x = ctx;
    cpu_swiglu_rows(x->out + r * x->ff, x->h13 + r * 2 * x->ff, n, x->ff);
}

static void swiglu_bwd_rows(const void *ctx, size_t r, int n) {
    const swiglu_rows_args *x = ctx;
    cpu_swiglu_grad_rows(x->out + r * 2 * x->ff, x->in + r * x->ff, x->h13 + r * 2 * x->ff, n,
                         x->ff);
}

void cpu_expert_swiglu_forward(moe_backend *be, real *act, real *h13, const real *inp,
                               const real *w13, const int *offsets, int n_experts, int ff, int d) {
    CPU_KERNEL(be);
    const swiglu_rows_args rows = {act, NULL, h13, ff};
    cpu_gemm_then_rows x = {expert_gemm32, be->state, h13, 2 * (size_t)ff, swiglu_fwd_rows, &rows};
    cpu_expert_gemms(CPU_EXPERT_FORWARD, h13, inp, w13, sizeof(real), offsets, n_experts, 2 * ff, d,
                     0, cpu_expert_gemm_then_rows, &x);
}

void cpu_expert_swiglu_backward(moe_backend *be, real *dh13, real *dact, const real *dout,
                                const real *w2, const real *h13, const int *offsets, int n_experts,
                                int ff, int d) {
    CPU_KERNEL(be);
    const swiglu_rows_args rows = {dh13, dact, h13, ff};
    cpu_gemm_then_rows x = {expert_gemm32, be->state, dact, (size_t)ff, swiglu_bwd_rows, &rows};
    cpu_expert_gemms(CPU_EXPERT_BACKWARD_INPUT, dact, dout, w2, sizeof(real), offsets, n_experts, d,
                     ff, 0, cpu_expert_gemm_then_rows, &x);
}
