// SwiGLU, the expert activation: act = silu(h1) * h3.
#include <math.h>

#include "layers/cpu/cpu_kernels.h"
#include "layers/cpu/vec_math.h"

void cpu_swiglu_forward(real *act, const real *h1, const real *h3, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        real a = h1[i];
        act[i] = a / (1 + vec_exp(-a)) * h3[i];
    }
}

void cpu_swiglu_backward(real *dh1, real *dh3, const real *dact, const real *h1,
                         const real *h3, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        real a = h1[i];
        real s = 1 / (1 + vec_exp(-a)); // sigmoid(a)
        real g = dact[i];
        dh1[i] = g * h3[i] * s * (1 + a * (1 - s));
        dh3[i] = g * a * s;
    }
}
