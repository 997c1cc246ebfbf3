#include "moe_test_case.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test_backend.h"

static void die_status(const char *what, moe_status st) {
    fprintf(stderr, "%s failed: %s: %s\n", what, moe_status_name(st), moe_last_error());
    exit(1);
}

moe_dtype moe_case_dtype = MOE_DTYPE_F32;

static void *dev_alloc(size_t bytes) {
    void *p = test_backend()->alloc(test_backend(), bytes);
    if (!p) {
        fprintf(stderr, "backend alloc of %zu bytes failed\n", bytes);
        exit(1);
    }
    return p;
}

static void alloc_case(moe_case *c) {
    size_t nw = moe_weights_count(&c->cfg), nx = (size_t)c->T * c->cfg.d_model;
    size_t nte = (size_t)c->T * c->cfg.n_experts, ntk = (size_t)c->T * c->cfg.top_k;
    c->params = calloc(nw, sizeof(real));
    c->grads = calloc(nw, sizeof(real));
    moe_weights_view(&c->w, c->params, &c->cfg);
    moe_weights_view(&c->g, c->grads, &c->cfg);
    c->x = calloc(nx, sizeof(real));
    c->dout = calloc(nx, sizeof(real));
    c->y = calloc(nx, sizeof(real));
    c->dx = calloc(nx, sizeof(real));
    c->dev_params = dev_alloc(nw * sizeof(real));
    c->dev_grads = dev_alloc(nw * sizeof(real));
    moe_weights_view(&c->dev_w, c->dev_params, &c->cfg);
    moe_weights_view(&c->dev_g, c->dev_grads, &c->cfg);
    if (c->cfg.dtype == MOE_DTYPE_BF16) { // the bf16 copies at the fp32 weights' offsets
        c->dev_params16 = dev_alloc(nw * sizeof(moe_bf16));
        c->dev_w.gate16 = c->dev_params16 + (c->dev_w.gate - c->dev_params);
        c->dev_w.w13_16 = c->dev_params16 + (c->dev_w.w13 - c->dev_params);
        c->dev_w.w2_16 = c->dev_params16 + (c->dev_w.w2 - c->dev_params);
    }
    c->dev_x = dev_alloc(nx * sizeof(real));
    c->dev_dout = dev_alloc(nx * sizeof(real));
    c->dev_y = dev_alloc(nx * sizeof(real));
    c->dev_dx = dev_alloc(nx * sizeof(real));
    c->topk_idx = calloc(ntk, sizeof(int));
    c->assign_row = calloc(ntk, sizeof(int));
    c->weights = calloc(ntk, sizeof(real));
    c->probs = calloc(nte, sizeof(real));
    c->scores = calloc(nte, sizeof(real));
    moe_status st = moe_layer_init(&c->layer, test_backend(), &c->cfg, c->T);
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
    if ((t = fixture_find(fx, "scoring")))
        c->cfg.scoring = t->data[0] ? MOE_SCORE_SIGMOID : MOE_SCORE_SOFTMAX;
    if ((t = fixture_find(fx, "route_scale"))) c->cfg.route_scale = t->data[0];
    if ((t = fixture_find(fx, "seq_aux_coef"))) c->cfg.seq_aux_coef = t->data[0];
    if ((t = fixture_find(fx, "jitter_eps"))) c->cfg.jitter_eps = t->data[0];
    if ((t = fixture_find(fx, "seq_len"))) c->seq_len = (int)t->data[0];
    c->cfg.dtype = moe_case_dtype;
    alloc_case(c);
    if ((t = fixture_find(fx, "bias"))) {
        c->bias = calloc((size_t)E, sizeof(real));
        for (int e = 0; e < E; e++) c->bias[e] = (real)t->data[e];
        c->w.bias = c->bias;
    }
    if ((t = fixture_find(fx, "jitter_noise")) && c->cfg.jitter_eps > 0) {
        c->jitter = malloc(t->count * sizeof(real));
        for (size_t i = 0; i < t->count; i++) c->jitter[i] = (real)t->data[i];
        // the fixture's noise instead of our RNG's (the layer reads it: backend memory)
        c->dev_jitter = dev_alloc(t->count * sizeof(real));
        test_backend()->copy_to_device(test_backend(), c->dev_jitter, c->jitter,
                                       t->count * sizeof(real));
        c->layer.jitter_override = c->dev_jitter;
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
    moe_backend *be = test_backend();
    moe_layer_free(&c->layer);
    free(c->params);
    free(c->grads);
    free(c->x);
    free(c->dout);
    free(c->y);
    free(c->dx);
    free(c->bias);
    free(c->jitter);
    real *dev[] = {c->dev_params, c->dev_grads, c->dev_x,    c->dev_dout,
                   c->dev_y,      c->dev_dx,    c->dev_bias, c->dev_jitter};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) be->free(be, dev[i]);
    if (c->dev_params16) be->free(be, c->dev_params16);
    free(c->topk_idx);
    free(c->assign_row);
    free(c->weights);
    free(c->probs);
    free(c->scores);
}

