// layers/cpu/attention_gemm.c's products, op by op, against a direct sum in double: every
// causal mode (the entries each must write, the terms each may skip), a and a^T at row strides
// wider than the operand, beta 0 and 1, row counts around the tile's (1 .. 30 rows: tails of
// 14-row AVX-512 and 6-row AVX2 tiles) and column counts around the vectors' (hd 8, 32, 40, 72;
// up to 90 columns); and the transpose of column ranges. Entries that must stay unwritten
// (beyond c's n columns, in c's row padding) are checked to be.
//
// Built twice (tests/CMakeLists.txt): against the library's build (AVX-512 where the build
// targets it), and with attention_gemm.c compiled again for AVX2 + FMA without AVX-512
// (renamed avx2_attention_*: the path of AVX2-only CPUs such as Zen 3), which runs where the
// CPU has AVX2 and FMA, and skips (77) elsewhere.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/cpu/cpu_kernels.h"
#include "test_util.h"

// (In the AVX2 build, cpu_attention_gemm and cpu_attention_transpose are renamed by the
// compiler's -D options, here and in attention_gemm.c alike.)

#define PAD 5         // extra columns of every row stride
#define SENTINEL 7.5f // what c holds where nothing may be written

static test_rng rng;
static real uniform(void) { return (real)(2 * rng_uniform(&rng) - 1); }

// Which entries of c [m, n] the mode must write, and which terms a(i, l) it may skip
static int must_write(cpu_attn_causal mode, int diag, int i, int j) {
    return mode != CPU_ATTN_CAUSAL_COLS || j < 16 * ((diag + i + 1 + 15) / 16);
}
static int term_zero(cpu_attn_causal mode, int diag, int i, int l) {
    return (mode == CPU_ATTN_CAUSAL_L_HI && l > diag + i) ||
           (mode == CPU_ATTN_CAUSAL_L_LO && i > diag + l);
}

// One product: a or a^T (trans) with the mode's zero terms set to 0, checked entry by entry.
static void check_case(cpu_attn_causal mode, int diag, int m, int n, int kd, int trans, real beta) {
    const int lda = (trans ? m : kd) + PAD, ldb = n + PAD, ldc = n + PAD;
    const int a_rows = trans ? kd : m;
    real *a = malloc(sizeof(real) * (size_t)a_rows * lda), *b = malloc(sizeof(real) * kd * ldb);
    real *c = malloc(sizeof(real) * (size_t)m * ldc), *c0 = malloc(sizeof(real) * (size_t)m * ldc);
    for (int t = 0; t < a_rows * lda; t++) a[t] = uniform();
    for (int t = 0; t < kd * ldb; t++) b[t] = uniform();
    const size_t ars = trans ? 1 : (size_t)lda, als = trans ? (size_t)lda : 1;
    for (int i = 0; i < m; i++)
        for (int l = 0; l < kd; l++)
            if (term_zero(mode, diag, i, l)) a[i * ars + l * als] = 0;
    for (int t = 0; t < m * ldc; t++) c0[t] = (t % ldc) < n ? uniform() : SENTINEL;
    memcpy(c, c0, sizeof(real) * (size_t)m * ldc);
    const real alpha = (real)0.75;
    cpu_attention_gemm(mode, diag, m, n, kd, alpha, a, ars, als, b, ldb, beta, c, ldc);
    double worst = 0, scale = 0;
    int kept = 1;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ldc; j++) {
            const real got = c[i * ldc + j];
            if (j >= n) {
                kept &= got == SENTINEL;
                continue;
            }
            if (!must_write(mode, diag, i, j)) continue;
            double want = beta != 0 ? c0[i * ldc + j] : 0;
            for (int l = 0; l < kd; l++)
                want += alpha * (double)a[i * ars + l * als] * b[l * ldb + j];
            const double e = fabs(got - want);
            worst = e > worst ? e : worst;
            scale = fabs(want) > scale ? fabs(want) : scale;
        }
    char what[160];
    static const char *names[] = {"full", "cols", "l_hi", "l_lo"};
    snprintf(what, sizeof what, "%s diag %d, %d x %d x %d, %s, beta %g: err %.2e of %.2e%s",
             names[mode], diag, m, n, kd, trans ? "a^T" : "a", (double)beta, worst, scale,
             kept ? "" : ", WROTE PAST n");
    // fp32 sums of kd terms of |x| <= 0.75: a few ulp of the sum's size
    check_true(what, kept && worst <= 1e-5 * (scale + 1) * (1 + kd / 64.0));
    free(a), free(b), free(c), free(c0);
}

static void check_transpose(int j0, int j1, int kd) {
    const int ldb = kd + PAD, ldbt = j1 + PAD;
    real *b = malloc(sizeof(real) * j1 * ldb), *bt = malloc(sizeof(real) * kd * ldbt);
    for (int t = 0; t < j1 * ldb; t++) b[t] = uniform();
    for (int t = 0; t < kd * ldbt; t++) bt[t] = SENTINEL;
    cpu_attention_transpose(bt, ldbt, b, ldb, j0, j1, kd);
    int ok = 1;
    for (int l = 0; l < kd; l++)
        for (int j = 0; j < ldbt; j++)
            ok &= bt[l * ldbt + j] == (j >= j0 && j < j1 ? b[j * ldb + l] : SENTINEL);
    char what[96];
    snprintf(what, sizeof what, "transpose of columns [%d, %d), kd %d", j0, j1, kd);
    check_true(what, ok);
    free(b), free(bt);
}

int main(void) {
#ifdef ATTN_GEMM_AVX2
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        printf("skip: this CPU has no AVX2 and FMA\n");
        return 77;
    }
    printf("attention_gemm.c compiled for AVX2 + FMA\n");
#else
    printf("attention_gemm.c as the library is built\n");
#endif
    rng_seed(&rng, 35);
    const int rows[] = {1, 5, 6, 7, 13, 14, 15, 29, 30};
    const int hds[] = {8, 32, 40, 72};
    for (int mode = CPU_ATTN_CAUSAL_NONE; mode <= CPU_ATTN_CAUSAL_L_LO; mode++)
        for (size_t r = 0; r < sizeof rows / sizeof *rows; r++)
            for (size_t h = 0; h < sizeof hds / sizeof *hds; h++) {
                const int m = rows[r], hd = hds[h], diag = (int)(r % 3) * 17;
                const int cols = diag + m; // a query block's columns: [0, diag + m)
                // q k^T: [m, cols] over hd; p v: [m, hd] over cols; p^T do: [cols, hd] over m
                if (mode == CPU_ATTN_CAUSAL_COLS || mode == CPU_ATTN_CAUSAL_NONE)
                    check_case(mode, diag, m, cols, hd, 0, 0);
                if (mode == CPU_ATTN_CAUSAL_L_HI || mode == CPU_ATTN_CAUSAL_NONE)
                    check_case(mode, diag, m, hd, cols, 0, (real)(h % 2));
                if (mode == CPU_ATTN_CAUSAL_L_LO || mode == CPU_ATTN_CAUSAL_NONE)
                    check_case(mode, diag, cols, hd, m, 1, 1);
            }
    check_transpose(0, 90, 32);
    check_transpose(17, 64, 40);
    check_transpose(5, 6, 8);
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
