// moe_checkpoint_load: a verified checkpoint into a model (config.json checked against it), and
// its optimizer's moments and update count.
#define _GNU_SOURCE // access

#include "ckpt/ckpt_internal.h"

#include "ckpt/path_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

// One AdamW moment of m's tensors into host: from its shards (PREFIX-0000F-of-0000N, beside
// the model's), or from the single PREFIX.safetensors of checkpoints before expert-parallel
// saves.
static moe_status load_moments(real *host, const moe_model *m, const char *folder,
                               const char *prefix) {
    char single[96], path[PATH_BUF];
    snprintf(single, sizeof single, "%s.safetensors", prefix);
    path_fmt(path, sizeof path, "%s/%s", folder, single);
    if (access(path, F_OK) == 0)
        return ckpt_load_tensors(host, m->tensors, m->n_tensors, folder, single, NULL);
    return ckpt_load_tensors(host, m->tensors, m->n_tensors, folder, NULL, prefix);
}

// moe_checkpoint_load after ckpt_verify: weights, moments, optimizer count.
static moe_status load_verified(const char *folder, moe_checkpoint_state *cs, moe_model *m,
                                moe_optimizer *opt) {
    real *host = NULL;
    moe_status st;
    if (opt && opt->cfg.kind != cs->optimizer)
        return moe_error(
            MOE_EINVAL,
            "%s/trainer_state.json: the checkpoint was trained with %s, "
            "the config says train.optimizer = \"%s\" (switching optimizers on resume "
            "is not supported: use train.init_from to start a new run from the weights)",
            folder, cs->optimizer == OPTIM_SGD ? "sgd" : "adamw",
            opt->cfg.kind == OPTIM_SGD ? "sgd" : "adamw");
    if ((st = moe_hf_config_check(folder, &m->cfg))) return st;
    if ((st = ckpt_load_weights(m, folder))) return st;
    if (opt && opt->m) {
        if (!(host = malloc(m->n_params * sizeof(real))))
            return moe_error(MOE_ENOMEM, "checkpoint: out of memory");
        for (int i = 0; i < 2 && !st; i++)
            if (!(st = load_moments(host, m, folder, i ? MOMENTS_SQ : MOMENTS))) {
                moe_model_placement_image(m, host, 0);
                m->be->copy_to_device(m->be, i ? opt->v : opt->m, host, m->n_params * sizeof(real));
            }
        free(host);
        if (st) return st;
    }
    if (opt) opt->t = cs->optimizer_t;
    return MOE_OK;
}

moe_status moe_checkpoint_model_config(const char *path, moe_model_config *out) {
    char folder[PATH_BUF];
    moe_status st = moe_checkpoint_resolve(folder, sizeof folder, path);
    return st ? st : moe_hf_config_read(out, folder);
}

moe_status moe_checkpoint_load(const char *path, moe_model *m, moe_optimizer *opt,
                               train_state *ts) {
    char folder[PATH_BUF];
    moe_status st = moe_checkpoint_resolve(folder, sizeof folder, path);
    if (st) return st;
    moe_checkpoint_state cs;
    if ((st = ckpt_verify(&cs, folder))) return st;
    st = load_verified(folder, &cs, m, opt);
    if (!st && ts)
        *ts = cs.ts; // the capacity needs go with it
    else
        ckpt_capacity_state_free(&cs.ts.capacity);
    return st;
}
