// Finite-difference gradient check of the MoE layer in double precision
// (this file is built against moe_layers_f64, where `real` is double).
//
// L = sum(y * dout) + L_aux + L_z. For every element of x, gate, w13 (= w1 and w3), w2 the central
// difference (L(+h) - L(-h)) / 2h is compared with the analytic gradient.
//
// L is discontinuous where a routing or drop decision flips, so every case is built with
// decisive routing and the margins are asserted (moe_routing in moe_test_case.h):
//   selection margin  min_t v_(k) - v_(k+1)            (v = s + bias, per token)
//   drop margin       min_e min_kept w - max_dropped w (probs policy, over-full experts)
// Perturbing one parameter by h moves every v and w by at most |dv/dparam| h: the router
// sees x only through z = (x u) gate^T, so |dz| <= max(|gate|, |x u|) h, and
// |ds_e| <= 2 s_e max|dz| (softmax: ds_e = s_e (dz_e - sum_j s_j dz_j)), <= max|dz| / 4
// (sigmoid); w = rs s / sum(s_sel) moves by a few times that. With |x| <~ 5, |gate| <~ 2
// this is <~ 1e-5 at h = 1e-6, so a gap > MARGIN_MIN = 1e-2 is over 1000 times what +-h can
// close, and over 1e12 times what BLAS rounding can (~1e-16 relative in double, whatever
// the kernel family). The test also measures the largest change of v and w over all +-h
// evaluations and asserts margin > MARGIN_SAFETY * 2 * max|change| (a gap closes by at
// most the change of both ends). Tokens whose margin is below MARGIN_MIN are re-drawn (new
// x row) while building the case; no element is skipped, and a decision flipped at any
// +-h fails the test.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_test_case.h"

#define H 1e-6
#define TOL 1e-6
#define MARGIN_MIN 1e-2
#define MARGIN_SAFETY 1000.0
#ifndef MAX_REDRAWS
#define MAX_REDRAWS 200
#endif

typedef struct {
    moe_routing base, cur;
    const real *bias;
    size_t flipped; // +-h evaluations whose routing state differs from the base
    double dv, dw;  // largest |change| of v and w over all +-h evaluations
} routing_watch;

static double loss_of(moe_case *c, routing_watch *rw) {
    moe_stats st;
    if (moe_case_forward(c, c->T, 1, &st)) { // copies x and the weights to the device
        fprintf(stderr, "forward failed: %s\n", moe_last_error());
        exit(1);
    }
    double l = st.aux + st.seq_aux + st.z;
    for (size_t i = 0; i < (size_t)c->T * c->cfg.d_model; i++) l += c->y[i] * c->dout[i];
    double dv, dw;
    moe_routing_capture(&rw->cur, &c->layer, rw->bias);
    rw->flipped += moe_routing_diff(&rw->base, &rw->cur, &dv, &dw) != 0;
    rw->dv = dv > rw->dv ? dv : rw->dv;
    rw->dw = dw > rw->dw ? dw : rw->dw;
    return l;
}

// Checks d L / d param for every element of param[0..n) against grad.
static void check_param(moe_case *c, const char *name, real *param, const real *grad, size_t n,
                        routing_watch *rw) {
    double *fd = malloc(n * sizeof(double)), *an = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        real saved = param[i];
        param[i] = saved + H;
        double lp = loss_of(c, rw);
        param[i] = saved - H;
        double lm = loss_of(c, rw);
        param[i] = saved;
        fd[i] = (lp - lm) / (2 * H);
        an[i] = grad[i];
    }
    char label[80];
    snprintf(label, sizeof label, "%s (%zu elements)", name, n);
    check_rel(label, an, fd, n, TOL);
    free(fd);
    free(an);
}

// Re-draws the x row of the token with the smallest margin until every selection and drop
// margin is >= MARGIN_MIN, at most MAX_REDRAWS times (the caller asserts the margins).
// Returns the number of rows re-drawn. The rows are continuous random draws, so no two
// tokens tie exactly and the worst one is the same under every BLAS kernel family (which
// is not so for the model's discrete tokens: see test_model_gradcheck.c).
static int make_decisive(moe_case *c, const real *bias, uint64_t seed) {
    test_rng r;
    rng_seed(&r, seed + 1000);
    moe_routing rt = {0};
    int redrawn = 0;
    for (;; redrawn++) {
        moe_stats st;
        if (moe_case_forward(c, c->T, 1, &st)) {
            fprintf(stderr, "forward failed: %s\n", moe_last_error());
            exit(1);
        }
        moe_routing_capture(&rt, &c->layer, bias);
        int ts, td;
        double ms = moe_routing_select_margin(&rt, &ts), md = moe_routing_drop_margin(&rt, &td);
        if ((ms >= MARGIN_MIN && md >= MARGIN_MIN) || redrawn >= MAX_REDRAWS) break;
        int t = ms < md ? ts : td;
        real *x = c->x + (size_t)t * c->cfg.d_model;
        for (int i = 0; i < c->cfg.d_model; i++) x[i] = (real)rng_normal(&r);
        x[0] += 1.0; // the same skew as every other token
    }
    moe_routing_free(&rt);
    return redrawn;
}

