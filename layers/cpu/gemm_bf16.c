// bf16 GEMMs (operands bf16, accumulation and output fp32) and the fp32 <-> bf16 conversions
// of the CPU backend (DESIGN.md §5b). Paths, chosen when the backend is created:
//
//   native    a bf16 GEMM on the CPU's bf16 instructions (AVX512-BF16 or AMX-BF16, CPUID),
//             the first of:
//             amx     moe's own kernel on AMX tiles (layers/cpu/amx.c), where the CPU has
//                     AMX-BF16 and Linux grants the tile state: on a Xeon with AMX it runs
//                     the training step's GEMMs as fast as oneDNN 2.6 or up to 2.9x faster
//                     (docs/bf16.md);
//             sbgemm  OpenBLAS's cblas_sbgemm, when the OpenBLAS loaded at run time exports
//                     it (built with BUILD_BFLOAT16: Debian 12's and PyPI's do not);
//             onednn  oneDNN's dnnl_gemm_bf16bf16f32 (Debian: libdnnl2, which scripts/test.sh
//                     installs), loaded with dlopen, so that no build and no fp32 run depends
//                     on it, and kept only when a probe GEMM succeeds (oneDNN refuses CPUs
//                     without bf16 instructions).
//             Both are looked up at run time, so a newer library on LD_LIBRARY_PATH counts.
//   emulated  everywhere else: the bf16 operands of each GEMM (each expert's, for the grouped
//             ones) are widened to fp32 (exact) in a workspace and cblas_sgemm multiplies
//             them. A product of two bf16 values (8-bit mantissas) is exact in fp32 and the
//             sums are fp32, so this is the same arithmetic as the native path up to the
//             summation order; it costs sgemm plus one pass over the operands.
//   reference only when asked for: c[i,j] = alpha sum_l a[i,l] b[l,j] + beta c[i,j], the sum
//             in l order (gemm.c's cpu_gemm_ordered). Slow (a plain loop), but a row's result
//             depends on that row alone; a BLAS's sgemm gives the same row other last bits
//             for other row counts (OpenBLAS's Haswell kernels: a tenth of the outputs of an
//             M = 16 GEMM differ from the first 16 rows of an M = 200 one), which bf16's next
//             rounding can turn into a whole bf16 step. The parity tests of expert parallelism, whose
//             experts see other row counts than one rank's, run bf16 on it, and a backend
//             created row_invariant (moe_backend_options) always takes it.
//
// MOE_BF16_GEMM=auto|native|amx|sbgemm|onednn|emulated|reference (environment, read at create)
// forces a path; the tests use cpu_backend_set_bf16_gemm. describe() says which path runs
// and why.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "layers/bf16.h"
#include "layers/blas.h"
#include "layers/cpu/cblas.h"
#include "layers/cpu/cpu_kernels.h"

// ---- conversions ------------------------------------------------------------------

void cpu_to_bf16(moe_backend *be, moe_bf16 *out, const real *in, size_t n) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++) out[i] = moe_f32_to_bf16((float)in[i]);
}

void cpu_from_bf16(moe_backend *be, real *out, const moe_bf16 *in, size_t n) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++) out[i] = moe_bf16_to_f32(in[i]);
}

// ---- the native libraries ------------------------------------------------------------------

// OpenBLAS's cblas_sbgemm, found at run time (dlsym), declared here in plain ints: its enums
// are ints in the ABI, and its blasint is int in the LP64 build moe links. Other BLAS headers
// (MKL's, BLIS's) have no blasint and spell the order's enum differently.
typedef void (*sbgemm_fn)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                          const moe_bf16 *a, int lda, const moe_bf16 *b, int ldb, float beta,
                          float *c, int ldc);
static sbgemm_fn sbgemm;             // process-wide, as the libraries are
static cpu_onednn_bf16_fn dnnl_gemm; // NULL: no oneDNN, or one that refused the probe
static char dnnl_name[96];           // "oneDNN 2.6.3", or why it is not used
static pthread_once_t found = PTHREAD_ONCE_INIT;

