// MoE layer benchmark on the CUDA backend: forward+backward of the layer vs. its expert GEMMs
// alone, both expert-GEMM implementations (a cublasGemmEx loop, cublasGemmGroupedBatchedEx),
// fp32 and TF32. Timed with CUDA events on the backend's stream after warm-up, median of the
// repeats.
//
//   TFLOP/s  = 18 T k d ff / (the six expert GEMMs of fwd+bwd, alone)   (dropless: N = T k)
//   R_layer  = bench_median(layer fwd+bwd) / bench_median(its expert GEMMs alone, same mode and math)
//
// The GEMMs alone run on the layer's own buffers and row offsets of the same iteration.
// Prints one JSON line per (math, mode) with --json. Exit 77 without a CUDA device.
//   bench_moe_layer_gpu --T 16384 --d 4096 --ff 4096 --E 8 --k 2 [--reps 5] [--warmup 2]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_clock.h"
#include "bench/bench_layer_args.h"
#include "cuda/cuda_backend.h"
#include "layers/moe.h"
#include "layers/rng.h"

// Uniform with standard deviation std (a = std sqrt 3), counter-based, made on the host and
// uploaded in chunks: the coarse shape's weights are 1.6 GB, so no Box-Muller here.
static void fill_uniform(moe_backend *be, float *dev, size_t n, float std, uint64_t key) {
    const size_t chunk = (size_t)1 << 22;
    float *h = malloc(chunk * sizeof(float));
    const double a = std * sqrt(3.0);
    for (size_t at = 0; at < n; at += chunk) {
        const size_t m = n - at < chunk ? n - at : chunk;
        for (size_t i = 0; i < m; i++)
            h[i] =
                (float)(a * (2 * moe_uniform01(moe_mix64(key ^ (at + i) * MOE_GOLDEN_GAMMA)) - 1));
        be->copy_to_device(be, dev + at, h, m * sizeof(float));
    }
    free(h);
}

// The six expert GEMMs of a forward and a backward through the backend's grouped entries.
static void expert_gemms(moe_backend *be, moe_layer *L, const moe_weights *w, const moe_weights *g,
                         int E, int d, int ff) {
    const int *off = L->host_counts + E;
    be->expert_matmul_forward(be, L->h13, L->xp, w->w13, off, E, 2 * ff, d);
    be->expert_matmul_forward(be, L->ye, L->act, w->w2, off, E, d, ff);
    be->expert_matmul_backward_weight(be, g->w2, L->dye, L->act, off, E, d, ff);
    be->expert_matmul_backward_input(be, L->dact, L->dye, w->w2, off, E, d, ff, 0);
    be->expert_matmul_backward_weight(be, g->w13, L->dh13, L->xp, off, E, 2 * ff, d);
    be->expert_matmul_backward_input(be, L->dxp, L->dh13, w->w13, off, E, 2 * ff, d, 0);
}

static const cli_option options[] = {BENCH_LAYER_OPTIONS(4096, 1024, 1024, 8, 2, 5, 2), {0}};

static const cli_command cli = {.name = "bench_moe_layer_gpu", .options = options};

