// The bf16 GEMM on AMX tiles (Intel AMX-BF16: Sapphire Rapids and later): c [m, n] =
// alpha op(a) op(b) + beta c, a and b bf16, c fp32, accumulation in fp32. The CPU backend's
// bf16 path "amx" (layers/cpu/gemm_bf16.c), chosen for the model's small shapes, where a
// library's per-call cost (checks, packing into its own layouts, threading) outweighs the
// arithmetic: attention's 64 x 256 x 32 blocks take 6 us in oneDNN 2.6 and 3 here (one
// thread of a Xeon; docs/measurements/2026-12-06-amx-gemm-xeon.md has the shapes).
//
// The instruction: TDPBF16PS c, a, b computes, for a tile c of 16 x 16 fp32, a tile a of
// 16 rows x 32 bf16 and a tile b of 16 x 16 pairs of bf16 ("VNNI" layout: b's row p holds
// (B[2p][j], B[2p+1][j]) for the 16 columns j),
//     c[i][j] += sum_p a[i][2p] B[2p][j] + a[i][2p+1] B[2p+1][j]      (p = 0 .. 15)
// So both operands are handled as 32-bit words, each a pair of bf16 along k:
//     A-words  wa[i][p] = (op(a)[i][2p], op(a)[i][2p+1])   16 rows i x 16 words p a tile
//     B-words  wb[p][j] = (op(b)[2p][j], op(b)[2p+1][j])   16 rows p x 16 words j a tile
// packed here into tiles of 1 KiB, zero-padded at every edge (rows, columns, odd k), so the
// kernel needs no edge cases until it writes c.
//
// Blocking: op(b) is packed a panel of columns at a time (every 16-column block, every
// 32-deep chunk of k; at most 1 MiB); then each block of 32 rows of op(a), read in place or
// packed, is multiplied against it, 32 columns at a time, by 4 accumulator tiles (0-3),
// 2 tiles of a (4, 5) and 2 of b (6, 7):
//     [c0 c1]   +=  [a0] [b0 b1]      for each chunk of 32 k
//     [c2 c3]       [a1]
// Few rows against weights stored [n, kd] swap the roles (c^T = b op(a)^T), and 1-3 rows
// use AVX512-BF16 dot products (few_rows). The experts' first GEMM can end in the SwiGLU
// (cpu_amx_swiglu_bf16, at the end of the file).
// Every output is one sum over k in chunk order whatever the thread count, so results are
// deterministic. TDPBF16PS treats bf16 subnormal inputs as zero and flushes subnormal
// outputs (Intel SDM), a difference from the other paths far below bf16's own rounding.
//
// Outside a parallel region the GEMM spreads over the threads (op(b)'s blocks, then the row
// blocks); inside one (one expert's or one attention block's GEMM per thread) it runs on the
// calling thread.
#define _GNU_SOURCE
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layers/cpu/cpu_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(MOE_REAL_DOUBLE) && defined(MOE_HAVE_AMX)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "layers/cpu/swiglu.h"

#define AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,amx-tile,amx-bf16")))

// ---- may this process use AMX? ---------------------------------------------------------

// Linux gives a process AMX's 8 KiB of tile state only when asked (arch_prctl, since 5.16);
// an AMX instruction without it is SIGILL.
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    const int avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1;
    const int amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
    // AVX512-BF16 (few_rows' VDPBF16PS): every AMX CPU so far has it, but check
    const int avx512_bf16 = (int)a >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5) & 1;
    if (!(avx512bw && avx512vl && amx_bf16 && amx_tile && avx512_bf16)) return;
    amx_ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

int cpu_amx_available(void) {
    pthread_once(&amx_once, amx_probe);
    return amx_ok;
}

// ---- tiles -------------------------------------------------------------------------------

enum { TILE_WORDS = 256 }; // a tile: 16 rows x 16 words of 32 bits (64 bytes a row)

// Palette 1, the 8 tiles all 16 rows x 64 bytes (LDTILECFG's 64-byte operand).
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

AMX_TARGET static void configure_tiles(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
}

// ---- packing -----------------------------------------------------------------------------

static inline __mmask32 first32(int n) {
    return n <= 0 ? 0 : n >= 32 ? 0xffffffffu : (1u << n) - 1;
}
static inline __mmask16 first16(int n) {
    return n <= 0 ? 0 : n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
}

// 16 words (x[i], y[i]): the pairs of two rows of 16 bf16.
AMX_TARGET static inline __m512i pair_rows(__m256i x, __m256i y) {
    return _mm512_or_si512(_mm512_cvtepu16_epi32(x),
                           _mm512_slli_epi32(_mm512_cvtepu16_epi32(y), 16));
}

// rows [16][16] words -> tile [16][16] words, transposed, in registers: pairs of rows
// interleaved by words, then by pairs of words (each 128-bit lane then holds a 4 x 4 block
// transposed), then the lanes gathered across the four groups of rows.
AMX_TARGET static void store_transposed(uint32_t *tile, const __m512i rows[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { // u[4i + c], lane l: column 4l + c of rows 4i .. 4i+3
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int c = 0; c < 4; c++) { // column 4l + c = lane l of u[c], u[4+c], u[8+c], u[12+c]
        const __m512i p0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44),
                      p1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee),
                      q0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44),
                      q1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
        _mm512_storeu_si512(tile + (0 + c) * 16, _mm512_shuffle_i32x4(p0, q0, 0x88));
        _mm512_storeu_si512(tile + (4 + c) * 16, _mm512_shuffle_i32x4(p0, q0, 0xdd));
        _mm512_storeu_si512(tile + (8 + c) * 16, _mm512_shuffle_i32x4(p1, q1, 0x88));
        _mm512_storeu_si512(tile + (12 + c) * 16, _mm512_shuffle_i32x4(p1, q1, 0xdd));
    }
}

