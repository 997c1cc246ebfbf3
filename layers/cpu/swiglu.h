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

// n elements of the bf16 forward: act[i] = bf16(swiglu(h1[i], h3[i])), and the kept inputs
// k1[i] = bf16(h1[i]), k3[i] = bf16(h3[i]) unless k1 is NULL.
static inline void swiglu_row_bf16(moe_bf16 *act, moe_bf16 *k1, moe_bf16 *k3, const real *h1,
                                   const real *h3, int n) {
    for (int i = 0; i < n; i++) act[i] = moe_f32_to_bf16((float)swiglu_one(h1[i], h3[i]));
    if (k1)
        for (int i = 0; i < n; i++) {
            k1[i] = moe_f32_to_bf16((float)h1[i]);
            k3[i] = moe_f32_to_bf16((float)h3[i]);
        }
}

#endif
