// Finite-difference gradient check of the whole model in double precision (built against
// moe_layers_f64). L = CE + sum over layers of (L_aux + L_z), B sequences of S tokens.
// Every parameter element is perturbed by +-h and compared; none is skipped.
//
// L is discontinuous where a routing or drop decision flips in any MoE layer, and every
// parameter before a layer's router (embeddings, attention, norms, earlier layers' experts)
// moves that router's input. So the case is built with decisive routing in every layer and
// the margins are asserted at the model's actual routing (moe_routing in moe_test_case.h):
//   selection margin  min_t v_(k) - v_(k+1)            (v = softmax p + bias, per token)
//   drop margin       min_e min_kept w - max_dropped w (probs policy, over-full experts)
// A parameter moved by h moves every v and w by |dv/dparam| h + O(h^2). The router input is
// an RMSNorm output (unit rms) of a residual stream whose derivative in any one weight is
// O(1) at this size and init (std 0.5); softmax gives |dp_e| <= 2 p_e max|dz|; so v and w
// move by O(1e-6) at h = 1e-6 (measured below: ~4e-6 at most). A gap > MARGIN_MIN = 2e-2 is
// then > MARGIN_SAFETY = 1000 times what +-h can close (for changes up to 1e-5) and > 1e12
// times what BLAS rounding can (~1e-16 relative in double, whatever the kernel family).
// Exact ties happen too: two sequences that start with the same token have bit-identical
// router inputs there in every layer (causal attention), and their equal combine weights at
// an over-full expert are split by the tie rule and the last bits of the BLAS kernel alone
// (drop margin 0). The test measures the largest change of v and w over all +-h evaluations
// in all layers and asserts margin > MARGIN_SAFETY * 2 * max|change| (a gap closes by at
// most the change of both ends). While building the case the token ids are re-drawn until
// every margin is >= MARGIN_MIN (make_decisive); a decision flipped at any +-h fails the
// test.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/model.h"
#include "moe_test_case.h"
#include "test_backend.h"

#define H_STEP 1e-6
#define TOL 1e-6
#define MARGIN_MIN 2e-2
#define MARGIN_SAFETY 1000.0
#ifndef MAX_REDRAWS
#define MAX_REDRAWS 1000
#endif

typedef struct {
    int n; // MoE layers
    moe_routing *base, *cur;
    size_t flipped; // +-h evaluations whose routing differs from the base in any layer
    double dv, dw;  // largest |change| of v and w over all of them and all layers
} routing_watch;

// The routing of every MoE layer (r[j]: the j-th MoE layer; dense layers route nothing).
static void capture_all(moe_routing *r, const moe_model *m) {
    int E = m->cfg.moe.n_experts;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const int j = moe_model_moe_index(&m->cfg, l);
        if (j < 0) continue;
        const real *bias = m->router_bias ? m->router_bias + (size_t)l * E : NULL;
        moe_routing_capture(&r[j], &m->moe[j], bias);
    }
}

// Smallest selection (*ms) and drop (*md) margins over the layers; *token: the token at
// the smaller of the two (-1 if both are infinite).
static void min_margins(const moe_routing *r, int n, double *ms, double *md, int *token) {
    *ms = *md = INFINITY;
    double worst = INFINITY;
    *token = -1;
    for (int l = 0; l < n; l++) {
        int ts, td;
        double s = moe_routing_select_margin(&r[l], &ts), d = moe_routing_drop_margin(&r[l], &td);
        *ms = s < *ms ? s : *ms;
        *md = d < *md ? d : *md;
        if (s < worst) worst = s, *token = ts;
        if (d < worst) worst = d, *token = td;
    }
}

static void watch(routing_watch *rw, const moe_model *m) {
    capture_all(rw->cur, m);
    size_t changed = 0;
    for (int l = 0; l < rw->n; l++) {
        double dv, dw;
        changed += moe_routing_diff(&rw->base[l], &rw->cur[l], &dv, &dw);
        rw->dv = dv > rw->dv ? dv : rw->dv;
        rw->dw = dw > rw->dw ? dw : rw->dw;
    }
    rw->flipped += changed != 0;
}

