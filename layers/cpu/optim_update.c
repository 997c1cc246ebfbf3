// Optimizer update kernels (optim/ chooses the hyperparameters and the regions).
#include <math.h>

#include "layers/bf16.h"
#include "layers/cpu/cpu_kernels.h"

// One AdamW element (backend.h's formula); returns the updated parameter.
static inline real adamw_one(real *p, real *m, real *v, real grad, moe_adamw_hparams h) {
    real g = h.grad_scale * grad;
    real q = *p - h.lr * h.weight_decay * *p; // decoupled decay first (torch)
    *m = h.beta1 * *m + (1 - h.beta1) * g;
    *v = h.beta2 * *v + (1 - h.beta2) * g * g;
    return *p = q - h.lr * (*m / h.bc1) / (real_sqrt(*v / h.bc2) + h.eps);
}

// With params16, the bf16 weights are written in the same pass: AdamW is bound by memory
// (28 bytes per parameter), and a separate to_bf16 would read params once more. Over blocks
// of ADAMW_BLOCK parameters (in cache when the rounding reads them back): the update loop,
// then the rounding loop, each one vector loop without a branch (GCC 12 vectorizes neither
// when both are one loop: that pass took 4x the fp32 update's time).
enum { ADAMW_BLOCK = 2048 };
void cpu_adamw_update(moe_backend *be, real *params, moe_bf16 *params16, real *m, real *v,
                      const real *grads, size_t n, moe_adamw_hparams hp) {
    CPU_KERNEL(be);
    if (params16) {
        const size_t blocks = (n + ADAMW_BLOCK - 1) / ADAMW_BLOCK;
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
        for (size_t b = 0; b < blocks; b++) {
            const size_t i0 = b * ADAMW_BLOCK, i1 = i0 + ADAMW_BLOCK < n ? i0 + ADAMW_BLOCK : n;
            for (size_t i = i0; i < i1; i++) adamw_one(&params[i], &m[i], &v[i], grads[i], hp);
            for (size_t i = i0; i < i1; i++) params16[i] = moe_f32_to_bf16((float)params[i]);
        }
    } else {
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
        for (size_t i = 0; i < n; i++) adamw_one(&params[i], &m[i], &v[i], grads[i], hp);
    }
}

void cpu_sgd_update(moe_backend *be, real *params, moe_bf16 *params16, const real *grads, size_t n,
                    real lr, real grad_scale) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++) {
        params[i] -= lr * grad_scale * grads[i];
        if (params16) params16[i] = moe_f32_to_bf16((float)params[i]);
    }
}
