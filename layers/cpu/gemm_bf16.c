// bf16 GEMMs (operands bf16, accumulation and output fp32) and the fp32 <-> bf16 conversions
// of the CPU backend (DESIGN.md §5b). Two paths, chosen when the backend is created:
//
//   native    OpenBLAS's cblas_sbgemm, when the OpenBLAS loaded at run time exports it
//             (built with BUILD_BFLOAT16; looked up with dlsym, so a newer OpenBLAS on
//             LD_LIBRARY_PATH enables it without a rebuild) and the CPU has bf16 instructions
//             (AVX512-BF16 or AMX-BF16, CPUID). OpenBLAS's kernel then runs them.
//   emulated  everywhere else: the bf16 operands of each GEMM (each expert's, for the grouped
//             ones) are widened to fp32 (exact) in a workspace and cblas_sgemm multiplies
//             them. A product of two bf16 values (8-bit mantissas) is exact in fp32 and the
//             sums are fp32, so this is the same arithmetic as the native path up to the
//             summation order; it costs sgemm plus one pass over the operands.
//
// MOE_BF16_GEMM=native|emulated (environment, read at create) forces a path; the tests use
// cpu_backend_set_bf16_gemm. describe() says which path runs and why.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <omp.h>
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

static void widen(real *out, const moe_bf16 *in, size_t n) {
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++) out[i] = moe_bf16_to_f32(in[i]);
}

void cpu_from_bf16(moe_backend *be, real *out, const moe_bf16 *in, size_t n) {
    CPU_KERNEL(be);
    widen(out, in, n);
}

// ---- which path -------------------------------------------------------------------

typedef void (*sbgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint,
                          blasint, blasint, float, const moe_bf16 *, blasint, const moe_bf16 *,
                          blasint, float, float *, blasint);