static void run_opts(const char *title, moe_config cfg, int T, uint64_t seed, int expect_drops,
                     int seq_len, int with_bias) {
    moe_case c;
    moe_case_random(&c, &cfg, T, seed);
    c.seq_len = seq_len;
    c.layer.noise_key = seed * 77; // fixed noise: every forward draws the same jitter
    real bias[16] = {0};
    if (with_bias) { // a bias large enough to change some selections
        test_rng r;
        rng_seed(&r, seed + 100);
        for (int e = 0; e < cfg.n_experts; e++) bias[e] = (real)(0.1 * rng_normal(&r));
        c.w.bias = bias;
    }
    // skew the router so that capacity mode really drops: expert 0 attracts tokens
    for (int i = 0; i < cfg.d_model; i++) c.w.gate[i] += 0.3;
    for (int t = 0; t < T; t++) c.x[(size_t)t * cfg.d_model] += 1.0;
    int redrawn = make_decisive(&c, c.w.bias, seed);
    moe_stats st;
    moe_case_run(&c, &st);
    printf("%s: T=%d d=%d ff=%d E=%d k=%d cf=%g capacity=%d dropped=%ld\n", title, T, cfg.d_model,
           cfg.d_ff, cfg.n_experts, cfg.top_k, cfg.capacity_factor, st.capacity, st.dropped);
    if (expect_drops)
        check_true("capacity mode drops assignments", st.dropped > 0);
    else
        check_true("nothing dropped", st.dropped == 0);

    routing_watch rw = {.bias = c.w.bias};
    moe_routing_capture(&rw.base, &c.layer, c.w.bias);
    int used = moe_routing_experts_used(&rw.base);
    double ms = moe_routing_select_margin(&rw.base, NULL);
    double md = moe_routing_drop_margin(&rw.base, NULL);
    size_t E = cfg.n_experts, d = cfg.d_model, ff = cfg.d_ff;
    size_t total = (size_t)T * d + E * d + 3 * E * ff * d;
    check_param(&c, "dx", c.x, c.dx, (size_t)T * d, &rw);
    check_param(&c, "dgate", c.w.gate, c.g.gate, E * d, &rw);
    check_param(&c, "dw13 (w1 and w3)", c.w.w13, c.g.w13, E * 2 * ff * d, &rw);
    check_param(&c, "dw2", c.w.w2, c.g.w2, E * d * ff, &rw);
    printf("  %d x rows re-drawn; %d of %zu experts used; margins: select %.3e, drop %.3e; "
           "max change under +-h: v %.3e, w %.3e\n",
           redrawn, used, E, ms, md, rw.dv, rw.dw);
    check_true("routing is not trivial: >= 3 experts used", used >= 3);
    check_routing_margins(ms, md, rw.dv, rw.dw, rw.flipped, 2 * total, MARGIN_MIN, MARGIN_SAFETY);
    moe_routing_free(&rw.base);
    moe_routing_free(&rw.cur);
    moe_case_free(&c);
}

static void run(const char *title, moe_config cfg, int T, uint64_t seed, int expect_drops) {
    run_opts(title, cfg, T, seed, expect_drops, 0, 0);
}

int main(void) {
    moe_config cfg = moe_config_default(8, 12, 4, 2);
    cfg.aux_coef = 0.1;
    cfg.z_coef = 0.05;
    run("dropless", cfg, 16, 1, 0);

    cfg.capacity_factor = 0.75;
    cfg.drop_policy = MOE_DROP_PROBS;
    run("capacity probs", cfg, 16, 2, 1);

    cfg.drop_policy = MOE_DROP_POSITION;
    run("capacity position", cfg, 16, 3, 1);

    cfg.norm_topk_prob = 0;
    cfg.drop_policy = MOE_DROP_PROBS;
    run("capacity probs, norm_topk_prob off", cfg, 16, 4, 1);

    moe_config switch_cfg = moe_config_default(8, 12, 6, 1);
    switch_cfg.norm_topk_prob = 0;
    switch_cfg.capacity_factor = 1.0;
    switch_cfg.aux_coef = 0.1;
    switch_cfg.z_coef = 0.05;
    run("switch k=1, cf=1", switch_cfg, 16, 5, 1);

    moe_config all_cfg = moe_config_default(8, 12, 4, 4);
    run("k == E dropless", all_cfg, 16, 6, 0);

    // balancing options (DeepSeek-V3 and Switch): sigmoid scoring with route_scale, a
    // selection bias, the sequence-level aux loss, router input jitter
    moe_config sig = moe_config_default(8, 12, 6, 2);
    sig.scoring = MOE_SCORE_SIGMOID;
    sig.route_scale = 2.5;
    sig.aux_coef = 0.1, sig.z_coef = 0.05, sig.seq_aux_coef = 0.2;
    sig.capacity_factor = 0.75;
    run_opts("sigmoid, route_scale 2.5, bias, seq aux (4 x 4), capacity", sig, 16, 7, 1, 4, 1);
    sig.norm_topk_prob = 0;
    sig.capacity_factor = 0;
    run_opts("sigmoid, norm off, dropless", sig, 16, 8, 0, 0, 0);
    moe_config jit = moe_config_default(8, 12, 4, 2);
    jit.aux_coef = 0.1, jit.z_coef = 0.05, jit.seq_aux_coef = 0.1, jit.jitter_eps = 0.2;
    jit.capacity_factor = 0.75;
    run_opts("softmax, jitter 0.2, seq aux (2 x 8), bias, capacity", jit, 16, 9, 1, 8, 1);

    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
