// Token embedding lookup and its backward (scatter-add into the table).
#include <string.h>

#include "layers/cpu/cpu_kernels.h"

void cpu_embedding_forward(moe_backend *be, real *out, const int *tokens, const real *embed, int T,
                           int d) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * d))
    for (int t = 0; t < T; t++)
        memcpy(out + (size_t)t * d, embed + (size_t)tokens[t] * d, (size_t)d * sizeof(real));
}

void cpu_embedding_backward(moe_backend *be, real *dembed, const real *dout, const int *tokens,
                            int T, int d) {
    CPU_KERNEL(be);
    // Tokens repeat, so rows collide: split the work over columns instead of tokens.
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * d))
    for (int i = 0; i < d; i++)
        for (int t = 0; t < T; t++) dembed[(size_t)tokens[t] * d + i] += dout[(size_t)t * d + i];
}
