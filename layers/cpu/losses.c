// Router losses (values) and router statistics.
#include <math.h>

#include "layers/cpu/cpu_kernels.h"
#include "layers/router_rows.h"

// One reduction over tokens of layers/router_rows.h's per-token sums (in double), then its
// formulas: the same text as the GPU's.
#pragma omp declare reduction(loss_sums:moe_router_loss_sums                         \
                              : omp_out = moe_router_loss_sums_add(omp_out, omp_in)) \
    initializer(omp_priv = (moe_router_loss_sums){0})

void cpu_router_losses(moe_backend *be, real *out, const real *probs, const real *logits,
                       const real *lse, const int *counts, const int *seq_counts,
                       moe_router_shape sh, moe_router_hparams hp) {
    CPU_KERNEL(be);
    const int T = sh.T, E = sh.E, seq_len = sh.seq_len;
    const int par = cpu_parallel_worth((size_t)T * E);
    moe_router_loss_sums sums = {0};
#pragma omp parallel for schedule(static) reduction(loss_sums : sums) if (par)
    for (int t = 0; t < T; t++)
        sums = moe_router_loss_sums_add(
            sums,
            moe_router_loss_row(probs + (size_t)t * E, logits + (size_t)t * E, lse[t], counts,
                                seq_counts + (size_t)(t / seq_len) * E, E, hp.seq_aux_coef != 0));
    moe_router_losses_of(out, sums, sh, hp);
}

void cpu_mul(moe_backend *be, real *out, const real *a, const real *b, size_t n, int accumulate) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++) out[i] = (accumulate ? out[i] : 0) + a[i] * b[i];
}
