// The training loop (train/trainer.h): a trainer opened from a config (the world, the model,
// the data, where the run starts), its steps (micro-batches, gradient reduction, skipping
// non-finite steps, the update, validation, checkpoints) and closing it. The run directory is
// train/run_dir.c's, the token files train/run_data.c's, the header train/run_header.c's, and
// the records of each step train/step_log.c's.
#define _POSIX_C_SOURCE 200809L // SIGKILL (test_kill)

#include "train/trainer.h"

#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "data/files.h"
#include "layers/profile.h"
#include "layers/rng.h"
#include "layers/timing.h"
#include "train/capacity.h"
#include "ckpt/checkpoint.h"
#include "train/launch.h"
#include "train/run_data.h"
#include "train/run_dir.h"
#include "train/run_header.h"
#include "train/step_log.h"
#include "train/trainer_internal.h"

moe_model_config moe_trainer_model_config(const moe_train_config *cfg) {
    moe_model_config m = cfg->model;
    m.moe.d_model = m.d_model;          // not keys of their own: they follow from
    m.router_bias = cfg->bias_rate > 0; // model.d_model and model.bias_rate
    return m;
}

uint64_t moe_trainer_noise_key(uint64_t seed, int64_t step, int micro) {
    return moe_mix64(seed ^ moe_mix64((uint64_t)step << 20 | (uint64_t)micro));
}

// The selection bias of every layer moves toward balance, by the step's routed counts (in
// global expert order, so the bias is updated in it too).
static void update_router_bias(moe_model *m, const long *routed, double rate) {
    const int L = m->cfg.n_layers, E = m->cfg.moe.n_experts;
    real *b = malloc((size_t)L * E * sizeof(real));
    if (!b) moe_fatal("out of memory");
    m->be->copy_to_host(m->be, b, m->router_bias, (size_t)L * E * sizeof(real));
    moe_model_placement_permute(m, b, L, 1, 1);
    for (int l = 0; l < L; l++)
        moe_router_bias_update(b + (size_t)l * E, routed + (size_t)l * E, E, rate);
    moe_model_placement_permute(m, b, L, 1, 0);
    m->be->copy_to_device(m->be, m->router_bias, b, (size_t)L * E * sizeof(real));
    free(b);
}

void moe_trainer_result_free(moe_trainer_result *r) {
    free(r->routed), free(r->kept), free(r->last_stats);
    r->routed = r->kept = NULL;
    r->last_stats = NULL;
}

// Dropless validation loss (inference mode, as `moe eval`), the same windows every time.
static moe_status validate(moe_model *m, const moe_token_file *val, const moe_train_config *cfg,
                           int *inputs, int *targets, double *loss) {
    data_loader vl;
    moe_status st =
        data_loader_init(&vl, val, cfg->batch_size, cfg->seq_len, (uint64_t)cfg->seed + 1, 0, 1);
    if (st) return moe_error_context(st, "validation data");
    double sum = 0;
    for (int i = 0; i < cfg->eval_batches; i++) {
        data_loader_next(&vl, inputs, targets);
        st = moe_model_forward(m, inputs, targets, cfg->batch_size, cfg->seq_len, moe_pass_infer());
        if (st && st != MOE_ENUMERIC) {
            st = moe_error_context(st, "validation batch %d", i + 1);
            break;
        }
        sum += m->ce;
        st = MOE_OK;
    }
    data_loader_free(&vl);
    *loss = sum / cfg->eval_batches;
    return st;
}

// Whether the gradient's reals [a, b) of this rank, clipped to [lo, hi), hold a non-finite one.
static int nonfinite_in(const moe_model *m, size_t a, size_t b, size_t lo, size_t hi) {
    a = a > lo ? a : lo, b = b < hi ? b : hi;
    if (a >= b) return 0;
    double ss;
    m->be->sum_squares(m->be, &ss, m->grads + a, b - a);
    return !isfinite(ss);
}

// The first tensor (in HF order) whose reduced gradient has a non-finite element, into name:
// this rank's tensors (its experts only, under expert parallelism) and, with the sharded
// optimizer, only its pieces (the rest of the buffer holds no reduced sum); then the first
// rank (in rank order) that found one, named with it when there are several. Collective.
static void first_nonfinite_grad(const trainer *t, char *name, size_t size) {
    const moe_model *m = &t->m;
    char mine[160] = "";
    for (int i = 0; i < m->n_tensors && !mine[0]; i++) {
        const moe_model_tensor *x = &m->tensors[i];
        const size_t a = x->offset, b = a + (size_t)x->rows * (x->cols ? x->cols : 1);
        const int bad = t->sharded ? nonfinite_in(m, a, b, t->zero.lo, t->zero.hi) ||
                                         nonfinite_in(m, a, b, t->zero.elo, t->zero.ehi)
                                   : nonfinite_in(m, a, b, 0, b);
        if (bad) snprintf(mine, sizeof mine, "%s", x->name);
    }
    snprintf(name, size, "none (the loss itself)");
    if (t->R == 1) {
        if (mine[0]) snprintf(name, size, "%s", mine);
        return;
    }
    char *all = malloc((size_t)t->R * sizeof mine);
    if (!all) moe_fatal("trainer: out of memory");
    t->world->allgather(t->world, all, mine, sizeof mine);
    for (int r = 0; r < t->R; r++)
        if (all[(size_t)r * sizeof mine]) {
            snprintf(name, size, "%s (rank %d)", all + (size_t)r * sizeof mine, r);
            break;
        }
    free(all);
}

