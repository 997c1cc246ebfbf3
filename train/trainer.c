// The training loop (see trainer.h).
#define _POSIX_C_SOURCE 200809L // lstat, dirent

#include "train/trainer.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/loader.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "optim/optimizer.h"
#include "train/checkpoint.h"
#include "train/log.h"

model_config trainer_model_config(const moe_train_config *cfg) {
    model_config m = {
        .vocab_size = cfg->vocab_size,
        .d_model = cfg->d_model,
        .n_layers = cfg->n_layers,
        .n_heads = cfg->n_heads,
        .n_kv_heads = cfg->n_kv_heads,
        .max_seq_len = cfg->max_seq_len,
        .tie_embeddings = cfg->tie_embeddings,
        .rope_theta = cfg->rope_theta,
        .rms_norm_eps = cfg->rms_norm_eps,
    };
    m.moe = moe_config_default(cfg->d_model, cfg->d_ff, cfg->n_experts, cfg->top_k);
    m.moe.norm_topk_prob = cfg->norm_topk_prob;
    m.moe.capacity_factor = cfg->capacity_factor;
    m.moe.drop_policy = cfg->drop_policy == 1 ? MOE_DROP_POSITION : MOE_DROP_PROBS;
    m.moe.aux_coef = cfg->aux_coef;
    m.moe.z_coef = cfg->z_coef;
    m.moe.scoring = cfg->scoring == 1 ? MOE_SCORE_SIGMOID : MOE_SCORE_SOFTMAX;
    m.moe.route_scale = cfg->route_scale;
    m.moe.seq_aux_coef = cfg->seq_aux_coef;
    m.moe.jitter_eps = cfg->router_jitter;
    m.router_bias = cfg->bias_rate > 0;
    return m;
}

static uint64_t mix64(uint64_t z) { // splitmix64's finaliser
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The selection bias of every layer moves toward balance, by the step's routed counts.
static void update_router_bias(model *m, const long *routed, double rate) {
    const int L = m->cfg.n_layers, E = m->cfg.moe.n_experts;
    real *b = malloc((size_t)L * E * sizeof(real));
    if (!b) moe_fatal("out of memory");
    m->be->copy_to_host(b, m->router_bias, (size_t)L * E * sizeof(real));
    for (int l = 0; l < L; l++) moe_router_bias_update(b + (size_t)l * E, routed + (size_t)l * E, E, rate);
    m->be->copy_to_device(m->router_bias, b, (size_t)L * E * sizeof(real));
    free(b);
}

#define TPS_WINDOW 1024 // steps in the median tokens/s (trainer.h)

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(double *v, int n) { // sorts v
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void trainer_result_free(trainer_result *r) {
    free(r->routed), free(r->kept), free(r->last_stats);
    r->routed = r->kept = NULL;
    r->last_stats = NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

// ---- run directories (trainer.h) -------------------------------------------------------

static int nonempty_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && st.st_size > 0;
}

// A folder with an entry; one that exists but cannot be read counts (it may hold a run).
static int nonempty_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return errno != ENOENT && errno != ENOTDIR;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d))) found = strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return found;
}

int trainer_run_dir_holds(const char *run_dir, char *what, size_t n) {
    static const char *names[] = {"metrics.jsonl", "expert_load.jsonl", "ckpt/"};
    char path[MOE_PATH_MAX + 32];
    int found = 0;
    if (n) what[0] = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", run_dir, names[i]);
        if (i < 2 ? nonempty_file(path) : nonempty_dir(path)) {
            size_t len = strlen(what);
            if (len < n) snprintf(what + len, n - len, "%s%s", found ? ", " : "", names[i]);
            found = 1;
        }
    }
    return found;
}

static moe_status delete_file(const char *path) {
    if (unlink(path) != 0 && errno != ENOENT)
        return moe_error(MOE_EIO, "%s: cannot delete: %s", path, strerror(errno));
    return MOE_OK;
}