// The A-words tile of op(a)'s rows i0 .. i0+15 and k chunk k0 .. k0+31 (rows past m, columns
// past kd zero). op(a)[i][k] = a[i lda + k], or a[k lda + i] when trans.
AMX_TARGET static void pack_a_tile(uint32_t *tile, const moe_bf16 *a, int lda, int trans, int m,
                                   int kd, int i0, int k0) {
    if (!trans) {
        const __mmask32 mk = first32(kd - k0);
        for (int r = 0; r < 16; r++) {
            const __m512i v = i0 + r < m
                                  ? _mm512_maskz_loadu_epi16(mk, a + (size_t)(i0 + r) * lda + k0)
                                  : _mm512_setzero_si512();
            _mm512_storeu_si512(tile + r * 16, v);
        }
        return;
    }
    const __mmask16 mi = first16(m - i0);
    __m512i rows[16]; // rows[p][i]: the pair (k0+2p, k0+2p+1) of column i0+i
    for (int p = 0; p < 16; p++) {
        const int k = k0 + 2 * p;
        const __m256i x = k < kd ? _mm256_maskz_loadu_epi16(mi, a + (size_t)k * lda + i0)
                                 : _mm256_setzero_si256();
        const __m256i y = k + 1 < kd ? _mm256_maskz_loadu_epi16(mi, a + (size_t)(k + 1) * lda + i0)
                                     : _mm256_setzero_si256();
        rows[p] = pair_rows(x, y);
    }
    store_transposed(tile, rows);
}

// The B-words tile of op(b)'s columns j0 .. j0+15 and k chunk k0 .. k0+31. op(b)[k][j] =
// b[k ldb + j], or b[j ldb + k] when trans.
AMX_TARGET static void pack_b_tile(uint32_t *tile, const moe_bf16 *b, int ldb, int trans, int n,
                                   int kd, int j0, int k0) {
    if (!trans) {
        const __mmask16 mj = first16(n - j0);
        for (int p = 0; p < 16; p++) {
            const int k = k0 + 2 * p;
            const __m256i x = k < kd ? _mm256_maskz_loadu_epi16(mj, b + (size_t)k * ldb + j0)
                                     : _mm256_setzero_si256();
            const __m256i y = k + 1 < kd
                                  ? _mm256_maskz_loadu_epi16(mj, b + (size_t)(k + 1) * ldb + j0)
                                  : _mm256_setzero_si256();
            _mm512_storeu_si512(tile + p * 16, pair_rows(x, y));
        }
        return;
    }
    const __mmask32 mk = first32(kd - k0);
    __m512i rows[16]; // rows[j][p]: column j0+j's 16 pairs from k0
    for (int j = 0; j < 16; j++)
        rows[j] = j0 + j < n ? _mm512_maskz_loadu_epi16(mk, b + (size_t)(j0 + j) * ldb + k0)
                             : _mm512_setzero_si512();
    store_transposed(tile, rows);
}

// ---- the kernel --------------------------------------------------------------------------

// Each thread's packing buffer for a block of op(a), grown on demand (64-byte aligned).
static _Thread_local uint32_t *a_buf, *b_buf;
static _Thread_local size_t a_cap, b_cap;

static uint32_t *grow(uint32_t **buf, size_t *cap, size_t words) {
    if (words > *cap) {
        free(*buf);
        *buf = aligned_alloc(64, (words * 4 + 63) / 64 * 64);
        *cap = *buf ? words : 0;
        if (!*buf) moe_fatal("cpu: cannot allocate %zu bytes for AMX packing", words * 4);
    }
    return *buf;
}

typedef struct {
    int trans_a, trans_b, m, n, kd, kc, nb; // kc: chunks of 32 k; nb: 16-column blocks (even)
    float alpha, beta;
    const moe_bf16 *a, *b;
    int lda, ldb, ldc;
    float *c;
    int c_trans;        // 1: the product's (i, j) is c[j ldc + i] (cpu_amx_gemm_bf16's swap)
    const uint32_t *bp; // op(b) packed: tile (jb, kc) at bp + (jb kc_n + kc) TILE_WORDS
} amx_gemm;

