// Finite-difference gradient check of the MoE layer in double precision
// (this file is built against moe_layers_f64, where `real` is double).
//
// L = sum(y * dout) + L_aux + L_z. For every element of x, gate, w13 (= w1 and w3), w2 the central
// difference (L(+h) - L(-h)) / 2h is compared with the analytic gradient. A perturbation
// that flips a routing or drop decision makes L discontinuous there: such an element is
// detected (top-k indices or kept rows changed), skipped and counted.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_test_case.h"

#define H 1e-6
#define TOL 1e-6

static double loss_of(moe_case *c, int *decisions_same, const int *base_idx,
                      const int *base_rows) {
    moe_stats st;
    if (moe_layer_forward(&c->layer, c->y, c->x, &c->w, c->T, c->seq_len, 1, &st)) {
        fprintf(stderr, "forward failed: %s\n", moe_last_error());
        exit(1);
    }
    double l = st.aux + st.seq_aux + st.z;
    for (size_t i = 0; i < (size_t)c->T * c->cfg.d_model; i++) l += c->y[i] * c->dout[i];
    size_t n = (size_t)c->T * c->cfg.top_k;
    *decisions_same = memcmp(c->layer.topk_idx, base_idx, n * sizeof(int)) == 0 &&
                      memcmp(c->layer.assign_row, base_rows, n * sizeof(int)) == 0;
    return l;
}

// Checks d L / d param for every element of param[0..n) against grad.
static void check_param(moe_case *c, const char *name, real *param, const real *grad, size_t n,
                        const int *base_idx, const int *base_rows, size_t *skipped) {
    double *fd = malloc(n * sizeof(double)), *an = malloc(n * sizeof(double));
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        real saved = param[i];
        int same_p, same_m;
        param[i] = saved + H;
        double lp = loss_of(c, &same_p, base_idx, base_rows);
        param[i] = saved - H;
        double lm = loss_of(c, &same_m, base_idx, base_rows);
        param[i] = saved;
        if (!same_p || !same_m) {
            (*skipped)++;
            continue;
        }
        fd[m] = (lp - lm) / (2 * H);
        an[m] = grad[i];
        m++;
    }
    char label[80];
    snprintf(label, sizeof label, "%s (%zu of %zu elements)", name, m, n);
    check_rel(label, an, fd, m, TOL);
    free(fd);
    free(an);
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
    moe_stats st;
    moe_case_run(&c, &st);
    printf("%s: T=%d d=%d ff=%d E=%d k=%d cf=%g capacity=%d dropped=%ld\n", title, T,
           cfg.d_model, cfg.d_ff, cfg.n_experts, cfg.top_k, cfg.capacity_factor, st.capacity,
           st.dropped);
    if (expect_drops) check_true("capacity mode drops assignments", st.dropped > 0);
    else check_true("nothing dropped", st.dropped == 0);

    size_t n = (size_t)T * cfg.top_k;
    int *base_idx = malloc(n * sizeof(int)), *base_rows = malloc(n * sizeof(int));
    memcpy(base_idx, c.layer.topk_idx, n * sizeof(int));
    memcpy(base_rows, c.layer.assign_row, n * sizeof(int));
    size_t E = cfg.n_experts, d = cfg.d_model, ff = cfg.d_ff, skipped = 0;
    size_t total = (size_t)T * d + E * d + 3 * E * ff * d;
    check_param(&c, "dx", c.x, c.dx, (size_t)T * d, base_idx, base_rows, &skipped);
    check_param(&c, "dgate", c.w.gate, c.g.gate, E * d, base_idx, base_rows, &skipped);
    check_param(&c, "dw13 (w1 and w3)", c.w.w13, c.g.w13, E * 2 * ff * d, base_idx, base_rows,
                &skipped);
    check_param(&c, "dw2", c.w.w2, c.g.w2, E * d * ff, base_idx, base_rows, &skipped);
    printf("  skipped %zu of %zu elements (a routing/drop decision flipped)\n", skipped, total);
    check_true("skipped elements are rare (< 1%)", skipped * 100 < total);
    free(base_idx);
    free(base_rows);
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
