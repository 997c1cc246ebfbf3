// MoE layer benchmark on the CUDA backend: forward+backward of the layer vs. its expert GEMMs
// alone, both expert-GEMM implementations (a cublasGemmEx loop, cublasGemmGroupedBatchedEx),
// fp32, TF32 and bf16 (bf16 operands, fp32 accumulation: DESIGN.md §5b). Timed with CUDA events
// on the backend's stream after warm-up, median of the repeats.
//
//   TFLOP/s       = 18 T k d ff / (the six expert GEMMs of fwd+bwd, alone)   (dropless: N = T k)
//   R_layer       = bench_median(layer fwd+bwd) / bench_median(its expert GEMMs alone)
//   dense TFLOP/s = the same six GEMMs as one dense group (all N rows, expert 0's weights):
//                   the library's rate on these FLOPs without the expert split
//   layer/dense   = the layer's FLOP rate / the dense rate  (issue 34's bf16 target: >= 0.7)
//
// The GEMMs alone run on the layer's own buffers (fp32, TF32) or on buffers of the same shapes
// (bf16), with the row offsets of the same iteration.
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

// The six expert GEMMs of a forward and a backward through the backend's grouped entries,
// rows grouped by off [E+1] (host).
static void expert_gemms(moe_backend *be, moe_layer *L, const moe_weights *w, const moe_weights *g,
                         const int *off, int E, int d, int ff) {
    be->expert_matmul_forward(be, L->h13, L->xp, w->w13, off, E, 2 * ff, d);
    be->expert_matmul_forward(be, L->ye, L->act, w->w2, off, E, d, ff);
    be->expert_matmul_backward_weight(be, g->w2, L->dye, L->act, off, E, d, ff);
    be->expert_matmul_backward_input(be, L->dact, L->dye, w->w2, off, E, d, ff, 0);
    be->expert_matmul_backward_weight(be, g->w13, L->dh13, L->xp, off, E, 2 * ff, d);
    be->expert_matmul_backward_input(be, L->dxp, L->dh13, w->w13, off, E, 2 * ff, d, 0);
}

// The bf16 layer's six GEMMs on buffers of their shapes: operands bf16, outputs fp32.
typedef struct {
    moe_bf16 *x16, *act16, *gd16, *g2ff16; // [N, d], [N, ff], [N, d], [N, 2ff]
    float *h13, *ye, *dact, *dx;           // [N, 2ff], [N, d], [N, ff], [N, d]
} bf16_gemm_bufs;

static void expert_gemms_bf16(moe_backend *be, const bf16_gemm_bufs *b, const moe_weights *w,
                              const moe_weights *g, const int *off, int E, int d, int ff) {
    be->expert_matmul_forward_bf16(be, b->h13, b->x16, w->w13_16, off, E, 2 * ff, d);
    be->expert_matmul_forward_bf16(be, b->ye, b->act16, w->w2_16, off, E, d, ff);
    be->expert_matmul_backward_weight_bf16(be, g->w2, b->gd16, b->act16, off, E, d, ff);
    be->expert_matmul_backward_input_bf16(be, b->dact, b->gd16, w->w2_16, off, E, d, ff, 0);
    be->expert_matmul_backward_weight_bf16(be, g->w13, b->g2ff16, b->x16, off, E, 2 * ff, d);
    be->expert_matmul_backward_input_bf16(be, b->dx, b->g2ff16, w->w13_16, off, E, 2 * ff, d, 0);
}

static void *dev_alloc(moe_backend *be, size_t bytes) {
    void *p = be->alloc(be, bytes);
    if (!p) moe_fatal("bench: out of device memory (%zu bytes)", bytes);
    return p;
}

// bf16 random values: uniform fp32 of std 1 through the scratch, rounded.
static moe_bf16 *random_bf16(moe_backend *be, float *scratch, size_t n, uint64_t key) {
    moe_bf16 *p = dev_alloc(be, n * sizeof(moe_bf16));
    fill_uniform(be, scratch, n, 1, key);
    be->to_bf16(be, p, scratch, n);
    return p;
}

