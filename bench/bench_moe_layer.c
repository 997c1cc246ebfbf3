// MoE layer benchmark: forward+backward of the layer vs. the same expert GEMMs alone.
//
//   R_layer = bench_median(layer fwd+bwd) / bench_median(its expert GEMMs alone, on the same path)
//
// The GEMM-only baseline uses the row counts the layer's router produced in the same
// run, so the ratio is the cost of everything that is not an expert GEMM (router,
// dispatch, permute, SwiGLU, combine, losses). Threads: OMP_NUM_THREADS /
// OPENBLAS_NUM_THREADS from the environment (scripts/bench_moe_layer sets both).
//
// --shared SFF: a shared expert of width SFF beside the layer (y += MLP_s(x), ungated, as
// DeepSeek's; the model runs it on the layer's input through the backend's GEMMs and SwiGLU):
// its forward and backward join the layer's time and its six GEMMs the baseline's (fp32).
//
// --dtype bf16: the layer in bf16 (bf16 GEMM operands, fp32 accumulation; the bf16 copy of
// the weights made once, as a model does per forward) against the same expert GEMMs through
// the backend's bf16 grouped kernels (six calls, one per GEMM kind over all experts, on the
// layer's bf16 operands: the path describe() names, native sbgemm or emulated).
#define _POSIX_C_SOURCE 200809L // clock_gettime
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_clock.h"
#include "bench/bench_layer_args.h"
#include "layers/cpu/cpu_backend.h"
#include "layers/moe.h"

static void fill_normal(float *x, size_t n, float std, unsigned *seed) {
    for (size_t i = 0; i < n; i += 2) {
        double u1 = (rand_r(seed) + 1.0) / (RAND_MAX + 2.0), u2 = rand_r(seed) / (RAND_MAX + 1.0);
        double r = sqrt(-2 * log(u1));
        x[i] = (float)(std * r * cos(6.283185307179586 * u2));
        if (i + 1 < n) x[i + 1] = (float)(std * r * sin(6.283185307179586 * u2));
    }
}

// The expert GEMMs of forward and backward, one backend matmul each per expert (the fp32
// path the layer's GEMMs take: the BLAS, or oneDNN's sgemm; layers/cpu/gemm.c), w1 and w3
// stacked as w13 [2ff, d], as the layer stores them. Here all six GEMMs of an expert run back
// to back; the layer runs each GEMM kind over all experts in turn.
static void expert_gemms(moe_backend *be, const int *off, int E, int d, int ff, float *xp,
                         float *h13, float *act, float *ye, float *dye, float *dact, float *dh13,
                         float *dxp, const float *w13, const float *w2, float *dw13, float *dw2) {
    const int f2 = 2 * ff;
    // the same threading as the layer's grouped GEMM (layers/cpu/gemm.c): experts over the
    // OpenMP threads when there are at least four per thread, else threaded calls
#pragma omp parallel for schedule(dynamic, 1) if (E >= 4 * omp_get_max_threads())
    for (int e = 0; e < E; e++) {
        int n = off[e + 1] - off[e];
        if (n == 0) continue;
        size_t r = off[e];
        const float *W13 = w13 + (size_t)e * f2 * d, *W2 = w2 + (size_t)e * d * ff;
        float *D13 = dw13 + (size_t)e * f2 * d, *D2 = dw2 + (size_t)e * d * ff;
        // forward: h13 = x W13^T, ye = act W2^T
        be->matmul(be, h13 + r * f2, xp + r * d, W13, n, f2, d, 0, 1, 0);
        be->matmul(be, ye + r * d, act + r * ff, W2, n, d, ff, 0, 1, 0);
        // backward: dW2 += dye^T act, dact = dye W2, dW13 += dh13^T x, dx = dh13 W13
        be->matmul(be, D2, dye + r * d, act + r * ff, d, ff, n, 1, 0, 1);
        be->matmul(be, dact + r * ff, dye + r * d, W2, n, ff, d, 0, 0, 0);
        be->matmul(be, D13, dh13 + r * f2, xp + r * d, f2, d, n, 1, 0, 1);
        be->matmul(be, dxp + r * d, dh13 + r * f2, W13, n, d, f2, 0, 0, 0);
    }
}

// The bf16 expert GEMMs: the layer's six grouped GEMMs through the backend's bf16 kernels, on
// the layer's bf16 inputs (xe16, act16) and its output gradients rounded once (dye16, dh13_16).
static void expert_gemms_bf16(moe_backend *be, const moe_layer *L, const moe_weights *w,
                              const moe_weights *g, const moe_bf16 *dye16,
                              const moe_bf16 *dh13_16) {
    const int *off = L->host_counts + L->cfg.n_experts, E = L->cfg.n_experts, d = L->cfg.d_model,
              ff = L->cfg.d_ff;
    be->expert_matmul_forward_bf16(be, L->h13, L->xe16, w->w13_16, off, E, 2 * ff, d);
    be->expert_matmul_forward_bf16(be, L->ye, L->act16, w->w2_16, off, E, d, ff);
    be->expert_matmul_backward_weight_bf16(be, g->w2, dye16, L->act16, off, E, d, ff);
    be->expert_matmul_backward_input_bf16(be, L->dact, dye16, w->w2_16, off, E, d, ff, 0);
    be->expert_matmul_backward_weight_bf16(be, g->w13, dh13_16, L->xe16, off, E, 2 * ff, d);
    be->expert_matmul_backward_input_bf16(be, L->dxp, dh13_16, w->w13_16, off, E, 2 * ff, d, 0);
}

