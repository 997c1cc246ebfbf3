// exp for the elementwise kernels, written so that the compiler vectorises the loops
// it sits in (a libm call blocks vectorisation). In double builds (the gradient
// checks) it is libm's exp.
//
// exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n ln2 (|r| <= ln2/2), exp(r) by the
// Cephes degree-6 polynomial: ~1 ulp in [-87, 88]. NaN propagates (comparisons with NaN
// are false, and the polynomial of NaN is NaN); the input is clamped so 2^n stays normal.
// Below -87 (exp < 2^-125, at the edge of fp32's normal range) the result is 0, so that
// exp(-inf) = 0 exactly: the causal masks write -inf and then run their loops unmasked.
#ifndef MOE_VEC_MATH_H
#define MOE_VEC_MATH_H

#include <stdint.h>
#include <string.h>

#include "layers/real.h"

#ifdef MOE_REAL_DOUBLE
static inline double vec_exp(double x) { return exp(x); }
#else
// a b + c: one rounding where the build targets FMA (GCC then emits one instruction for
// fmaf), two elsewhere; vec_exp16 below makes the same choice, so the two agree bit for bit.
// With FMA the exp is 11 instructions shorter: attention's rows of exps (the bf16 kernels'
// largest non-GEMM work) ran 0.53 -> 0.38 ns an element (Xeon with AMX).
#ifdef __FMA__
#define VEC_MADD(a, b, c) fmaf(a, b, c)
#else
#define VEC_MADD(a, b, c) ((a) * (b) + (c))
#endif
static inline float vec_exp(float x) {
    const int under = x < -87.0f;
    x = x > 88.0f ? 88.0f : x;
    x = x < -87.0f ? -87.0f : x;
    const float magic = 12582912.0f; // 1.5 * 2^23: adding it rounds to an integer
    float t = VEC_MADD(x, 1.44269504088896341f, magic);
    float n = t - magic;
    float r = VEC_MADD(-n, 0.693359375f, x);
    r = VEC_MADD(-n, -2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = VEC_MADD(p, r, 1.3981999507e-3f);
    p = VEC_MADD(p, r, 8.3334519073e-3f);
    p = VEC_MADD(p, r, 4.1665795894e-2f);
    p = VEC_MADD(p, r, 1.6666665459e-1f);
    p = VEC_MADD(p, r, 5.0000001201e-1f);
    p = VEC_MADD(p * r, r, r) + 1.0f;
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    uint32_t scale_bits = (tb - 0x4B400000u + 127u) << 23; // 2^n
    float scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    return under ? 0.0f : p * scale;
}

// ---- 16 lanes at a time, where the build targets AVX-512 (MOE_NATIVE on such a CPU) --------
// For loops the compiler does not turn into good vector code by itself: a row's softmax, where
// `omp simd reduction` ends each row in a chain of 32 scalar adds (its lanes summed in order),
// which at attention's row lengths (64 to 256) took as long as the row's exps.
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define MOE_VEC16 1

// vec_exp on each lane: the same operations in the same order, so the same bits (layers/cpu is
// compiled without FMA contraction). MINPS and MAXPS return their second operand when either
// is NaN, so NaN stays NaN as in the comparisons above.
#ifdef __FMA__
#define VEC_MADD16(a, b, c) _mm512_fmadd_ps(a, b, c)
#else
#define VEC_MADD16(a, b, c) _mm512_add_ps(_mm512_mul_ps(a, b), c)
#endif
static inline __m512 vec_exp16(__m512 x) {
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_set1_ps(88.0f), x);
    x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x);
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512 t = VEC_MADD16(x, _mm512_set1_ps(1.44269504088896341f), magic);
    const __m512 n = _mm512_sub_ps(t, magic), minus_n = _mm512_sub_ps(_mm512_setzero_ps(), n);
    __m512 r = VEC_MADD16(minus_n, _mm512_set1_ps(0.693359375f), x);
    r = VEC_MADD16(minus_n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = VEC_MADD16(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = VEC_MADD16(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = VEC_MADD16(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = VEC_MADD16(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = VEC_MADD16(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(VEC_MADD16(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    const __m512i scale = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_castps_si512(t), _mm512_set1_epi32((int)(127u - 0x4B400000u))), 23);
    return _mm512_maskz_mul_ps((__mmask16)~under, p, _mm512_castsi512_ps(scale));
}

// moe_f32_to_bf16 on each lane (round to nearest even, NaN made quiet): 16 bf16 values.
static inline __m256i vec_to_bf16_16(__m512 v) {
    const __m512i b = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), odd), 16);
    const __mmask16 nan = _mm512_cmp_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000), _MM_CMPINT_NLE);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// The same for values that are zero or normal, as exp's are (vec_exp returns 0 below -87 and
// at least e^-87 > FLT_MIN above): AVX512-BF16's VCVTNEPS2BF16 rounds to nearest even as
// above and makes NaN quiet the same way, but flushes subnormal inputs to zero, so it is
// only the same bits away from them. One instruction instead of ten: attention's row of
// exps into bf16, 0.65 -> 0.53 ns an element (Xeon with AMX, rows of 64-256).
static inline __m256i vec_to_bf16_16_normal(__m512 v) {
#ifdef __AVX512BF16__
    return (__m256i)_mm512_cvtneps_pbh(v);
#else
    return vec_to_bf16_16(v);
#endif
}

// 16 bf16 values widened exactly (moe_bf16_to_f32 on each lane).
static inline __m512 vec_from_bf16_16(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The lanes [j, n) of a 16-lane step at j (all 16 when n - j >= 16).
static inline __mmask16 vec_lanes16(int j, int n) {
    return n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
}
#endif
#endif

#endif
