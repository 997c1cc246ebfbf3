// The router losses on the GPU, twin of layers/cpu/losses.c: one block sums layers/
// router_rows.h's per-token terms in double (a fixed-shape tree per field) and applies its
// formulas, as the CPU does; and `mul` (the router jitter's product).
#include "cuda/cuda_kernels.cuh" // first: the C headers as C++
#include "cuda/reduce.cuh"
extern "C" {
#include "layers/router_rows.h"
}

static __global__ void k_router_losses(real *out, const real *probs, const real *logits,
                                       const real *lse, const int *counts, const int *seq_counts,
                                       moe_router_shape sh, moe_router_hparams hp) {
    const int T = sh.T, E = sh.E, seq_len = sh.seq_len;
    moe_router_loss_sums s = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int t = threadIdx.x; t < T; t += blockDim.x)
        s = moe_router_loss_sums_add(s, moe_router_loss_row(probs + (size_t)t * E,
                                                            logits + (size_t)t * E, lse[t], counts,
                                                            seq_counts + (size_t)(t / seq_len) * E,
                                                            E, hp.seq_aux_coef != 0));
    s.aux = block_sum(s.aux), s.seq = block_sum(s.seq), s.ent = block_sum(s.ent);
    s.z = block_sum(s.z), s.lse = block_sum(s.lse);
    s.zsum = block_sum(s.zsum), s.zsq = block_sum(s.zsq), s.zmax = block_max(s.zmax);
    if (threadIdx.x == 0) moe_router_losses_of(out, s, sh, hp);
}

void cuda_router_losses(moe_backend *be, real *out, const real *probs, const real *logits,
                        const real *lse, const int *counts, const int *seq_counts,
                        moe_router_shape sh, moe_router_hparams hp) {
    k_router_losses<<<1, 512, 0, cuda_stream(be)>>>(out, probs, logits, lse, counts, seq_counts, sh,
                                                    hp);
    CUDA_LAUNCHED(be, "k_router_losses");
}

static __global__ void k_mul(real *out, const real *a, const real *b, size_t n, int accumulate) {
    GRID_STRIDE(i, n) out[i] = (accumulate ? out[i] : 0) + a[i] * b[i];
}
void cuda_mul(moe_backend *be, real *out, const real *a, const real *b, size_t n, int accumulate) {
    if (!n) return;
    k_mul<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(out, a, b, n,
                                                                            accumulate);
    CUDA_LAUNCHED(be, "k_mul");
}