// The shared expert's buffers: weights w13 [2s, d], w2 [d, s] and their gradients, and
// h13 [T, 2s], act [T, s], y [T, d], dact [T, s], dh13 [T, 2s] (fp32).
typedef struct {
    int s;
    float *w13, *w2, *g13, *g2, *h13, *act, *y, *dact, *dh13;
} shared_mlp;

// The shared expert's forward and backward on x [T, d] (out += y; dx += its input gradient),
// gemms_only: its six GEMMs alone (the baseline).
static void shared_fwd_bwd(moe_backend *be, shared_mlp *m, float *out, float *dx, const float *x,
                           const float *dout, int T, int d, int gemms_only) {
    const int s = m->s;
    be->matmul(be, m->h13, x, m->w13, T, 2 * s, d, 0, 1, 0);
    if (!gemms_only) be->swiglu_forward(be, m->act, m->h13, T, s);
    be->matmul(be, m->y, m->act, m->w2, T, d, s, 0, 1, 0);
    if (!gemms_only) be->add(be, out, out, m->y, (size_t)T * d);
    be->matmul(be, m->g2, dout, m->act, d, s, T, 1, 0, 1);
    be->matmul(be, m->dact, dout, m->w2, T, s, d, 0, 0, 0);
    if (!gemms_only) be->swiglu_backward(be, m->dh13, m->dact, m->h13, T, s);
    be->matmul(be, m->g13, m->dh13, x, 2 * s, d, T, 1, 0, 1);
    be->matmul(be, dx, m->dh13, m->w13, T, d, 2 * s, 0, 0, 1);
}

static const char *const dtypes[] = {"fp32", "bf16", NULL};

static const cli_option options[] = {
    BENCH_LAYER_OPTIONS(4096, 512, 1408, 8, 2, 7, 2),
    {"--dtype", CLI_CHOICE(bench_layer_args, dtype), .choices = dtypes, .def = "fp32",
     .help = "the layer's precision; bf16: bf16 GEMM operands, fp32 accumulation"},
    {"--shared", CLI_INT(bench_layer_args, shared), .value = "SFF", .lo = 0, .hi = 1 << 20,
     .def = "0", .help = "a shared expert of width SFF beside the layer (fp32); 0: none"},
    {0}};

static const cli_command cli = {.name = "bench_moe_layer", .options = options};

