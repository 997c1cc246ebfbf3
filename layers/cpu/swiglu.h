// SwiGLU's element math, shared by every CPU kernel that computes it (layers/cpu/expert.c's
// SwiGLU kernels, layers/cpu/amx.c's GEMM with a SwiGLU epilogue), so that they all give the
// same bits: act = silu(h1) h3; dh1 = g h3 silu'(h1), dh3 = g silu(h1) with
// silu'(a) = s (1 + a (1 - s)), s = sigmoid(a).
#ifndef MOE_CPU_SWIGLU_H
#define MOE_CPU_SWIGLU_H

#include "layers/bf16.h"
#include "layers/cpu/vec_math.h"

static inline real swiglu_one(real h1, real h3) { return h1 / (1 + vec_exp(-h1)) * h3; }

static inline void swiglu_grad_one(real *dh1, real *dh3, real g, real a, real h3) {
    const real s = 1 / (1 + vec_exp(-a)); // sigmoid(a)
    *dh1 = g * h3 * s * (1 + a * (1 - s));
    *dh3 = g * a * s;
}

#ifdef MOE_VEC16
// swiglu_one on 16 lanes: the same operations in the same order (vec_exp16), the same bits
static inline __m512 swiglu16(__m512 h1, __m512 h3) {
    const __m512 e = vec_exp16(_mm512_sub_ps(_mm512_setzero_ps(), h1)); // exp(-h1); -0 or +0: 1
    return _mm512_mul_ps(_mm512_div_ps(h1, _mm512_add_ps(_mm512_set1_ps(1), e)), h3);
}
#endif

// n elements of the bf16 forward: act[i] = bf16(swiglu(h1[i], h3[i])), and the kept inputs
// k1[i] = bf16(h1[i]), k3[i] = bf16(h3[i]) unless k1 is NULL.
// With AVX-512, 16 lanes by hand (the same bits): in the AMX epilogue (rows of 16) GCC
// vectorised the loops at 256 bits, and the bf16 forward kernel took 0.7-0.9 ms a step more
// (shakespeare.cfg, Xeon with AMX). The backward's and fp32's loops, by hand, ran no faster.
static inline void swiglu_row_bf16(moe_bf16 *act, moe_bf16 *k1, moe_bf16 *k3, const real *h1,
                                   const real *h3, int n) {
#ifdef MOE_VEC16
    for (int i = 0; i < n; i += 16) {
        const __mmask16 k = vec_lanes16(i, n);
        const __m512 x1 = _mm512_maskz_loadu_ps(k, h1 + i), x3 = _mm512_maskz_loadu_ps(k, h3 + i);
        _mm256_mask_storeu_epi16(act + i, k, vec_to_bf16_16(swiglu16(x1, x3)));
        if (k1) {
            _mm256_mask_storeu_epi16(k1 + i, k, vec_to_bf16_16(x1));
            _mm256_mask_storeu_epi16(k3 + i, k, vec_to_bf16_16(x3));
        }
    }
#else
    for (int i = 0; i < n; i++) act[i] = moe_f32_to_bf16((float)swiglu_one(h1[i], h3[i]));
    if (k1)
        for (int i = 0; i < n; i++) {
            k1[i] = moe_f32_to_bf16((float)h1[i]);
            k3[i] = moe_f32_to_bf16((float)h3[i]);
        }
#endif
}

#endif