static const cli_option options[] = {BENCH_LAYER_OPTIONS(4096, 1024, 1024, 8, 2, 5, 2), {0}};

static const cli_command cli = {.name = "bench_moe_layer_gpu", .options = options};

// The six GEMMs of math m (0 fp32, 1 tf32, 2 bf16) with rows grouped by off over E groups.
typedef struct {
    moe_backend *be;
    moe_layer *L;
    const bf16_gemm_bufs *b16;
    const moe_weights *w, *g;
    int d, ff;
} gemm_set;

static void six_gemms(const gemm_set *s, int bf16, const int *off, int E) {
    if (bf16)
        expert_gemms_bf16(s->be, s->b16, s->w, s->g, off, E, s->d, s->ff);
    else
        expert_gemms(s->be, s->L, s->w, s->g, off, E, s->d, s->ff);
}

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
    // one layer per precision (bf16 keeps bf16 buffers of its own), the same weights and data
    moe_config cfg = moe_config_default(d, ff, E, k), cfg16 = cfg;
    cfg16.dtype = MOE_DTYPE_BF16;
    moe_layer L, L16;
    if (moe_layer_init(&L, be, &cfg, T) || moe_layer_init(&L16, be, &cfg16, T))
        moe_fatal("%s", moe_last_error());
    const size_t nw = moe_weights_count(&cfg), nx = (size_t)T * d, N = (size_t)T * k;
    float *params = dev_alloc(be, nw * sizeof(float)), *grads = dev_alloc(be, nw * sizeof(float));
    float *x = dev_alloc(be, nx * sizeof(float)), *dout = dev_alloc(be, nx * sizeof(float));
    float *y = dev_alloc(be, nx * sizeof(float)), *dx = dev_alloc(be, nx * sizeof(float));
    moe_weights w, g, w16;
    moe_weights_view(&w, params, &cfg);
    moe_weights_view(&g, grads, &cfg);
    fill_uniform(be, params, nw, 0.02f, 1);
    fill_uniform(be, x, nx, 1, 2);
    fill_uniform(be, dout, nx, 1, 3);
    // the bf16 copies the layer reads, in moe_weights_view's order (gate, w13, w2)
    moe_bf16 *params16 = dev_alloc(be, nw * sizeof(moe_bf16));
    be->to_bf16(be, params16, params, nw);
    w16 = w;
    w16.gate16 = params16, w16.w13_16 = params16 + (w.w13 - params);
    w16.w2_16 = params16 + (w.w2 - params);
    bf16_gemm_bufs b16 = {0};
    b16.h13 = dev_alloc(be, N * 2 * ff * sizeof(float));
    b16.ye = dev_alloc(be, N * d * sizeof(float)), b16.dx = dev_alloc(be, N * d * sizeof(float));
    b16.dact = dev_alloc(be, N * ff * sizeof(float));
    // the random operands pass through the widest fp32 buffer ([N, d] or [N, 2ff]: the fine
    // shape's d is wider than its 2ff)
    float *wide = 2 * ff >= d ? b16.h13 : b16.ye;
    b16.x16 = random_bf16(be, wide, N * d, 4), b16.act16 = random_bf16(be, wide, N * ff, 5);
    b16.gd16 = random_bf16(be, wide, N * d, 6);
    b16.g2ff16 = random_bf16(be, wide, N * 2 * ff, 7);
    if (!json) printf("%s\n", be->describe(be));

    double *t_layer = malloc(reps * sizeof(double)), *t_gemm = malloc(reps * sizeof(double));
    double *t_dense = malloc(reps * sizeof(double));
    const double flops = 18.0 * (double)T * k * d * ff;
    const int dense_off[2] = {0, (int)N};
    static const char *maths[] = {"fp32", "tf32", "bf16"};
    for (int math = 0; math < 3; math++)
        for (int mode = 0; mode < 2; mode++) {
            const int bf16 = math == 2;
            moe_layer *lay = bf16 ? &L16 : &L;
            const moe_weights *wl = bf16 ? &w16 : &w;
            const gemm_set set = {be, &L, &b16, wl, &g, d, ff};
            cuda_backend_set_tf32(be, math == 1);
            cuda_backend_set_expert_gemm(be,
                                         mode ? CUDA_EXPERT_GEMM_GROUPED : CUDA_EXPERT_GEMM_LOOP);
            moe_stats st = {0};
            for (int i = 0; i < warmup + reps; i++) {
                cuda_backend_timer_start(be);
                if (moe_layer_forward(lay, y, x, wl, T, 0, moe_pass_train(lay->cfg.capacity_factor),
                                      &st))
                    moe_fatal("%s", moe_last_error());
                if (moe_layer_backward(lay, dx, &g, dout, x, wl, 1.0))
                    moe_fatal("%s", moe_last_error());
                const double ml = cuda_backend_timer_stop_ms(be);
                cuda_backend_timer_start(be);
                six_gemms(&set, bf16, lay->host_counts + E, E);
                const double mg = cuda_backend_timer_stop_ms(be);
                cuda_backend_timer_start(be);
                six_gemms(&set, bf16, dense_off, 1);
                const double md = cuda_backend_timer_stop_ms(be);
                if (i >= warmup)
                    t_layer[i - warmup] = ml * 1e-3, t_gemm[i - warmup] = mg * 1e-3,
                                t_dense[i - warmup] = md * 1e-3;
            }
            const double ml = bench_median(t_layer, reps), mg = bench_median(t_gemm, reps);
            const double md = bench_median(t_dense, reps);
            const char *impl = mode ? "grouped" : "loop";
            if (json)
                printf("{\"impl\":\"moe.c cuda\",\"math\":\"%s\",\"expert_gemm\":\"%s\",\"T\":%d,"
                       "\"d\":%d,\"ff\":%d,\"E\":%d,\"k\":%d,\"layer_median_s\":%.6f,"
                       "\"gemm_median_s\":%.6f,\"dense_median_s\":%.6f,\"R_layer\":%.4f,"
                       "\"gemm_tflops\":%.2f,\"layer_tflops\":%.2f,\"dense_tflops\":%.2f,"
                       "\"layer_over_dense\":%.4f,\"max_over_mean\":%.4f,\"grouped_refused\":%d}\n",
                       maths[math], impl, T, d, ff, E, k, ml, mg, md, ml / mg, flops / mg * 1e-12,
                       flops / ml * 1e-12, flops / md * 1e-12, md / ml, st.max_over_mean,
                       cuda_backend_grouped_refused(be));
            else
                printf("T=%d d=%d ff=%d E=%d k=%d %s %s: layer fwd+bwd %.2f ms, expert GEMMs %.2f "
                       "ms (%.1f TFLOP/s), R_layer %.3f, dense %.1f TFLOP/s, layer/dense %.3f, "
                       "max/mean load %.3f\n",
                       T, d, ff, E, k, maths[math], impl, ml * 1e3, mg * 1e3, flops / mg * 1e-12,
                       ml / mg, flops / md * 1e-12, md / ml, st.max_over_mean);
            fflush(stdout);
        }
    moe_layer_free(&L16);
    moe_layer_free(&L);
    be->free(be, params), be->free(be, grads), be->free(be, x), be->free(be, dout);
    be->free(be, y), be->free(be, dx), be->free(be, params16);
    be->free(be, b16.h13), be->free(be, b16.ye), be->free(be, b16.dx), be->free(be, b16.dact);
    be->free(be, b16.x16), be->free(be, b16.act16), be->free(be, b16.gd16);
    be->free(be, b16.g2ff16);
    free(t_layer), free(t_gemm), free(t_dense);
    moe_backend_destroy(be);
    return 0;
}
