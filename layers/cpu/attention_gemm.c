// fp32 attention's block products (attention.c: q k^T, p v, p^T do, ds k, ds^T q) in vector
// registers (AVX-512, or AVX2 with FMA), skipping the causal triangle. The BLAS ran these shapes
// (64 query rows, the columns 64 .. S, an inner size of hd = 32 or of 64) at 0.55 of its
// large-GEMM rate: each call packs both operands for an inner loop of 32. Here nothing is
// packed but k^T and v^T (for q k^T and do v^T, by cpu_attention_transpose, kept across a kv
// head's blocks by attention.c), and the output tile stays in registers for the whole sum.
//
// c [m, n] = alpha sum_l a(i, l) b[l, :] + beta c, a(i, l) = a[i ars + l als] (so a or a^T, of
// any row stride), b's rows at stride ldb. A tile of c is TILE_ROWS rows x 2 vectors: per l two
// loads of b and TILE_ROWS broadcasts of a for 2 TILE_ROWS FMAs, the accumulators filling the
// registers but for three (AVX-512: 14 x 32 columns in 28 of 32 zmm; AVX2: 6 x 16 in 12 of 16
// ymm). Each sum runs in l order, one rounding per l (FMA), whichever thread and tile computes
// it. Measured on one thread (Xeon with AMX, 64 query rows, hd = 32, 256 / 2048 columns),
// GFLOP/s: 8 x 32 tiles 129-132 / 110-129, 14 x 32 133-151 / 114-143, 7 x 64 (4 loads of b, 7
// broadcasts) 108-149.
#include "layers/cpu/cblas.h"

#include "layers/cpu/cpu_kernels.h"
#include "layers/cpu/vec_math.h"

#if !defined(MOE_REAL_DOUBLE) && defined(__FMA__) && (defined(MOE_VEC16) || defined(__AVX2__))
#include <immintrin.h>

// ---- the vector ISA: LANES floats a vector, masks of the lanes [j, n) ----------------------
#ifdef MOE_VEC16
#define LANES 16
#define TILE_ROWS 14
typedef __m512 vec;
typedef __mmask16 lanes;
static inline lanes lanes_of(int j, int n) { return vec_lanes16(j, n); }
static inline lanes no_lanes(void) { return 0; }
static inline vec load(lanes k, const real *p) { return _mm512_maskz_loadu_ps(k, p); }
static inline void store(real *p, lanes k, vec x) { _mm512_mask_storeu_ps(p, k, x); }
static inline vec set1(real x) { return _mm512_set1_ps(x); }
static inline vec zero(void) { return _mm512_setzero_ps(); }
static inline vec madd(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
static inline vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
// element l of b's rows 0 .. (row stride ldb) in the lanes k: b[t ldb + l] in lane t
static inline vec gather(lanes k, const real *b, int ldb, int l) {
    const __m512i rows =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32(ldb));
    return _mm512_mask_i32gather_ps(zero(), k, rows, b + l, 4);
}
#else
#define LANES 8
#define TILE_ROWS 6
typedef __m256 vec;
typedef __m256i lanes; // all-ones in the lanes taken
static inline lanes lanes_of(int j, int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n - j), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline lanes no_lanes(void) { return _mm256_setzero_si256(); }
static inline vec load(lanes k, const real *p) { return _mm256_maskload_ps(p, k); }
static inline void store(real *p, lanes k, vec x) { _mm256_maskstore_ps(p, k, x); }
static inline vec set1(real x) { return _mm256_set1_ps(x); }
static inline vec zero(void) { return _mm256_setzero_ps(); }
static inline vec madd(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
static inline vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
static inline vec gather(lanes k, const real *b, int ldb, int l) {
    const __m256i rows =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(ldb));
    return _mm256_mask_i32gather_ps(zero(), b + l, rows, _mm256_castsi256_ps(k), 4);
}
#endif

// Rows [0, R) of the tile at c, its two vectors of columns under the masks k0, k1, the sum over
// l in [l0, l1).
static inline __attribute__((always_inline)) void tile(const int R, const real *a, size_t ars,
                                                       size_t als, const real *b, int ldb, lanes k0,
                                                       lanes k1, int l0, int l1, real alpha,
                                                       real beta, real *c, int ldc) {
    vec acc0[TILE_ROWS], acc1[TILE_ROWS];
#pragma GCC unroll 14
    for (int r = 0; r < R; r++) acc0[r] = acc1[r] = zero();
    for (int l = l0; l < l1; l++) {
        const real *bl = b + (size_t)l * ldb, *al = a + (size_t)l * als;
        const vec b0 = load(k0, bl), b1 = load(k1, bl + LANES);
#pragma GCC unroll 14
        for (int r = 0; r < R; r++) {
            const vec x = set1(al[r * ars]);
            acc0[r] = madd(x, b0, acc0[r]);
            acc1[r] = madd(x, b1, acc1[r]);
        }
    }
    const vec va = set1(alpha);
#pragma GCC unroll 14
    for (int r = 0; r < R; r++) {
        real *cr = c + (size_t)r * ldc;
        vec c0 = mul(va, acc0[r]), c1 = mul(va, acc1[r]);
        if (beta != 0) {
            c0 = add(c0, load(k0, cr));
            c1 = add(c1, load(k1, cr + LANES));
        }
        store(cr, k0, c0);
        store(cr + LANES, k1, c1);
    }
}

// tile() with R a constant, so that its accumulators are registers
static void tile_rows(int R, const real *a, size_t ars, size_t als, const real *b, int ldb,
                      lanes k0, lanes k1, int l0, int l1, real alpha, real beta, real *c, int ldc) {
#define TILE_CASE(n) \
    case n: tile(n, a, ars, als, b, ldb, k0, k1, l0, l1, alpha, beta, c, ldc); break;
    switch (R) {
        TILE_CASE(1)
        TILE_CASE(2)
        TILE_CASE(3)
        TILE_CASE(4)
        TILE_CASE(5)
        TILE_CASE(6)
#if TILE_ROWS > 6
        TILE_CASE(7)
        TILE_CASE(8)
        TILE_CASE(9)
        TILE_CASE(10)
        TILE_CASE(11)
        TILE_CASE(12)
        TILE_CASE(13)
        TILE_CASE(14)
#endif
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
        for (int j = 0; j < n1; j += 2 * LANES)
            tile_rows(R, a + (size_t)i * ars, ars, als, b + j, ldb, lanes_of(j, n1),
                      j + LANES < n1 ? lanes_of(j + LANES, n1) : no_lanes(), l0, l1, alpha, beta,
                      c + (size_t)i * ldc + j, ldc);
    }
}

void cpu_attention_transpose(real *bt, int ldbt, const real *b, int ldb, int j0, int j1, int kd) {
    for (int j = j0; j < j1; j += LANES) { // LANES columns of a row of bt, from LANES rows of b
        const lanes k = lanes_of(j, j1);
        for (int l = 0; l < kd; l++)
            store(bt + (size_t)l * ldbt + j, k, gather(k, b + (size_t)j * ldb, ldb, l));
    }
}

#else
// Elsewhere (no AVX2 and FMA in the build, or the double build of the gradient checks) the
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
