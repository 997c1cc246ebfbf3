#include "moe_test_case.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die_status(const char *what, moe_status st) {
    fprintf(stderr, "%s failed: %s: %s\n", what, moe_status_name(st), moe_last_error());
    exit(1);
}

static void alloc_case(moe_case *c) {
    size_t nw = moe_weights_count(&c->cfg), nx = (size_t)c->T * c->cfg.d_model;
    c->params = calloc(nw, sizeof(real));
    c->grads = calloc(nw, sizeof(real));
    moe_weights_view(&c->w, c->params, &c->cfg);
    moe_weights_view(&c->g, c->grads, &c->cfg);
    c->x = calloc(nx, sizeof(real));
    c->dout = calloc(nx, sizeof(real));
    c->y = calloc(nx, sizeof(real));
    c->dx = calloc(nx, sizeof(real));
    moe_status st = moe_layer_init(&c->layer, moe_backend_cpu(), &c->cfg, c->T);
    if (st) die_status("moe_layer_init", st);
}

static void copy_tensor(real *dst, const fixture *fx, const char *name, size_t n) {
    const fixture_tensor *t = fixture_get(fx, name, n);
    for (size_t i = 0; i < n; i++) dst[i] = (real)t->data[i];
}

void moe_case_from_fixture(moe_case *c, const fixture *fx) {
    memset(c, 0, sizeof *c);
    int E = fixture_int(fx, "E"), k = fixture_int(fx, "k");
    c->cfg = moe_config_default(fixture_int(fx, "d"), fixture_int(fx, "ff"), E, k);
    c->cfg.norm_topk_prob = fixture_int(fx, "norm_topk_prob");
    int policy = fixture_int(fx, "policy");
    c->cfg.capacity_factor = policy == 0 ? 0.0 : fixture_double(fx, "capacity_factor");
    c->cfg.drop_policy = policy == 2 ? MOE_DROP_POSITION : MOE_DROP_PROBS;
    c->cfg.aux_coef = fixture_double(fx, "aux_coef");
    c->cfg.z_coef = fixture_double(fx, "z_coef");
    c->T = fixture_int(fx, "T");
    // balancing options, present in the newer fixtures only
    const fixture_tensor *t;
    if ((t = fixture_find(fx, "scoring"))) c->cfg.scoring = t->data[0] ? MOE_SCORE_SIGMOID : MOE_SCORE_SOFTMAX;
    if ((t = fixture_find(fx, "route_scale"))) c->cfg.route_scale = t->data[0];
    if ((t = fixture_find(fx, "seq_aux_coef"))) c->cfg.seq_aux_coef = t->data[0];
    if ((t = fixture_find(fx, "jitter_eps"))) c->cfg.jitter_eps = t->data[0];
    if ((t = fixture_find(fx, "seq_len"))) c->seq_len = (int)t->data[0];
    alloc_case(c);
    if ((t = fixture_find(fx, "bias"))) {
        c->bias = calloc((size_t)E, sizeof(real));
        for (int e = 0; e < E; e++) c->bias[e] = (real)t->data[e];
        c->w.bias = c->bias;
    }
    if ((t = fixture_find(fx, "jitter_noise")) && c->cfg.jitter_eps > 0) {
        c->jitter = malloc(t->count * sizeof(real));
        for (size_t i = 0; i < t->count; i++) c->jitter[i] = (real)t->data[i];
        c->layer.jitter_override = c->jitter; // the fixture's noise instead of our RNG's
    }
    size_t d = c->cfg.d_model, ff = c->cfg.d_ff, T = c->T;
    copy_tensor(c->x, fx, "x", T * d);
    copy_tensor(c->dout, fx, "dout", T * d);
    copy_tensor(c->w.gate, fx, "gate", E * d);
    // HF w1, w3 [E, ff, d] -> stacked w13 [E, 2ff, d]
    const fixture_tensor *w1 = fixture_get(fx, "w1", E * ff * d);
    const fixture_tensor *w3 = fixture_get(fx, "w3", E * ff * d);
    for (size_t e = 0; e < (size_t)E; e++)
        for (size_t i = 0; i < ff * d; i++) {
            c->w.w13[(2 * e) * ff * d + i] = (real)w1->data[e * ff * d + i];
            c->w.w13[(2 * e + 1) * ff * d + i] = (real)w3->data[e * ff * d + i];
        }
    copy_tensor(c->w.w2, fx, "w2", E * d * ff);
}

void moe_case_random(moe_case *c, const moe_config *cfg, int T, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->cfg = *cfg;
    c->T = T;
    alloc_case(c);
    test_rng r;
    rng_seed(&r, seed);
    size_t d = cfg->d_model, ff = cfg->d_ff, E = cfg->n_experts;
    for (size_t i = 0; i < (size_t)T * d; i++) c->x[i] = (real)rng_normal(&r);
    for (size_t i = 0; i < (size_t)T * d; i++) c->dout[i] = (real)rng_normal(&r);
    for (size_t i = 0; i < E * d; i++) c->w.gate[i] = (real)(rng_normal(&r) / sqrt((double)d));
    for (size_t i = 0; i < E * 2 * ff * d; i++)
        c->w.w13[i] = (real)(rng_normal(&r) / sqrt((double)d));
    for (size_t i = 0; i < E * d * ff; i++) c->w.w2[i] = (real)(rng_normal(&r) / sqrt((double)ff));
}

void moe_case_free(moe_case *c) {
    moe_layer_free(&c->layer);
    free(c->params);
    free(c->grads);
    free(c->x);
    free(c->dout);
    free(c->y);
    free(c->dx);
    free(c->bias);
    free(c->jitter);
}

void moe_case_run(moe_case *c, moe_stats *stats) {
    size_t nx = (size_t)c->T * c->cfg.d_model;
    memset(c->dx, 0, nx * sizeof(real));
    memset(c->grads, 0, moe_weights_count(&c->cfg) * sizeof(real));
    moe_status st = moe_layer_forward(&c->layer, c->y, c->x, &c->w, c->T, c->seq_len, 1, stats);
    if (st) die_status("moe_layer_forward", st);
    st = moe_layer_backward(&c->layer, c->dx, &c->g, c->dout, c->x, &c->w, 1.0);
    if (st) die_status("moe_layer_backward", st);
}

static double *slots[4];
static size_t slot_cap[4];

static double *slot_buffer(int slot, size_t n) {
    if (slot_cap[slot] < n) {
        free(slots[slot]);
        slots[slot] = malloc(n * sizeof(double) + 1);
        slot_cap[slot] = n;
    }
    return slots[slot];
}

double *as_double(int slot, const real *x, size_t n) {
    double *out = slot_buffer(slot, n);
    for (size_t i = 0; i < n; i++) out[i] = x[i];
    return out;
}

double *w13_part_as_double(int slot, const real *w13, int part, int E, int ff, int d) {
    size_t m = (size_t)ff * d;
    double *out = slot_buffer(slot, (size_t)E * m);
    for (size_t e = 0; e < (size_t)E; e++)
        for (size_t i = 0; i < m; i++) out[e * m + i] = w13[(2 * e + part) * m + i];
    return out;
}

double *int_as_double(int slot, const int *x, size_t n) {
    double *out = slot_buffer(slot, n);
    for (size_t i = 0; i < n; i++) out[i] = x[i];
    return out;
}