static double total_loss(moe_model *m, const int *tok, const int *tgt, int B, int S) {
    if (moe_model_forward(m, tok, tgt, B, S, moe_pass_train(m->cfg.moe.capacity_factor))) {
        fprintf(stderr, "forward: %s\n", moe_last_error());
        exit(1);
    }
    return m->ce + m->aux + m->z;
}

// Re-draws all the tokens until every margin in every layer is >= MARGIN_MIN, at most
// MAX_REDRAWS times (the caller asserts the margins). Returns the number of re-draws.
// Whole sets, not the token at the worst margin: exact ties are common here (a sequence
// that starts "a a" or two that start alike have bit-identical router inputs), and which of
// two tied tokens is the dropped one, hence which one a targeted re-draw would change, is
// decided by the last bits of the BLAS kernel. A whole-set re-draw asks only "are all
// margins >= MARGIN_MIN", which every kernel family answers alike (a tie is ~0 under each),
// so every family builds the same case.
static int make_decisive(moe_model *m, int *tok, const int *tgt, int B, int S, test_rng *r) {
    const int Lm = moe_model_n_moe_layers(&m->cfg);
    moe_routing *rt = calloc(Lm, sizeof *rt);
    int redrawn = 0;
    for (;; redrawn++) {
        total_loss(m, tok, tgt, B, S);
        capture_all(rt, m);
        double ms, md;
        int t;
        min_margins(rt, Lm, &ms, &md, &t);
        if ((ms >= MARGIN_MIN && md >= MARGIN_MIN) || redrawn >= MAX_REDRAWS) break;
        for (t = 0; t < B * S; t++) tok[t] = (int)(rng_uniform(r) * m->cfg.vocab_size);
    }
    for (int l = 0; l < Lm; l++) moe_routing_free(&rt[l]);
    free(rt);
    return redrawn;
}