// Whether step (0-based) ends with a checkpoint: every checkpoint.interval steps and at the end.
static int checkpoint_due(const moe_train_config *cfg, const moe_trainer_hooks *hooks,
                          int64_t step) {
    if (hooks && hooks->no_checkpoint) return 0;
    return (cfg->ckpt_interval > 0 && (step + 1) % cfg->ckpt_interval == 0) ||
           step + 1 == cfg->steps;
}

static moe_status out_of_memory(void) { return moe_error(MOE_ENOMEM, "trainer: out of memory"); }

// parallel.transport = "nccl": the world becomes the backend's device communicator over the
// MPI one (which it then owns), so the groups split from it move rows and gradients on the
// device. Collective.
static moe_status trainer_open_transport(trainer *t) {
    if (t->cfg->transport != MOE_TRANSPORT_NCCL) return MOE_OK;
    if (!t->be->device_comm)
        return moe_error(MOE_EINVAL,
                         "parallel.transport = \"nccl\" needs a device with its own transport "
                         "(model.device = \"cuda\" in a build with MOE_NCCL); backend %s has none",
                         t->be->name);
    moe_comm *dev;
    moe_status st = t->be->device_comm(t->be, t->world, &dev);
    if (!st) t->world = dev;
    return st;
}

// The groups of expert parallelism: EP groups of parallel.ep_size consecutive ranks, and the
// expert-data-parallel groups of the ranks with the same place in theirs (same experts).
static moe_status trainer_open_groups(trainer *t) {
    const moe_train_config *cfg = t->cfg;
    const int R = t->R, E = cfg->model.moe.n_experts, ep = cfg->ep_size ? cfg->ep_size : R;
    if (R % ep || E % ep)
        return moe_error(MOE_EINVAL,
                         "parallel.ep_size = %d must divide the %d ranks and "
                         "model.n_experts = %d",
                         ep, R, E);
    // the overlap's chunks are groups of a rank's experts; no exchange, no effect
    const int C = cfg->model.moe.overlap_chunks;
    if (ep > 1 && C > E / ep)
        return moe_error(MOE_EINVAL,
                         "parallel.overlap_chunks = %d exceeds the %d experts each of the %d "
                         "ranks of an expert-parallel group holds",
                         C, E / ep, ep);
    if (R == 1) return MOE_OK;
    moe_status st = t->world->split(t->world, t->rank / ep, t->rank, &t->ep);
    if (!st) st = t->world->split(t->world, t->rank % ep, t->rank, &t->edp);
    return st;
}

// What rank 0 alone did (st: its status; the others pass MOE_OK) becomes every rank's outcome:
// the others fail with "rank 0 could not <what>" when it failed. One rank: st.
static moe_status rank0_status(const trainer *t, moe_status st, const char *what) {
    if (t->R == 1) return st;
    long code = st;
    t->world->broadcast(t->world, &code, sizeof code, 0);
    if (code && t->rank) return moe_error((moe_status)code, "rank 0 could not %s", what);
    return st;
}

// The token files; rank 0 prepares them from data.text when they are missing, the other ranks
// read them once it has (and fail when it did).
static moe_status trainer_open_data(trainer *t) {
    moe_status st = t->rank == 0 ? moe_run_data_open(t->cfg, &t->train, &t->val) : MOE_OK;
    if ((st = rank0_status(t, st, "open the data"))) return st;
    return t->rank ? moe_run_data_open(t->cfg, &t->train, &t->val) : MOE_OK;
}

// The backend, the data, the model at its initialisation, the optimizer and the loader.
static moe_status trainer_open_model(trainer *t) {
    const moe_train_config *cfg = t->cfg;
    const moe_backend_options bo = {.threads = cfg->threads,
                                    .procs_per_node = moe_launch_local_size(),
                                    .tf32 = cfg->tf32,
                                    .attention_cudnn = cfg->attention == MOE_ATTENTION_CUDNN};
    moe_status st = moe_backend_create(&t->be, cfg->device, &bo);
    if (st) return moe_trainer_key_error(st, "model.device", cfg->device);
    if ((st = trainer_open_transport(t))) return st;
    if ((st = trainer_open_groups(t))) return st;
    if ((st = trainer_open_data(t))) return st;
    const moe_model_config mc = moe_trainer_model_config(cfg);
    if ((st = moe_model_create_parallel(&t->m, t->be, &mc, cfg->batch_size, cfg->seq_len, t->ep)))
        return st;
    if (cfg->n_placement && (st = moe_model_set_expert_placement(&t->m, cfg->expert_placement)))
        return st; // (the config checked that it is a permutation)
    moe_model_init_weights(&t->m, (uint64_t)cfg->seed, cfg->init_std);
    // weight decay on matrices; RMSNorm weights and biases only with train.decay_norms
    t->regions = malloc((size_t)t->m.n_tensors * sizeof *t->regions);
    if (!t->regions) return out_of_memory();
    for (int i = 0; i < t->m.n_tensors; i++) {
        const moe_model_tensor *mt = &t->m.tensors[i];
        t->regions[i].offset = mt->offset;
        t->regions[i].count = (size_t)mt->rows * (mt->cols ? mt->cols : 1);
        t->regions[i].decay = !(mt->is_norm || mt->is_bias) || cfg->decay_norms;
    }
    optim_config oc = {
        .kind = cfg->optimizer,
        .beta1 = cfg->beta1,
        .beta2 = cfg->beta2,
        .eps = cfg->eps,
        .weight_decay = cfg->weight_decay,
    };
    t->sharded = cfg->shard_optimizer && t->R > 1;
    if (t->sharded && !(st = moe_zero_init(&t->zero, &t->m, t->world, t->edp)))
        st = moe_zero_optimizer_create(&t->zero, &t->opt, &t->m, &oc, t->regions, t->m.n_tensors);
    else if (!t->sharded)
        st = moe_optimizer_create(&t->opt, t->be, &oc, t->m.n_params, t->regions, t->m.n_tensors);
    if (st) return st;
    return data_loader_init(&t->loader, &t->train, cfg->batch_size, cfg->seq_len,
                            (uint64_t)cfg->seed, t->rank, t->R);
}