// c's 32 x 32 block at (i0, j0) from the 4 accumulator tiles. Whole blocks with beta 0 or 1
// (c loaded into the tiles before) are stored in place, then scaled there when alpha is not 1
// (c = fl(alpha fl(sum)), as the libraries compute it); edge blocks and other betas go
// through t: c = alpha t + beta c, beta 0 not reading c.
AMX_TARGET static void store_block(const amx_gemm *g, int i0, int j0, int direct) {
    const size_t ldc = (size_t)g->ldc;
    float *c = g->c_trans ? NULL : g->c + i0 * ldc + j0;
    const __m512 alpha = _mm512_set1_ps(g->alpha), beta = _mm512_set1_ps(g->beta);
    if (direct) {
        _tile_stored(0, c, ldc * 4);
        _tile_stored(1, c + 16, ldc * 4);
        _tile_stored(2, c + 16 * ldc, ldc * 4);
        _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
        if (g->alpha != 1)
            for (int r = 0; r < 32; r++)
                for (int h = 0; h < 32; h += 16)
                    _mm512_storeu_ps(c + r * ldc + h,
                                     _mm512_mul_ps(alpha, _mm512_loadu_ps(c + r * ldc + h)));
        return;
    }
    float t[32][32] __attribute__((aligned(64)));
    _tile_stored(0, &t[0][0], 128);
    _tile_stored(1, &t[0][16], 128);
    _tile_stored(2, &t[16][0], 128);
    _tile_stored(3, &t[16][16], 128);
    const int rows = g->m - i0 < 32 ? g->m - i0 : 32, cols = g->n - j0;
    const int beta0 = g->beta == 0;
    if (g->c_trans) { // a few columns of c^T: element by element
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < 32 && j < cols; j++) {
                float *cij = g->c + (size_t)(j0 + j) * ldc + i0 + r;
                *cij = beta0 ? g->alpha * t[r][j] : g->alpha * t[r][j] + g->beta * *cij;
            }
        return;
    }
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < 32 && h < cols; h += 16) {
            const __mmask16 mj = first16(cols - h);
            float *cr = c + r * ldc + h;
            __m512 v = _mm512_mul_ps(alpha, _mm512_load_ps(&t[r][h]));
            if (!beta0) v = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(mj, cr), v);
            _mm512_mask_storeu_ps(cr, mj, v);
        }
}

// Where the tiles of op(a)'s rows i0 .. i0+31 are: tile (t, kc) at pa + t step_t + kc step_k,
// its 16 rows sa bytes apart.
typedef struct {
    const char *pa;
    size_t sa, step_t, step_k;
} a_tiles;

// op(a)'s tiles are read in place when they can be (a not transposed, 32 whole rows, kd a
// multiple of 32: 16 rows of 64 bytes at a's stride), else packed into this thread's buffer.
AMX_TARGET static a_tiles a_block(const amx_gemm *g, int i0) {
    if (!g->trans_a && i0 + 32 <= g->m && g->kd % 32 == 0) {
        const size_t sa = (size_t)g->lda * 2;
        return (a_tiles){(const char *)(g->a + (size_t)i0 * g->lda), sa, 16 * sa, 64};
    }
    uint32_t *ap = grow(&a_buf, &a_cap, (size_t)g->kc * 2 * TILE_WORDS);
    for (int kc = 0; kc < g->kc; kc++)
        for (int t = 0; t < 2; t++)
            pack_a_tile(ap + (size_t)(kc * 2 + t) * TILE_WORDS, g->a, g->lda, g->trans_a, g->m,
                        g->kd, i0 + 16 * t, kc * 32);
    return (a_tiles){(const char *)ap, 64, TILE_WORDS * 4, 2 * TILE_WORDS * 4};
}

