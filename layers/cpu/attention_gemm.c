// fp32 attention's block products (attention.c: q k^T, p v, p^T do, ds k, ds^T q) on AVX-512
// registers, skipping the causal triangle. The BLAS ran these shapes (64 query rows, the
// columns 64 .. S, an inner size of hd = 32 or of 64) at 0.55 of its large-GEMM rate: each call
// packs both operands for an inner loop of 32. Here nothing is packed but k^T for q k^T, and
// the output tile stays in registers for the whole sum.
//
// c [m, n] = alpha sum_l a(i, l) b[l, :] + beta c, a(i, l) = a[i ars + l als] (so a or a^T, of
// any row stride), b's rows at stride ldb. A tile of c is 14 rows x 32 columns: 28 zmm
// accumulators, two loads of b and 14 broadcasts of a per l. Each sum runs in l order, one
// rounding per l (FMA), whichever thread and tile computes it. Measured on one thread (Xeon with
// AMX, 64 query rows, hd = 32, 256 / 2048 columns), GFLOP/s: 8 x 32 tiles 129-132 / 110-129,
// these 133-151 / 114-143; 7 x 64 tiles (4 loads of b, 7 broadcasts) 108-149.
#include "layers/cpu/cblas.h"

#include "layers/cpu/cpu_kernels.h"
#include "layers/cpu/vec_math.h"

#if defined(MOE_VEC16) && !defined(MOE_REAL_DOUBLE) && defined(__FMA__)
#define TILE_ROWS 14 // 28 accumulators: 28 of the 32 zmm registers

// Rows [i, i + R) of c, columns [j, j + 32) under the masks k0, k1, the sum over l in [l0, l1).
static inline __attribute__((always_inline)) void tile(const int R, const real *a, size_t ars,
                                                       size_t als, const real *b, int ldb,
                                                       __mmask16 k0, __mmask16 k1, int l0, int l1,
                                                       real alpha, real beta, real *c, int ldc) {
    __m512 acc0[TILE_ROWS], acc1[TILE_ROWS];
#pragma GCC unroll 14
    for (int r = 0; r < R; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
    for (int l = l0; l < l1; l++) {
        const real *bl = b + (size_t)l * ldb, *al = a + (size_t)l * als;
        const __m512 b0 = _mm512_maskz_loadu_ps(k0, bl), b1 = _mm512_maskz_loadu_ps(k1, bl + 16);
#pragma GCC unroll 14
        for (int r = 0; r < R; r++) {
            const __m512 x = _mm512_set1_ps(al[r * ars]);
            acc0[r] = _mm512_fmadd_ps(x, b0, acc0[r]);
            acc1[r] = _mm512_fmadd_ps(x, b1, acc1[r]);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 14
    for (int r = 0; r < R; r++) {
        real *cr = c + (size_t)r * ldc;
        __m512 c0 = _mm512_mul_ps(va, acc0[r]), c1 = _mm512_mul_ps(va, acc1[r]);
        if (beta != 0) {
            c0 = _mm512_add_ps(c0, _mm512_maskz_loadu_ps(k0, cr));
            c1 = _mm512_add_ps(c1, _mm512_maskz_loadu_ps(k1, cr + 16));
        }
        _mm512_mask_storeu_ps(cr, k0, c0);
        _mm512_mask_storeu_ps(cr + 16, k1, c1);
    }
}

// tile() with R a constant, so that its accumulators are registers
static void tile_rows(int R, const real *a, size_t ars, size_t als, const real *b, int ldb,
                      __mmask16 k0, __mmask16 k1, int l0, int l1, real alpha, real beta, real *c,
                      int ldc) {
#define TILE_CASE(n) \
    case n: tile(n, a, ars, als, b, ldb, k0, k1, l0, l1, alpha, beta, c, ldc); break;
    switch (R) {
        TILE_CASE(1)
        TILE_CASE(2)
        TILE_CASE(3)
        TILE_CASE(4)
        TILE_CASE(5)
        TILE_CASE(6)
        TILE_CASE(7)
        TILE_CASE(8)
        TILE_CASE(9)
        TILE_CASE(10)
        TILE_CASE(11)
        TILE_CASE(12)
        TILE_CASE(13)
        TILE_CASE(14)
    }
#undef TILE_CASE
}

void cpu_attention_gemm(cpu_attn_causal causal, int diag, int m, int n, int kd, real alpha,
                        const real *a, size_t ars, size_t als, const real *b, int ldb, real beta,
                        real *c, int ldc) {
    for (int i = 0; i < m; i += TILE_ROWS) {
        const int R = m - i < TILE_ROWS ? m - i : TILE_ROWS;
        const int last = diag + i + R;   // the tile's last row uses columns j < last
        const int w = (last + 15) & ~15; // COLS: whole 16-lane vectors, as attention.c's rows
        const int n1 = causal == CPU_ATTN_CAUSAL_COLS && w < n ? w : n;
        const int l0 = causal == CPU_ATTN_CAUSAL_L_LO && i > diag ? i - diag : 0;
        const int l1 = causal == CPU_ATTN_CAUSAL_L_HI && last < kd ? last : kd;
        for (int j = 0; j < n1; j += 32)
            tile_rows(R, a + (size_t)i * ars, ars, als, b + j, ldb, vec_lanes16(j, n1),
                      j + 16 < n1 ? vec_lanes16(j + 16, n1) : 0, l0, l1, alpha, beta,
                      c + (size_t)i * ldc + j, ldc);
    }
}


void cpu_attention_transpose(real *bt, int ldbt, const real *b, int ldb, int j0, int j1, int kd) {
    // 16 columns of a row of bt at a time, gathered from 16 rows of b
    const __m512i rows =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(ldb));
    for (int j = j0; j < j1; j += 16) {
        const __mmask16 k = vec_lanes16(j, j1);
        const real *bj = b + (size_t)j * ldb;
        for (int l = 0; l < kd; l++)
            _mm512_mask_storeu_ps(
                bt + (size_t)l * ldbt + j, k,
                _mm512_mask_i32gather_ps(_mm512_setzero_ps(), k, rows, bj + l, 4));
    }
}

#else
// Elsewhere (no AVX-512 and FMA in the build, or the double build of the gradient checks) the
// BLAS, on all of c's entries: a is a or a^T (one of ars, als is 1).
#ifdef MOE_REAL_DOUBLE
#define cblas_gemm cblas_dgemm
#else
#define cblas_gemm cblas_sgemm
#endif

void cpu_attention_gemm(cpu_attn_causal causal, int diag, int m, int n, int kd, real alpha,
                        const real *a, size_t ars, size_t als, const real *b, int ldb, real beta,
                        real *c, int ldc) {
    (void)causal, (void)diag;
    const int trans = ars == 1 && als != 1;
    cblas_gemm(CblasRowMajor, trans ? CblasTrans : CblasNoTrans, CblasNoTrans, m, n, kd, alpha, a,
               (int)(trans ? als : ars), b, ldb, beta, c, ldc);
}

void cpu_attention_transpose(real *bt, int ldbt, const real *b, int ldb, int j0, int j1, int kd) {
    for (int j = j0; j < j1; j++)
        for (int l = 0; l < kd; l++) bt[(size_t)l * ldbt + j] = b[(size_t)j * ldb + l];
}
#endif