// Auto capacity continues where the checkpoint was: its factor and its window's needs.
static moe_status trainer_resume_capacity(trainer *t, const moe_capacity_state *c) {
    if (t->cap.plan.mode != MOE_CAPACITY_AUTO) return MOE_OK;
    if (!c->present) {
        printf("note: %s has no auto capacity state (its run did not use capacity_factor = "
               "\"auto\"): auto capacity starts at %.4g with an empty window\n",
               t->resume, t->cap.factor);
        return MOE_OK;
    }
    if (c->L != t->L || c->n >= t->cap.plan.window)
        return moe_error(MOE_EINVAL,
                         "%s: its auto capacity window (%lld steps of %d layers) does not fit "
                         "model.capacity_window = %lld with %d layers",
                         t->resume, (long long)c->n, c->L, (long long)t->cap.plan.window, t->L);
    t->cap.factor = c->factor, t->cap.n = c->n;
    memcpy(t->cap.need, c->need, (size_t)c->n * c->L * sizeof *c->need);
    return MOE_OK;
}

// A checkpoint's parameters, moments and state; a sharded optimizer takes its piece of the
// whole moments the folder holds (the folder is the same for every R, sharded or not).
static moe_status trainer_load_checkpoint(trainer *t, train_state *ts) {
    if (!t->sharded) return moe_checkpoint_load(t->resume, &t->m, &t->opt, ts);
    moe_optimizer full;
    moe_status st = moe_zero_whole_like(&t->opt, &t->m, &full);
    if (!st && !(st = moe_checkpoint_load(t->resume, &t->m, &full, ts)))
        moe_zero_take_shard(&t->zero, &t->opt, &full);
    moe_optimizer_destroy(&full);
    return st;
}

// Continues from a checkpoint of this run: parameters, optimizer, step, data order, skip
// counts; the logs keep the records up to its step.
static moe_status trainer_resume(trainer *t) {
    const moe_train_config *cfg = t->cfg;
    train_state ts;
    moe_status st;
    if ((st = trainer_load_checkpoint(t, &ts))) return st;
    st = trainer_resume_capacity(t, &ts.capacity);
    free(ts.capacity.need);
    if (st || (st = data_loader_set_state(&t->loader, &ts.loader))) return st;
    t->start_step = ts.step, t->res.skipped = ts.skipped,
    t->consecutive_skips = ts.consecutive_skips;
    t->res.steps_done = t->start_step;
    printf("resumed from %s at step %lld\n", t->resume, (long long)t->start_step);
    moe_run_dir_warn_schedule_change(cfg, t->resume, t->start_step);
    // the logs continue from the checkpoint: records of later steps are dropped
    if (t->rank) return MOE_OK; // rank 0 writes the logs
    if ((st = moe_jsonl_keep_until(cfg->run_dir, "metrics.jsonl", t->start_step))) return st;
    return moe_jsonl_keep_until(cfg->run_dir, "expert_load.jsonl", t->start_step);
}

// train.init_from: the weights of an HF folder (or a checkpoint); errors name the key.
static moe_status trainer_init_from(trainer *t) {
    char from[MOE_PATH_MAX + 64]; // a folder, or a `latest` file naming one
    moe_status st;
    if ((st = moe_checkpoint_resolve(from, sizeof from, t->cfg->init_from)) ||
        (st = moe_hf_config_check(from, &t->m.cfg)) || (st = moe_hf_load_weights(&t->m, from)))
        return moe_trainer_key_error(st, "train.init_from", t->cfg->init_from);
    printf("initialised from %s\n", from);
    return MOE_OK;
}

// Global-batch balancing is on (a pre-pass per step; nothing to balance without aux_coef).
static int global_aux(const trainer *t) {
    return t->cfg->model.aux_scope == MOE_AUX_GLOBAL && t->cfg->model.moe.aux_coef > 0;
}

// The buffers of the steps: a micro-batch's tokens, the step's load, the load alert's, and
// the result's sums over the run.
static moe_status trainer_alloc(trainer *t) {
    const int L = t->L, E = t->E;
    moe_step_load *sl = &t->sl;
    t->inputs = malloc(t->T * sizeof(int));
    t->targets = malloc(t->T * sizeof(int));
    sl->routed = malloc((size_t)L * E * sizeof(long));
    sl->kept = malloc((size_t)L * E * sizeof(long));
    sl->micro_routed = malloc((size_t)t->cfg->grad_accum * t->R * L * E * sizeof(long));
    sl->entropy = malloc((size_t)L * sizeof(double));
    sl->aux = malloc((size_t)L * sizeof(double));
    sl->seq_aux = malloc((size_t)L * sizeof(double));
    sl->z = malloc((size_t)L * sizeof(double));
    t->alerts = calloc((size_t)L, sizeof *t->alerts);
    if (global_aux(t)) {
        t->step_tokens = malloc((size_t)t->cfg->grad_accum * 2 * t->T * sizeof(int));
        t->aux_counts = malloc((size_t)L * E * sizeof(long));
        if (!t->step_tokens || !t->aux_counts) return out_of_memory();
    }
    if (!t->inputs || !t->targets || !sl->routed || !sl->kept || !sl->micro_routed ||
        !sl->entropy || !sl->aux || !sl->seq_aux || !sl->z || !t->alerts ||
        moe_alert_window_init(&t->aw, t->cfg->alert_window, L, E))
        return out_of_memory();
    return MOE_OK;
}