// The 2 x 2 product over every chunk of k: accumulators 0, 1 (rows 0-15) and 2, 3 (rows
// 16-31) += a's two tiles times the column blocks b0 and b1 (kc tiles each, 1 KiB apart).
AMX_TARGET static inline void tiles_2x2(const a_tiles *at, const uint32_t *b0, const uint32_t *b1,
                                        int kc) {
    for (int k = 0; k < kc; k++) {
        _tile_loadd(4, at->pa + k * at->step_k, at->sa);
        _tile_loadd(5, at->pa + k * at->step_k + at->step_t, at->sa);
        _tile_loadd(6, b0 + (size_t)k * TILE_WORDS, 64);
        _tile_loadd(7, b1 + (size_t)k * TILE_WORDS, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
}

// Rows i0 .. i0+31 of c against every column, 32 columns at a time.
AMX_TARGET static void row_block(const amx_gemm *g, int i0) {
    const int whole_rows = i0 + 32 <= g->m,
              in_place = !g->c_trans && (g->beta == 0 || (g->beta == 1 && g->alpha == 1));
    const a_tiles at = a_block(g, i0);
    const char *pa = at.pa;
    const size_t sa = at.sa, step_t = at.step_t, step_k = at.step_k;
    for (int jb = 0; jb < g->nb; jb += 2) {
        const int j0 = jb * 16, direct = in_place && whole_rows && j0 + 32 <= g->n;
        float *c = g->c + (size_t)i0 * g->ldc + j0;
        const size_t ldc_bytes = (size_t)g->ldc * 4;
        if (direct && g->beta == 1) {
            _tile_loadd(0, c, ldc_bytes);
            _tile_loadd(1, c + 16, ldc_bytes);
            _tile_loadd(2, c + 16 * (size_t)g->ldc, ldc_bytes);
            _tile_loadd(3, c + 16 * (size_t)g->ldc + 16, ldc_bytes);
        } else {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
        }
        const uint32_t *b0 = g->bp + (size_t)jb * g->kc * TILE_WORDS,
                       *b1 = b0 + (size_t)g->kc * TILE_WORDS;
        if (j0 + 16 < g->n && i0 + 16 < g->m)
            tiles_2x2(&at, b0, b1, g->kc);
        else if (i0 + 16 < g->m) // 16 columns or fewer left: tiles 1 and 3 stay zero
            for (int kc = 0; kc < g->kc; kc++) {
                _tile_loadd(4, pa + kc * step_k, sa);
                _tile_loadd(5, pa + kc * step_k + step_t, sa);
                _tile_loadd(6, b0 + (size_t)kc * TILE_WORDS, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(2, 5, 6);
            }
        else // 16 rows or fewer left: tiles 2 and 3 stay zero
            for (int kc = 0; kc < g->kc; kc++) {
                _tile_loadd(4, pa + kc * step_k, sa);
                _tile_loadd(6, b0 + (size_t)kc * TILE_WORDS, 64);
                _tile_loadd(7, b1 + (size_t)kc * TILE_WORDS, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
            }
        store_block(g, i0, j0, direct);
    }
}

// op(b)'s tiles of the 16-column blocks [jb0, jb1).
AMX_TARGET static void pack_b_blocks(const amx_gemm *g, uint32_t *bp, int jb0, int jb1) {
    for (int jb = jb0; jb < jb1; jb++)
        for (int kc = 0; kc < g->kc; kc++)
            pack_b_tile(bp + ((size_t)jb * g->kc + kc) * TILE_WORDS, g->b, g->ldb, g->trans_b, g->n,
                        g->kd, jb * 16, kc * 32);
}

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

// v[0..15] -> one vector whose lane j is the sum of v[j]'s 16 lanes: pairs of vectors added
// lane-wise after interleaving (words, then pairs of words), then the 128-bit lanes.
BF16_TARGET static inline __m512 sum16(const __m512 v[16]) {
    __m512 w[8], x[4];
    for (int k = 0; k < 8; k++) // lane l: [a0+a2, b0+b2, a1+a3, b1+b3] of v[2k], v[2k+1]
        w[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]),
                             _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    for (int k = 0; k < 4; k++) { // lane l: the lane's sums of v[4k .. 4k+3]
        const __m512d a = _mm512_castps_pd(w[2 * k]), b = _mm512_castps_pd(w[2 * k + 1]);
        x[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    const __m512 z01 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], 0x44),
                                     _mm512_shuffle_f32x4(x[0], x[1], 0xee)),
                 z23 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], 0x44),
                                     _mm512_shuffle_f32x4(x[2], x[3], 0xee));
    return _mm512_add_ps(_mm512_shuffle_f32x4(z01, z23, 0x88),
                         _mm512_shuffle_f32x4(z01, z23, 0xdd));
}

// A few rows (m < 4, a not transposed) against weights stored [n, kd] (decode steps):
// c[i][j] = alpha (a_i . b_j) + beta c[i][j], each dot product 32 bf16 at a time by
// VDPBF16PS (AVX512-BF16, which every AMX CPU has), 16 columns at once, their 16 partial
// vectors summed together at the end (sum16). The rows of b are read once, in order; tiles
// would read them 16 rows at a time across b's stride.
BF16_TARGET static void few_rows(int m, int n, int kd, float alpha, const moe_bf16 *a, int lda,
                                 const moe_bf16 *b, int ldb, float beta, float *c, int ldc) {
    const int spread =
        !omp_in_parallel() && omp_get_max_threads() > 1 && cpu_parallel_worth((size_t)n * kd / 8);
#pragma omp parallel for schedule(static) if (spread)
    for (int j0 = 0; j0 < n; j0 += 16) {
        const int nj = n - j0 < 16 ? n - j0 : 16;
        for (int i = 0; i < m; i++) {
            __m512 acc[16];
            for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
            for (int k0 = 0; k0 < kd; k0 += 32) { // 16 columns always, so acc stays in registers
                const __mmask32 mk = first32(kd - k0);
                const __m512bh x = (__m512bh)_mm512_maskz_loadu_epi16(mk, a + (size_t)i * lda + k0);
                for (int j = 0; j < 16; j++) {
                    const int jr = j < nj ? j0 + j : j0; // past n: nothing loaded
                    acc[j] = _mm512_dpbf16_ps(acc[j], x,
                                              (__m512bh)_mm512_maskz_loadu_epi16(
                                                  j < nj ? mk : 0, b + (size_t)jr * ldb + k0));
                }
            }
            const __mmask16 mj = first16(nj);
            float *ci = c + (size_t)i * ldc + j0;
            __m512 v = _mm512_mul_ps(_mm512_set1_ps(alpha), sum16(acc));
            if (beta != 0)
                v = _mm512_add_ps(
                    v, _mm512_mul_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mj, ci)));
            _mm512_mask_storeu_ps(ci, mj, v);
        }
    }
}

AMX_TARGET static void gemm_panel(amx_gemm *g);

// cpu_amx_gemm_bf16 computes c^T (below) for these shapes.
static int swap_rows(int m, int n, int kd, int trans_b) {
    return trans_b && n >= 32 && (m < 32 || (m <= 128 && kd >= 256 && n >= 8 * m));
}