static void find_libraries(void) {
#ifndef MOE_REAL_DOUBLE // the f64 build (finite differences) has no fp32 output to give them
    void *f = dlsym(RTLD_DEFAULT, "cblas_sbgemm");
    memcpy(&sbgemm, &f, sizeof sbgemm);
    if (cpu_has_bf16_instructions() || getenv("MOE_BF16_GEMM")) {
        const cpu_onednn *o = cpu_onednn_load();
        dnnl_gemm = o->gemm_bf16;
        snprintf(dnnl_name, sizeof dnnl_name, "%s%s", o->name,
                 o->loaded && !o->gemm_bf16 ? " refused its bf16 GEMM here" : "");
    }
#endif
}

const char *cpu_bf16_path_name(int path) {
    switch (path) {
    case CPU_BF16_SBGEMM: return "OpenBLAS sbgemm";
    case CPU_BF16_ONEDNN: return "oneDNN dnnl_gemm_bf16bf16f32";
    case CPU_BF16_REFERENCE: return "reference";
    case CPU_BF16_AMX: return "moe AMX kernel";
    default: return "emulated";
    }
}

// The first native path found (CPU_BF16_EMULATED: none): moe's AMX kernel (0 in the f64
// build), as fast as oneDNN 2.6 or faster at every shape a training step runs (docs/bf16.md),
// then the libraries.
static int first_native(void) {
    return cpu_amx_available() ? CPU_BF16_AMX
           : sbgemm            ? CPU_BF16_SBGEMM
           : dnnl_gemm         ? CPU_BF16_ONEDNN
                               : CPU_BF16_EMULATED;
}

static int path_available(int path) {
    return path == CPU_BF16_EMULATED || path == CPU_BF16_REFERENCE ||
           (path == CPU_BF16_SBGEMM && sbgemm) || (path == CPU_BF16_ONEDNN && dnnl_gemm) ||
           (path == CPU_BF16_AMX && cpu_amx_available());
}

int cpu_has_bf16_instructions(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    const int amx_bf16 = (d >> 22) & 1, max_sub = (int)a;
    int avx512_bf16 = 0;
    if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) avx512_bf16 = (a >> 5) & 1;
    return amx_bf16 || avx512_bf16;
#else
    return 0;
#endif
}

// The path MOE_BF16_GEMM names (auto: the first native library, on a CPU with bf16
// instructions), or an error.
static moe_status chosen_path(int hw, int *path) {
    const int first = first_native();
    const char *env = getenv("MOE_BF16_GEMM");
    if (!env || !*env || !strcmp(env, "auto")) {
        *path = hw ? first : CPU_BF16_EMULATED;
    } else if (!strcmp(env, "emulated")) {
        *path = CPU_BF16_EMULATED;
    } else if (!strcmp(env, "reference")) {
        *path = CPU_BF16_REFERENCE;
    } else if (!strcmp(env, "amx")) {
        *path = CPU_BF16_AMX;
        if (!cpu_amx_available())
            return moe_error(MOE_EINVAL,
                             "MOE_BF16_GEMM=amx: this CPU, build or kernel cannot run AMX-BF16 "
                             "tiles");
    } else if (!strcmp(env, "native") || !strcmp(env, "sbgemm") || !strcmp(env, "onednn")) {
        *path = !strcmp(env, "sbgemm")   ? CPU_BF16_SBGEMM
                : !strcmp(env, "onednn") ? CPU_BF16_ONEDNN
                                         : first;
        if (*path == CPU_BF16_EMULATED || !path_available(*path))
            return moe_error(MOE_EINVAL,
                             "MOE_BF16_GEMM=%s: no such bf16 GEMM here (the BLAS loaded, %s, "
                             "has %scblas_sbgemm; oneDNN: %s%s)",
                             env, moe_blas_name(), sbgemm ? "" : "no ", dnnl_name,
                             dnnl_gemm ? ", whose bf16 GEMM works: MOE_BF16_GEMM=onednn" : "");
    } else {
        return moe_error(MOE_EINVAL,
                         "MOE_BF16_GEMM='%s': expected auto, native, sbgemm, onednn, amx, "
                         "emulated or reference",
                         env);
    }
    return MOE_OK;
}