int main(int argc, char **argv) {
    bench_layer_args o = {0};
    const int rc = cli_args(&cli, argc - 1, argv + 1, &o, stdout, stderr);
    if (rc != CLI_RUN) return rc;
    const moe_dtype dtype = o.dtype ? MOE_DTYPE_BF16 : MOE_DTYPE_F32;
    const int T = (int)o.T, d = (int)o.d, ff = (int)o.ff, E = (int)o.E, k = (int)o.k,
              reps = (int)o.reps, warmup = (int)o.warmup, json = o.json;
    moe_config cfg = moe_config_default(d, ff, E, k);
    cfg.dtype = dtype;
    const int bf16 = dtype == MOE_DTYPE_BF16, S = (int)o.shared;
    if (S && bf16) moe_fatal("bench_moe_layer: --shared is fp32 only");
    moe_backend *be;
    if (moe_backend_create(&be, "cpu", NULL)) moe_fatal("%s", moe_last_error());
    moe_layer L;
    if (moe_layer_init(&L, be, &cfg, T)) moe_fatal("%s", moe_last_error());

    size_t nw = moe_weights_count(&cfg), nx = (size_t)T * d;
    float *params = malloc(nw * sizeof(float)), *grads = calloc(nw, sizeof(float));
    float *x = malloc(nx * sizeof(float)), *dout = malloc(nx * sizeof(float));
    float *y = malloc(nx * sizeof(float)), *dx = calloc(nx, sizeof(float));
    unsigned seed = 1234;
    moe_weights w, g;
    moe_weights_view(&w, params, &cfg);
    moe_weights_view(&g, grads, &cfg);
    fill_normal(params, nw, 0.02f, &seed);
    fill_normal(x, nx, 1, &seed);
    fill_normal(dout, nx, 1, &seed);
    // bf16: the weights' bf16 copy, and the expert output gradients' for the GEMM baseline
    const size_t N = (size_t)T * k;
    moe_bf16 *params16 = bf16 ? malloc(nw * sizeof(moe_bf16)) : NULL,
             *dye16 = bf16 ? malloc(N * d * sizeof(moe_bf16)) : NULL,
             *dh13_16 = bf16 ? malloc(N * 2 * ff * sizeof(moe_bf16)) : NULL;
    if (bf16) {
        be->to_bf16(be, params16, params, nw);
        w.gate16 = params16 + (w.gate - params);
        w.w13_16 = params16 + (w.w13 - params);
        w.w2_16 = params16 + (w.w2 - params);
    }

    shared_mlp sm = {.s = S};
    if (S) {
        float **bufs[] = {&sm.w13, &sm.g13, &sm.h13,  &sm.dh13, &sm.w2,
                          &sm.g2,  &sm.act, &sm.dact, &sm.y};
        const size_t n[] = {2 * (size_t)S * d, 2 * (size_t)S * d, 2 * (size_t)T * S,
                            2 * (size_t)T * S, (size_t)d * S,     (size_t)d * S,
                            (size_t)T * S,     (size_t)T * S,     nx};
        for (size_t i = 0; i < sizeof n / sizeof n[0]; i++)
            if (!(*bufs[i] = calloc(n[i], sizeof(float)))) moe_fatal("bench: out of memory");
        fill_normal(sm.w13, 2 * (size_t)S * d, 0.02f, &seed);
        fill_normal(sm.w2, (size_t)d * S, 0.02f, &seed);
    }
    double *t_layer = malloc(reps * sizeof(double)), *t_gemm = malloc(reps * sizeof(double));
    moe_stats st = {0};
    for (int i = 0; i < warmup + reps; i++) {
        double t0 = bench_now();
        if (moe_layer_forward(&L, y, x, &w, T, 0, moe_pass_train(L.cfg.capacity_factor), &st))
            moe_fatal("%s", moe_last_error());
        if (moe_layer_backward(&L, dx, &g, dout, x, &w, 1.0)) moe_fatal("%s", moe_last_error());
        if (S) shared_fwd_bwd(be, &sm, y, dx, x, dout, T, d, 0);
        double t1 = bench_now();
        // the same expert GEMMs on the layer's own buffers and row counts
        double tg = t1, t2;
        if (bf16) {
            const size_t rows = (size_t)L.host_counts[2 * E]; // offsets[E]
            be->to_bf16(be, dye16, L.dye, rows * d);
            be->to_bf16(be, dh13_16, L.dh13, rows * 2 * ff);
            tg = bench_now(); // the roundings are not GEMM time
            expert_gemms_bf16(be, &L, &w, &g, dye16, dh13_16);
            t2 = bench_now();
        } else {
            expert_gemms(be, L.host_counts + E, E, d, ff, L.xp, L.h13, L.act, L.ye, L.dye, L.dact,
                         L.dh13, L.dxp, w.w13, w.w2, g.w13, g.w2);
            if (S) shared_fwd_bwd(be, &sm, y, dx, x, dout, T, d, 1);
            t2 = bench_now();
        }
        if (i >= warmup) t_layer[i - warmup] = t1 - t0, t_gemm[i - warmup] = t2 - tg;
    }
    double ml = bench_median(t_layer, reps), mg = bench_median(t_gemm, reps);
    // dropless: N = T*k rows; the shared expert's 6 GEMMs of T x d x s (w13's count twice)
    double flops = 9.0 * 2.0 * (double)T * k * d * ff + 9.0 * 2.0 * (double)T * d * S;
    const cpu_state *cs = be->state;
    const char *path = bf16 ? cs->bf16_line : *cs->fp32_line ? cs->fp32_line : "fp32: sgemm";
    if (json)
        printf("{\"impl\":\"moe.c\",\"dtype\":\"%s\",\"T\":%d,\"d\":%d,\"ff\":%d,\"E\":%d,"
               "\"k\":%d,\"shared\":%d,\"layer_median_s\":%.6f,\"gemm_median_s\":%.6f,\"R_layer\":%"
               ".4f,"
               "\"gemm_gflops\":%.2f,\"max_over_mean\":%.4f,\"blas\":\"%s\","
               "\"blas_kernel\":\"%s\",\"gemm_path\":\"%s\"}\n",
               bf16 ? "bf16" : "fp32", T, d, ff, E, k, S, ml, mg, ml / mg, flops / mg * 1e-9,
               st.max_over_mean, moe_blas_name(), moe_blas_kernel(), path);
    else
        printf("T=%d d=%d ff=%d E=%d k=%d shared=%d %s: layer fwd+bwd %.4f s, expert GEMMs %.4f s "
               "(%.1f GFLOP/s), R_layer %.3f, max/mean load %.3f, BLAS kernels %s; %s\n",
               T, d, ff, E, k, S, bf16 ? "bf16" : "fp32", ml, mg, flops / mg * 1e-9, ml / mg,
               st.max_over_mean, moe_blas_kernel(), path);
    free(params16), free(dye16), free(dh13_16);
    free(sm.w13), free(sm.g13), free(sm.h13), free(sm.dh13), free(sm.w2), free(sm.g2), free(sm.act);
    free(sm.dact), free(sm.y);
    moe_layer_free(&L);
    free(params), free(grads), free(x), free(dout), free(y), free(dx), free(t_layer), free(t_gemm);
    moe_backend_destroy(be);
    return 0;
}
