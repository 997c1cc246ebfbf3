// Inference path (KV cache, chunked prefill) against the training forward: same weights,
// same tokens, dropless. Token-by-token decode logits == full-sequence logits (<= 1e-5),
// chunked prefill == unchunked, and the inference model keeps no training buffers.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/model.h"
#include "test_util.h"
#include "test_backend.h"

#define TOL 1e-5

// The logits [rows, V] of the last forward or moe_model_infer, copied from the device to doubles.
static double *copy_logits(const moe_model *m, int rows, int V) {
    const size_t n = (size_t)rows * V;
    double *out = malloc(n * sizeof(double));
    real *host = malloc(n * sizeof(real));
    m->be->copy_to_host(m->be, host, m->logits, n * sizeof(real));
    for (size_t i = 0; i < n; i++) out[i] = host[i];
    free(host);
    return out;
}

// Inference (prefill, chunked prefill, decode) against the training forward of one config.
static int run_case(const char *title, moe_model_config cfg) {
    printf("%s\n", title);
    const int S = 24, V = cfg.vocab_size;
    moe_model train, inf;
    if (moe_model_create(&train, test_backend(), &cfg, 1, S) ||
        moe_model_create_inference(&inf, test_backend(), &cfg, S, S)) {
        fprintf(stderr, "%s\n", moe_last_error());
        return 1;
    }
    moe_model_init_weights(&train, 7, 0.3);
    { // norms away from 1 and biases away from 0: a part skipped on one path shows
        real *h = malloc(train.n_params * sizeof(real));
        train.be->copy_to_host(train.be, h, train.params, train.n_params * sizeof(real));
        test_rng nr;
        rng_seed(&nr, 11);
        for (int i = 0; i < train.n_tensors; i++)
            for (int j = 0; j < train.tensors[i].rows &&
                            (train.tensors[i].is_norm || train.tensors[i].is_bias);
                 j++)
                h[train.tensors[i].offset + j] =
                    (real)((train.tensors[i].is_norm ? 1 : 0) + 0.3 * rng_normal(&nr));
        train.be->copy_to_device(train.be, train.params, h, train.n_params * sizeof(real));
        free(h);
    }
    inf.be->copy_on_device(inf.be, inf.params, train.params, train.n_params * sizeof(real));
    const int Lm = moe_model_n_moe_layers(&cfg); // the others are dense layers
    check_true("inference model has no gradients and one shared MoE layer",
               inf.grads == NULL && inf.n_moe == 1 && train.n_moe == Lm);

    test_rng r;
    rng_seed(&r, 3);
    int tokens[24], targets[24];
    for (int t = 0; t < S; t++) tokens[t] = (int)(rng_uniform(&r) * V), targets[t] = (t * 5) % V;
    if (moe_model_forward(&train, tokens, targets, 1, S,
                          moe_pass_train(train.cfg.moe.capacity_factor)))
        return 1;
    double *full = copy_logits(&train, S, V);

    if (moe_model_infer(&inf, tokens, S, 0)) return 1;
    double *once = copy_logits(&inf, S, V);
    check_rel("one prefill of 24 == training forward", once, full, (size_t)S * V, TOL);

    // chunked prefill: 5 + 5 + 5 + 5 + 4
    double *chunked = malloc((size_t)S * V * sizeof(double));
    for (int p = 0; p < S; p += 5) {
        int n = p + 5 <= S ? 5 : S - p;
        if (moe_model_infer(&inf, tokens + p, n, p)) return 1;
        double *part = copy_logits(&inf, n, V);
        memcpy(chunked + (size_t)p * V, part, (size_t)n * V * sizeof(double));
        free(part);
    }
    check_rel("chunked prefill (5) == unchunked", chunked, once, (size_t)S * V, TOL);

    // decode: one token at a time
    double *decode = malloc((size_t)S * V * sizeof(double));
    for (int p = 0; p < S; p++) {
        if (moe_model_infer(&inf, tokens + p, 1, p)) return 1;
        double *row = copy_logits(&inf, 1, V);
        memcpy(decode + (size_t)p * V, row, (size_t)V * sizeof(double));
        free(row);
    }
    check_rel("token-by-token decode == full forward", decode, full, (size_t)S * V, TOL);

    // cross-entropy of the inference logits == the training forward's ce (dropless)
    double ce = 0;
    for (int t = 0; t < S; t++) {
        const double *z = once + (size_t)t * V;
        double mx = z[0], sum = 0;
        for (int i = 1; i < V; i++) mx = z[i] > mx ? z[i] : mx;
        for (int i = 0; i < V; i++) sum += exp(z[i] - mx);
        ce += mx + log(sum) - z[targets[t]];
    }
    ce /= S;
    check_rel("inference cross-entropy == training forward ce", &ce, &train.ce, 1, TOL);

    long hits = 0;
    for (int i = 0; i < cfg.n_layers * cfg.moe.n_experts; i++) hits += inf.expert_hits[i];
    check_true("expert hits count every routed assignment (of the MoE layers)",
               hits == 3L * Lm * S * cfg.moe.top_k);
    check_true("a chunk beyond the cache is refused",
               moe_model_infer(&inf, tokens, 2, S - 1) == MOE_EINVAL);
    printf("    -> %s\n", moe_last_error());
    check_true("training forward on an inference model is refused",
               moe_model_forward(&inf, tokens, targets, 1, S, moe_pass_infer()) == MOE_EINVAL);

    free(full), free(once), free(chunked), free(decode);
    moe_model_destroy(&train);
    moe_model_destroy(&inf);
    return 0;
}

int main(void) {
    moe_model_config cfg = {
        .vocab_size = 37,
        .d_model = 32,
        .n_layers = 3,
        .n_heads = 4,
        .n_kv_heads = 2,
        .max_seq_len = 24,
        .tie_embeddings = 0,
        .rope_theta = 1000.0,
        .rms_norm_eps = 1e-5,
    };
    cfg.moe = moe_config_default(32, 40, 6, 2);
    if (run_case("mixtral", cfg)) return 1;
    // the parts of 2025-26 models (DESIGN.md §2.1) on the inference path too
    moe_model_config q2 = cfg, q3 = cfg, ol = cfg;
    q2.family = MOE_FAMILY_QWEN2_MOE, q2.sparse_step = 2, q2.dense_d_ff = 48;
    q2.qkv_bias = 1, q2.shared_d_ff = 24, q2.shared_gate = 1;
    if (run_case("qwen2_moe: layer 0 and 2 dense, q/k/v biases, gated shared expert", q2)) return 1;
    q3.family = MOE_FAMILY_QWEN3_MOE, q3.qk_norm = MOE_QK_NORM_HEAD, q3.first_k_dense = 1;
    q3.head_dim = 12, q3.dense_d_ff = 20;
    if (run_case("qwen3_moe: q/k norm per head, head_dim 12, layer 0 dense", q3)) return 1;
    ol.family = MOE_FAMILY_OLMOE, ol.qk_norm = MOE_QK_NORM_FULL;
    if (run_case("olmoe: q/k norm over the projections", ol)) return 1;
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