int main(int argc, char **argv) {
    bench_layer_args o = {0};
    const int rc = cli_args(&cli, argc - 1, argv + 1, &o, stdout, stderr);
    if (rc != CLI_RUN) return rc;
    const int T = (int)o.T, d = (int)o.d, ff = (int)o.ff, E = (int)o.E, k = (int)o.k,
              reps = (int)o.reps, warmup = (int)o.warmup, json = o.json;
    moe_backend *be;
    if (moe_backend_create(&be, "cuda", NULL)) {
        printf("skipped: %s\n", moe_last_error());
        return 77;
    }
    moe_config cfg = moe_config_default(d, ff, E, k);
    moe_layer L;
    if (moe_layer_init(&L, be, &cfg, T)) moe_fatal("%s", moe_last_error());
    const size_t nw = moe_weights_count(&cfg), nx = (size_t)T * d;
    float *params = be->alloc(be, nw * sizeof(float)), *grads = be->alloc(be, nw * sizeof(float));
    float *x = be->alloc(be, nx * sizeof(float)), *dout = be->alloc(be, nx * sizeof(float));
    float *y = be->alloc(be, nx * sizeof(float)), *dx = be->alloc(be, nx * sizeof(float));
    if (!params || !grads || !x || !dout || !y || !dx) moe_fatal("bench: out of device memory");
    moe_weights w, g;
    moe_weights_view(&w, params, &cfg);
    moe_weights_view(&g, grads, &cfg);
    fill_uniform(be, params, nw, 0.02f, 1);
    fill_uniform(be, x, nx, 1, 2);
    fill_uniform(be, dout, nx, 1, 3);
    if (!json) printf("%s\n", be->describe(be));

    double *t_layer = malloc(reps * sizeof(double)), *t_gemm = malloc(reps * sizeof(double));
    const double flops = 18.0 * (double)T * k * d * ff;
    for (int tf32 = 0; tf32 < 2; tf32++)
        for (int mode = 0; mode < 2; mode++) {
            cuda_backend_set_tf32(be, tf32);
            cuda_backend_set_expert_gemm(be,
                                         mode ? CUDA_EXPERT_GEMM_GROUPED : CUDA_EXPERT_GEMM_LOOP);
            moe_stats st = {0};
            for (int i = 0; i < warmup + reps; i++) {
                cuda_backend_timer_start(be);
                if (moe_layer_forward(&L, y, x, &w, T, 0, moe_pass_train(L.cfg.capacity_factor),
                                      &st))
                    moe_fatal("%s", moe_last_error());
                if (moe_layer_backward(&L, dx, &g, dout, x, &w, 1.0))
                    moe_fatal("%s", moe_last_error());
                const double ml = cuda_backend_timer_stop_ms(be);
                cuda_backend_timer_start(be);
                expert_gemms(be, &L, &w, &g, E, d, ff);
                const double mg = cuda_backend_timer_stop_ms(be);
                if (i >= warmup) t_layer[i - warmup] = ml * 1e-3, t_gemm[i - warmup] = mg * 1e-3;
            }
            const double ml = bench_median(t_layer, reps), mg = bench_median(t_gemm, reps);
            const char *math = tf32 ? "tf32" : "fp32", *impl = mode ? "grouped" : "loop";
            if (json)
                printf("{\"impl\":\"moe.c cuda\",\"math\":\"%s\",\"expert_gemm\":\"%s\",\"T\":%d,"
                       "\"d\":%d,\"ff\":%d,\"E\":%d,\"k\":%d,\"layer_median_s\":%.6f,"
                       "\"gemm_median_s\":%.6f,\"R_layer\":%.4f,\"gemm_tflops\":%.2f,"
                       "\"layer_tflops\":%.2f,\"max_over_mean\":%.4f,\"grouped_refused\":%d}\n",
                       math, impl, T, d, ff, E, k, ml, mg, ml / mg, flops / mg * 1e-12,
                       flops / ml * 1e-12, st.max_over_mean, cuda_backend_grouped_refused(be));
            else
                printf("T=%d d=%d ff=%d E=%d k=%d %s %s: layer fwd+bwd %.2f ms, expert GEMMs %.2f "
                       "ms (%.1f TFLOP/s), R_layer %.3f, max/mean load %.3f\n",
                       T, d, ff, E, k, math, impl, ml * 1e3, mg * 1e3, flops / mg * 1e-12, ml / mg,
                       st.max_over_mean);
            fflush(stdout);
        }
    moe_layer_free(&L);
    be->free(be, params), be->free(be, grads), be->free(be, x), be->free(be, dout);
    be->free(be, y), be->free(be, dx);
    free(t_layer), free(t_gemm);
    moe_backend_destroy(be);
    return 0;
}