// A checkpoint folder: its plain files, then the folder, which fails (naming it) when it
// holds a folder: nothing the trainer writes, so not ours to delete.
static moe_status delete_checkpoint_folder(const char *path) {
    DIR *d = opendir(path);
    if (!d) return moe_error(MOE_EIO, "%s: cannot read: %s", path, strerror(errno));
    struct dirent *e;
    char file[MOE_PATH_MAX + 600];
    moe_status st = MOE_OK;
    while (!st && (e = readdir(d))) {
        struct stat sb;
        if (snprintf(file, sizeof file, "%s/%s", path, e->d_name) >= (int)sizeof file)
            st = moe_error(MOE_EINVAL, "%s/%s: path too long", path, e->d_name);
        else if (lstat(file, &sb) == 0 && !S_ISDIR(sb.st_mode)) st = delete_file(file);
    }
    closedir(d);
    if (!st && rmdir(path) != 0)
        st = moe_error(MOE_EIO, "%s: cannot delete: %s", path, strerror(errno));
    return st;
}

moe_status trainer_clear_run_dir(const char *run_dir) {
    static const char *files[] = {"metrics.jsonl", "expert_load.jsonl", "config.cfg",
                                  "metrics.jsonl.tmp", "expert_load.jsonl.tmp",
                                  "ckpt/latest", "ckpt/latest.tmp"};
    char path[MOE_PATH_MAX + 300], folder[MOE_PATH_MAX + 600];
    moe_status st;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s", run_dir, files[i]);
        if ((st = delete_file(path))) return st;
    }
    snprintf(path, sizeof path, "%s/ckpt", run_dir);
    DIR *d = opendir(path);
    if (!d) return errno == ENOENT ? MOE_OK : moe_error(MOE_EIO, "%s: cannot read: %s", path, strerror(errno));
    struct dirent *e;
    st = MOE_OK;
    while (!st && (e = readdir(d))) {
        struct stat sb;
        if (snprintf(folder, sizeof folder, "%s/%s", path, e->d_name) >= (int)sizeof folder)
            st = moe_error(MOE_EINVAL, "%s/%s: path too long", path, e->d_name);
        else if (!strncmp(e->d_name, "step_", 5) && lstat(folder, &sb) == 0 && S_ISDIR(sb.st_mode))
            st = delete_checkpoint_folder(folder);
    }
    closedir(d);
    if (!st) (void)rmdir(path); // if empty now: anything else in it is the user's
    return st;
}

moe_status trainer_resolve_resume(char *out, size_t n, const char *arg) {
    char path[MOE_PATH_MAX + 32];
    struct stat sb;
    snprintf(out, n, "%s", arg);
    if (stat(arg, &sb) != 0 || !S_ISDIR(sb.st_mode)) return MOE_OK; // `latest`, or missing:
                                                                    // checkpoint_load says so
    static const char *latest[] = {"ckpt/latest", "latest"}; // a run dir, its ckpt folder
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", arg, latest[i]);
        if (file_exists(path)) {
            snprintf(out, n, "%s", path);
            return MOE_OK;
        }
    }
    static const char *run_files[] = {"metrics.jsonl", "expert_load.jsonl", "config.cfg", "ckpt"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", arg, run_files[i]);
        if (file_exists(path))
            return moe_error(MOE_EIO,
                             "--resume %s: a run directory with no checkpoint to resume from "
                             "(no %s/ckpt/latest); start it over with --overwrite, or name a "
                             "checkpoint folder",
                             arg, arg);
    }
    return MOE_OK; // a step folder
}

