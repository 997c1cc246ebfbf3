// The MoE layer with group-limited sigmoid routing plus an ungated shared expert against
// transformers' own DeepseekV3MoE block: the fixtures tests/deepseek_moe_hf.py writes from it
// (x, dout, the weights in moe.c's layout, out and every gradient). The layer (dropless, no
// router losses, the correction bias as the selection bias) plus the shared SwiGLU MLP run
// through the backend's kernels (bench/bench_moe_layer.c's shared_fwd_bwd): the chosen experts
// equal HF's as a set per token, out, dx and the gradients of gate, w13, w2 and the shared
// expert's w13, w2 within 1e-5 relative.
//   test_deepseek_moe FIXTURE.bin...
#include <stdio.h>
#include <stdlib.h>

#include "layers/moe.h"
#include "test_backend.h"
#include "test_util.h"

#define TOL 1e-5

static void *dev_copy(moe_backend *be, const void *host, size_t bytes) {
    void *p = be->alloc(be, bytes);
    if (!p) {
        fprintf(stderr, "test_deepseek_moe: out of device memory\n");
        exit(1);
    }
    if (host) be->copy_to_device(be, p, host, bytes);
    return p;
}

static void die(const char *what, moe_status st) {
    fprintf(stderr, "%s failed: %s: %s\n", what, moe_status_name(st), moe_last_error());
    exit(1);
}

static void load(real *dst, const fixture *fx, const char *name, size_t n) {
    const fixture_tensor *t = fixture_get(fx, name, n);
    for (size_t i = 0; i < n; i++) dst[i] = (real)t->data[i];
}

// got: n reals of backend memory, copied back and compared with the fixture's `name`
static void check_dev(moe_backend *be, const char *name, const real *got, const fixture *fx,
                      size_t n) {
    real *h = malloc(n * sizeof(real));
    double *g = malloc(n * sizeof(double));
    be->copy_to_host(be, h, got, n * sizeof(real));
    for (size_t i = 0; i < n; i++) g[i] = (double)h[i];
    check_rel(name, g, fixture_get(fx, name, n)->data, n, TOL);
    free(h), free(g);
}

