// The fp32 GEMMs on each of their paths (layers/cpu/gemm.c): the BLAS's sgemm and oneDNN's
// dnnl_sgemm (where oneDNN loads; not in sanitizer builds). matmul (k = 0 too; every transpose, beta 0
// and 1, odd sizes) and the three grouped GEMMs (an empty expert, accumulate) against a double
// GEMM of the same operands, within fp32 accumulation error; the choice (MOE_FP32_GEMM:
// auto picks oneDNN on an Intel CPU with AVX-512 where it loads, blas and onednn force, a
// row-invariant backend takes neither, other values are refused naming the variable).
#define _POSIX_C_SOURCE 200809L // setenv
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/cpu/cpu_backend.h"
#include "layers/cpu/cpu_kernels.h"
#include "layers/status.h"
#include "test_util.h"

static test_rng rng;

static float *randn(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = (float)rng_normal(&rng);
    return p;
}

// op(x)[i][l] of x stored [rows, cols] (transposed: x is [cols, rows] as op sees it)
static double at(const float *x, int trans, int ld, int i, int l) {
    return trans ? x[(size_t)l * ld + i] : x[(size_t)i * ld + l];
}

// c (as computed) against beta c0 + op(a) op(b) in double: the largest error over
// sum_l |op(a) op(b)| + |beta c0| (fp32 accumulation error is a few 1e-7 of that).
static double gemm_err(const float *c, const float *c0, const float *a, const float *b, int ta,
                       int tb, int m, int n, int kd, int lda, int ldb, int ldc, float beta) {
    double worst = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = beta * (double)c0[(size_t)i * ldc + j], mag = fabs(s);
            for (int l = 0; l < kd; l++) {
                const double p = at(a, ta, lda, i, l) * at(b, tb, ldb, l, j);
                s += p, mag += fabs(p);
            }
            const double e = fabs(c[(size_t)i * ldc + j] - s) / (mag > 0 ? mag : 1);
            if (e > worst) worst = e;
        }
    return worst;
}

static void check_matmul(moe_backend *be, const char *path) {
    static const int sizes[][3] = {{1, 1, 1}, {5, 7, 0}, {7, 13, 5}, {33, 65, 17}, {130, 70, 190}};
    double worst = 0;
    for (size_t z = 0; z < sizeof sizes / sizeof *sizes; z++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int beta = 0; beta < 2; beta++) {
                    const int m = sizes[z][0], n = sizes[z][1], kd = sizes[z][2];
                    float *a = randn((size_t)m * kd), *b = randn((size_t)kd * n),
                          *c0 = randn((size_t)m * n), *c = malloc((size_t)m * n * sizeof *c);
                    memcpy(c, c0, (size_t)m * n * sizeof *c);
                    be->matmul(be, c, a, b, m, n, kd, ta, tb, (real)beta);
                    const double e = gemm_err(c, c0, a, b, ta, tb, m, n, kd, ta ? m : kd,
                                              tb ? kd : n, n, (float)beta);
                    if (e > worst) worst = e;
                    free(a), free(b), free(c0), free(c);
                }
    char what[96];
    snprintf(what, sizeof what, "%s: matmul within 1e-5 (%.1e)", path, worst);
    check_true(what, worst <= 1e-5);
}

