// The whole model under expert parallelism (moe_model_create_parallel) against the single-rank
// model, under mpirun -np R: the same seed gives every rank the same dense weights and its
// experts' slice of the single-rank model's (looked up by HF name); on its own batch each
// rank's losses and dense gradients equal the single-rank model's on that batch, and each
// local expert's gradient equals the single-rank gradients summed over the EP group.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/cpu/cpu_backend.h"
#include "layers/exchange.h"
#include "layers/model.h"
#include "optim/optimizer.h"
#include "ep_test.h"
#include "test_backend.h"
#include "test_util.h"

#define TOL 1e-6

static const moe_model_tensor *by_name(const moe_model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

static size_t numel(const moe_model_tensor *t) { return (size_t)t->rows * (t->cols ? t->cols : 1); }

// Relative difference ||got - want|| / ||want|| over the tensors of `got` (a model of some
// experts) of one kind (dense or expert) against the same-named tensors of `want` (the whole
// model), values in host doubles; *worst_tensor: the largest per-tensor relative difference.
static double compare(const moe_model *got, const double *g, const moe_model *want, const double *w,
                      int experts_only, int *missing, double *worst_tensor) {
    double diff = 0, norm = 0;
    for (int i = 0; i < got->n_tensors; i++) {
        const moe_model_tensor *t = &got->tensors[i], *u = by_name(want, t->name);
        if (!u || numel(u) != numel(t)) {
            (*missing)++;
            continue;
        }
        if (t->is_expert != experts_only) continue;
        const double *a = g + t->offset, *b = w + u->offset;
        for (size_t j = 0; j < numel(t); j++)
            diff += (a[j] - b[j]) * (a[j] - b[j]), norm += b[j] * b[j];
        if (worst_tensor) *worst_tensor = fmax(*worst_tensor, rel_err(a, b, numel(t)));
    }
    return norm > 0 ? sqrt(diff / norm) : sqrt(diff);
}

// cfg.dtype bf16: both models in bf16 (the rows travel in fp32), on the CPU backend's
// reference bf16 GEMM (bf16_reference below): the same bound holds (measured 4e-8 to 9e-8 on
// 2 and 4 ranks; fp32's 4e-7)
static void run(moe_comm *world, moe_comm *ep, moe_backend *be, moe_model_config cfg, int B, int S,
                const char *title) {
    const int T = B * S;
    int *tok = malloc(2 * (size_t)T * sizeof(int)), *tgt = tok + T;
    test_rng r;
    rng_seed(&r, 500 + (uint64_t)world->rank);
    for (int i = 0; i < 2 * T; i++) tok[i] = (int)(rng_uniform(&r) * cfg.vocab_size);
    moe_model one, par;
    if (moe_model_create(&one, be, &cfg, B, S) ||
        moe_model_create_parallel(&par, be, &cfg, B, S, ep)) {
        fprintf(stderr, "%s\n", moe_last_error());
        exit(1);
    }
    moe_model_init_weights(&one, 3, 0.3);
    moe_model_init_weights(&par, 3, 0.3);
    double *p1 = ep_host_doubles(be, one.params, one.n_params),
           *p2 = ep_host_doubles(be, par.params, par.n_params);
    int missing = 0;
    double wp = fmax(compare(&par, p2, &one, p1, 0, &missing, NULL),
                     compare(&par, p2, &one, p1, 1, &missing, NULL));
    check_true("EP weights == the whole model's, tensor by tensor (by name)", wp == 0 && !missing);

    double loss[2][3];
    moe_model *ms[2] = {&one, &par};
    for (int i = 0; i < 2; i++) {
        moe_model_zero_grads(ms[i]);
        if (moe_model_forward(ms[i], tok, tgt, B, S,
                              moe_pass_train(ms[i]->cfg.moe.capacity_factor)) ||
            moe_model_backward(ms[i], 1.0)) {
            fprintf(stderr, "%s\n", moe_last_error());
            exit(1);
        }
        loss[i][0] = ms[i]->ce, loss[i][1] = ms[i]->aux, loss[i][2] = ms[i]->z;
    }
    double g1n = 0;
    double *g1 = ep_host_doubles(be, one.grads, one.n_params),
           *g2 = ep_host_doubles(be, par.grads, par.n_params);
    for (size_t i = 0; i < one.n_params; i++) g1n += fabs(g1[i]);
    double per_tensor = 0; // reported: the largest relative difference of one tensor
    const double dense = compare(&par, g2, &one, g1, 0, &missing, &per_tensor);
    // the single-rank expert gradients summed over the EP group
    ep->allreduce_sum_double(ep, g1 + one.n_dense, one.n_params - one.n_dense);
    const double expert = compare(&par, g2, &one, g1, 1, &missing, &per_tensor);
    double dl = 0;
    for (int j = 0; j < 3; j++)
        dl = fmax(dl, fabs(loss[1][j] - loss[0][j]) / fmax(fabs(loss[0][j]), 1e-30));
    double mine[2] = {fmax(fmax(dense, expert), dl), per_tensor}, worst[2] = {0, 0};
    double *all = malloc(2 * (size_t)world->size * sizeof(double));
    world->allgather(world, all, mine, sizeof mine);
    for (int j = 0; j < 2 * world->size; j++) worst[j % 2] = fmax(worst[j % 2], all[j]);
    char what[192];
    snprintf(what, sizeof what,
             "EP model %s: losses (ce, aux, z), dense and expert gradients within %g", title, TOL);
    check_true(what, worst[0] <= TOL && g1n > 0 && !missing);
    if (world->rank == 0)
        printf("R=%d ep=%d %-26s relative difference %.2e (losses, dense, experts), %.2e "
               "(worst tensor), ce %.4f\n",
               world->size, ep->size, title, worst[0], worst[1], loss[0][0]);
    free(all), free(p1), free(p2), free(g1), free(g2), free(tok);
    moe_model_destroy(&par);
    moe_model_destroy(&one);
}

// bf16 parity runs on the reference bf16 GEMM (on = 1; 0 restores the path it replaced), on
// a CPU backend. The experts of an EP rank multiply other row counts than one rank's, and a
// BLAS's row results depend on the row count in the last bit (OpenBLAS's Haswell kernels,
// emulated bf16 on an AVX2 CPU: 1.1e-3 here, not 1e-7), which the next rounding to bf16 can
// make a whole bf16 step; the reference GEMM's rows depend on the row alone.
static void bf16_reference(moe_backend *be, int on) {
    static int saved = -1;
    if (strncmp(be->name, "cpu", 3) != 0) return;
    cpu_state *s = be->state;
    if (on) saved = s->bf16_native;
    cpu_backend_set_bf16_gemm(be, on ? CPU_BF16_REFERENCE : saved);
}

static void tokens_of(int rank, const moe_model_config *cfg, int T, int *tok) {
    test_rng r;
    rng_seed(&r, 900 + (uint64_t)rank);
    for (int i = 0; i < 2 * T; i++) tok[i] = (int)(rng_uniform(&r) * cfg->vocab_size);
}

// One training step: R ranks with a micro-batch each (loss scale 1/R, gradients SUM-reduced:
// dense over the world, experts over the ranks holding the same experts), against one rank
// accumulating the R micro-batches; then an SGD step with the clipping scale of the global
// norm. Gradients, the norm and the updated weights agree. (SGD, not AdamW: the two sum the
// same terms in different orders, and where a gradient entry is a cancellation down to ~1e-8
// its last bits differ by a few percent, which AdamW's first step, g / (|g| + eps) with eps
// 1e-8, turns into 1e-4 absolute differences of those weights. Linear in g, SGD keeps the
// gradients' agreement, which is what this test is about.)
static void run_step(moe_comm *world, moe_comm *ep, moe_comm *edp, moe_backend *be,
                     moe_model_config cfg, int B, int S, const char *title) {
    const int T = B * S, R = world->size;
    int *tok = malloc(2 * (size_t)T * sizeof(int));
    moe_model one, par;
    if (moe_model_create(&one, be, &cfg, B, S) ||
        moe_model_create_parallel(&par, be, &cfg, B, S, ep)) {
        fprintf(stderr, "%s\n", moe_last_error());
        exit(1);
    }
    moe_model_init_weights(&one, 5, 0.3);
    moe_model_init_weights(&par, 5, 0.3);
    moe_model_zero_grads(&one);
    moe_model_zero_grads(&par);
    for (int j = 0; j < R; j++) { // every rank's micro-batch, in rank order
        tokens_of(j, &cfg, T, tok);
        if (moe_model_forward(&one, tok, tok + T, B, S,
                              moe_pass_train(one.cfg.moe.capacity_factor)) ||
            moe_model_backward(&one, 1.0 / R))
            exit(1);
    }
    tokens_of(world->rank, &cfg, T, tok);
    if (moe_model_forward(&par, tok, tok + T, B, S, moe_pass_train(par.cfg.moe.capacity_factor)) ||
        moe_model_backward(&par, 1.0 / R))
        exit(1);
    moe_model_reduce_grads(&par, world, edp);
    double ss1, ss2 = moe_model_grad_sum_squares(&par);
    be->sum_squares(be, &ss1, one.grads, one.n_params);
    int missing = 0;
    double *g1 = ep_host_doubles(be, one.grads, one.n_params),
           *g2 = ep_host_doubles(be, par.grads, par.n_params);
    double worst = fmax(compare(&par, g2, &one, g1, 0, &missing, NULL),
                        compare(&par, g2, &one, g1, 1, &missing, NULL));
    worst = fmax(worst, fabs(ss2 - ss1) / ss1);
    const optim_config oc = {.kind = OPTIM_SGD};
    moe_optimizer o1, o2;
    const optim_region r1 = {0, one.n_params, 1}, r2 = {0, par.n_params, 1};
    if (moe_optimizer_create(&o1, be, &oc, one.n_params, &r1, 1) ||
        moe_optimizer_create(&o2, be, &oc, par.n_params, &r2, 1))
        exit(1);
    moe_optimizer_step(&o1, one.params, NULL, one.grads, 0.5, moe_clip_scale(sqrt(ss1), 0.1));
    moe_optimizer_step(&o2, par.params, NULL, par.grads, 0.5, moe_clip_scale(sqrt(ss2), 0.1));
    double *p1 = ep_host_doubles(be, one.params, one.n_params),
           *p2 = ep_host_doubles(be, par.params, par.n_params);
    worst = fmax(worst, fmax(compare(&par, p2, &one, p1, 0, &missing, NULL),
                             compare(&par, p2, &one, p1, 1, &missing, NULL)));
    double *all = malloc((size_t)R * sizeof(double));
    world->allgather(world, all, &worst, sizeof worst);
    for (int j = 0; j < R; j++) worst = fmax(worst, all[j]);
    check_true("R ranks x 1 micro-batch == 1 rank x R micro-batches: gradients, norm, SGD step",
               worst <= TOL && !missing);
    if (world->rank == 0)
        printf("R=%d ep=%d step, %-20s relative difference %.2e (gradients, norm, weights)\n", R,
               ep->size, title, worst);
    moe_optimizer_destroy(&o1), moe_optimizer_destroy(&o2);
    free(all), free(g1), free(g2), free(p1), free(p2), free(tok);
    moe_model_destroy(&par);
    moe_model_destroy(&one);
}

int main(void) {
    moe_comm *world = ep_world();
    moe_backend *be = test_backend();
    moe_model_config cfg = {
        .vocab_size = 40,
        .d_model = 16,
        .n_layers = 2,
        .n_heads = 2,
        .n_kv_heads = 1,
        .max_seq_len = 16,
        .tie_embeddings = 0,
        .rope_theta = 100.0,
        .rms_norm_eps = 1e-5,
    };
    cfg.moe = moe_config_default(16, 24, 8, 2);
    const int R = world->size;
    int ep_sizes[2] = {R, R / 2}, n_ep = R >= 4 ? 2 : 1;
    for (int s = 0; s < n_ep; s++) {
        moe_comm *ep;
        if (world->split(world, world->rank / ep_sizes[s], world->rank, &ep)) return 1;
        cfg.moe.capacity_factor = 0;
        run(world, ep, be, cfg, 2, 12, "dropless");
        cfg.moe.exchange = MOE_EXCHANGE_ROWS; // the default is dedup
        run(world, ep, be, cfg, 2, 12, "dropless, rows exchange");
        cfg.moe.capacity_factor = 1.0;
        run(world, ep, be, cfg, 2, 12, "capacity 1.0, rows exchange");
        cfg.moe.exchange = MOE_EXCHANGE_DEDUP, cfg.moe.capacity_factor = 0;
        cfg.dtype = MOE_DTYPE_BF16; // rows travel in fp32 either way
        bf16_reference(be, 1);
        run(world, ep, be, cfg, 2, 12, "dropless, bf16");
        bf16_reference(be, 0);
        cfg.dtype = MOE_DTYPE_F32;
        cfg.moe.capacity_factor = 1.0;
        run(world, ep, be, cfg, 2, 12, "capacity 1.0, probs");
        cfg.router_bias = 1, cfg.tie_embeddings = 1;
        run(world, ep, be, cfg, 2, 12, "capacity 1.0, bias, tied");
        cfg.router_bias = 0, cfg.tie_embeddings = 0;
        // the dense parts of 2025-26 models (DESIGN.md §2.1) stay on the token's rank: a dense
        // layer, q/k/v biases, a gated shared expert (Qwen2-MoE); q/k norm per head (Qwen3-MoE)
        moe_model_config q2 = cfg, q3 = cfg;
        q2.family = MOE_FAMILY_QWEN2_MOE, q2.n_layers = 3, q2.sparse_step = 2, q2.dense_d_ff = 20;
        q2.qkv_bias = 1, q2.shared_d_ff = 12, q2.shared_gate = 1;
        run(world, ep, be, q2, 2, 12, "qwen2_moe: dense layer, biases, gated shared expert");
        q2.moe.exchange = MOE_EXCHANGE_ROWS;
        run(world, ep, be, q2, 2, 12, "qwen2_moe, rows exchange");
        q2.moe.exchange = MOE_EXCHANGE_DEDUP;
        q3.family = MOE_FAMILY_QWEN3_MOE, q3.qk_norm = MOE_QK_NORM_HEAD, q3.first_k_dense = 1;
        q3.n_layers = 3, q3.moe.capacity_factor = 0;
        run(world, ep, be, q3, 2, 12, "qwen3_moe: q/k norm, layer 0 dense, dropless");
        moe_comm *edp; // the ranks holding the same experts: same place in their EP groups
        if (world->split(world, world->rank % ep_sizes[s], world->rank, &edp)) return 1;
        cfg.moe.capacity_factor = 0;
        run_step(world, ep, edp, be, cfg, 2, 12, "dropless");
        cfg.moe.capacity_factor = 1.0;
        run_step(world, ep, edp, be, cfg, 2, 12, "capacity 1.0");
        run_step(world, ep, edp, be, q2, 2, 12, "qwen2_moe, capacity 1.0");
        edp->destroy(edp);
        ep->destroy(ep);
    }
    return ep_verdict(world);
}
