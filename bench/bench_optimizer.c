// The optimizer step of a bf16 run, which is bound by memory: median milliseconds of
//   separate  adamw_update, then to_bf16 of the weights (what the next forward used to do)
//   fused     adamw_update writing the bf16 weights in the same pass (what the trainer does)
//   alone     adamw_update without bf16 weights (an fp32 run)
// over N parameters (default: the shakespeare model's 7,577,280), the three alternating, and
// the effective bandwidth of each (bytes moved / time: 28 per parameter for AdamW, +6 for a
// separate to_bf16, +2 for the fused write).
//   bench_optimizer [--n 7577280] [--reps 21]
#define _POSIX_C_SOURCE 200809L // clock_gettime
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_clock.h"
#include "layers/backend.h"
#include "layers/status.h"

enum { SEPARATE, FUSED, ALONE, VARIANTS };

static void step(moe_backend *be, int variant, real *p, moe_bf16 *p16, real *m, real *v,
                 const real *g, size_t n) {
    // lr, beta1, beta2, eps, weight_decay, bc1, bc2, grad_scale
    const moe_adamw_hparams hp = {1e-5f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 0.5f, 1.0f};
    be->adamw_update(be, p, variant == FUSED ? p16 : NULL, m, v, g, n, hp);
    if (variant == SEPARATE) be->to_bf16(be, p16, p, n);
}

int main(int argc, char **argv) {
    size_t n = 7577280;
    int reps = 21;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc)
            n = (size_t)atoll(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else
            moe_fatal("bench_optimizer: unknown argument '%s'", argv[i]);
    }
    if (n < 1 || reps < 1 || reps > 1000) moe_fatal("bench_optimizer: bad --n or --reps");
    moe_backend *be = NULL;
    if (moe_backend_create(&be, "cpu", NULL)) moe_fatal("%s", moe_last_error());
    real *p = be->alloc(be, n * sizeof(real)), *m = be->alloc(be, n * sizeof(real)),
         *v = be->alloc(be, n * sizeof(real)), *g = be->alloc(be, n * sizeof(real));
    moe_bf16 *p16 = be->alloc(be, n * sizeof(moe_bf16));
    double *t = malloc((size_t)VARIANTS * reps * sizeof(double));
    if (!p || !m || !v || !g || !p16 || !t) moe_fatal("bench_optimizer: out of memory");
    for (size_t i = 0; i < n; i++)
        p[i] = 0.01f * (real)(i % 97), m[i] = v[i] = 0, g[i] = 0.001f * (real)(i % 13);
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < VARIANTS; k++) {
            const double t0 = bench_now();
            step(be, k, p, p16, m, v, g, n);
            t[k * reps + r] = bench_now() - t0;
        }
    printf("%s\n", be->describe(be));
    printf("AdamW step over %zu parameters, medians of %d alternating runs\n", n, reps);
    const char *name[VARIANTS] = {"adamw_update + to_bf16", "adamw_update -> params16 (fused)",
                                  "adamw_update alone (fp32)"};
    const double bytes[VARIANTS] = {34, 30, 28};
    double med[VARIANTS];
    for (int k = 0; k < VARIANTS; k++) {
        med[k] = bench_median(t + k * reps, reps);
        printf("  %-34s %7.2f ms  %6.1f GB/s\n", name[k], 1e3 * med[k],
               bytes[k] * (double)n / med[k] / 1e9);
    }
    printf("  fused / separate = %.2f\n", med[FUSED] / med[SEPARATE]);
    be->free(be, p), be->free(be, m), be->free(be, v), be->free(be, g), be->free(be, p16);
    free(t);
    moe_backend_destroy(be);
    return 0;
}
