// The training config: a libconfig file (+ `--set group.key=value` overrides) -> a
// validated moe_train_config (the entry points: the defaults and the load). See config.h for
// the keys; the schema (schema.c) is the one place that lists them (reading, validation and
// writing are all driven by it). config_internal.h says which file does what.
//
// libconfig 1.5 pitfalls handled here (DESIGN.md §7):
// - an integer literal above 2^31-1 without an `L` suffix is silently wrapped to 32 bits
//   (`3000000000` reads as -1294967296), and one above 2^63-1 is wrapped or saturated. So
//   every integer setting is re-read from its literal text in the source (literal.c) and that
//   exact value is used; a literal beyond 64 bits is rejected as an overflow.
// - a typo'd key is just another setting: the parsed tree is walked and every group and
//   key the schema does not know is rejected, with the closest known name suggested (read.c).
// - `lr = 1;` is an integer: integers are accepted wherever a number is expected.
// - it opens @include files itself with fopen, without limits (no include hook before
//   1.7), and drops a "\x00" escape without a word. So every text is scanned before
//   libconfig parses it (scan.c): each @include is resolved as libconfig will, read
//   within the limits of config.h and scanned in turn; a "\x00" in a string is refused.
#include "config/config.h"

#include <stdlib.h>
#include <string.h>

#include "layers/moe.h" // moe_config_default
#include "config/config_internal.h"

void moe_train_config_default(moe_train_config *cfg) {
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg); // also the padding and the string tails: memcmp-able
    moe_model_config *m = &cfg->model;
    m->vocab_size = 256;
    m->d_model = 128;
    m->n_layers = 4;
    m->n_heads = 4;
    m->n_kv_heads = 4; // = n_heads
    m->max_seq_len = 256;
    m->rope_theta = 1e6;
    m->rms_norm_eps = 1e-5;
    m->tie_embeddings = 0;
    m->head_dim = 0; // d_model / n_heads
    m->family = MOE_FAMILY_MIXTRAL;
    m->sparse_step = 1; // every layer MoE (first_k_dense 0, no shared expert, q/k norm or biases)
    // the MoE layer's own defaults (layers/moe.h: Mixtral routing, dropless, aux 0.01, z 0.001),
    // field by field: a struct copy may bring indeterminate padding bytes into the memset one
    const moe_config d = moe_config_default(m->d_model, 256, 8, 2);
    moe_config *e = &m->moe;
    e->d_model = d.d_model, e->d_ff = d.d_ff, e->n_experts = d.n_experts, e->top_k = d.top_k;
    e->norm_topk_prob = d.norm_topk_prob, e->capacity_factor = d.capacity_factor;
    e->drop_policy = d.drop_policy, e->aux_coef = d.aux_coef, e->z_coef = d.z_coef;
    e->scoring = d.scoring, e->route_scale = d.route_scale, e->seq_aux_coef = d.seq_aux_coef;
    e->jitter_eps = d.jitter_eps;
    e->n_group = d.n_group, e->topk_group = d.topk_group; // 1, 1: no group-limited routing
    e->dtype = d.dtype;                   // fp32 (the model's dtype decides: moe_model_create)
    m->dtype = MOE_DTYPE_F32;             // train.dtype
    e->exchange = d.exchange;             // dedup
    e->overlap_chunks = d.overlap_chunks; // 1: one exchange, no overlap
    cfg->capacity = (moe_capacity_plan){.mode = MOE_CAPACITY_FIXED,
                                        .max_drop = 0.01,
                                        .window = 100,
                                        .min = 1.0,
                                        .max = 2.0,
                                        .max_change = 1.25};
    cfg->bias_rate = 0.0;
    cfg->init_std = 0.02;
    snprintf(cfg->device, sizeof cfg->device, "cpu");
    cfg->tf32 = 0;

    cfg->seed = 1;
    cfg->steps = 1000;
    cfg->batch_size = 8;
    cfg->seq_len = 128;
    cfg->grad_accum = 1;
    cfg->optimizer = OPTIM_ADAMW;
    cfg->lr = 3e-4;
    cfg->min_lr = 3e-5;
    cfg->warmup_steps = 100;
    cfg->schedule = MOE_SCHEDULE_COSINE;
    cfg->beta1 = 0.9;
    cfg->beta2 = 0.95;
    cfg->eps = 1e-8;
    cfg->weight_decay = 0.1;
    cfg->decay_norms = 0;
    cfg->grad_clip = 1.0;
    cfg->max_skipped = 10;
    cfg->threads = 0;
    cfg->eval_interval = 100;
    cfg->eval_batches = 8;
    cfg->load_alert_action = MOE_ALERT_WARN;

    strcpy(cfg->dir, "data/cache/default");
    cfg->n_text = 0;
    cfg->val_fraction = 0.1;

    strcpy(cfg->run_dir, "runs/default");
    cfg->interval = 10;
    cfg->load_alert = 2.0; // the load alert's defaults, measured: config.h
    cfg->alert_after = 150;
    cfg->alert_window = 50;
    cfg->timing = 1;
    cfg->coactivation = 1;

    cfg->ckpt_interval = 0;
    cfg->ckpt_keep = 2;
    cfg->ep_size = 0;     // all the ranks of the run
    cfg->n_placement = 0; // the default placement
}