static sbgemm_fn find_sbgemm(void) {
#ifdef MOE_REAL_DOUBLE
    return NULL; // the f64 build (finite differences) has no fp32 output to give sbgemm
#else
    void *f = dlsym(RTLD_DEFAULT, "cblas_sbgemm");
    sbgemm_fn fn;
    memcpy(&fn, &f, sizeof fn); // object to function pointer, as POSIX allows
    return fn;
#endif
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

moe_status cpu_bf16_select(cpu_state *s) {
    s->sbgemm = (void (*)(void))find_sbgemm();
    const int hw = cpu_has_bf16_instructions();
    const char *env = getenv("MOE_BF16_GEMM");
    if (!env || !*env || !strcmp(env, "auto")) {
        s->bf16_native = s->sbgemm && hw;
    } else if (!strcmp(env, "emulated")) {
        s->bf16_native = 0;
    } else if (!strcmp(env, "native")) {
        if (!s->sbgemm)
            return moe_error(MOE_EINVAL,
                             "MOE_BF16_GEMM=native: the BLAS loaded (%s) has no cblas_sbgemm "
                             "(an OpenBLAS built without BUILD_BFLOAT16, or another BLAS)",
                             moe_blas_name());
        s->bf16_native = 1;
    } else {
        return moe_error(MOE_EINVAL, "MOE_BF16_GEMM='%s': expected auto, native or emulated", env);
    }
    const char *why = hw ? (s->sbgemm ? "forced by MOE_BF16_GEMM" : "this OpenBLAS has no sbgemm")
                         : "no AVX512-BF16/AMX";
    if (s->bf16_native)
        snprintf(s->bf16_line, sizeof s->bf16_line, "bf16: native (OpenBLAS sbgemm%s)",
                 hw ? "" : "; forced, no AVX512-BF16/AMX: slow");
    else
        snprintf(s->bf16_line, sizeof s->bf16_line,
                 "bf16: emulated (%s: operands widened to fp32 for sgemm)", why);
    return MOE_OK;
}

int cpu_backend_set_bf16_gemm(moe_backend *be, int native) {
    cpu_state *s = be->state;
    if (native && !s->sbgemm) return 0;
    s->bf16_native = native;
    return 1;
}

// ---- one GEMM of bf16 operands, either path -------------------------------------------

#ifdef MOE_REAL_DOUBLE
#define cblas_gemm cblas_dgemm
#else
#define cblas_gemm cblas_sgemm
#endif

// c [m, n] = op(a) op(b) + beta c with a, b bf16 and contiguous (lda, ldb their row lengths):
// native, sbgemm; emulated, both widened into ws (na + nb reals, the calling thread's) and
// the fp32 GEMM.
static void gemm16(const cpu_state *s, real *ws, int trans_a, int trans_b, int m, int n, int kd,
                   const moe_bf16 *a, int lda, const moe_bf16 *b, int ldb, real beta, real *c,
                   int ldc) {
    if (m == 0 || n == 0) return;
    const enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans,
                               tb = trans_b ? CblasTrans : CblasNoTrans;
#ifndef MOE_REAL_DOUBLE // the f64 build (finite differences) has only the emulated path
    if (s->bf16_native) {
        ((sbgemm_fn)s->sbgemm)(CblasRowMajor, ta, tb, m, n, kd, 1.0f, a, lda, b, ldb, beta, c, ldc);
        return;
    }
#else
    (void)s;
#endif
    const size_t na = (size_t)m * kd, nb = (size_t)kd * n;
    if (omp_in_parallel()) { // one expert of a loop spread over the threads
        for (size_t i = 0; i < na; i++) ws[i] = moe_bf16_to_f32(a[i]);
        for (size_t i = 0; i < nb; i++) ws[na + i] = moe_bf16_to_f32(b[i]);
    } else {
        widen(ws, a, na);
        widen(ws + na, b, nb);
    }
    cblas_gemm(CblasRowMajor, ta, tb, m, n, kd, 1, ws, lda, ws + na, ldb, beta, c, ldc);
}

// The emulated path's widening workspace (host memory private to the kernels, so strict mode
// does not protect it): `per` reals for each of `slots` threads, grown on demand; NULL (and
// unused) on the native path.
static real *workspace(cpu_state *s, size_t per, int slots) {
    if (s->bf16_native) return NULL;
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
    real *ws = workspace(s, (size_t)m * kd + (size_t)kd * n, 1);
    gemm16(s, ws, trans_a, trans_b, m, n, kd, a, trans_a ? m : kd, b, trans_b ? kd : n, beta, c, n);
}

// ---- the grouped GEMMs ------------------------------------------------------------------
// The loops of gemm.c: one GEMM per expert over its contiguous rows, the experts spread over
// the threads when there are at least four per thread (each thread then widens into its own
// slot of the workspace, one expert at a time, so the widened operands are still in cache
// when the GEMM reads them).

static int max_rows(const int *offsets, int n_experts) {
    int r = 0;
    for (int e = 0; e < n_experts; e++)
        if (offsets[e + 1] - offsets[e] > r) r = offsets[e + 1] - offsets[e];
    return r;
}

#define EXPERTS_PARALLEL if (n_experts >= 4 * omp_get_max_threads())

// The thread's slot of `per` reals (NULL on the native path).
static real *slot(real *ws, size_t per) {
    return ws ? ws + (size_t)omp_get_thread_num() * per : NULL;
}

void cpu_expert_matmul_forward_bf16(moe_backend *be, real *out, const moe_bf16 *inp,
                                    const moe_bf16 *weight, const int *offsets, int n_experts,
                                    int n_out, int n_in) {
    CPU_KERNEL(be);
    cpu_state *s = be->state;
    const size_t per = ((size_t)max_rows(offsets, n_experts) + n_out) * n_in;
    real *ws = workspace(s, per, omp_get_max_threads());
#pragma omp parallel for schedule(dynamic, 1) EXPERTS_PARALLEL
    for (int e = 0; e < n_experts; e++) // out_e [rows, n_out] = inp_e w_e^T
        gemm16(s, slot(ws, per), 0, 1, offsets[e + 1] - offsets[e], n_out, n_in,
               inp + (size_t)offsets[e] * n_in, n_in, weight + (size_t)e * n_out * n_in, n_in, 0,
               out + (size_t)offsets[e] * n_out, n_out);
}

void cpu_expert_matmul_backward_input_bf16(moe_backend *be, real *dinp, const moe_bf16 *dout,
                                           const moe_bf16 *weight, const int *offsets,
                                           int n_experts, int n_out, int n_in, int accumulate) {
    CPU_KERNEL(be);
    cpu_state *s = be->state;
    const size_t per = (size_t)max_rows(offsets, n_experts) * n_out + (size_t)n_out * n_in;
    real *ws = workspace(s, per, omp_get_max_threads());
#pragma omp parallel for schedule(dynamic, 1) EXPERTS_PARALLEL
    for (int e = 0; e < n_experts; e++) // dinp_e [rows, n_in] (+)= dout_e w_e
        gemm16(s, slot(ws, per), 0, 0, offsets[e + 1] - offsets[e], n_in, n_out,
               dout + (size_t)offsets[e] * n_out, n_out, weight + (size_t)e * n_out * n_in, n_in,
               accumulate ? 1 : 0, dinp + (size_t)offsets[e] * n_in, n_in);
}

void cpu_expert_matmul_backward_weight_bf16(moe_backend *be, real *dweight, const moe_bf16 *dout,
                                            const moe_bf16 *inp, const int *offsets, int n_experts,
                                            int n_out, int n_in) {
    CPU_KERNEL(be);
    cpu_state *s = be->state;
    const size_t per = (size_t)max_rows(offsets, n_experts) * (n_out + n_in);
    real *ws = workspace(s, per, omp_get_max_threads());
#pragma omp parallel for schedule(dynamic, 1) EXPERTS_PARALLEL
    for (int e = 0; e < n_experts; e++) { // dw_e [n_out, n_in] += dout_e^T inp_e
        const int rows = offsets[e + 1] - offsets[e];
        if (rows)
            gemm16(s, slot(ws, per), 1, 0, n_out, n_in, rows, dout + (size_t)offsets[e] * n_out,
                   n_out, inp + (size_t)offsets[e] * n_in, n_in, 1,
                   dweight + (size_t)e * n_out * n_in, n_in);
    }
}
