// The model's initial weights (moe_model_init_weights): normal(0, std) matrices drawn on the
// host from the seed, the residual projections (o_proj, w2/down_proj) scaled by 1/sqrt(2L),
// norms at 1, biases at 0; the same numbers on every rank and under any expert placement (each
// keeps its tensors).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layers/model.h"
#include "layers/rng.h"

static double normal(uint64_t *s) { // Box-Muller
    double u1 = moe_uniform01(moe_splitmix64(s)) + 0x1.0p-53, u2 = moe_uniform01(moe_splitmix64(s));
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

// The weights of the whole model (all E experts) from seed, in the layout of table tab.
static void init_host(real *host, const moe_model_tensor *tab, int n_tensors, int n_layers,
                      uint64_t seed, double std) {
    uint64_t s = seed;
    const double residual_std = std / sqrt(2.0 * n_layers);
    for (int i = 0; i < n_tensors; i++) {
        const moe_model_tensor *t = &tab[i];
        size_t n = (size_t)t->rows * (t->cols ? t->cols : 1);
        real *w = host + t->offset;
        for (size_t j = 0; j < n; j++)
            w[j] = t->is_norm   ? 1
                   : t->is_bias ? 0
                                : (real)((t->is_residual ? residual_std : std) * normal(&s));
    }
}

// Under expert parallelism a rank holds some experts of the whole model: it draws the whole
// model (the same numbers as one rank) and keeps its tensors, found by name in table order.
// Under an expert placement the gate rows are then put in slot order.
void moe_model_init_weights(moe_model *m, uint64_t seed, double std) {
    const size_t n_all = moe_model_param_count(&m->cfg);
    real *host = malloc(n_all * sizeof(real));
    const int subset = m->ep || m->placement; // m's table is not the whole one in its order
    moe_model_tensor *all = subset ? moe_model_tensor_table(&m->cfg) : m->tensors;
    if (!host || !all)
        moe_fatal("model: cannot allocate %zu bytes to initialise weights", n_all * sizeof(real));
    init_host(host, all, (int)moe_model_tensor_count(&m->cfg), m->cfg.n_layers, seed, std);
    if (subset) { // keep this rank's tensors: the table is a subsequence of the whole one
        real *mine = malloc(m->n_params * sizeof(real));
        if (!mine) moe_fatal("model: out of memory");
        for (int i = 0, j = 0; i < m->n_tensors; i++) {
            while (strcmp(all[j].name, m->tensors[i].name)) j++;
            const moe_model_tensor *t = &m->tensors[i];
            memcpy(mine + t->offset, host + all[j].offset,
                   (size_t)t->rows * (t->cols ? t->cols : 1) * sizeof(real));
        }
        free(host), free(all);
        host = mine;
        moe_model_placement_image(m, host, 0); // the gate rows in slot order
    }
    m->be->copy_to_device(m->be, m->params, host, m->n_params * sizeof(real));
    free(host);
}