// Host -> device: x (T rows), the weights, and the bias when the test set one (w.bias, a host
// array the test may point anywhere or change between calls).
static void upload_inputs(moe_case *c, int T) {
    moe_backend *be = test_backend();
    const size_t E = c->cfg.n_experts;
    be->copy_to_device(be, c->dev_x, c->x, (size_t)T * c->cfg.d_model * sizeof(real));
    be->copy_to_device(be, c->dev_params, c->params, moe_weights_count(&c->cfg) * sizeof(real));
    if (c->dev_params16)
        be->to_bf16(be, c->dev_params16, c->dev_params, moe_weights_count(&c->cfg));
    if (c->w.bias) {
        if (!c->dev_bias) c->dev_bias = dev_alloc(E * sizeof(real));
        be->copy_to_device(be, c->dev_bias, c->w.bias, E * sizeof(real));
    }
    c->dev_w.bias = c->w.bias ? c->dev_bias : NULL;
}

// Device -> host: y (T rows) and the layer's routing buffers of the last forward.
static void download_forward(moe_case *c, int T) {
    moe_backend *be = test_backend();
    const moe_layer *L = &c->layer;
    const size_t te = (size_t)T * c->cfg.n_experts, tk = (size_t)T * c->cfg.top_k;
    be->copy_to_host(be, c->y, c->dev_y, (size_t)T * c->cfg.d_model * sizeof(real));
    be->copy_to_host(be, c->topk_idx, L->topk_idx, tk * sizeof(int));
    be->copy_to_host(be, c->assign_row, L->assign_row, tk * sizeof(int));
    be->copy_to_host(be, c->weights, L->weights, tk * sizeof(real));
    be->copy_to_host(be, c->probs, L->probs, te * sizeof(real));
    be->copy_to_host(be, c->scores, L->scores, te * sizeof(real));
}

moe_status moe_case_forward(moe_case *c, int T, int training, moe_stats *stats) {
    upload_inputs(c, T);
    moe_status st = moe_layer_forward(
        &c->layer, c->dev_y, c->dev_x, &c->dev_w, T, c->seq_len,
        training ? moe_pass_train(c->layer.cfg.capacity_factor) : moe_pass_infer(), stats);
    if (!st) download_forward(c, T);
    return st;
}