// E = 5 experts of 0, 3, 40, 1 and 77 rows.
static void check_grouped(moe_backend *be, const char *path) {
    enum { E = 5, N_IN = 24, N_OUT = 36 };
    const int offsets[E + 1] = {0, 0, 3, 43, 44, 121}, N = offsets[E];
    float *x = randn((size_t)N * N_IN), *w = randn((size_t)E * N_OUT * N_IN),
          *dy = randn((size_t)N * N_OUT), *y = malloc((size_t)N * N_OUT * sizeof *y),
          *dx0 = randn((size_t)N * N_IN), *dx = malloc((size_t)N * N_IN * sizeof *dx),
          *dw0 = randn((size_t)E * N_OUT * N_IN),
          *dw = malloc((size_t)E * N_OUT * N_IN * sizeof *dw);
    double worst = 0, e;
    be->expert_matmul_forward(be, y, x, w, offsets, E, N_OUT, N_IN);
    for (int acc = 0; acc < 2; acc++) {
        memcpy(dx, dx0, (size_t)N * N_IN * sizeof *dx);
        be->expert_matmul_backward_input(be, dx, dy, w, offsets, E, N_OUT, N_IN, acc);
        for (int k = 0; k < E; k++) {
            const int r = offsets[k], rows = offsets[k + 1] - r;
            const float *wk = w + (size_t)k * N_OUT * N_IN;
            e = gemm_err(dx + (size_t)r * N_IN, dx0 + (size_t)r * N_IN, dy + (size_t)r * N_OUT, wk,
                         0, 0, rows, N_IN, N_OUT, N_OUT, N_IN, N_IN, (float)acc);
            worst = e > worst ? e : worst;
        }
    }
    memcpy(dw, dw0, (size_t)E * N_OUT * N_IN * sizeof *dw);
    be->expert_matmul_backward_weight(be, dw, dy, x, offsets, E, N_OUT, N_IN);
    for (int k = 0; k < E; k++) {
        const int r = offsets[k], rows = offsets[k + 1] - r;
        const size_t wk = (size_t)k * N_OUT * N_IN;
        e = gemm_err(y + (size_t)r * N_OUT, y, x + (size_t)r * N_IN, w + wk, 0, 1, rows, N_OUT,
                     N_IN, N_IN, N_IN, N_OUT, 0);
        worst = e > worst ? e : worst;
        e = gemm_err(dw + wk, dw0 + wk, dy + (size_t)r * N_OUT, x + (size_t)r * N_IN, 1, 0, N_OUT,
                     N_IN, rows, N_OUT, N_IN, N_IN, 1);
        worst = e > worst ? e : worst;
    }
    char what[96];
    snprintf(what, sizeof what, "%s: grouped GEMMs within 1e-5 (%.1e)", path, worst);
    check_true(what, worst <= 1e-5);
    free(x), free(w), free(dy), free(y), free(dx0), free(dx), free(dw0), free(dw);
}

static moe_backend *create(const char *env, moe_status *st) {
    if (env)
        setenv("MOE_FP32_GEMM", env, 1);
    else
        unsetenv("MOE_FP32_GEMM");
    moe_backend *be = NULL;
    *st = moe_backend_create(&be, "cpu", NULL);
    return be;
}

int main(void) {
    rng_seed(&rng, 35);
    const cpu_onednn *o = cpu_onednn_load();
    printf("oneDNN: %s, dnnl_sgemm %s\n", o->name, o->sgemm ? "works" : "not here");
    moe_status st;
    moe_backend *be = create(NULL, &st);
    check_true("the backend is created", st == MOE_OK);
    if (!be) return 1;
    cpu_backend_set_threads(be, 2);
    const cpu_state *s = be->state;
    check_true("auto: oneDNN's sgemm exactly on an Intel CPU with AVX-512 where it loads",
               (s->fp32_onednn != NULL) == (cpu_intel_avx512() && o->sgemm != NULL));
    check_true("the BLAS path is set", cpu_backend_set_fp32_gemm(be, 0) && !s->fp32_onednn);
    check_matmul(be, "BLAS");
    check_grouped(be, "BLAS");
    if (cpu_backend_set_fp32_gemm(be, 1)) {
        check_true("oneDNN's path is set", s->fp32_onednn != NULL);
        check_matmul(be, "oneDNN");
        check_grouped(be, "oneDNN");
    } else {
        check_true("no oneDNN: its path is refused", !s->fp32_onednn && !o->sgemm);
        printf("(oneDNN's sgemm is not here: its path is not checked)\n");
    }
    be->destroy(be);

    be = create("blas", &st);
    check_true("MOE_FP32_GEMM=blas: the BLAS",
               st == MOE_OK && be && !((cpu_state *)be->state)->fp32_onednn);
    if (be) be->destroy(be);
    be = create("onednn", &st);
    check_true("MOE_FP32_GEMM=onednn: oneDNN where it loads, else an error naming it",
               o->sgemm ? st == MOE_OK && be && ((cpu_state *)be->state)->fp32_onednn
                        : st != MOE_OK && strstr(moe_last_error(), "MOE_FP32_GEMM=onednn"));
    if (be) be->destroy(be);
    setenv("MOE_FP32_GEMM", "onednn", 1); // row-invariant: plain loops whatever it says
    moe_backend_options ri = {.row_invariant = 1};
    st = moe_backend_create(&be, "cpu", &ri);
    check_true("row-invariant: no oneDNN sgemm, and the header does not name one",
               st == MOE_OK && !((cpu_state *)be->state)->fp32_onednn &&
                   !strstr(be->describe(be), "dnnl_sgemm"));
    if (st == MOE_OK) be->destroy(be);
    be = create("fastest", &st);
    check_true("MOE_FP32_GEMM=fastest: refused, naming the variable",
               st != MOE_OK && !be && strstr(moe_last_error(), "MOE_FP32_GEMM='fastest'"));
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