static void run(const char *title, moe_model_config cfg, int B, int S, uint64_t seed) {
    moe_model m;
    if (moe_model_create(&m, test_backend(), &cfg, B, S)) {
        fprintf(stderr, "moe_model_create: %s\n", moe_last_error());
        exit(1);
    }
    moe_model_init_weights(&m, seed, 0.5);
    test_rng r;
    rng_seed(&r, seed);
    int T = B * S, *tok = malloc(T * sizeof(int)), *tgt = malloc(T * sizeof(int));
    for (int t = 0; t < T; t++) tok[t] = (int)(rng_uniform(&r) * cfg.vocab_size);
    for (int t = 0; t < T; t++) tgt[t] = (int)(rng_uniform(&r) * cfg.vocab_size);
    // norms away from 1 and biases away from 0 so their gradients are not special
    for (int i = 0; i < m.n_tensors; i++)
        for (int j = 0; j < m.tensors[i].rows && (m.tensors[i].is_norm || m.tensors[i].is_bias);
             j++)
            m.params[m.tensors[i].offset + j] =
                (m.tensors[i].is_norm ? 1 : 0) + 0.2 * rng_normal(&r);
    int redrawn = make_decisive(&m, tok, tgt, B, S, &r);

    moe_model_zero_grads(&m);
    double l0 = total_loss(&m, tok, tgt, B, S);
    long dropped = 0;
    for (int l = 0; l < cfg.n_layers; l++) dropped += m.moe_stats[l].dropped;
    moe_model_backward(&m, 1.0);
    printf("%s: loss %.6f (ce %.6f aux %.6f z %.6f), dropped %ld\n", title, l0, m.ce, m.aux, m.z,
           dropped);
    if (cfg.moe.capacity_factor > 0) check_true("capacity mode drops assignments", dropped > 0);

    const int L = moe_model_n_moe_layers(&cfg); // the MoE layers'
    routing_watch rw = {L, calloc(L, sizeof(moe_routing)), calloc(L, sizeof(moe_routing)), 0, 0, 0};
    capture_all(rw.base, &m);
    double ms, md;
    int worst_tok, used = cfg.moe.n_experts;
    min_margins(rw.base, L, &ms, &md, &worst_tok);
    for (int l = 0; l < L; l++) {
        int u = moe_routing_experts_used(&rw.base[l]);
        used = u < used ? u : used;
    }
    real *grads = malloc(m.n_params * sizeof(real));
    memcpy(grads, m.grads, m.n_params * sizeof(real));

    size_t total = 0;
    for (int i = 0; i < m.n_tensors; i++) {
        const moe_model_tensor *t = &m.tensors[i];
        size_t cnt = (size_t)t->rows * (t->cols ? t->cols : 1);
        double *fd = malloc(cnt * sizeof(double)), *an = malloc(cnt * sizeof(double));
        for (size_t j = 0; j < cnt; j++) {
            real *p = m.params + t->offset + j, saved = *p;
            *p = saved + H_STEP;
            double lp = total_loss(&m, tok, tgt, B, S);
            watch(&rw, &m);
            *p = saved - H_STEP;
            double lm = total_loss(&m, tok, tgt, B, S);
            watch(&rw, &m);
            *p = saved;
            total++;
            fd[j] = (lp - lm) / (2 * H_STEP);
            an[j] = grads[t->offset + j];
        }
        // one line per kind of tensor is enough output: print layer 0 / expert 0 and non-layer
        int quiet = strstr(t->name, "experts.") && !strstr(t->name, "experts.0.");
        if (!quiet || !(rel_err(an, fd, cnt) <= TOL)) check_rel(t->name, an, fd, cnt, TOL);
        free(fd);
        free(an);
    }
    printf("  tokens re-drawn %d times; >= %d of %d experts used per layer; margins (all layers): "
           "select %.3e, drop %.3e; max change under +-h: v %.3e, w %.3e\n",
           redrawn, used, cfg.moe.n_experts, ms, md, rw.dv, rw.dw);
    check_true("routing is not trivial: every expert used", used == cfg.moe.n_experts);
    check_routing_margins(ms, md, rw.dv, rw.dw, rw.flipped, 2 * total, MARGIN_MIN, MARGIN_SAFETY);
    for (int l = 0; l < L; l++) moe_routing_free(&rw.base[l]), moe_routing_free(&rw.cur[l]);
    free(rw.base), free(rw.cur), free(grads), free(tok), free(tgt);
    moe_model_destroy(&m);
}

// Global-batch balancing (aux_scope "global", DESIGN.md §3.6) over two micro-batches of one
// sequence each: J = (1/2) sum_m (CE_m + L_aux_m + L_z_m), L_aux_m with f from the counts of
// both micro-batches (a pre-pass, as the trainer's). Counts are integers, so away from a routing
// flip the finite differences of J (its pre-pass included) are J's gradient with f held, which
// the two backwards at loss_scale 1/2 accumulate. Dropless: a token routes the same in a batch
// of one sequence or two, so the margins of the two-sequence forward are the micro-batches'.
static long *global_counts(moe_model *m, const int *tok, const int *tgt, int S) {
    const int L = m->cfg.n_layers, E = m->cfg.moe.n_experts;
    long *c = calloc((size_t)L * E, sizeof(long));
    moe_model_set_aux_counts(m, NULL, 0);
    for (int mb = 0; mb < 2; mb++) {
        total_loss(m, tok + mb * S, tgt + mb * S, 1, S);
        for (int l = 0; l < L; l++)
            for (int e = 0; e < E && moe_model_layer_is_moe(&m->cfg, l); e++)
                c[(size_t)l * E + e] += m->moe_stats[l].routed[e];
    }
    return c;
}