moe_status cpu_bf16_select(cpu_state *s) {
    pthread_once(&found, find_libraries);
    const int hw = cpu_has_bf16_instructions();
    moe_status st = chosen_path(hw, &s->bf16_native);
    if (st) return st;
    if (s->row_invariant) { // every output one sum in k order, whatever MOE_BF16_GEMM says
        s->bf16_native = CPU_BF16_REFERENCE;
        snprintf(s->bf16_line, sizeof s->bf16_line,
                 "bf16: reference (row-invariant: a plain loop)");
    } else if (s->bf16_native == CPU_BF16_ONEDNN)
        snprintf(s->bf16_line, sizeof s->bf16_line, "bf16: native (%s dnnl_gemm_bf16bf16f32%s)",
                 dnnl_name, hw ? "" : "; forced, no AVX512-BF16/AMX");
    else if (s->bf16_native == CPU_BF16_SBGEMM)
        snprintf(s->bf16_line, sizeof s->bf16_line, "bf16: native (OpenBLAS sbgemm%s)",
                 hw ? "" : "; forced, no AVX512-BF16/AMX: slow");
    else if (s->bf16_native == CPU_BF16_AMX)
        snprintf(s->bf16_line, sizeof s->bf16_line, "bf16: native (moe's AMX kernel)");
    else if (s->bf16_native == CPU_BF16_REFERENCE)
        snprintf(s->bf16_line, sizeof s->bf16_line,
                 "bf16: reference (forced by MOE_BF16_GEMM: a plain loop, slow)");
    else if (!hw)
        snprintf(s->bf16_line, sizeof s->bf16_line,
                 "bf16: emulated (no AVX512-BF16/AMX: operands widened to fp32 for sgemm)");
    else if (first_native() != CPU_BF16_EMULATED)
        snprintf(s->bf16_line, sizeof s->bf16_line,
                 "bf16: emulated (forced by MOE_BF16_GEMM: operands widened to fp32 for sgemm)");
    else // the CPU could, no library can: say why (and what to install)
        snprintf(s->bf16_line, sizeof s->bf16_line,
                 "bf16: emulated (this CPU has bf16 instructions, but this OpenBLAS has no "
                 "sbgemm and %s%s)",
                 dnnl_name,
                 dnnl_gemm || strncmp(dnnl_name, "no ", 3) ? ""
                                                           : ": install libdnnl2 for native bf16");
    return MOE_OK;
}

int cpu_backend_set_bf16_gemm(moe_backend *be, int path) {
    cpu_state *s = be->state;
    pthread_once(&found, find_libraries);
    if (!path_available(path)) return 0;
    s->bf16_native = path;
    return 1;
}

// ---- one GEMM of bf16 operands, either path -------------------------------------------

#ifdef MOE_REAL_DOUBLE
#define cblas_gemm cblas_dgemm
#else
#define cblas_gemm cblas_sgemm
#endif

// a [rows, cols] bf16 with row stride ld, widened into w [rows, cols] (contiguous): on the
// calling thread inside a parallel region (one task's operand), else spread over the threads.
static void widen_block(real *w, const moe_bf16 *a, int rows, int cols, int ld) {
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && \
                                              cpu_parallel_worth((size_t)rows * cols))
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            w[(size_t)r * cols + c] = moe_bf16_to_f32(a[(size_t)r * ld + c]);
}

#ifndef MOE_REAL_DOUBLE
// c [rows, cols] (row stride ld) *= alpha, as widen_block spreads its work (the oneDNN path's).
static void scale_block(real *c, int rows, int cols, int ld, real alpha) {
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && \
                                              cpu_parallel_worth((size_t)rows * cols))
    for (int r = 0; r < rows; r++) {
        real *cr = c + (size_t)r * ld;
#pragma omp simd
        for (int j = 0; j < cols; j++) cr[j] *= alpha;
    }
}
#endif