// The result's per-expert sums and memory figures (after the header, as they always were).
static moe_status trainer_alloc_result(trainer *t) {
    moe_trainer_result *r = &t->res;
    r->n_layers = t->L, r->n_experts = t->E;
    r->routed = calloc((size_t)t->L * t->E, sizeof(long));
    r->kept = calloc((size_t)t->L * t->E, sizeof(long));
    r->last_stats = calloc((size_t)t->L, sizeof(moe_stats));
    if (!r->routed || !r->kept || !r->last_stats) return out_of_memory();
    moe_model_memory(&t->m, &r->param_bytes, &r->grad_bytes, &r->activation_bytes);
    r->optimizer_bytes = t->opt.m ? 2 * t->opt.n * sizeof(real) : 0; // sharded: this rank's
    return MOE_OK;
}


// Everything up to the first step: model, optimizer, data, where the run starts (a
// checkpoint of this run, an HF folder, or the initialisation), the logs, the header.
static moe_status trainer_open(trainer *t, const moe_train_config *cfg, const char *resume,
                               const moe_trainer_hooks *hooks) {
    t->cfg = cfg, t->resume = resume, t->hooks = hooks;
    t->res.last_val_loss = NAN;
    moe_status st;
    if ((st = trainer_open_model(t))) return st;
    t->L = t->m.cfg.n_layers, t->E = t->m.cfg.moe.n_experts;
    if ((st = moe_capacity_ctl_init(&t->cap, &cfg->capacity, cfg->model.moe.capacity_factor, t->L)))
        return st;
    t->timer.be = t->be;
    if (cfg->timing) moe_model_set_timer(&t->m, &t->timer);
    if (cfg->coactivation) {
        if (!(t->coact = calloc((size_t)t->L * t->E * t->E, sizeof *t->coact)))
            return out_of_memory();
        for (int j = 0; j < t->m.n_moe; j++) t->m.moe[j].coactivation = 1;
    }
    snprintf(t->ckpt_root, sizeof t->ckpt_root, "%s/ckpt", cfg->run_dir);
    if (resume)
        st = trainer_resume(t);
    else if (cfg->init_from[0])
        st = trainer_init_from(t);
    if (st) return st;
    const char *log_dir = t->rank ? "/dev" : cfg->run_dir; // rank 0 writes the logs
    if ((st = moe_jsonl_open(&t->metrics, log_dir, t->rank ? "null" : "metrics.jsonl",
                             resume != NULL)) ||
        (st = moe_jsonl_open(&t->load_log, log_dir, t->rank ? "null" : "expert_load.jsonl",
                             resume != NULL)))
        return st;
    t->T = (size_t)cfg->batch_size * (size_t)cfg->seq_len;
    if ((st = trainer_alloc(t))) return st;
    moe_run_header_print(cfg, &t->m, t->be, &t->train, &t->val, t->R, t->world->name);
    if ((st = trainer_alloc_result(t))) return st;
    t->t_start = moe_clock_s();
    return MOE_OK;
}

// The forward and backward of every micro-batch; a non-finite forward, or one whose
// cross-entropy is no result (moe_model_ce_is_result: its perplexity overflows), stops the step
// with s->finite = 0 (not an error: the step is skipped).
// The step's per-layer counters of the MoE layers (exchange statistics, co-activations).
static void trainer_reset_layer_counters(trainer *t) {
    for (int j = 0; j < t->m.n_moe && (t->R > 1 || t->cfg->timing); j++)
        moe_layer_exchange_reset(&t->m.moe[j]);
    for (int j = 0; j < t->m.n_moe && t->coact; j++)
        memset(t->m.moe[j].coact, 0, (size_t)t->E * t->E * sizeof(long));
}

// Micro-batch `micro` of the step: its tokens (read now, or by the pre-pass) and its forward.
// Returns the forward's status; *bad: a non-finite loss or a CE beyond a result on any rank
// (all ranks agree: collective under expert parallelism).
static moe_status trainer_forward(trainer *t, step_result *s, int micro, int from_buffer,
                                  long bad[2]) {
    const moe_train_config *cfg = t->cfg;
    int *in = t->inputs, *tg = t->targets;
    if (t->step_tokens) in = t->step_tokens + (size_t)2 * micro * t->T, tg = in + t->T;
    if (!from_buffer) data_loader_next(&t->loader, in, tg);
    t->m.noise_key = moe_trainer_noise_key((uint64_t)cfg->seed, s->step, micro * t->R + t->rank);
    moe_status st = moe_model_forward(&t->m, in, tg, cfg->batch_size, cfg->seq_len,
                                      moe_pass_train(s->capacity_factor));
    if (st && st != MOE_ENUMERIC) // which step (and, from the model, which layer)
        st = moe_error_context(st, "step %lld, micro-batch %d", (long long)s->step + 1, micro + 1);
    bad[0] = st == MOE_ENUMERIC || (!st && !isfinite(t->m.ce + t->m.aux + t->m.z));
    bad[1] = !st && !moe_model_ce_is_result(t->m.ce);
    if (t->R > 1) t->world->allreduce_sum_long(t->world, bad, 2); // one rank's NaN: all
    return st;
}