AMX_TARGET void cpu_amx_gemm_bf16(int trans_a, int trans_b, int m, int n, int kd, float alpha,
                                  const moe_bf16 *a, int lda, const moe_bf16 *b, int ldb,
                                  float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0) return;
    if (m < 4 && !trans_a && trans_b) {
        few_rows(m, n, kd, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    // Few rows against weights stored [n, kd] (decode and small batches; an lm_head): packing
    // all of op(b) would cost more than the product, so compute c^T = b op(a)^T instead, b's
    // rows read in place and the few columns of op(a)^T packed. 8 x 1024 x 1024: 101 -> 340
    // GFLOP/s; 64 x 32000 x 1024: 482 -> 850 (oneDNN 744). Not for a short kd (attention's
    // 64 x 256 x 32), where c^T's element-wise store would cost more than the packing saves.
    const int swap = swap_rows(m, n, kd, trans_b);
    amx_gemm g = {swap ? 0 : trans_a,
                  swap ? !trans_a : trans_b,
                  swap ? n : m,
                  swap ? m : n,
                  kd,
                  (kd + 31) / 32,
                  0,
                  alpha,
                  beta,
                  swap ? b : a,
                  swap ? a : b,
                  swap ? ldb : lda,
                  swap ? lda : ldb,
                  ldc,
                  c,
                  swap,
                  NULL};
    if (g.kc == 0) g.kc = 1; // kd 0: one chunk of zeros, so that c = beta c
    // op(b) is packed a panel of columns at a time, at most 1 MiB of tiles (half an L2), so
    // that the packed copy stays in cache and never grows with the weights (an lm_head of
    // 32000 x 4096 whole would be 256 MiB more)
    const int panel = 32 * (g.kc < 512 ? 512 / g.kc : 1);
    for (int j0 = 0; j0 < g.n; j0 += panel) {
        amx_gemm p = g;
        p.n = g.n - j0 < panel ? g.n - j0 : panel;
        p.b = g.b + (g.trans_b ? (size_t)j0 * g.ldb : (size_t)j0);
        p.c = g.c + (g.c_trans ? (size_t)j0 * g.ldc : (size_t)j0);
        gemm_panel(&p);
    }
}

// One panel: op(b) packed, then every 32-row block of c against it.
AMX_TARGET static void gemm_panel(amx_gemm *g) {
    g->nb = (g->n + 31) / 32 * 2;
    const int m = g->m, n = g->n, kd = g->kd;
    uint32_t *bp = grow(&b_buf, &b_cap, (size_t)g->nb * g->kc * TILE_WORDS);
    g->bp = bp;
    const int row_blocks = (m + 31) / 32;
    const int spread = !omp_in_parallel() && omp_get_max_threads() > 1 &&
                       cpu_parallel_worth((size_t)m * n * (kd > 32 ? kd / 32 : 1));
    if (!spread) {
        configure_tiles();
        pack_b_blocks(g, bp, 0, g->nb);
        for (int ib = 0; ib < row_blocks; ib++) row_block(g, ib * 32);
        _tile_release();
        return;
    }
#pragma omp parallel
    {
        configure_tiles();
#pragma omp for schedule(static)
        for (int jb = 0; jb < g->nb; jb++) pack_b_blocks(g, bp, jb, jb + 1);
#pragma omp for schedule(static)
        for (int ib = 0; ib < row_blocks; ib++) row_block(g, ib * 32);
        _tile_release();
    }
}

// ---- an expert's first GEMM with SwiGLU as its epilogue ----------------------------------
// h = a w13^T, [h1 | h3] = h (ff columns each), act = bf16(silu(h1) h3), h13_16 = bf16(h):
// the tiles of gate columns j .. j+15 and of the up columns ff+j .. ff+j+15 are computed side
// by side (accumulators 0, 2 and 1, 3), and the SwiGLU reads them from a 32 x 32 block in L1.
// h never goes to memory in fp32 (12 MiB a layer of shakespeare's written, then read back).
// The same bits as cpu_amx_gemm_bf16 followed by swiglu_forward_bf16: every h value is the
// same sum of the same tiles, and swiglu_row_bf16 is the unfused kernel's element math.

// Op(b)'s tiles of gate columns [p0, p0 + 16 np16) (blocks 0 .. np16-1) and of their up
// columns ff + p0 .. (blocks np16 .. 2 np16-1), blocks [jb0, jb1) of those.
AMX_TARGET static void pack_swiglu_blocks(const amx_gemm *g, uint32_t *bp, int ff, int p0, int np16,
                                          int jb0, int jb1) {
    for (int jb = jb0; jb < jb1; jb++) {
        const int col = jb < np16 ? p0 + 16 * jb : ff + p0 + 16 * (jb - np16);
        for (int kc = 0; kc < g->kc; kc++)
            pack_b_tile(bp + ((size_t)jb * g->kc + kc) * TILE_WORDS, g->b, g->ldb, 1, g->n, g->kd,
                        col, kc * 32);
    }
}

AMX_TARGET static void swiglu_row_block(const amx_gemm *g, int i0, int ff, int p0, int np16,
                                        moe_bf16 *act16, moe_bf16 *h13_16) {
    const a_tiles at = a_block(g, i0);
    const int rows = g->m - i0 < 32 ? g->m - i0 : 32;
    float t[32][32] __attribute__((aligned(64)));
    for (int jb = 0; jb < np16; jb++) {
        const uint32_t *bg = g->bp + (size_t)jb * g->kc * TILE_WORDS,
                       *bu = g->bp + (size_t)(np16 + jb) * g->kc * TILE_WORDS;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        tiles_2x2(&at, bg, bu, g->kc);
        _tile_stored(0, &t[0][0], 128); // t[r] = h1 of 16 columns, then their h3
        _tile_stored(1, &t[0][16], 128);
        _tile_stored(2, &t[16][0], 128);
        _tile_stored(3, &t[16][16], 128);
        const int j = p0 + 16 * jb;
        for (int r = 0; r < rows; r++) {
            const size_t row = (size_t)(i0 + r);
            moe_bf16 *k = h13_16 ? h13_16 + row * 2 * ff : NULL;
            swiglu_row_bf16(act16 + row * ff + j, k ? k + j : NULL, k ? k + ff + j : NULL, t[r],
                            t[r] + 16, 16);
        }
    }
}

AMX_TARGET void cpu_amx_swiglu_bf16(int m, int ff, int kd, const moe_bf16 *a, int lda,
                                    const moe_bf16 *w13, moe_bf16 *act16, moe_bf16 *h13_16,
                                    float *h13) {
    if (m <= 0) return;
    if (ff % 16 || m < 4 || swap_rows(m, 2 * ff, kd, 1)) { // the GEMM's other paths, then
        cpu_amx_gemm_bf16(0, 1, m, 2 * ff, kd, 1, a, lda, w13, kd, 0, h13, 2 * ff);
        cpu_swiglu_rows_bf16(act16, h13_16, h13, m, ff);
        return;
    }
    amx_gemm g = {0, 1,   m,   2 * ff, kd,     (kd + 31) / 32, 0, 1,   0,
                  a, w13, lda, kd,     2 * ff, NULL,           0, NULL};
    if (g.kc == 0) g.kc = 1;
    // gate columns a panel: with their up columns at most 1 MiB of packed tiles
    const int panel = 16 * (g.kc < 512 ? 512 / g.kc : 1), row_blocks = (m + 31) / 32;
    for (int p0 = 0; p0 < ff; p0 += panel) {
        const int np16 = (ff - p0 < panel ? ff - p0 : panel) / 16;
        uint32_t *bp = grow(&b_buf, &b_cap, (size_t)2 * np16 * g.kc * TILE_WORDS);
        g.bp = bp;
        const int spread = !omp_in_parallel() && omp_get_max_threads() > 1 &&
                           cpu_parallel_worth((size_t)m * 32 * np16 * (kd > 32 ? kd / 32 : 1));
        if (!spread) {
            configure_tiles();
            pack_swiglu_blocks(&g, bp, ff, p0, np16, 0, 2 * np16);
            for (int ib = 0; ib < row_blocks; ib++)
                swiglu_row_block(&g, ib * 32, ff, p0, np16, act16, h13_16);
            _tile_release();
            continue;
        }
#pragma omp parallel
        {
            configure_tiles();
#pragma omp for schedule(static)
            for (int jb = 0; jb < 2 * np16; jb++)
                pack_swiglu_blocks(&g, bp, ff, p0, np16, jb, jb + 1);
#pragma omp for schedule(static)
            for (int ib = 0; ib < row_blocks; ib++)
                swiglu_row_block(&g, ib * 32, ff, p0, np16, act16, h13_16);
            _tile_release();
        }
    }
}

// ---- attention's backward scores with the softmax backward as their epilogue ---------------
#ifdef MOE_VEC16 // (its epilogue is vec_math.h's 16-lane code)
// For a block of n query rows (query i0 + i) against columns j < cols:
//     S = q k^T and dP = do v^T   (tiles side by side: accumulators 0, 1 and 2, 3)
//     p = exp(fl(scale S) - lse_i),  ds = fl(fl(p fl(dP - D_i)) scale)      for j <= i0 + i
// into p16 = bf16(p), ds16 = bf16(ds) [n, ld16]. S and dP never go to memory in fp32: the
// unfused path (layers/cpu/attention.c) stored both [n, cols] blocks, scaled S in a pass of
// its own, then read them back for the exps and for ds. The same bits as that path: each S
// and dP is the same sum of the same tiles, scaled as store_block scales, and the element
// math is exp_sum's and the ds loop's (masked entries: p = +0 and ds = +0 (dP - D) scale up
// to the row's 16-lane width w, +0 beyond; see attention.c's row_width).

// The nb 16-column blocks of op(b) [kd, n] (op(b) = x, or x^T when trans; row stride ld),
// each as its kc chunks of k, and when nb is odd a block of zero tiles after them, so that the
// kernels can take the blocks in pairs.
AMX_TARGET static void pack_panel(uint32_t *bp, const moe_bf16 *x, int ld, int trans, int n, int kd,
                                  int nb, int kc) {
    for (int jb = 0; jb < nb; jb++)
        for (int c = 0; c < kc; c++)
            pack_b_tile(bp + ((size_t)jb * kc + c) * TILE_WORDS, x, ld, trans, n, kd, jb * 16,
                        c * 32);
    if (nb % 2) memset(bp + (size_t)nb * kc * TILE_WORDS, 0, (size_t)kc * TILE_WORDS * 4);
}

// The epilogue of 16 rows (r0 ..) and 32 columns (j0 ..): t[r] = S (32 columns), then dP.
AMX_TARGET static void softmax_backward_tiles(const cpu_amx_attn_bwd *x, int r0, int j0,
                                              float t[16][64]) {
    const __m512 scale = _mm512_set1_ps(x->scale);
    const int rows = x->n - r0 < 16 ? x->n - r0 : 16;
    for (int r = 0; r < rows; r++) {
        const int i = r0 + r, last = x->i0 + i;
        const int w = ((last + 16) & ~15) < x->cols ? (last + 16) & ~15 : x->cols;
        const __m512 lse = _mm512_set1_ps(x->lse[i]), D = _mm512_set1_ps(x->D[i]);
        moe_bf16 *p16 = x->p16 + (size_t)i * x->ld16, *ds16 = x->ds16 + (size_t)i * x->ld16;
        for (int h = 0; h < 32; h += 16) {
            const int j = j0 + h;
            if (j >= x->cols) break;
            const __mmask16 k = vec_lanes16(j, x->cols);
            __m256i pb = _mm256_setzero_si256(), db = _mm256_setzero_si256();
            if (j < w) {
                const __mmask16 valid = vec_lanes16(j, last + 1); // j .. last
                const __m512 sc = _mm512_mul_ps(scale, _mm512_load_ps(&t[r][h]));
                const __m512 p = _mm512_maskz_mov_ps(valid, vec_exp16(_mm512_sub_ps(sc, lse)));
                const __m512 dp = _mm512_load_ps(&t[r][32 + h]);
                pb = vec_to_bf16_16_normal(p);
                db = vec_to_bf16_16(_mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(dp, D)), scale));
            }
            _mm256_mask_storeu_epi16(p16 + j, k, pb);
            _mm256_mask_storeu_epi16(ds16 + j, k, db);
        }
    }
}

