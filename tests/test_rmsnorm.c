// RMSNorm's CPU kernels at sizes the model tests do not reach: T = 1000 tokens (several of the
// backward's 64-token blocks of the weight gradient, the last one partial), against a plain
// double-precision evaluation of the formulas written here; dweight and dinp accumulate into
// what they hold. And the same bits on 1 and 2 threads.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/cpu/cpu_backend.h"
#include "test_util.h"

#define T 1000 // T x D above the fork threshold (32768): 2 threads really split it
#define D 40

static double max_rel(const float *a, const double *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return sqrt(num / (den > 0 ? den : 1));
}

// out, rstd, dinp, dweight of the kernels on `threads` threads (dinp, dweight start at 0.5)
static void run(moe_backend *be, int threads, const float *x, const float *w, const float *g,
                float *out, float *rstd, float *dx, float *dw) {
    cpu_backend_set_threads(be, threads);
    for (int i = 0; i < T * D; i++) dx[i] = 0.5f;
    for (int i = 0; i < D; i++) dw[i] = 0.5f;
    be->rmsnorm_forward(be, out, rstd, x, w, T, D, 1e-5f);
    be->rmsnorm_backward(be, dx, dw, g, x, w, rstd, T, D);
}

int main(void) {
    moe_backend *be;
    if (cpu_backend_create(&be, NULL, 0)) return 1;
    static float x[T * D], w[D], g[T * D], out[T * D], rstd[T], dx[T * D], dw[D];
    static float out2[T * D], rstd2[T], dx2[T * D], dw2[D];
    static double rout[T * D], rdx[T * D], rdw[D];
    test_rng rng;
    rng_seed(&rng, 7);
    for (int i = 0; i < T * D; i++) x[i] = (float)rng_normal(&rng), g[i] = (float)rng_normal(&rng);
    for (int i = 0; i < D; i++) w[i] = (float)(1 + 0.3 * rng_normal(&rng));
    run(be, 1, x, w, g, out, rstd, dx, dw);
    run(be, 2, x, w, g, out2, rstd2, dx2, dw2);

    // reference: r = 1/sqrt(mean x^2 + eps), n = x r, out = n w,
    // dx = 0.5 + r (w g - n mean_i(w g n)), dw = 0.5 + sum_t g n
    for (int i = 0; i < D; i++) rdw[i] = 0.5;
    for (int t = 0; t < T; t++) {
        double ss = 0, dot = 0;
        for (int i = 0; i < D; i++) ss += (double)x[t * D + i] * x[t * D + i];
        const double r = 1 / sqrt(ss / D + 1e-5);
        for (int i = 0; i < D; i++) dot += (double)w[i] * g[t * D + i] * x[t * D + i] * r;
        for (int i = 0; i < D; i++) {
            const double n = x[t * D + i] * r;
            rout[t * D + i] = n * w[i];
            rdx[t * D + i] = 0.5 + r * (w[i] * g[t * D + i] - n * dot / D);
            rdw[i] += g[t * D + i] * n;
        }
    }
    const double e_out = max_rel(out, rout, T * D), e_dx = max_rel(dx, rdx, T * D),
                 e_dw = max_rel(dw, rdw, D);
    const int same = !memcmp(out, out2, sizeof out) && !memcmp(rstd, rstd2, sizeof rstd) &&
                     !memcmp(dx, dx2, sizeof dx) && !memcmp(dw, dw2, sizeof dw);
    printf("T=%d d=%d: rel err out %.2e, dinp %.2e, dweight %.2e (bound 1e-5); 1 vs 2 threads: "
           "%s\n",
           T, D, e_out, e_dx, e_dw, same ? "same bits" : "DIFFERENT");
    moe_backend_destroy(be);
    const int ok = e_out < 1e-5 && e_dx < 1e-5 && e_dw < 1e-5 && same;
    printf(ok ? "all checks passed\n" : "FAILED\n");
    return !ok;
}
