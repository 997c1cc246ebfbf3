// SwiGLU, the expert activation: act = silu(h1) * h3, with [h1 | h3] one row of h13.
#include <omp.h>

#include "layers/bf16.h"
#include "layers/cpu/cpu_kernels.h"
#include "layers/cpu/swiglu.h"

// The kernels' work over rows, callable from inside a kernel (expert_swiglu_*: right after an
// expert's GEMM, on its rows): spread over the threads unless already in a parallel region.
#define ROWS_PARALLEL(N, ff) if (!omp_in_parallel() && cpu_parallel_worth((size_t)(N) * (ff)))

void cpu_swiglu_rows(real *act, const real *h13, int N, int ff) {
#pragma omp parallel for schedule(static) ROWS_PARALLEL(N, ff)
    for (int r = 0; r < N; r++) {
        const real *h1 = h13 + (size_t)r * 2 * ff, *h3 = h1 + ff;
        real *a = act + (size_t)r * ff;
        for (int i = 0; i < ff; i++) a[i] = swiglu_one(h1[i], h3[i]);
    }
}

void cpu_swiglu_grad_rows(real *dh13, const real *dact, const real *h13, int N, int ff) {
#pragma omp parallel for schedule(static) ROWS_PARALLEL(N, ff)
    for (int r = 0; r < N; r++) {
        const real *h1 = h13 + (size_t)r * 2 * ff, *h3 = h1 + ff, *g = dact + (size_t)r * ff;
        real *dh1 = dh13 + (size_t)r * 2 * ff, *dh3 = dh1 + ff;
        for (int i = 0; i < ff; i++) swiglu_grad_one(&dh1[i], &dh3[i], g[i], h1[i], h3[i]);
    }
}

void cpu_swiglu_rows_bf16(moe_bf16 *act16, moe_bf16 *h13_16, const real *h13, int N, int ff) {
#pragma omp parallel for schedule(static) ROWS_PARALLEL(N, ff)
    for (int r = 0; r < N; r++) {
        const real *h = h13 + (size_t)r * 2 * ff;
        moe_bf16 *k = h13_16 ? h13_16 + (size_t)r * 2 * ff : NULL;
        swiglu_row_bf16(act16 + (size_t)r * ff, k, k ? k + ff : NULL, h, h + ff, ff);
    }
}

void cpu_swiglu_grad_rows_bf16(moe_bf16 *dh13_16, const real *dact, const moe_bf16 *h13_16, int N,
                               int ff) {
#pragma omp parallel for schedule(static) ROWS_PARALLEL(N, ff)
    for (int r = 0; r < N; r++) {
        const moe_bf16 *h1 = h13_16 + (size_t)r * 2 * ff, *h3 = h1 + ff;
        const real *g = dact + (size_t)r * ff;
        moe_bf16 *dh1 = dh13_16 + (size_t)r * 2 * ff, *dh3 = dh1 + ff;
        for (int i = 0; i < ff; i++) {
            real d1, d3;
            swiglu_grad_one(&d1, &d3, g[i], moe_bf16_to_f32(h1[i]), moe_bf16_to_f32(h3[i]));
            dh1[i] = moe_f32_to_bf16((float)d1);
            dh3[i] = moe_f32_to_bf16((float)d3);
        }
    }
}

// ---- the table's kernels ------------------------------------------------------------------

void cpu_swiglu_forward(moe_backend *be, real *act, const real *h13, int N, int ff) {
    CPU_KERNEL(be);
    cpu_swiglu_rows(act, h13, N, ff);
}

void cpu_swiglu_backward(moe_backend *be, real *dh13, const real *dact, const real *h13, int N,
                         int ff) {
    CPU_KERNEL(be);
    cpu_swiglu_grad_rows(dh13, dact, h13, N, ff);
}

void cpu_swiglu_forward_bf16(moe_backend *be, moe_bf16 *act16, moe_bf16 *h13_16, const real *h13,
                             int N, int ff) {
    CPU_KERNEL(be);
    cpu_swiglu_rows_bf16(act16, h13_16, h13, N, ff);
}

void cpu_swiglu_backward_bf16(moe_backend *be, moe_bf16 *dh13_16, const real *dact,
                              const moe_bf16 *h13_16, int N, int ff) {
    CPU_KERNEL(be);
    cpu_swiglu_grad_rows_bf16(dh13_16, dact, h13_16, N, ff);
}