void moe_case_run(moe_case *c, moe_stats *stats) {
    moe_backend *be = test_backend();
    size_t nx = (size_t)c->T * c->cfg.d_model, nw = moe_weights_count(&c->cfg);
    be->zero(be, c->dev_dx, nx * sizeof(real));
    be->zero(be, c->dev_grads, nw * sizeof(real));
    be->copy_to_device(be, c->dev_dout, c->dout, nx * sizeof(real));
    moe_status st = moe_case_forward(c, c->T, 1, stats);
    if (st) die_status("moe_layer_forward", st);
    st = moe_layer_backward(&c->layer, c->dev_dx, &c->dev_g, c->dev_dout, c->dev_x, &c->dev_w, 1.0);
    if (st) die_status("moe_layer_backward", st);
    be->copy_to_host(be, c->dx, c->dev_dx, nx * sizeof(real));
    be->copy_to_host(be, c->grads, c->dev_grads, nw * sizeof(real));
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

void moe_routing_capture(moe_routing *r, const moe_layer *L, const real *bias) {
    const int T = L->last_tokens, E = L->cfg.n_experts, k = L->cfg.top_k;
    if (r->T != T || r->E != E) {
        moe_routing_free(r);
        r->v = malloc((size_t)T * E * sizeof(double));
        r->w = malloc((size_t)T * E * sizeof(double));
        r->state = malloc((size_t)T * E);
    }
    r->T = T, r->E = E, r->k = k;
    r->capacity = L->stats.capacity;
    r->policy = L->cfg.drop_policy;
    // the layer's buffers are backend memory: read host copies of them
    const size_t te = (size_t)T * E, tk = (size_t)T * k;
    real *scores = malloc(te * sizeof(real)), *weights = malloc(tk * sizeof(real));
    int *topk_idx = malloc(tk * sizeof(int)), *assign_row = malloc(tk * sizeof(int));
    L->be->copy_to_host(L->be, scores, L->scores, te * sizeof(real));
    L->be->copy_to_host(L->be, weights, L->weights, tk * sizeof(real));
    L->be->copy_to_host(L->be, topk_idx, L->topk_idx, tk * sizeof(int));
    L->be->copy_to_host(L->be, assign_row, L->assign_row, tk * sizeof(int));
    for (size_t i = 0; i < te; i++) {
        r->v[i] = (double)scores[i] + (bias ? (double)bias[i % E] : 0.0);
        r->w[i] = 0;
        r->state[i] = 0;
    }
    for (size_t s = 0; s < tk; s++) {
        size_t idx = (s / k) * E + topk_idx[s];
        r->w[idx] = weights[s];
        r->state[idx] = assign_row[s] >= 0 ? 1 : 2;
    }
    free(scores), free(weights), free(topk_idx), free(assign_row);
}

void moe_routing_free(moe_routing *r) {
    free(r->v);
    free(r->w);
    free(r->state);
    memset(r, 0, sizeof *r);
}

double moe_routing_select_margin(const moe_routing *r, int *token) {
    double best = INFINITY;
    if (token) *token = -1;
    if (r->k >= r->E) return best;
    for (int t = 0; t < r->T; t++) {
        // selected experts have v >= every unselected one: margin = min sel v - max unsel v
        double lo_sel = INFINITY, hi_unsel = -INFINITY;
        for (int e = 0; e < r->E; e++) {
            double v = r->v[(size_t)t * r->E + e];
            if (r->state[(size_t)t * r->E + e])
                lo_sel = v < lo_sel ? v : lo_sel;
            else
                hi_unsel = v > hi_unsel ? v : hi_unsel;
        }
        if (lo_sel - hi_unsel < best) {
            best = lo_sel - hi_unsel;
            if (token) *token = t;
        }
    }
    return best;
}

double moe_routing_drop_margin(const moe_routing *r, int *token) {
    double best = INFINITY;
    if (token) *token = -1;
    if (r->capacity <= 0 || r->policy != MOE_DROP_PROBS) return best;
    for (int e = 0; e < r->E; e++) {
        double lo_kept = INFINITY, hi_drop = -INFINITY;
        int drop_tok = -1;
        for (int t = 0; t < r->T; t++) {
            size_t te = (size_t)t * r->E + e;
            if (r->state[te] == 1 && r->w[te] < lo_kept) lo_kept = r->w[te];
            if (r->state[te] == 2 && r->w[te] > hi_drop) hi_drop = r->w[te], drop_tok = t;
        }
        if (drop_tok >= 0 && lo_kept - hi_drop < best) {
            best = lo_kept - hi_drop;
            if (token) *token = drop_tok;
        }
    }
    return best;
}

size_t moe_routing_diff(const moe_routing *a, const moe_routing *b, double *dv, double *dw) {
    size_t n = 0;
    double mv = 0, mw = 0;
    for (size_t i = 0; i < (size_t)a->T * a->E; i++) {
        n += a->state[i] != b->state[i];
        double x = fabs(a->v[i] - b->v[i]), y = fabs(a->w[i] - b->w[i]);
        mv = x > mv ? x : mv;
        mw = y > mw ? y : mw;
    }
    if (dv) *dv = mv;
    if (dw) *dw = mw;
    return n;
}

int moe_routing_experts_used(const moe_routing *r) {
    int used = 0;
    for (int e = 0; e < r->E; e++) {
        int any = 0;
        for (int t = 0; t < r->T; t++) any |= r->state[(size_t)t * r->E + e] == 1;
        used += any;
    }
    return used;
}

void check_routing_margins(double ms, double md, double dv, double dw, size_t flipped, size_t evals,
                           double margin_min, double safety) {
    char label[96];
    snprintf(label, sizeof label, "selection margin %.1e >= %.0e (no near-tie)", ms, margin_min);
    check_true(label, ms >= margin_min);
    snprintf(label, sizeof label, "drop margin %.1e >= %.0e (no near-tie)", md, margin_min);
    check_true(label, md >= margin_min);
    snprintf(label, sizeof label, "margins > %.0f x 2 x max change under +-h", safety);
    check_true(label, ms > safety * 2 * dv && md > safety * 2 * dw);
    snprintf(label, sizeof label, "no decision flipped (%zu of %zu evaluations)", flipped, evals);
    check_true(label, flipped == 0);
}