moe_status moe_train_config_load(moe_train_config *cfg, const char *path, int n_set,
                                 char *const *sets) {
    if (!cfg) return moe_error(MOE_EINVAL, "moe_train_config_load: cfg is NULL");
    if (n_set < 0 || (n_set > 0 && !sets))
        return moe_error(MOE_EINVAL, "moe_train_config_load: bad overrides (n_set = %d)", n_set);
    if (path && strlen(path) >= MOE_PATH_MAX)
        return moe_error(MOE_EINVAL, "%.64s...: path too long (at most %d bytes)", path,
                         MOE_PATH_MAX - 1);

    load_ctx *c = calloc(1, sizeof *c);
    moe_train_config *tmp = malloc(sizeof *tmp);
    override_origin *origins = n_set > 0 ? calloc((size_t)n_set, sizeof *origins) : NULL;
    if (!c || !tmp || (n_set > 0 && !origins)) {
        free(c);
        free(tmp);
        free(origins);
        return moe_error(MOE_ENOMEM, "moe_train_config_load: out of memory");
    }
    c->path = path;
    c->overrides = origins;
    config_init(&c->lc);
    moe_train_config_default(tmp);
    moe_status st = MOE_OK;

    if (path) {
        if ((st = moe_cfg_read_file(path, &c->main_text))) goto done;
        // @include "x" is relative to the config's folder.
        const char *slash = strrchr(path, '/');
        if (slash) {
            size_t n = slash == path ? 1 : (size_t)(slash - path);
            memcpy(c->include_dir, path, n);
            c->include_dir[n] = '\0';
            config_set_include_dir(&c->lc, c->include_dir);
        }
        // every @include checked and read before libconfig opens it; no "\x00" in strings
        if ((st = moe_cfg_scan_source(c, path, NULL, c->main_text))) goto done;
        if (!config_read_string(&c->lc, c->main_text)) {
            char file[MOE_PATH_MAX + 64];
            moe_cfg_resolve_file(c, config_error_file(&c->lc), file, sizeof file);
            st = moe_error(MOE_EINVAL, "%s:%d: syntax error: %s", file, config_error_line(&c->lc),
                           config_error_text(&c->lc) ? config_error_text(&c->lc) : "?");
            goto done;
        }
        memcpy(tmp->source, path, strlen(path) + 1);
    }
    for (int i = 0; i < n_set; i++) {
        if (!sets[i]) {
            st = moe_error(MOE_EINVAL, "--set #%d is NULL", i + 1);
            goto done;
        }
        if ((st = moe_cfg_apply_set(c, sets[i], &origins[i]))) goto done;
    }
    if ((st = moe_cfg_read_tree(c, tmp))) goto done;
    if ((st = moe_cfg_merge_init_from(c, tmp))) goto done;
    if ((st = moe_cfg_check_combinations(c, tmp))) goto done;
    if ((st = moe_cfg_check_placement(c, tmp))) goto done;
    memcpy(cfg, tmp, sizeof *cfg);

done:
    config_destroy(&c->lc);
    for (int i = 0; i < c->n_files; i++) {
        free(c->files[i].path);
        free(c->files[i].text);
    }
    free(c->files);
    for (int i = 0; i < n_set; i++) free(origins[i].text);
    free(origins);
    free(c->main_text);
    free(c);
    free(tmp);
    return st;
}