AMX_TARGET int cpu_amx_attention_scores_bwd(const cpu_amx_attn_bwd *x) {
    const int kc = (x->hd + 31) / 32, nb = (x->cols + 15) / 16, nb2 = (nb + 1) / 2 * 2;
    uint32_t *bk = grow(&b_buf, &b_cap, (size_t)2 * nb2 * kc * TILE_WORDS + 4 * kc * TILE_WORDS);
    uint32_t *bv = bk + (size_t)nb2 * kc * TILE_WORDS, *aq = bv + (size_t)nb2 * kc * TILE_WORDS,
             *ad = aq + (size_t)2 * kc * TILE_WORDS;
    pack_panel(bk, x->k, x->ldk, 1, x->cols, x->hd, nb, kc); // k^T
    pack_panel(bv, x->v, x->ldk, 1, x->cols, x->hd, nb, kc); // v^T
    float t[16][64] __attribute__((aligned(64)));
    configure_tiles();
    for (int r0 = 0; r0 < x->n; r0 += 16) {
        for (int c = 0; c < kc; c++) { // this row group's q and do tiles, every chunk of k
            pack_a_tile(aq + (size_t)c * TILE_WORDS, x->q, x->ldq, 0, x->n, x->hd, r0, c * 32);
            pack_a_tile(ad + (size_t)c * TILE_WORDS, x->dO, x->ldo, 0, x->n, x->hd, r0, c * 32);
        }
        for (int jb = 0; jb < nb; jb += 2) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int c = 0; c < kc; c++) {
                const size_t b0 = ((size_t)jb * kc + c) * TILE_WORDS, b1 = b0 + kc * TILE_WORDS;
                _tile_loadd(4, aq + (size_t)c * TILE_WORDS, 64);
                _tile_loadd(5, ad + (size_t)c * TILE_WORDS, 64);
                _tile_loadd(6, bk + b0, 64);
                _tile_loadd(7, bk + b1, 64);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_loadd(6, bv + b0, 64);
                _tile_loadd(7, bv + b1, 64);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, &t[0][0], 256);
            _tile_stored(1, &t[0][16], 256);
            _tile_stored(2, &t[0][32], 256);
            _tile_stored(3, &t[0][48], 256);
            softmax_backward_tiles(x, r0, jb * 16, t);
        }
    }
    _tile_release();
    return 1;
}