size_t cpu_gemm_bf16_ws(int m, int n, int kd) { return (size_t)m * kd + (size_t)kd * n; }

void cpu_gemm_bf16(const cpu_state *s, real *ws, int trans_a, int trans_b, int m, int n, int kd,
                   real alpha, const moe_bf16 *a, int lda, const moe_bf16 *b, int ldb, real beta,
                   real *c, int ldc) {
    if (m == 0 || n == 0) return;
    if (s->bf16_native == CPU_BF16_REFERENCE || s->row_invariant) {
        cpu_gemm_ordered(1, trans_a, trans_b, m, n, kd, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    const enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans,
                               tb = trans_b ? CblasTrans : CblasNoTrans;
#ifndef MOE_REAL_DOUBLE // the f64 build (finite differences) has only the emulated path
    if (s->bf16_native == CPU_BF16_AMX) {
        cpu_amx_gemm_bf16(trans_a, trans_b, m, n, kd, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    if (s->bf16_native == CPU_BF16_SBGEMM) {
        sbgemm(CblasRowMajor, (int)ta, (int)tb, m, n, kd, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    if (s->bf16_native == CPU_BF16_ONEDNN) {
        // oneDNN 2.6 applies an alpha other than 1 in a scalar pass over C, one element at a
        // time: attention's scores (alpha = hd^-1/2, 64 x 256 x 32) took 41 us instead of 6
        // (Xeon, AMX). With beta = 0 the same product, fl(alpha * fl(sum)), is one vector
        // pass here (scale_block).
        const int later = alpha != 1 && beta == 0;
        const int e = dnnl_gemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, kd,
                                later ? 1 : alpha, a, lda, b, ldb, beta, c, ldc);
        if (e)
            moe_fatal("cpu: %s's dnnl_gemm_bf16bf16f32 failed (status %d) on %dx%dx%d", dnnl_name,
                      e, m, n, kd);
        if (later) scale_block(c, m, n, ldc, alpha);
        return;
    }
#endif
    // op(a) is [m, kd]: a itself is [kd, m] when transposed; likewise b
    const int ra = trans_a ? kd : m, ca = trans_a ? m : kd, rb = trans_b ? n : kd,
              cb = trans_b ? kd : n;
    real *wa = ws, *wb = ws + (size_t)m * kd;
    widen_block(wa, a, ra, ca, lda);
    widen_block(wb, b, rb, cb, ldb);
    cblas_gemm(CblasRowMajor, ta, tb, m, n, kd, alpha, wa, ca, wb, cb, beta, c, ldc);
}

// The emulated path's widening workspace (host memory private to the kernels, so strict mode
// does not protect it): `per` reals for each of `slots` threads, grown on demand; NULL (and
// unused) on the native path.
static real *workspace(cpu_state *s, size_t per, int slots) {
    if (s->bf16_native || s->row_invariant) return NULL;
    const size_t need = per * (size_t)slots + 1;
    if (need > s->bf16_ws_n) {
        free(s->bf16_ws);
        s->bf16_ws = malloc(need * sizeof(real));
        s->bf16_ws_n = s->bf16_ws ? need : 0;
        if (!s->bf16_ws) moe_fatal("cpu: cannot allocate %zu bytes for bf16 GEMMs", need * 4);
    }
    return s->bf16_ws;
}

void cpu_matmul_bf16(moe_backend *be, real *c, const moe_bf16 *a, const moe_bf16 *b, int m, int n,
                     int kd, int trans_a, int trans_b, real beta) {
    CPU_KERNEL(be);
    cpu_state *s = be->state;
    real *ws = workspace(s, cpu_gemm_bf16_ws(m, n, kd), 1);
    cpu_gemm_bf16(s, ws, trans_a, trans_b, m, n, kd, 1, a, trans_a ? m : kd, b, trans_b ? kd : n,
                  beta, c, n);
}

// ---- the grouped GEMMs ------------------------------------------------------------------
// gemm.c's loop (cpu_expert_gemms): one GEMM per expert over its contiguous rows, the experts
// spread over the threads when there are at least four per thread (each thread then widens
// into its own slot of the workspace, one expert at a time, so the widened operands are still
// in cache when the GEMM reads them).

static int max_rows(const int *offsets, int n_experts) {
    int r = 0;
    for (int e = 0; e < n_experts; e++)
        if (offsets[e + 1] - offsets[e] > r) r = offsets[e + 1] - offsets[e];
    return r;
}

// What one expert's GEMM needs beside its operands: the path, and the workspace of `per` reals
// for each thread (NULL on the native path).
typedef struct {
    const cpu_state *s;
    real *ws;
    size_t per;
} expert_ctx;

static void expert_gemm16(void *ctx, int trans_a, int trans_b, int m, int n, int kd, const void *a,
                          int lda, const void *b, int ldb, real beta, real *c, int ldc) {
    const expert_ctx *x = ctx;
    real *slot = x->ws ? x->ws + (size_t)omp_get_thread_num() * x->per : NULL;
    cpu_gemm_bf16(x->s, slot, trans_a, trans_b, m, n, kd, 1, a, lda, b, ldb, beta, c, ldc);
}

// The pass's GEMMs over the bf16 operands x and y, with a workspace slot per thread for
// GEMMs of up to m x n x kd (m, n, kd of the largest expert's GEMM); then (or NULL): a row
// kernel after each expert's GEMM (its gemm and gemm_ctx are set here).
static void expert_gemms16(moe_backend *be, cpu_expert_pass pass, real *c, const moe_bf16 *x,
                           const moe_bf16 *y, const int *offsets, int n_experts, int n_out,
                           int n_in, int accumulate, int m, int n, int kd,
                           cpu_gemm_then_rows *then) {
    cpu_state *s = be->state;
    const size_t per = cpu_gemm_bf16_ws(m, n, kd);
    expert_ctx ctx = {s, workspace(s, per, omp_get_max_threads()), per};
    if (then) then->gemm = expert_gemm16, then->gemm_ctx = &ctx;
    cpu_expert_gemms(pass, c, x, y, sizeof(moe_bf16), offsets, n_experts, n_out, n_in, accumulate,
                     then ? cpu_expert_gemm_then_rows : expert_gemm16, then ? (void *)then : &ctx);
}

void cpu_expert_matmul_forward_bf16(moe_backend *be, real *out, const moe_bf16 *inp,
                                    const moe_bf16 *weight, const int *offsets, int n_experts,
                                    int n_out, int n_in) {
    CPU_KERNEL(be);
    expert_gemms16(be, CPU_EXPERT_FORWARD, out, inp, weight, offsets, n_experts, n_out, n_in, 0,
                   max_rows(offsets, n_experts), n_out, n_in, NULL);
}

// The experts' SwiGLU right after each expert's GEMM (gemm.c's cpu_gemm_then_rows). On the
// AMX path the first GEMM ends in the SwiGLU itself (cpu_amx_swiglu_bf16: h13 stays in L1).
// Forward: out16 = act16, keep16 = h13_16 (or NULL), in = h13; backward: out16 = dh13_16,
// in = dact, h13_16. in is what the GEMM wrote.
typedef struct {
    moe_bf16 *out16, *keep16;
    const real *in;
    const moe_bf16 *h13_16;
    int ff;
} swiglu_ctx;

static void swiglu_fwd_rows16(const void *ctx, size_t r, int n) {
    const swiglu_ctx *x = ctx;
    cpu_swiglu_rows_bf16(x->out16 + r * x->ff, x->keep16 ? x->keep16 + r * 2 * x->ff : NULL,
                         x->in + r * 2 * x->ff, n, x->ff);
}

static void swiglu_bwd_rows16(const void *ctx, size_t r, int n) {
    const swiglu_ctx *x = ctx;
    cpu_swiglu_grad_rows_bf16(x->out16 + r * 2 * x->ff, x->in + r * x->ff,
                              x->h13_16 + r * 2 * x->ff, n, x->ff);
}

#ifndef MOE_REAL_DOUBLE
static void expert_swiglu(void *ctx, int trans_a, int trans_b, int m, int n, int kd, const void *a,
                          int lda, const void *b, int ldb, real beta, real *c, int ldc) {
    (void)trans_a, (void)trans_b, (void)n, (void)ldb, (void)beta, (void)ldc; // 0, 1, 2ff, kd, 0
    const swiglu_ctx *x = ctx;
    const size_t row = (size_t)(c - x->in) / (2 * (size_t)x->ff); // the expert's first row
    cpu_amx_swiglu_bf16(m, x->ff, kd, a, lda, b, x->out16 + row * x->ff,
                        x->keep16 ? x->keep16 + row * 2 * x->ff : NULL, c);
}
#endif

void cpu_expert_swiglu_forward_bf16(moe_backend *be, moe_bf16 *act16, moe_bf16 *h13_16, real *h13,
                                    const moe_bf16 *inp, const moe_bf16 *w13, const int *offsets,
                                    int n_experts, int ff, int d) {
    CPU_KERNEL(be);
    const cpu_state *s = be->state;
    const swiglu_ctx rows = {act16, h13_16, h13, NULL, ff};
#ifndef MOE_REAL_DOUBLE
    if (s->bf16_native == CPU_BF16_AMX && !s->row_invariant) {
        cpu_expert_gemms(CPU_EXPERT_FORWARD, h13, inp, w13, sizeof(moe_bf16), offsets, n_experts,
                         2 * ff, d, 0, expert_swiglu, (void *)&rows);
        return;
    }
#endif
    (void)s;
    cpu_gemm_then_rows then = {NULL, NULL, h13, 2 * (size_t)ff, swiglu_fwd_rows16, &rows};
    expert_gemms16(be, CPU_EXPERT_FORWARD, h13, inp, w13, offsets, n_experts, 2 * ff, d, 0,
                   max_rows(offsets, n_experts), 2 * ff, d, &then);
}

void cpu_expert_swiglu_backward_bf16(moe_backend *be, moe_bf16 *dh13_16, real *dact,
                                     const moe_bf16 *dout, const moe_bf16 *w2,
                                     const moe_bf16 *h13_16, const int *offsets, int n_experts,
                                     int ff, int d) {
    CPU_KERNEL(be);
    const swiglu_ctx rows = {dh13_16, NULL, dact, h13_16, ff};
    cpu_gemm_then_rows then = {NULL, NULL, dact, (size_t)ff, swiglu_bwd_rows16, &rows};
    expert_gemms16(be, CPU_EXPERT_BACKWARD_INPUT, dact, dout, w2, offsets, n_experts, d, ff, 0,
                   max_rows(offsets, n_experts), ff, d, &then);
}

void cpu_expert_matmul_backward_input_bf16(moe_backend *be, real *dinp, const moe_bf16 *dout,
                                           const moe_bf16 *weight, const int *offsets,
                                           int n_experts, int n_out, int n_in, int accumulate) {
    CPU_KERNEL(be);
    expert_gemms16(be, CPU_EXPERT_BACKWARD_INPUT, dinp, dout, weight, offsets, n_experts, n_out,
                   n_in, accumulate, max_rows(offsets, n_experts), n_in, n_out, NULL);
}

void cpu_expert_matmul_backward_weight_bf16(moe_backend *be, real *dweight, const moe_bf16 *dout,
                                            const moe_bf16 *inp, const int *offsets, int n_experts,
                                            int n_out, int n_in) {
    CPU_KERNEL(be);
    expert_gemms16(be, CPU_EXPERT_BACKWARD_WEIGHT, dweight, dout, inp, offsets, n_experts, n_out,
                   n_in, 0, n_out, n_in, max_rows(offsets, n_experts), NULL);
}