// Global-batch balancing (DESIGN.md §3.6): the step's micro-batches forwarded once for their
// routed counts (the same tokens, jitter and capacity as the pass that follows, so the same
// routing), summed over them and over the world; the forwards and backwards that follow take
// L_aux's f from these counts. Its forwards' losses and counters are discarded.
static moe_status trainer_aux_prepass(trainer *t, step_result *s) {
    const int L = t->L, E = t->E;
    memset(t->aux_counts, 0, (size_t)L * E * sizeof(long));
    moe_status st = moe_model_set_aux_counts(&t->m, NULL, 0);
    for (int micro = 0; !st && micro < t->cfg->grad_accum; micro++) {
        long bad[2];
        st = trainer_forward(t, s, micro, 0, bad);
        if (bad[0] || bad[1]) return MOE_OK; // the pass below meets the same forward
        if (st) return st;
        for (int l = 0; l < L; l++)
            for (int e = 0; e < E && moe_model_layer_is_moe(&t->m.cfg, l); e++)
                t->aux_counts[(size_t)l * E + e] += t->m.moe_stats[l].routed[e];
    }
    if (t->R > 1) t->world->allreduce_sum_long(t->world, t->aux_counts, (size_t)L * E);
    trainer_reset_layer_counters(t);
    const long tokens = (long)t->cfg->grad_accum * t->R * t->T;
    return st ? st : moe_model_set_aux_counts(&t->m, t->aux_counts, tokens);
}

static moe_status trainer_micro_batches(trainer *t, step_result *s) {
    const moe_train_config *cfg = t->cfg;
    moe_status st;
    // R ranks x grad_accum micro-batches are one rank's R x grad_accum: rank r's micro-batch
    // g is micro-batch g R + r of that (its data block and its jitter noise)
    const int n_micro = cfg->grad_accum * t->R;
    s->finite = 1;
    if (global_aux(t) && (st = trainer_aux_prepass(t, s))) return st;
    for (int micro = 0; micro < cfg->grad_accum; micro++) {
        long bad[2];
        st = trainer_forward(t, s, micro, global_aux(t), bad);
        if (bad[0] || bad[1]) {
            s->finite = 0;
            s->ce_overflow = !bad[0];
            return MOE_OK;
        }
        if (st) return st;
        moe_step_load_add(&t->sl, &t->m);
        s->ce += t->m.ce / n_micro;
        s->aux += t->m.aux / n_micro;
        s->z += t->m.z / n_micro;
        if ((st = moe_model_backward(&t->m, 1.0 / n_micro))) return st;
    }
    return MOE_OK;
}

// Expert parallelism, after the micro-batches: gradients summed (dense over the world, experts
// over the ranks holding the same ones), the losses and the load statistics summed over the
// world, the micro-batch counts gathered in the single-rank order (g R + r).
static void trainer_reduce_step(trainer *t, step_result *s) {
    moe_comm *w = t->world;
    moe_step_load *sl = &t->sl;
    const int L = t->L, E = t->E, G = t->cfg->grad_accum, R = t->R;
    if (t->sharded)
        moe_zero_reduce_grads(&t->zero, &t->m); // this rank's pieces only
    else
        moe_model_reduce_grads(&t->m, w, t->edp);
    double loss[3] = {s->ce, s->aux, s->z};
    w->allreduce_sum_double(w, loss, 3);
    s->ce = loss[0], s->aux = loss[1], s->z = loss[2];
    w->allreduce_sum_long(w, sl->routed, (size_t)L * E);
    w->allreduce_sum_long(w, sl->kept, (size_t)L * E);
    double *sums[4] = {sl->entropy, sl->aux, sl->seq_aux, sl->z};
    for (int i = 0; i < 4; i++) w->allreduce_sum_double(w, sums[i], (size_t)L);
    const size_t block = (size_t)G * L * E; // [G][L][E] per rank -> [G R][L][E]
    long *all = malloc((size_t)R * block * sizeof(long));
    if (!all) moe_fatal("trainer: out of memory");
    w->allgather(w, all, sl->micro_routed, block * sizeof(long));
    for (int r = 0; r < R; r++)
        for (int g = 0; g < G; g++)
            memcpy(sl->micro_routed + ((size_t)g * R + r) * L * E,
                   all + (size_t)r * block + (size_t)g * L * E, (size_t)L * E * sizeof(long));
    free(all);
    sl->micro = G * R;
}

// Test-only: a NaN in the first element of this rank's last MoE layer's first local expert's
// w2 gradient, before the reduction: at the hooks' steps [nan_from, nan_to] (0-based), and
// with MOE_TEST_NAN="RANK:STEP" on that rank at that step (1-based; tests/train/zero.py).
static int test_nan_due(const trainer *t, int64_t step) {
    const moe_trainer_hooks *h = t->hooks;
    if (h && h->nan_from >= 0 && step >= h->nan_from && step <= h->nan_to) return 1;
    const char *spec = getenv("MOE_TEST_NAN");
    int rank;
    long long at;
    return spec && sscanf(spec, "%d:%lld", &rank, &at) == 2 && rank == t->rank && at == step + 1;
}

static void test_plant_nan(trainer *t) {
    real nan_value = NAN;
    const moe_model_config *mc = &t->m.cfg;
    const size_t per_layer = (size_t)t->m.E_local * mc->d_model * mc->moe.d_ff;
    t->be->copy_to_device(t->be, t->m.g.w2 + (size_t)(moe_model_n_moe_layers(mc) - 1) * per_layer,
                          &nan_value, sizeof nan_value);
}