// ---- attention's forward of a query block, the softmax between its two products ------------
// For 16 query rows at a time: S = q k^T on tiles into a [16, cols] buffer (L1), scaled as
// store_block scales (fl(scale S)); the caller's softmax turns its rows into e16 = bf16(exp(S -
// max)) and 1 / sum (attention.c's exp_row_bf16); then o = (e16 v) / sum on tiles, each o
// element fl(sum * inv) as the unfused path's GEMM and its pass over o. The unfused path
// stored the block's [64, cols] scores and its [64, hd] output to memory and read both back.

// The 16 x 32 product of a row group's A tiles (a: kc tiles, 1 KiB apart, or in place at
// stride sa) and the pair of column blocks jb, jb+1 of packed b, into t (row stride ldt floats).
AMX_TARGET static void tiles_1x2(const char *a, size_t sa, size_t step, const uint32_t *bp, int jb,
                                 int kc, float *t, int ldt) {
    _tile_zero(0);
    _tile_zero(1);
    for (int c = 0; c < kc; c++) {
        _tile_loadd(4, a + c * step, sa);
        _tile_loadd(6, bp + ((size_t)jb * kc + c) * TILE_WORDS, 64);
        _tile_loadd(7, bp + ((size_t)(jb + 1) * kc + c) * TILE_WORDS, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
    }
    _tile_stored(0, t, (size_t)ldt * 4);
    _tile_stored(1, t + 16, (size_t)ldt * 4);
}

AMX_TARGET int cpu_amx_attention_forward_block(const cpu_amx_attn_fwd *x) {
    const int kc = (x->hd + 31) / 32, nb = (x->cols + 15) / 16, nb2 = (nb + 1) / 2 * 2;
    const int cc = (x->cols + 31) / 32, hb = (x->hd + 15) / 16, hb2 = (hb + 1) / 2 * 2;
    const int lds = nb2 * 16, lde = cc * 32; // the scores' and e16's row strides
    const size_t tiles = (size_t)nb2 * kc + (size_t)hb2 * cc + kc,
                 floats = (size_t)16 * lds + 16 * (size_t)hb2 * 16, halves = (size_t)16 * lde;
    uint32_t *bk = grow(&b_buf, &b_cap, tiles * TILE_WORDS + floats + (halves + 1) / 2);
    uint32_t *bv = bk + (size_t)nb2 * kc * TILE_WORDS, *aq = bv + (size_t)hb2 * cc * TILE_WORDS;
    float *s = (float *)(aq + (size_t)kc * TILE_WORDS), *o = s + (size_t)16 * lds;
    moe_bf16 *e16 = (moe_bf16 *)(o + (size_t)16 * hb2 * 16);
    pack_panel(bk, x->k, x->ldk, 1, x->cols, x->hd, nb, kc); // k^T
    pack_panel(bv, x->v, x->ldk, 0, x->hd, x->cols, hb, cc); // v
    memset(e16, 0, halves * sizeof(moe_bf16)); // columns [cols, lde) stay 0 (the last chunk)
    const __m512 scale = _mm512_set1_ps(x->scale);
    float inv[16];
    configure_tiles();
    for (int r0 = 0; r0 < x->n; r0 += 16) {
        const int rows = x->n - r0 < 16 ? x->n - r0 : 16;
        for (int c = 0; c < kc; c++)
            pack_a_tile(aq + (size_t)c * TILE_WORDS, x->q, x->ldq, 0, x->n, x->hd, r0, c * 32);
        for (int jb = 0; jb < nb; jb += 2)
            tiles_1x2((const char *)aq, 64, TILE_WORDS * 4, bk, jb, kc, s + jb * 16, lds);
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < x->cols; j += 16) {
                const __mmask16 k = vec_lanes16(j, x->cols);
                float *sj = s + (size_t)r * lds + j;
                _mm512_mask_storeu_ps(sj, k, _mm512_mul_ps(scale, _mm512_maskz_loadu_ps(k, sj)));
            }
        x->softmax(x->ctx, s, lds, e16, lde, inv, r0, rows);
        for (int hb0 = 0; hb0 < hb; hb0 += 2)
            tiles_1x2((const char *)e16, (size_t)lde * 2, 64, bv, hb0, cc, o + hb0 * 16, hb2 * 16);
        for (int r = 0; r < rows; r++) {
            float *out = x->out + (size_t)(r0 + r) * x->ldo;
            const __m512 v = _mm512_set1_ps(inv[r]);
            for (int c = 0; c < x->hd; c += 16) {
                const __mmask16 k = vec_lanes16(c, x->hd);
                _mm512_mask_storeu_ps(
                    out + c, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, o + r * hb2 * 16 + c), v));
            }
        }
    }
    _tile_release();
    return 1;
}
#define MOE_AMX_ATTENTION 1
#endif