static double global_loss(moe_model *m, const int *tok, const int *tgt, int S, int backward) {
    long *c = global_counts(m, tok, tgt, S);
    if (moe_model_set_aux_counts(m, c, 2L * S)) exit(1);
    double J = 0;
    for (int mb = 0; mb < 2; mb++) {
        J += total_loss(m, tok + mb * S, tgt + mb * S, 1, S) / 2;
        if (backward) moe_model_backward(m, 0.5);
    }
    moe_model_set_aux_counts(m, NULL, 0);
    free(c);
    return J;
}

static void run_global(const char *title, moe_model_config cfg, int S, uint64_t seed) {
    moe_model m;
    if (moe_model_create(&m, test_backend(), &cfg, 2, S)) exit(1);
    moe_model_init_weights(&m, seed, 0.5);
    test_rng r;
    rng_seed(&r, seed);
    int *tok = malloc(2 * S * sizeof(int)), *tgt = malloc(2 * S * sizeof(int));
    for (int t = 0; t < 2 * S; t++) tok[t] = (int)(rng_uniform(&r) * cfg.vocab_size);
    for (int t = 0; t < 2 * S; t++) tgt[t] = (int)(rng_uniform(&r) * cfg.vocab_size);
    const int redrawn = make_decisive(&m, tok, tgt, 2, S, &r);
    moe_model_zero_grads(&m);
    const double J = global_loss(&m, tok, tgt, S, 1);
    // the global f is not the micro-batches' own: J differs from the micro-batch scope's
    double Jm = 0;
    for (int mb = 0; mb < 2; mb++) Jm += total_loss(&m, tok + mb * S, tgt + mb * S, 1, S) / 2;
    printf("%s: J %.6f (micro-batch scope %.6f)\n", title, J, Jm);
    check_true("the global scope changes the loss", fabs(J - Jm) > 1e-9);
    const int L = moe_model_n_moe_layers(&cfg);
    routing_watch rw = {L, calloc(L, sizeof(moe_routing)), calloc(L, sizeof(moe_routing)), 0, 0, 0};
    total_loss(&m, tok, tgt, 2, S);
    capture_all(rw.base, &m);
    double ms, md;
    int worst;
    min_margins(rw.base, L, &ms, &md, &worst);
    real *grads = malloc(m.n_params * sizeof(real));
    memcpy(grads, m.grads, m.n_params * sizeof(real));
    size_t total = 0;
    for (int i = 0; i < m.n_tensors; i++) {
        const moe_model_tensor *t = &m.tensors[i];
        const size_t cnt = (size_t)t->rows * (t->cols ? t->cols : 1);
        double *fd = malloc(cnt * sizeof(double)), *an = malloc(cnt * sizeof(double));
        for (size_t j = 0; j < cnt; j++) {
            real *p = m.params + t->offset + j, saved = *p;
            *p = saved + H_STEP;
            const double lp = global_loss(&m, tok, tgt, S, 0);
            total_loss(&m, tok, tgt, 2, S), watch(&rw, &m);
            *p = saved - H_STEP;
            const double lm = global_loss(&m, tok, tgt, S, 0);
            total_loss(&m, tok, tgt, 2, S), watch(&rw, &m);
            *p = saved;
            total++;
            fd[j] = (lp - lm) / (2 * H_STEP), an[j] = grads[t->offset + j];
        }
        if (!strstr(t->name, "experts.") || strstr(t->name, "experts.0.") ||
            !(rel_err(an, fd, cnt) <= TOL))
            check_rel(t->name, an, fd, cnt, TOL);
        free(fd), free(an);
    }
    printf("  tokens re-drawn %d times; margins: select %.3e; max change under +-h: v %.3e\n",
           redrawn, ms, rw.dv);
    check_routing_margins(ms, md, rw.dv, rw.dw, rw.flipped, 2 * total, MARGIN_MIN, MARGIN_SAFETY);
    for (int l = 0; l < L; l++) moe_routing_free(&rw.base[l]), moe_routing_free(&rw.cur[l]);
    free(rw.base), free(rw.cur), free(grads), free(tok), free(tgt);
    moe_model_destroy(&m);
}