static void format_duration(char *buf, size_t n, double s) {
    if (!isfinite(s) || s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
}

// Token files: data.train / data.val, else data.dir/{train,val}.bin, prepared from
// data.text when missing.
static moe_status open_data(const moe_train_config *cfg, token_file *train, token_file *val) {
    char train_path[MOE_PATH_MAX + 16], val_path[MOE_PATH_MAX + 16];
    if (cfg->train_path[0]) snprintf(train_path, sizeof train_path, "%s", cfg->train_path);
    else snprintf(train_path, sizeof train_path, "%s/train.bin", cfg->dir);
    if (cfg->val_path[0]) snprintf(val_path, sizeof val_path, "%s", cfg->val_path);
    else snprintf(val_path, sizeof val_path, "%s/val.bin", cfg->dir);

    if ((!file_exists(train_path) || !file_exists(val_path)) && cfg->n_text > 0 &&
        !cfg->train_path[0] && !cfg->val_path[0]) {
        const char *sources[MOE_MAX_TEXT_SOURCES];
        for (int i = 0; i < cfg->n_text; i++) sources[i] = cfg->text[i];
        uint64_t n_train = 0, n_val = 0;
        printf("preparing %s from %d text source(s) (byte tokenizer)\n", cfg->dir, cfg->n_text);
        moe_status st = data_prepare_text(sources, cfg->n_text, cfg->dir, cfg->val_fraction,
                                          &n_train, &n_val);
        if (st) return st;
        printf("prepared %llu train and %llu val tokens\n", (unsigned long long)n_train,
               (unsigned long long)n_val);
    }
    moe_status st = token_file_read(train, train_path);
    if (st) return st;
    st = token_file_read(val, val_path);
    if (st) return st;
    for (int i = 0; i < 2; i++) {
        const token_file *tf = i ? val : train;
        if ((int64_t)tf->vocab_size > cfg->vocab_size)
            return moe_error(MOE_EINVAL,
                             "%s: token vocabulary %u exceeds model.vocab_size = %d", tf->path,
                             tf->vocab_size, cfg->vocab_size);
    }
    return MOE_OK;
}

// Per-step aggregate of the MoE statistics over micro-batches, per layer.
typedef struct {
    long *routed, *kept; // [L][E]
    long *micro_routed;  // [grad_accum][L][E]: capacity applies per micro-batch, so
                         // capacity planning (moe stats --capacity) needs each one's counts
    double *entropy, *aux, *seq_aux, *z; // [L], summed over micro-batches
    int micro;
} step_load;

static void step_load_reset(step_load *s, int L, int E) {
    memset(s->routed, 0, (size_t)L * E * sizeof(long));
    memset(s->kept, 0, (size_t)L * E * sizeof(long));
    memset(s->entropy, 0, (size_t)L * sizeof(double));
    memset(s->aux, 0, (size_t)L * sizeof(double));
    memset(s->seq_aux, 0, (size_t)L * sizeof(double));
    memset(s->z, 0, (size_t)L * sizeof(double));
    s->micro = 0;
}

static void step_load_add(step_load *s, const model *m) {
    const int L = m->cfg.n_layers, E = m->cfg.moe.n_experts;
    for (int l = 0; l < L; l++) {
        const moe_stats *st = &m->moe_stats[l];
        for (int e = 0; e < E; e++) {
            s->routed[(size_t)l * E + e] += st->routed[e];
            s->kept[(size_t)l * E + e] += st->kept[e];
            s->micro_routed[((size_t)s->micro * L + l) * E + e] = st->routed[e];
        }
        s->entropy[l] += st->entropy;
        s->aux[l] += st->aux;
        s->seq_aux[l] += st->seq_aux;
        s->z[l] += st->z;
    }
    s->micro++;
}

// The steps of one layer whose max/mean load exceeded log.load_alert since the last console
// line: how many, and the worst of them (which the console warning names).
typedef struct {
    long long n, step;
    double mom;
    int expert;
} load_alert;

// max/mean and CV of one layer's counts; *hot receives the hottest expert.
static void load_summary(const long *c, int E, double *max_over_mean, double *cv, int *hot) {
    double sum = 0, var = 0;
    int h = 0;
    for (int e = 0; e < E; e++) {
        sum += c[e];
        if (c[e] > c[h]) h = e;
    }
    double mean = sum / E;
    for (int e = 0; e < E; e++) var += (c[e] - mean) * (c[e] - mean);
    *max_over_mean = mean > 0 ? c[h] / mean : 0;
    *cv = mean > 0 ? sqrt(var / E) / mean : 0;
    *hot = h;
}

// Dropless validation loss (inference mode, as `moe eval`), the same windows every time.
static moe_status validate(model *m, const token_file *val, const moe_train_config *cfg,
                           int *inputs, int *targets, double *loss) {
    data_loader vl;
    moe_status st = data_loader_init(&vl, val, cfg->batch_size, cfg->seq_len,
                                     (uint64_t)cfg->seed + 1, 0, 1);
    if (st) return moe_error_context(st, "validation data");
    double sum = 0;
    for (int i = 0; i < cfg->eval_batches; i++) {
        data_loader_next(&vl, inputs, targets);
        st = model_forward(m, inputs, targets, cfg->batch_size, cfg->seq_len, 0);
        if (st && st != MOE_ENUMERIC) break;
        sum += m->ce;
        st = MOE_OK;
    }
    data_loader_free(&vl);
    *loss = sum / cfg->eval_batches;
    return st;
}

// The first tensor (in HF order) whose gradient has a non-finite element.
static const char *first_nonfinite_grad(const model *m) {
    for (int i = 0; i < m->n_tensors; i++) {
        const model_tensor *t = &m->tensors[i];
        double ss;
        m->be->sum_squares(&ss, m->grads + t->offset, (size_t)t->rows * (t->cols ? t->cols : 1));
        if (!isfinite(ss)) return t->name;
    }
    return "none (the loss itself)";
}

// Whether step (0-based) ends with a checkpoint: every checkpoint.interval steps and at the end.
static int checkpoint_due(const moe_train_config *cfg, const trainer_hooks *hooks, int64_t step) {
    if (hooks && hooks->no_checkpoint) return 0;
    return (cfg->ckpt_interval > 0 && (step + 1) % cfg->ckpt_interval == 0) || step + 1 == cfg->steps;
}

moe_status trainer_run(const moe_train_config *cfg, const char *resume,
                       const trainer_hooks *hooks, trainer_result *result) {
    trainer_result res = {0};
    res.last_val_loss = NAN;
    if (result) *result = res; // the early returns below leave an empty, freeable result
    const int threads = moe_cpu_threads(cfg->threads);
    const moe_backend *be = moe_backend_cpu();

    moe_status st = make_dirs(cfg->run_dir);
    if (st) return st;
    {
        char path[MOE_PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/config.cfg", cfg->run_dir);
        FILE *f = fopen(path, "w");
        if (!f)
            return moe_error(MOE_EIO, "%s: cannot write the resolved config: %s", path,
                             strerror(errno));
        if ((st = moe_train_config_write(cfg, f))) {
            fclose(f);
            return st;
        }
        if ((st = file_close_checked(f, path))) return st; // a full disk shows here at the latest
    }

    token_file train = {0}, val = {0};
    model m = {0};
    optimizer opt = {0};
    data_loader loader = {0};
    jsonl_file metrics = {0}, load_log = {0};
    int *inputs = NULL, *targets = NULL;
    optim_region *regions = NULL;
    step_load sl = {0};
    load_alert *alerts = NULL; // [L]
    // tokens/s of the last TPS_WINDOW steps after the first, a ring: memory does not grow
    // with train.steps (which may be 1e12)
    double step_tps[TPS_WINDOW];
    int64_t n_tps = 0;

    st = open_data(cfg, &train, &val);
    if (st) goto done;
    model_config mc = trainer_model_config(cfg);
    st = model_create(&m, be, &mc, cfg->batch_size, cfg->seq_len);
    if (st) goto done;
    model_init_weights(&m, (uint64_t)cfg->seed, cfg->init_std);

    // weight decay on matrices; RMSNorm weights only with train.decay_norms
    regions = malloc((size_t)m.n_tensors * sizeof *regions);
    if (!regions) {
        st = moe_error(MOE_ENOMEM, "trainer: out of memory");
        goto done;
    }
    for (int i = 0; i < m.n_tensors; i++) {
        const model_tensor *t = &m.tensors[i];
        regions[i].offset = t->offset;
        regions[i].count = (size_t)t->rows * (t->cols ? t->cols : 1);
        regions[i].decay = !t->is_norm || cfg->decay_norms;
    }
    optim_config oc = {
        .kind = cfg->optimizer == 1 ? OPTIM_SGD : OPTIM_ADAMW,
        .beta1 = cfg->beta1, .beta2 = cfg->beta2, .eps = cfg->eps,
        .weight_decay = cfg->weight_decay,
    };
    st = optimizer_create(&opt, be, &oc, m.n_params, regions, m.n_tensors);
    if (st) goto done;
    st = data_loader_init(&loader, &train, cfg->batch_size, cfg->seq_len, (uint64_t)cfg->seed, 0, 1);
    if (st) goto done;

    // where the run starts: a checkpoint of this run, an HF folder, or the initialisation
    int64_t start_step = 0, consecutive_skips = 0;
    char ckpt_root[MOE_PATH_MAX + 8];
    snprintf(ckpt_root, sizeof ckpt_root, "%s/ckpt", cfg->run_dir);
    if (resume) {
        train_state ts;
        if ((st = checkpoint_load(resume, &m, &opt, &ts))) goto done;
        if ((st = data_loader_set_state(&loader, &ts.loader))) goto done;
        start_step = ts.step, res.skipped = ts.skipped, consecutive_skips = ts.consecutive_skips;
        res.steps_done = start_step;
        printf("resumed from %s at step %lld\n", resume, (long long)start_step);
        // the logs continue from the checkpoint: records of later steps are dropped
        if ((st = jsonl_keep_until(cfg->run_dir, "metrics.jsonl", start_step))) goto done;
        if ((st = jsonl_keep_until(cfg->run_dir, "expert_load.jsonl", start_step))) goto done;
    } else if (cfg->init_from[0]) {
        char from[MOE_PATH_MAX + 64]; // a folder, or a `latest` file naming one
        if ((st = checkpoint_resolve(from, sizeof from, cfg->init_from))) goto done;
        if ((st = hf_config_check(from, &mc))) goto done;
        if ((st = hf_load_weights(&m, from))) goto done;
        printf("initialised from %s\n", from);
    }
    if ((st = jsonl_open(&metrics, cfg->run_dir, "metrics.jsonl", resume != NULL))) goto done;
    if ((st = jsonl_open(&load_log, cfg->run_dir, "expert_load.jsonl", resume != NULL))) goto done;

    const int L = mc.n_layers, E = mc.moe.n_experts;
    const size_t T = (size_t)cfg->batch_size * (size_t)cfg->seq_len; // tokens per micro-batch
    inputs = malloc(T * sizeof(int));
    targets = malloc(T * sizeof(int));
    sl.routed = malloc((size_t)L * E * sizeof(long));
    sl.kept = malloc((size_t)L * E * sizeof(long));
    sl.micro_routed = malloc((size_t)cfg->grad_accum * L * E * sizeof(long));
    sl.entropy = malloc((size_t)L * sizeof(double));
    sl.aux = malloc((size_t)L * sizeof(double));
    sl.seq_aux = malloc((size_t)L * sizeof(double));
    sl.z = malloc((size_t)L * sizeof(double));
    alerts = calloc((size_t)L, sizeof *alerts);
    if (!inputs || !targets || !sl.routed || !sl.kept || !sl.micro_routed || !sl.entropy ||
        !sl.aux || !sl.seq_aux || !sl.z || !alerts) {
        st = moe_error(MOE_ENOMEM, "trainer: out of memory");
        goto done;
    }
    printf("model: %d layers, d=%d, %d heads (%d kv), %d experts top-%d, ff=%d: %.2fM parameters "
           "(%.2fM in experts)\n", L, mc.d_model, mc.n_heads, mc.n_kv_heads, E, mc.moe.top_k,
           mc.moe.d_ff, m.n_params / 1e6, (m.n_params - m.n_dense) / 1e6);
    printf("data: %s (%llu tokens), %s (%llu tokens); %d x %d tokens x %d micro-batches per step\n",
           train.path, (unsigned long long)train.count, val.path, (unsigned long long)val.count,
           cfg->batch_size, cfg->seq_len, cfg->grad_accum);
    printf("threads: %d%s\n", threads, cfg->threads > 0 ? " (train.threads)" : " (automatic)");
    printf("note: aux is Switch/Megatron-normalised (balanced = aux_coef); HF's helper reports "
           "top_k times this\n");

    res.n_layers = L, res.n_experts = E;
    res.routed = calloc((size_t)L * E, sizeof(long));
    res.kept = calloc((size_t)L * E, sizeof(long));
    res.last_stats = calloc((size_t)L, sizeof(moe_stats));
    if (!res.routed || !res.kept || !res.last_stats) {
        st = moe_error(MOE_ENOMEM, "trainer: out of memory");
        goto done;
    }
    model_memory(&m, &res.param_bytes, &res.grad_bytes, &res.activation_bytes);
    res.optimizer_bytes = opt.m ? 2 * m.n_params * sizeof(real) : 0;

    const double t_start = now_s();
    for (int64_t step = start_step; step < cfg->steps; step++) {
        if (hooks && hooks->stop_after > 0 && step - start_step >= hooks->stop_after) break;
        const double t0 = now_s();
        const double lr = lr_at_step(cfg->schedule == 1 ? SCHEDULE_CONSTANT : SCHEDULE_COSINE,
                                     cfg->lr, cfg->min_lr, cfg->warmup_steps,
                                     hooks && hooks->schedule_steps ? hooks->schedule_steps : cfg->steps,
                                     step);
        model_zero_grads(&m);
        step_load_reset(&sl, L, E);
        double ce = 0, aux = 0, z = 0;
        int finite = 1;
        for (int micro = 0; micro < cfg->grad_accum; micro++) {
            data_loader_next(&loader, inputs, targets);
            // the router jitter noise is a function of (seed, step, micro-batch): resumable
            m.noise_key = mix64((uint64_t)cfg->seed ^ mix64((uint64_t)step * 1024 + (uint64_t)micro));
            st = model_forward(&m, inputs, targets, cfg->batch_size, cfg->seq_len, 1);
            if (st == MOE_ENUMERIC || (!st && !isfinite(m.ce + m.aux + m.z))) {
                finite = 0;
                st = MOE_OK;
                break;
            }
            if (st) goto done;
            step_load_add(&sl, &m);
            ce += m.ce / cfg->grad_accum;
            aux += m.aux / cfg->grad_accum;
            z += m.z / cfg->grad_accum;
            if ((st = model_backward(&m, 1.0 / cfg->grad_accum))) goto done;
        }
        if (hooks && step >= hooks->nan_from && step <= hooks->nan_to && hooks->nan_from >= 0) {
            real nan_value = NAN; // test-only: poison the last layer's w2
            be->copy_to_device(m.g.w2 + (size_t)(L - 1) * E * mc.d_model * mc.moe.d_ff, &nan_value,
                               sizeof nan_value);
        }
        double ss = 0;
        be->sum_squares(&ss, m.grads, m.n_params);
        const double grad_norm = sqrt(ss), loss = ce + aux + z;
        if (!finite || !isfinite(loss) || !isfinite(grad_norm)) {
            res.skipped++;
            consecutive_skips++;
            fprintf(stderr,
                    "warning: step %lld: non-finite %s; first non-finite gradient: %s; update "
                    "skipped (%lld consecutive, %lld in all)\n",
                    (long long)step + 1, !finite || !isfinite(loss) ? "loss" : "gradient norm",
                    finite ? first_nonfinite_grad(&m) : "not computed (forward failed)",
                    (long long)consecutive_skips, (long long)res.skipped);
            cJSON *rec = cJSON_CreateObject();
            cJSON_AddNumberToObject(rec, "step", (double)step + 1);
            cJSON_AddNumberToObject(rec, "loss", finite ? loss : NAN);
            cJSON_AddNumberToObject(rec, "grad_norm", grad_norm);
            cJSON_AddBoolToObject(rec, "skipped", 1);
            cJSON_AddNumberToObject(rec, "skipped_total", (double)res.skipped);
            if ((st = jsonl_write(&metrics, rec))) goto done;
            if (consecutive_skips >= cfg->max_skipped) {
                st = moe_error(MOE_ENUMERIC,
                               "stopping at step %lld: %lld consecutive steps had a non-finite "
                               "loss or gradient norm (train.max_skipped = %d)",
                               (long long)step + 1, (long long)consecutive_skips, cfg->max_skipped);
                goto done;
            }
            // no checkpoint of a skipped step: with `keep`, saving the states of a diverging
            // run would rotate out the last good one, and a resume would diverge again
            if (checkpoint_due(cfg, hooks, step))
                fprintf(stderr, "warning: step %lld: no checkpoint (its update was skipped)\n",
                        (long long)step + 1);
            continue;
        }
        consecutive_skips = 0;
        optimizer_step(&opt, m.params, m.grads, lr, clip_scale(grad_norm, cfg->grad_clip));
        if (m.router_bias) update_router_bias(&m, sl.routed, cfg->bias_rate);
        const double dt = now_s() - t0;
        if (res.steps_done == 0) res.first_loss = loss;
        res.last_loss = loss;
        res.steps_done = step + 1;

        // expert load: one record per MoE layer
        double worst_mom = 0, drop_sum = 0, routed_sum = 0;
        int worst_layer = 0;
        for (int l = 0; l < L; l++) {
            const long *routed = sl.routed + (size_t)l * E, *kept = sl.kept + (size_t)l * E;
            double mom, cv;
            int hot;
            load_summary(routed, E, &mom, &cv, &hot);
            long dropped = 0, total = 0;
            for (int e = 0; e < E; e++) dropped += routed[e] - kept[e], total += routed[e];
            drop_sum += dropped, routed_sum += total;
            if (mom > worst_mom) worst_mom = mom, worst_layer = l;
            if (mom > cfg->load_alert) { // checked every step
                if (cfg->load_alert_action == 1) { // "stop"
                    fprintf(stderr, "warning: step %lld layer %d: expert %d has %.2fx the mean load "
                            "(log.load_alert = %.2f)\n", (long long)step + 1, l, hot, mom, cfg->load_alert);
                    st = moe_error(MOE_ENUMERIC,
                                   "stopping at step %lld: layer %d expert %d has %.2fx the mean load "
                                   "(log.load_alert = %.2f, train.load_alert_action = \"stop\")",
                                   (long long)step + 1, l, hot, mom, cfg->load_alert);
                    goto done;
                }
                load_alert *a = &alerts[l]; // "warn": the console reports the worst step
                if (!a->n || mom > a->mom) a->mom = mom, a->step = step + 1, a->expert = hot;
                a->n++;
            }
            cJSON *rec = cJSON_CreateObject();
            cJSON_AddNumberToObject(rec, "step", (double)step + 1);
            cJSON_AddNumberToObject(rec, "layer", l);
            cJSON_AddNumberToObject(rec, "tokens", (double)T * sl.micro);
            cJSON_AddNumberToObject(rec, "capacity", m.moe_stats[l].capacity);
            cJSON_AddItemToObject(rec, "counts", json_int_array(routed, E));
            cJSON_AddItemToObject(rec, "kept", json_int_array(kept, E));
            if (sl.micro > 1) {
                cJSON *mc = cJSON_AddArrayToObject(rec, "micro_counts");
                for (int i = 0; i < sl.micro; i++)
                    cJSON_AddItemToArray(mc, json_int_array(sl.micro_routed + ((size_t)i * L + l) * E, E));
            }
            cJSON_AddNumberToObject(rec, "dropped", (double)dropped);
            cJSON_AddNumberToObject(rec, "max_over_mean", mom);
            cJSON_AddNumberToObject(rec, "cv", cv);
            cJSON_AddNumberToObject(rec, "entropy", sl.entropy[l] / sl.micro);
            cJSON_AddNumberToObject(rec, "aux", sl.aux[l] / sl.micro);
            cJSON_AddNumberToObject(rec, "z", sl.z[l] / sl.micro);
            cJSON_AddNumberToObject(rec, "seq_aux", sl.seq_aux[l] / sl.micro);
            if (m.router_bias) {
                real *b = malloc((size_t)E * sizeof(real));
                if (!b) {
                    cJSON_Delete(rec);
                    st = moe_error(MOE_ENOMEM, "trainer: out of memory");
                    goto done;
                }
                m.be->copy_to_host(b, m.router_bias + (size_t)l * E, (size_t)E * sizeof(real));
                cJSON *arr = cJSON_AddArrayToObject(rec, "bias");
                for (int e = 0; e < E; e++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(b[e]));
                free(b);
            } else {
                cJSON_AddNullToObject(rec, "bias");
            }
            const moe_stats *ms = &m.moe_stats[l]; // router logits: the step's last micro-batch
            cJSON_AddNumberToObject(rec, "logit_mean", ms->logit_mean);
            cJSON_AddNumberToObject(rec, "logit_std", ms->logit_std);
            cJSON_AddNumberToObject(rec, "logit_max_abs", ms->logit_max_abs);
            cJSON_AddNumberToObject(rec, "lse_mean", ms->lse_mean);
            cJSON_AddNumberToObject(rec, "exchange_bytes", 0);
            cJSON_AddNumberToObject(rec, "exchange_s", 0);
            if ((st = jsonl_write(&load_log, rec))) goto done;
        }
        const double drop_frac = routed_sum > 0 ? drop_sum / routed_sum : 0;
        const double tok_per_s = (double)T * cfg->grad_accum / dt;
        for (size_t i = 0; i < (size_t)L * E; i++) res.routed[i] += sl.routed[i], res.kept[i] += sl.kept[i];
        for (int l = 0; l < L; l++) res.last_stats[l] = m.moe_stats[l];
        if (step > start_step) step_tps[n_tps++ % TPS_WINDOW] = tok_per_s;

        int evaluated = 0;
        double val_loss = NAN;
        if ((cfg->eval_interval > 0 && (step + 1) % cfg->eval_interval == 0) ||
            step + 1 == cfg->steps) {
            if ((st = validate(&m, &val, cfg, inputs, targets, &val_loss))) goto done;
            res.last_val_loss = val_loss;
            evaluated = 1;
        }

        cJSON *rec = cJSON_CreateObject();
        cJSON_AddNumberToObject(rec, "step", (double)step + 1);
        cJSON_AddNumberToObject(rec, "loss", loss);
        cJSON_AddNumberToObject(rec, "ce", ce);
        cJSON_AddNumberToObject(rec, "aux", aux);
        cJSON_AddNumberToObject(rec, "z", z);
        cJSON_AddNumberToObject(rec, "lr", lr);
        cJSON_AddNumberToObject(rec, "grad_norm", grad_norm);
        cJSON_AddNumberToObject(rec, "tokens_per_s", tok_per_s);
        cJSON_AddNumberToObject(rec, "step_s", dt);
        cJSON_AddNumberToObject(rec, "max_over_mean", worst_mom);
        cJSON_AddNumberToObject(rec, "drop_frac", drop_frac);
        cJSON_AddNumberToObject(rec, "skipped_total", (double)res.skipped);
        if (evaluated) cJSON_AddNumberToObject(rec, "val_loss", val_loss);
        if ((st = jsonl_write(&metrics, rec))) goto done;

        const int last = step + 1 == cfg->steps;
        if ((step + 1) % cfg->interval == 0 || step == 0 || last || evaluated) {
            char eta[32];
            const double elapsed = now_s() - t_start;
            format_duration(eta, sizeof eta,
                            elapsed / (step + 1 - start_step) * (cfg->steps - step - 1));
            printf("step %5lld/%lld | loss %.4f (ce %.4f aux %.4f z %.4f) | lr %.2e | gnorm %.3f | "
                   "%.0f tok/s | ETA %s | load max/mean %.2f (L%d) | drop %.2f%%",
                   (long long)step + 1, (long long)cfg->steps, loss, ce, aux, z, lr, grad_norm,
                   tok_per_s, eta, worst_mom, worst_layer, 100 * drop_frac);
            if (evaluated) printf(" | val %.4f", val_loss);
            printf("\n");
            fflush(stdout);
            for (int l = 0; l < L; l++) { // warn (stop acted above, on every step)
                const load_alert *a = &alerts[l];
                if (a->n)
                    fprintf(stderr,
                            "warning: step %lld layer %d: expert %d has %.2fx the mean load "
                            "(log.load_alert = %.2f; %lld step%s above it since the last report)\n",
                            a->step, l, a->expert, a->mom, cfg->load_alert, a->n,
                            a->n == 1 ? "" : "s");
            }
            memset(alerts, 0, (size_t)L * sizeof *alerts);
        }
        if (checkpoint_due(cfg, hooks, step)) {
            train_state ts = {.step = step + 1, .skipped = res.skipped,
                              .consecutive_skips = consecutive_skips};
            data_loader_get_state(&ts.loader, &loader);
            const char *shard_env = getenv("MOE_TEST_SHARD_BYTES"); // test-only
            uint64_t shard = shard_env ? strtoull(shard_env, NULL, 10) : CHECKPOINT_SHARD_BYTES;
            if ((st = checkpoint_save(ckpt_root, &m, &opt, &ts, cfg, cfg->ckpt_keep, shard)))
                goto done;
            printf("checkpoint: %s/step_%08lld\n", ckpt_root, (long long)step + 1);
        }
    }
    res.seconds = now_s() - t_start;
    res.median_tokens_per_s =
        n_tps ? median_of(step_tps, n_tps < TPS_WINDOW ? (int)n_tps : TPS_WINDOW) : NAN;
    printf("done: %lld steps in %.1f s, final loss %.4f, val loss %.4f, %lld skipped\n",
           (long long)res.steps_done, res.seconds, res.last_loss, res.last_val_loss,
           (long long)res.skipped);

done:
    if (result) *result = res;
    else trainer_result_free(&res);
    // a failed close loses the last records: an error unless the run failed already
    for (int i = 0; i < 2; i++) {
        jsonl_file *j = i ? &load_log : &metrics;
        if (st && j->f) fclose(j->f);
        else if (!st) st = jsonl_close(j);
    }
    free(inputs), free(targets), free(regions);
    free(sl.routed), free(sl.kept), free(sl.micro_routed), free(sl.entropy), free(sl.aux), free(sl.seq_aux), free(sl.z);
    free(alerts);
    data_loader_free(&loader);
    optimizer_destroy(&opt);
    model_destroy(&m);
    token_file_free(&train);
    token_file_free(&val);
    return st;
}