#else // no AMX in this build (not x86-64, or a compiler without AMX intrinsics)

int cpu_amx_available(void) { return 0; }

void cpu_amx_gemm_bf16(int trans_a, int trans_b, int m, int n, int kd, float alpha,
                       const moe_bf16 *a, int lda, const moe_bf16 *b, int ldb, float beta, float *c,
                       int ldc) {
    (void)trans_a, (void)trans_b, (void)m, (void)n, (void)kd, (void)alpha, (void)a, (void)lda;
    (void)b, (void)ldb, (void)beta, (void)c, (void)ldc;
    moe_fatal("cpu: the AMX bf16 GEMM is not in this build");
}

void cpu_amx_swiglu_bf16(int m, int ff, int kd, const moe_bf16 *a, int lda, const moe_bf16 *w13,
                         moe_bf16 *act16, moe_bf16 *h13_16, float *h13) {
    (void)m, (void)ff, (void)kd, (void)a, (void)lda, (void)w13, (void)act16, (void)h13_16;
    (void)h13;
    moe_fatal("cpu: the AMX bf16 GEMM is not in this build");
}

#endif

#ifndef MOE_AMX_ATTENTION // no AMX, or no AVX-512 target: attention.c's loops do it
int cpu_amx_attention_scores_bwd(const cpu_amx_attn_bwd *x) {
    (void)x;
    return 0;
}

int cpu_amx_attention_forward_block(const cpu_amx_attn_fwd *x) {
    (void)x;
    return 0;
}
#endif