int main(void) {
    moe_model_config cfg = {
        .vocab_size = 11,
        .d_model = 8,
        .n_layers = 2,
        .n_heads = 2,
        .n_kv_heads = 1,
        .max_seq_len = 8,
        .tie_embeddings = 0,
        .rope_theta = 100.0,
        .rms_norm_eps = 1e-5,
    };
    cfg.moe = moe_config_default(8, 6, 3, 2);
    cfg.moe.aux_coef = 0.1;
    cfg.moe.z_coef = 0.05;
    run("untied, GQA, dropless", cfg, 2, 5, 1);
    cfg.moe.capacity_factor = 0.7;
    run("untied, GQA, capacity 0.7 probs", cfg, 2, 5, 2);
    cfg.tie_embeddings = 1;
    cfg.n_kv_heads = 2;
    cfg.moe.drop_policy = MOE_DROP_POSITION;
    run("tied, MHA, capacity 0.7 position", cfg, 2, 5, 3);
    // head_dim 6 != d_model / n_heads = 4 (Qwen3-MoE's shape): q, k, v 6 wide per head,
    // o_proj maps 2 x 6 -> 8
    cfg.head_dim = 6;
    cfg.tie_embeddings = 0, cfg.n_kv_heads = 1, cfg.moe.capacity_factor = 0;
    run("head_dim 6 (d_model 8, 2 heads), GQA, dropless", cfg, 2, 5, 4);

    // The layers of 2025-26 models (DESIGN.md §2.1), each family's combination:
    // Qwen3-MoE: q/k RMSNorm per head (head_dim 6), the first layer dense (an MLP of 10)
    cfg.family = MOE_FAMILY_QWEN3_MOE, cfg.qk_norm = MOE_QK_NORM_HEAD;
    cfg.first_k_dense = 1, cfg.dense_d_ff = 10, cfg.n_layers = 3;
    run("qwen3_moe: q/k norm per head, head_dim 6, layer 0 dense", cfg, 2, 5, 5);
    // Qwen2-MoE: q/k/v biases, a gated shared expert, every second layer MoE, capacity drops
    cfg.family = MOE_FAMILY_QWEN2_MOE, cfg.qk_norm = MOE_QK_NORM_NONE, cfg.head_dim = 0;
    cfg.first_k_dense = 0, cfg.sparse_step = 2, cfg.n_layers = 2, cfg.dense_d_ff = 7;
    cfg.qkv_bias = 1, cfg.shared_d_ff = 5, cfg.shared_gate = 1;
    cfg.moe.capacity_factor = 0.7;
    run("qwen2_moe: q/k/v biases, gated shared expert, sparse_step 2, capacity 0.7", cfg, 2, 5, 6);
    // OLMoE: q/k RMSNorm over the whole projections (q 8 wide, k 4: GQA)
    cfg.family = MOE_FAMILY_OLMOE, cfg.qk_norm = MOE_QK_NORM_FULL;
    cfg.sparse_step = 1, cfg.qkv_bias = 0, cfg.shared_d_ff = 0, cfg.shared_gate = 0;
    cfg.moe.capacity_factor = 0;
    run("olmoe: q/k norm over the projections, GQA, dropless", cfg, 2, 5, 7);

    // global-batch balancing, with a dense layer and a shared expert in the stack
    cfg.family = MOE_FAMILY_QWEN2_MOE, cfg.qk_norm = MOE_QK_NORM_NONE, cfg.sparse_step = 2;
    cfg.shared_d_ff = 5, cfg.shared_gate = 1, cfg.qkv_bias = 1, cfg.n_layers = 2;
    cfg.moe.aux_coef = 0.5; // (large: the aux part of the gradient is well above the tolerance)
    run_global("aux_scope global: two micro-batches, qwen2_moe, dropless", cfg, 5, 8);
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
