// Cross-entropy of logits against target ids (softmax fused into the backward).
#include <math.h>

#include "layers/cpu/cpu_kernels.h"
#include "layers/cpu/vec_math.h"

// logsumexp of a row: the terms exp(z_i - max) in real (vectorised vec_exp, ~1 ulp), summed in
// double (lane-wise partial sums in a fixed order).
static double row_logsumexp(const real *z, int V) {
    real mx = z[0];
#pragma omp simd reduction(max : mx)
    for (int i = 1; i < V; i++) mx = z[i] > mx ? z[i] : mx;
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < V; i++) sum += (double)vec_exp(z[i] - mx);
    return mx + log(sum);
}

void cpu_cross_entropy_forward(moe_backend *be, real *losses, const real *logits,
                               const int *targets, int T, int V) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * V))
    for (int t = 0; t < T; t++) {
        const real *z = logits + (size_t)t * V;
        losses[t] = (real)(row_logsumexp(z, V) - z[targets[t]]);
    }
}

void cpu_cross_entropy_backward(moe_backend *be, real *dlogits, const real *logits,
                                const int *targets, int T, int V, real dloss) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * V))
    for (int t = 0; t < T; t++) {
        const real *z = logits + (size_t)t * V;
        real *dz = dlogits + (size_t)t * V;
        const real lse = (real)row_logsumexp(z, V);
        for (int i = 0; i < V; i++) dz[i] = dloss * vec_exp(z[i] - lse);
        dz[targets[t]] -= dloss;
    }
}