// The gradients of one step and their norm (the update is trainer_update's).
static moe_status trainer_step(trainer *t, step_result *s) {
    const moe_train_config *cfg = t->cfg;
    const moe_trainer_hooks *h = t->hooks;
    s->lr = moe_lr_at_step(cfg->schedule, cfg->lr, cfg->min_lr, cfg->warmup_steps,
                           h && h->schedule_steps ? h->schedule_steps : cfg->steps, s->step);
    s->capacity_factor = moe_capacity_ctl_factor(&t->cap, cfg->model.moe.capacity_factor, s->step);
    moe_model_zero_grads(&t->m);
    moe_step_load_reset(&t->sl, t->L, t->E);
    trainer_reset_layer_counters(t);
    memset(t->timer.s, 0, sizeof t->timer.s);
    moe_status st = trainer_micro_batches(t, s);
    if (global_aux(t)) moe_model_set_aux_counts(&t->m, NULL, 0); // (validation: its own)
    if (st) return st;
    if (test_nan_due(t, s->step)) test_plant_nan(t);
    if (t->R > 1) trainer_reduce_step(t, s);
    const double ss = t->sharded ? moe_zero_grad_sum_squares(&t->zero, &t->m)
                                 : moe_model_grad_sum_squares(&t->m); // each expert once
    s->grad_norm = sqrt(ss), s->loss = s->ce + s->aux + s->z;
    return MOE_OK;
}

static int step_is_finite(const step_result *s) {
    return s->finite && isfinite(s->loss) && isfinite(s->grad_norm);
}

// A step with a non-finite loss or gradient norm: no update, a warning and a metrics record;
// MOE_ENUMERIC after train.max_skipped of them in a row.
static moe_status trainer_skip(trainer *t, const step_result *s) {
    const moe_train_config *cfg = t->cfg;
    moe_trainer_result *r = &t->res;
    r->skipped++;
    t->consecutive_skips++;
    char first[200] = "not computed (forward failed)";
    if (s->finite) first_nonfinite_grad(t, first, sizeof first); // collective: every rank skips
    fprintf(stderr,
            "warning: step %lld: %s; first non-finite gradient: %s; update "
            "skipped (%lld consecutive, %lld in all)\n",
            (long long)s->step + 1,
            s->ce_overflow ? "cross-entropy beyond 709.78 nats/token (its perplexity overflows: "
                             "damaged weights?)"
            : !s->finite || !isfinite(s->loss) ? "non-finite loss"
                                               : "non-finite gradient norm",
            first, (long long)t->consecutive_skips, (long long)r->skipped);
    cJSON *rec = cJSON_CreateObject();
    cJSON_AddNumberToObject(rec, "step", (double)s->step + 1);
    cJSON_AddNumberToObject(rec, "loss", s->finite ? s->loss : NAN);
    cJSON_AddNumberToObject(rec, "grad_norm", s->grad_norm);
    cJSON_AddBoolToObject(rec, "skipped", 1);
    cJSON_AddNumberToObject(rec, "skipped_total", (double)r->skipped);
    moe_status st = moe_jsonl_write(&t->metrics, rec);
    if (st) return st;
    if (t->consecutive_skips >= cfg->max_skipped)
        return moe_error(MOE_ENUMERIC,
                         "stopping at step %lld: %lld consecutive steps had a non-finite "
                         "(or overflowing) loss or gradient norm (train.max_skipped = %d)",
                         (long long)s->step + 1, (long long)t->consecutive_skips, cfg->max_skipped);
    // no checkpoint of a skipped step: with `keep`, saving the states of a diverging
    // run would rotate out the last good one, and a resume would diverge again
    if (checkpoint_due(cfg, t->hooks, s->step))
        fprintf(stderr, "warning: step %lld: no checkpoint (its update was skipped)\n",
                (long long)s->step + 1);
    return MOE_OK;
}

// The update of a finite step: clip, optimizer, router bias; the step's time.
static void trainer_update(trainer *t, step_result *s, double t0) {
    t->consecutive_skips = 0;
    const double o0 = moe_clock_s();
    moe_bf16 *params16 = moe_model_bf16_for_update(&t->m);
    moe_optimizer_step(&t->opt, t->m.params, params16, t->m.grads, s->lr,
                       moe_clip_scale(s->grad_norm, t->cfg->grad_clip));
    if (t->sharded) moe_zero_gather_params(&t->zero, &t->m, params16);
    if (t->m.router_bias) update_router_bias(&t->m, t->sl.routed, t->cfg->bias_rate);
    if (t->be->synchronize) t->be->synchronize(t->be);
    s->optimizer_s = moe_clock_s() - o0;
    s->dt = moe_clock_s() - t0;
    if (t->res.steps_done == 0) t->res.first_loss = s->loss;
    t->res.last_loss = s->loss;
    t->res.steps_done = s->step + 1;
}

// Co-activations of a finite step: each layer's counts of its micro-batches go to the sums
// logged every log.interval steps.
static void trainer_coactivation(trainer *t) {
    if (!t->coact) return;
    const int E = t->E;
    const size_t EE = (size_t)E * E;
    for (int l = 0; l < t->L; l++) { // slots (i, j), i < j, to global experts (gi, gj), gi < gj
        const int ml = moe_model_moe_index(&t->m.cfg, l); // (a dense layer: none)
        for (int i = 0; i < E && ml >= 0; i++)
            for (int j = i + 1; j < E; j++) {
                int gi = moe_model_expert_global(&t->m, i), gj = moe_model_expert_global(&t->m, j);
                if (gi > gj) {
                    const int x = gi;
                    gi = gj, gj = x;
                }
                t->coact[l * EE + (size_t)gi * E + gj] += t->m.moe[ml].coact[(size_t)i * E + j];
            }
    }
    t->coact_steps++;
}

