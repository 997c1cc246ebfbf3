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
static inline float vec_exp(float x) {
    const int under = x < -87.0f;
    x = x > 88.0f ? 88.0f : x;
    x = x < -87.0f ? -87.0f : x;
    const float magic = 12582912.0f; // 1.5 * 2^23: adding it rounds to an integer
    float t = x * 1.44269504088896341f + magic;
    float n = t - magic;
    float r = x - n * 0.693359375f - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    uint32_t scale_bits = (tb - 0x4B400000u + 127u) << 23; // 2^n
    float scale;
    memcpy(&scale, &scale_bits, sizeof scale);
    return under ? 0.0f : p * scale;
}
#endif

#endif
