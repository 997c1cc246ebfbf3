// Finite-difference gradient check of the whole model in double precision (built against
// moe_layers_f64). L = CE + sum over layers of (L_aux + L_z), B sequences of S tokens.
// Every parameter element is perturbed by +-h; elements whose perturbation flips a routing
// or drop decision in any layer are detected, skipped and counted.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/model.h"
#include "test_util.h"

#define H_STEP 1e-6
#define TOL 1e-6

typedef struct {
    int *idx, *rows; // per layer [T*k]
} decisions;

static void save_decisions(decisions *dc, const model *m) {
    size_t n = (size_t)m->B * m->S * m->cfg.moe.top_k;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        memcpy(dc->idx + l * n, m->moe[l].topk_idx, n * sizeof(int));
        memcpy(dc->rows + l * n, m->moe[l].assign_row, n * sizeof(int));
    }
}

static int same_decisions(const decisions *dc, const model *m) {
    size_t n = (size_t)m->B * m->S * m->cfg.moe.top_k;
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (memcmp(dc->idx + l * n, m->moe[l].topk_idx, n * sizeof(int)) ||
            memcmp(dc->rows + l * n, m->moe[l].assign_row, n * sizeof(int)))
            return 0;
    return 1;
}

static double total_loss(model *m, const int *tok, const int *tgt, int B, int S) {
    if (model_forward(m, tok, tgt, B, S, 1)) {
        fprintf(stderr, "forward: %s\n", moe_last_error());
        exit(1);
    }
    return m->ce + m->aux + m->z;
}

static void run(const char *title, model_config cfg, int B, int S, uint64_t seed) {
    model m;
    if (model_create(&m, moe_backend_cpu(), &cfg, B, S)) {
        fprintf(stderr, "model_create: %s\n", moe_last_error());
        exit(1);
    }
    model_init_weights(&m, seed, 0.5);
    test_rng r;
    rng_seed(&r, seed);
    int T = B * S, *tok = malloc(T * sizeof(int)), *tgt = malloc(T * sizeof(int));
    for (int t = 0; t < T; t++) tok[t] = (int)(rng_uniform(&r) * cfg.vocab_size);
    for (int t = 0; t < T; t++) tgt[t] = (int)(rng_uniform(&r) * cfg.vocab_size);
    // norms away from 1 so their gradients are not special
    for (int i = 0; i < m.n_tensors; i++)
        if (m.tensors[i].is_norm)
            for (int j = 0; j < m.tensors[i].rows; j++)
                m.params[m.tensors[i].offset + j] = 1 + 0.2 * rng_normal(&r);

    model_zero_grads(&m);
    double l0 = total_loss(&m, tok, tgt, B, S);
    long dropped = 0;
    for (int l = 0; l < cfg.n_layers; l++) dropped += m.moe_stats[l].dropped;
    model_backward(&m, 1.0);
    printf("%s: loss %.6f (ce %.6f aux %.6f z %.6f), dropped %ld\n", title, l0, m.ce, m.aux,
           m.z, dropped);
    if (cfg.moe.capacity_factor > 0) check_true("capacity mode drops assignments", dropped > 0);

    size_t n = (size_t)T * cfg.moe.top_k * cfg.n_layers;
    decisions dc = {malloc(n * sizeof(int)), malloc(n * sizeof(int))};
    save_decisions(&dc, &m);
    real *grads = malloc(m.n_params * sizeof(real));
    memcpy(grads, m.grads, m.n_params * sizeof(real));

    size_t skipped = 0, total = 0;
    for (int i = 0; i < m.n_tensors; i++) {
        const model_tensor *t = &m.tensors[i];
        size_t cnt = (size_t)t->rows * (t->cols ? t->cols : 1), used = 0;
        double *fd = malloc(cnt * sizeof(double)), *an = malloc(cnt * sizeof(double));
        for (size_t j = 0; j < cnt; j++) {
            real *p = m.params + t->offset + j, saved = *p;
            *p = saved + H_STEP;
            double lp = total_loss(&m, tok, tgt, B, S);
            int same = same_decisions(&dc, &m);
            *p = saved - H_STEP;
            double lm = total_loss(&m, tok, tgt, B, S);
            same &= same_decisions(&dc, &m);
            *p = saved;
            total++;
            if (!same) {
                skipped++;
                continue;
            }
            fd[used] = (lp - lm) / (2 * H_STEP);
            an[used] = grads[t->offset + j];
            used++;
        }
        // one line per kind of tensor is enough output: print layer 0 / expert 0 and non-layer
        int quiet = strstr(t->name, "experts.") && !strstr(t->name, "experts.0.");
        if (!quiet || !(rel_err(an, fd, used) <= TOL)) check_rel(t->name, an, fd, used, TOL);
        free(fd);
        free(an);
    }
    printf("  skipped %zu of %zu elements (a routing/drop decision flipped)\n", skipped, total);
    check_true("skipped elements are rare (< 1%)", skipped * 100 < total);
    free(dc.idx), free(dc.rows), free(grads), free(tok), free(tgt);
    model_destroy(&m);
}

int main(void) {
    model_config cfg = {
        .vocab_size = 11, .d_model = 8, .n_layers = 2, .n_heads = 2, .n_kv_heads = 1,
        .max_seq_len = 8, .tie_embeddings = 0, .rope_theta = 100.0, .rms_norm_eps = 1e-5,
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
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