// Auto capacity, after a finite step: each layer's need from its micro-batches' counts
// (every rank has the same gathered counts); at a window's end the factor of the next steps.
static void trainer_capacity(trainer *t, step_result *s) {
    if (t->cap.plan.mode != MOE_CAPACITY_AUTO) return;
    const int L = t->L, E = t->E, G = t->sl.micro;
    double *need = malloc((size_t)L * sizeof *need);
    long *counts = malloc((size_t)G * E * sizeof *counts);
    if (!need || !counts) moe_fatal("trainer: out of memory");
    for (int l = 0; l < L; l++) {
        need[l] = 0; // a dense layer needs no capacity
        if (!moe_model_layer_is_moe(&t->m.cfg, l)) continue;
        for (int g = 0; g < G; g++)
            memcpy(counts + (size_t)g * E, t->sl.micro_routed + ((size_t)g * L + l) * E,
                   (size_t)E * sizeof *counts);
        need[l] = moe_capacity_needed_factor(counts, G, E, (long)t->T, t->cfg->model.moe.top_k,
                                             t->cap.plan.max_drop);
    }
    s->capacity_decided = moe_capacity_ctl_observe(&t->cap, need, s->step, &s->capacity);
    // the same inputs give the same decision on every rank; rank 0's is the one kept anyway
    if (s->capacity_decided && t->R > 1)
        t->world->broadcast(t->world, &t->cap.factor, sizeof t->cap.factor, 0);
    if (s->capacity_decided && t->rank == 0 && s->capacity.new_factor != s->capacity.old_factor)
        printf("capacity: step %lld: capacity_factor %.4g -> %.4g (%s)\n", (long long)s->step + 1,
               s->capacity.old_factor, t->cap.factor, s->capacity.why);
    free(need), free(counts);
}

// Validation every train.eval_interval steps and at the last one.
static moe_status trainer_validate(trainer *t, step_result *s) {
    const moe_train_config *cfg = t->cfg;
    s->evaluated = 0, s->val_loss = NAN;
    if (!((cfg->eval_interval > 0 && (s->step + 1) % cfg->eval_interval == 0) ||
          s->step + 1 == cfg->steps))
        return MOE_OK;
    const double v0 = moe_clock_s();
    moe_model_set_timer(&t->m, NULL); // its forwards are not the step's phases
    moe_status st = validate(&t->m, &t->val, cfg, t->inputs, t->targets, &s->val_loss);
    if (cfg->timing) moe_model_set_timer(&t->m, &t->timer);
    if (st) return st;
    s->val_s = moe_clock_s() - v0;
    t->res.last_val_loss = s->val_loss;
    s->evaluated = 1;
    return MOE_OK;
}

// A checkpoint every checkpoint.interval steps and at the end. Under expert parallelism the
// save is collective: the ranks of the first EP group write their experts' shards, rank 0 the
// rest (ckpt/checkpoint.h); every rank returns the same status.
static moe_status trainer_checkpoint(trainer *t, int64_t step) {
    if (!checkpoint_due(t->cfg, t->hooks, step)) return MOE_OK;
    train_state ts = {.step = step + 1,
                      .skipped = t->res.skipped,
                      .consecutive_skips = t->consecutive_skips,
                      .world_size = t->R,
                      .ep_size = t->m.ep ? t->m.ep->size : 1,
                      .capacity = {.present = t->cap.plan.mode == MOE_CAPACITY_AUTO,
                                   .factor = t->cap.factor,
                                   .n = t->cap.n,
                                   .L = t->L,
                                   .need = t->cap.need}};
    data_loader_get_state(&ts.loader, &t->loader);
    const char *shard_env = getenv("MOE_TEST_SHARD_BYTES"); // test-only
    uint64_t shard = shard_env ? strtoull(shard_env, NULL, 10) : CKPT_SHARD_BYTES;
    const double c0 = moe_clock_s();
    moe_optimizer full; // sharded: the whole moments, gathered for the save (then freed)
    moe_status st = t->sharded ? moe_zero_gather_moments(&t->zero, &t->opt, &t->m, &full) : MOE_OK;
    if (!st)
        st = moe_checkpoint_save(t->ckpt_root, &t->m, t->sharded ? &full : &t->opt, &ts, t->cfg,
                                 t->cfg->ckpt_keep, shard, t->R > 1 ? t->world : NULL);
    if (t->sharded) moe_optimizer_destroy(&full);
    t->ckpt_s = moe_clock_s() - c0;
    if (st) return st;
    printf("checkpoint: %s/step_%08lld\n", t->ckpt_root, (long long)step + 1);
    return MOE_OK;
}

// Test-only (tests/train/ep_parity.py): MOE_TEST_KILL="RANK:STEP" kills that rank with
// SIGKILL at the start of that step (1-based), as a crashed machine would.
static void test_kill(const trainer *t, int64_t step) {
    const char *spec = getenv("MOE_TEST_KILL");
    int rank;
    long long at;
    if (spec && sscanf(spec, "%d:%lld", &rank, &at) == 2 && rank == t->rank && at == step + 1)
        raise(SIGKILL);
}

// One step, from the gradients to its logs, alerts and checkpoint.
static moe_status trainer_run_step(trainer *t, int64_t step) {
    test_kill(t, step);
    moe_profile_step_begin(step + 1);
    const double t0 = moe_clock_s();
    step_result s = {.step = step};
    moe_status st = trainer_step(t, &s);
    if (st) return st;
    if (!step_is_finite(&s)) return trainer_skip(t, &s);
    trainer_update(t, &s, t0);
    moe_profile_step_end(step + 1, step + 1 == t->cfg->steps); // (before the validation)
    trainer_capacity(t, &s);
    trainer_coactivation(t);
    if ((st = moe_trainer_log_load(t, &s)) || (st = trainer_validate(t, &s)) ||
        (st = moe_trainer_log_metrics(t, &s)) || (st = moe_trainer_alerts(t, step)))
        return st;
    moe_trainer_print_step(t, &s);
    return trainer_checkpoint(t, step);
}

