// Optimizer update kernels (optim/ chooses the hyperparameters and the regions).
#include <math.h>

#include "layers/cpu/cpu_kernels.h"

void cpu_adamw_update(moe_backend *be, real *params, real *m, real *v, const real *grads, size_t n,
                      real lr, real beta1, real beta2, real eps, real weight_decay, real bc1,
                      real bc2, real grad_scale) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++) {
        real g = grad_scale * grads[i];
        real p = params[i] - lr * weight_decay * params[i]; // decoupled decay first (torch)
        m[i] = beta1 * m[i] + (1 - beta1) * g;
        v[i] = beta2 * v[i] + (1 - beta2) * g * g;
        params[i] = p - lr * (m[i] / bc1) / (real_sqrt(v[i] / bc2) + eps);
    }
}

void cpu_sgd_update(moe_backend *be, real *params, const real *grads, size_t n, real lr,
                    real grad_scale) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++) params[i] -= lr * grad_scale * grads[i];
}