static void run(const char *path) {
    fixture fx;
    fixture_load(&fx, path);
    const int T = fixture_int(&fx, "T"), d = fixture_int(&fx, "d"), ff = fixture_int(&fx, "ff"),
              E = fixture_int(&fx, "E"), k = fixture_int(&fx, "k"),
              s = fixture_int(&fx, "shared_ff");
    moe_config cfg = moe_config_default(d, ff, E, k);
    cfg.scoring = MOE_SCORE_SIGMOID;
    cfg.n_group = fixture_int(&fx, "n_group");
    cfg.topk_group = fixture_int(&fx, "topk_group");
    cfg.norm_topk_prob = fixture_int(&fx, "norm_topk_prob");
    cfg.route_scale = fixture_double(&fx, "route_scale");
    cfg.aux_coef = 0, cfg.z_coef = 0; // DeepseekV3MoE has no router loss
    cfg.capacity_factor = 0;          // dropless
    printf("%s: T=%d d=%d ff=%d E=%d k=%d n_group=%d topk_group=%d norm=%d route_scale=%g "
           "shared=%d\n",
           path, T, d, ff, E, k, cfg.n_group, cfg.topk_group, cfg.norm_topk_prob, cfg.route_scale,
           s);

    moe_backend *be = test_backend();
    const size_t nx = (size_t)T * d, nw = moe_weights_count(&cfg);
    const size_t n13 = (size_t)2 * s * d, n2 = (size_t)d * s;
    // host: the layer's weights [gate | w13 | w2], the bias, x, dout, the shared weights
    real *params = malloc(nw * sizeof(real)), *bias = malloc((size_t)E * sizeof(real));
    real *x = malloc(nx * sizeof(real)), *dout = malloc(nx * sizeof(real));
    real *sw13 = malloc(n13 * sizeof(real)), *sw2 = malloc(n2 * sizeof(real));
    moe_weights w;
    moe_weights_view(&w, params, &cfg);
    load(w.gate, &fx, "gate", (size_t)E * d);
    load(w.w13, &fx, "w13", (size_t)E * 2 * ff * d);
    load(w.w2, &fx, "w2", (size_t)E * d * ff);
    load(bias, &fx, "bias", E);
    load(x, &fx, "x", nx);
    load(dout, &fx, "dout", nx);
    load(sw13, &fx, "shared_w13", n13);
    load(sw2, &fx, "shared_w2", n2);

    // backend memory
    real *dparams = dev_copy(be, params, nw * sizeof(real));
    real *dgrads = dev_copy(be, NULL, nw * sizeof(real)); // zero-filled: the backward accumulates
    moe_weights dw, dg;
    moe_weights_view(&dw, dparams, &cfg);
    moe_weights_view(&dg, dgrads, &cfg);
    dw.bias = dev_copy(be, bias, (size_t)E * sizeof(real));
    real *dx_in = dev_copy(be, x, nx * sizeof(real)),
         *ddout = dev_copy(be, dout, nx * sizeof(real));
    real *dy = dev_copy(be, NULL, nx * sizeof(real)), *ddx = dev_copy(be, NULL, nx * sizeof(real));
    real *w13s = dev_copy(be, sw13, n13 * sizeof(real)),
         *w2s = dev_copy(be, sw2, n2 * sizeof(real));
    real *g13s = dev_copy(be, NULL, n13 * sizeof(real)),
         *g2s = dev_copy(be, NULL, n2 * sizeof(real));
    real *h13 = dev_copy(be, NULL, (size_t)T * 2 * s * sizeof(real));
    real *dh13 = dev_copy(be, NULL, (size_t)T * 2 * s * sizeof(real));
    real *act = dev_copy(be, NULL, (size_t)T * s * sizeof(real));
    real *dact = dev_copy(be, NULL, (size_t)T * s * sizeof(real));
    real *ys = dev_copy(be, NULL, nx * sizeof(real));

    moe_layer L;
    moe_status st = moe_layer_init(&L, be, &cfg, T);
    if (st) die("moe_layer_init", st);

    // forward: out = MoE(x) + MLP_s(x)
    st = moe_layer_forward(&L, dy, dx_in, &dw, T, T, moe_pass_train(0), NULL);
    if (st) die("moe_layer_forward", st);
    be->matmul(be, h13, dx_in, w13s, T, 2 * s, d, 0, 1, 0); // [T, 2s] = x w13^T
    be->swiglu_forward(be, act, h13, T, s);
    be->matmul(be, ys, act, w2s, T, d, s, 0, 1, 0); // [T, d] = act w2^T
    be->add(be, dy, dy, ys, nx);

    // backward of sum(out * dout): the layer's (accumulating into dx), then the MLP's
    st = moe_layer_backward(&L, ddx, &dg, ddout, dx_in, &dw, 1.0);
    if (st) die("moe_layer_backward", st);
    be->matmul(be, g2s, ddout, act, d, s, T, 1, 0, 0);  // [d, s] = dout^T act
    be->matmul(be, dact, ddout, w2s, T, s, d, 0, 0, 0); // [T, s] = dout w2
    be->swiglu_backward(be, dh13, dact, h13, T, s);
    be->matmul(be, g13s, dh13, dx_in, 2 * s, d, T, 1, 0, 0); // [2s, d] = dh13^T x
    be->matmul(be, ddx, dh13, w13s, T, d, 2 * s, 0, 0, 1);   // dx += dh13 w13

    // the chosen experts, as a set per token (HF's topk is unsorted)
    const size_t tk = (size_t)T * k;
    int *idx = malloc(tk * sizeof(int));
    be->copy_to_host(be, idx, L.topk_idx, tk * sizeof(int));
    const fixture_tensor *want = fixture_get(&fx, "topk_idx", tk);
    size_t bad = 0;
    for (int t = 0; t < T; t++) {
        unsigned long long got_set = 0, want_set = 0; // E <= 64
        for (int j = 0; j < k; j++) {
            got_set |= 1ull << idx[(size_t)t * k + j];
            want_set |= 1ull << (int)want->data[(size_t)t * k + j];
        }
        bad += got_set != want_set;
    }
    char label[96];
    snprintf(label, sizeof label, "chosen experts equal transformers' (%zu tokens differ)", bad);
    check_true(label, bad == 0);

    check_dev(be, "out", dy, &fx, nx);
    check_dev(be, "dx", ddx, &fx, nx);
    check_dev(be, "dgate", dg.gate, &fx, (size_t)E * d);
    check_dev(be, "dw13", dg.w13, &fx, (size_t)E * 2 * ff * d);
    check_dev(be, "dw2", dg.w2, &fx, (size_t)E * d * ff);
    check_dev(be, "dshared_w13", g13s, &fx, n13);
    check_dev(be, "dshared_w2", g2s, &fx, n2);

    moe_layer_free(&L);
    real *dev[] = {dparams, dgrads, dw.bias, dx_in, ddout, dy,  ddx,  w13s,
                   w2s,     g13s,   g2s,     h13,   dh13,  act, dact, ys};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) be->free(be, dev[i]);
    free(params), free(bias), free(x), free(dout), free(sw13), free(sw2), free(idx);
    fixture_free(&fx);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FIXTURE.bin...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) run(argv[i]);
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