// The result's timing and the closing line.
static void trainer_finish(trainer *t) {
    moe_trainer_result *r = &t->res;
    r->seconds = moe_clock_s() - t->t_start;
    r->median_tokens_per_s =
        t->n_tps
            ? moe_step_log_median(t->step_tps, t->n_tps < TPS_WINDOW ? (int)t->n_tps : TPS_WINDOW)
            : NAN;
    char val_part[64] = "no validation at the end"; // a skipped last step, or stopped early
    if (isfinite(r->last_val_loss))
        snprintf(val_part, sizeof val_part, "val loss %.4f", r->last_val_loss);
    struct rusage ru; // the dry run's "peak memory per rank, predicted" against this
    getrusage(RUSAGE_SELF, &ru);
    printf("done: %lld steps in %.1f s, final loss %.4f, %s, %lld skipped, peak RSS %.1f MiB\n",
           (long long)r->steps_done, r->seconds, r->last_loss, val_part, (long long)r->skipped,
           ru.ru_maxrss / 1024.0);
}

// Frees what trainer_open got to and hands the result over; st is the run's status, or the
// logs' when they fail to close (a failed close loses the last records).
static moe_status trainer_close(trainer *t, moe_status st, moe_trainer_result *result) {
    if (result)
        *result = t->res;
    else
        moe_trainer_result_free(&t->res);
    for (int i = 0; i < 2; i++) {
        moe_jsonl_file *j = i ? &t->load_log : &t->metrics;
        if (st && j->f)
            fclose(j->f);
        else if (!st)
            st = moe_jsonl_close(j);
    }
    moe_step_load *sl = &t->sl;
    free(t->inputs), free(t->targets), free(t->regions);
    free(t->step_tokens), free(t->aux_counts);
    free(sl->routed), free(sl->kept), free(sl->micro_routed), free(sl->entropy), free(sl->aux),
        free(sl->seq_aux), free(sl->z);
    free(t->alerts);
    moe_alert_window_free(&t->aw);
    moe_capacity_ctl_free(&t->cap);
    free(t->coact);
    data_loader_free(&t->loader);
    moe_optimizer_destroy(&t->opt);
    moe_zero_free(&t->zero);
    moe_model_destroy(&t->m);
    if (t->ep) t->ep->destroy(t->ep);
    if (t->edp) t->edp->destroy(t->edp);
    // a failed run keeps the world: the caller's moe_fatal ends every rank (MPI_Abort)
    if (t->world && (!st || t->R == 1)) t->world->destroy(t->world);
    moe_backend_destroy(t->be); // after the communicators (an NCCL one uses its device)
    moe_token_file_free(&t->train);
    moe_token_file_free(&t->val);
    return st;
}

// Every rank must train the same run: the resolved configs are hashed and compared
// (train/launch.h; `moe train` compared the rest of its intent before); a rank whose config
// differs from rank 0's is named.
static moe_status trainer_same_config(trainer *t, const moe_train_config *cfg) {
    moe_launch_intent me = {.command = "train", .config_hash = moe_launch_config_hash(cfg)};
    me.resume_step = -1;
    return moe_launch_agree(t->world, &me);
}

// The world of the run (mpirun's ranks, else one), then the run directory and its config.cfg
// from rank 0, which the others wait for (they see rank 0's status). The other ranks print
// nothing (their stdout is /dev/null); their errors still go to stderr, prefixed by the rank.
static moe_status trainer_open_run_dir(trainer *t, const moe_train_config *cfg) {
    moe_status st = moe_comm_world(&t->world);
    if (st) return st;
    t->rank = t->world->rank, t->R = t->world->size;
    if (t->rank && !freopen("/dev/null", "w", stdout))
        return moe_error(MOE_EIO, "rank %d: cannot silence stdout", t->rank);
    if (t->R > 1 && (st = trainer_same_config(t, cfg))) return st;
    if (t->rank == 0) st = moe_file_make_dirs(cfg->run_dir);
    if (t->rank == 0 && !st) st = moe_run_dir_write_config(cfg);
    return rank0_status(t, st, "create the run directory (log.dir)");
}

moe_status moe_trainer_run(const moe_train_config *cfg, const char *resume,
                           const moe_trainer_hooks *hooks, moe_trainer_result *result) {
    moe_trainer_result empty = {0};
    empty.last_val_loss = NAN;
    if (result) *result = empty; // the early returns below leave an empty, freeable result
    moe_status st;
    if (resume) { // a finished run: nothing to do (and nothing written)
        int64_t finished;
        if ((st = moe_run_dir_resume_finished(resume, cfg->steps, &finished))) return st;
        if (finished) {
            printf("run already finished at step %lld (train.steps = %lld): nothing to do; raise "
                   "train.steps to continue\n",
                   (long long)finished, (long long)cfg->steps);
            if (result) result->steps_done = finished;
            return MOE_OK;
        }
    }
    trainer *t = calloc(1, sizeof *t);
    if (!t) return out_of_memory();
    if ((st = trainer_open_run_dir(t, cfg))) {
        // one rank: nothing to keep; several: the caller's moe_fatal ends them all (MPI_Abort)
        if (t->world && t->R == 1) t->world->destroy(t->world);
        free(t);
        return st;
    }
    st = trainer_open(t, cfg, resume, hooks);
    for (int64_t step = t->start_step; !st && step < cfg->steps; step++) {
        if (hooks && hooks->stop_after > 0 && step - t->start_step >= hooks->stop_after) break;
        st = trainer_run_step(t, step);
    }
    if (!st) trainer_finish(t);
    st = trainer_close(t, st, result);
    free(t);
    return st;
}
