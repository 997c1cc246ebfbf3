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
    const int S = 24, V = cfg.vocab_size;
    moe_model train, inf;
    if (moe_model_create(&train, test_backend(), &cfg, 1, S) ||
        moe_model_create_inference(&inf, test_backend(), &cfg, S, S)) {
        fprintf(stderr, "%s\n", moe_last_error());
        return 1;
    }
    moe_model_init_weights(&train, 7, 0.3);
    inf.be->copy_on_device(inf.be, inf.params, train.params, train.n_params * sizeof(real));
    check_true("inference model has no gradients and one shared MoE layer",
               inf.grads == NULL && inf.n_moe == 1 && train.n_moe == cfg.n_layers);

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
    check_true("expert hits count every routed assignment",
               hits == 3L * cfg.n_layers * S * cfg.moe.top_k);
    check_true("a chunk beyond the cache is refused",
               moe_model_infer(&inf, tokens, 2, S - 1) == MOE_EINVAL);
    printf("    -> %s\n", moe_last_error());
    check_true("training forward on an inference model is refused",
               moe_model_forward(&inf, tokens, targets, 1, S, moe_pass_infer()) == MOE_EINVAL);

    free(full), free(once), free(chunked), free(decode);
    moe_model_destroy(&train);
    moe_model_destroy(&inf);
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
