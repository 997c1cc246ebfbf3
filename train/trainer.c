// The training loop (see trainer.h).
#define _POSIX_C_SOURCE 200809L // lstat, dirent

#include "train/trainer.h"

#include "layers/timing.h"
#include "train/capacity.h"

#include <dirent.h>
#include <signal.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "data/files.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "optim/optimizer.h"
#include "train/ckpt/checkpoint.h"
#include "train/launch.h"
#include "train/log.h"
#include "layers/rng.h"

model_config trainer_model_config(const moe_train_config *cfg) {
    model_config m = cfg->model;
    m.moe.d_model = m.d_model;          // not keys of their own: they follow from
    m.router_bias = cfg->bias_rate > 0; // model.d_model and model.bias_rate
    return m;
}

uint64_t trainer_noise_key(uint64_t seed, int64_t step, int micro) {
    return moe_mix64(seed ^ moe_mix64((uint64_t)step << 20 | (uint64_t)micro));
}

// The selection bias of every layer moves toward balance, by the step's routed counts (in
// global expert order, so the bias is updated in it too).
static void update_router_bias(model *m, const long *routed, double rate) {
    const int L = m->cfg.n_layers, E = m->cfg.moe.n_experts;
    real *b = malloc((size_t)L * E * sizeof(real));
    if (!b) moe_fatal("out of memory");
    m->be->copy_to_host(m->be, b, m->router_bias, (size_t)L * E * sizeof(real));
    model_placement_permute(m, b, L, 1, 1);
    for (int l = 0; l < L; l++)
        moe_router_bias_update(b + (size_t)l * E, routed + (size_t)l * E, E, rate);
    model_placement_permute(m, b, L, 1, 0);
    m->be->copy_to_device(m->be, m->router_bias, b, (size_t)L * E * sizeof(real));
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
        else if (lstat(file, &sb) == 0 && !S_ISDIR(sb.st_mode))
            st = delete_file(file);
    }
    closedir(d);
    if (!st && rmdir(path) != 0)
        st = moe_error(MOE_EIO, "%s: cannot delete: %s", path, strerror(errno));
    return st;
}

moe_status trainer_clear_run_dir(const char *run_dir) {
    static const char *files[] = {"metrics.jsonl",     "expert_load.jsonl",     "config.cfg",
                                  "metrics.jsonl.tmp", "expert_load.jsonl.tmp", "config.cfg.tmp",
                                  "ckpt/latest",       "ckpt/latest.tmp"};
    char path[MOE_PATH_MAX + 300], folder[MOE_PATH_MAX + 600];
    moe_status st;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s", run_dir, files[i]);
        if ((st = delete_file(path))) return st;
    }
    snprintf(path, sizeof path, "%s/ckpt", run_dir);
    DIR *d = opendir(path);
    if (!d)
        return errno == ENOENT ? MOE_OK
                               : moe_error(MOE_EIO, "%s: cannot read: %s", path, strerror(errno));
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
    if (stat(arg, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return MOE_OK;                                       // `latest`, or missing:
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
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%lds", t);
}

// The token files a config names and the key each comes from (for messages): data.train /
// data.val, else data.dir/{train,val}.bin.
typedef struct {
    char path[2][MOE_PATH_MAX + 16]; // train, val
    char key[2][24];                 // "data.train" or "data.dir/train.bin", ...
    int from_dir;                    // both come from data.dir
} data_paths;

static void data_paths_of(const moe_train_config *cfg, data_paths *d) {
    static const char *names[2] = {"train", "val"};
    const char *given[2] = {cfg->train_path, cfg->val_path};
    d->from_dir = !cfg->train_path[0] && !cfg->val_path[0];
    for (int i = 0; i < 2; i++) {
        if (given[i][0]) {
            snprintf(d->path[i], sizeof d->path[i], "%s", given[i]);
            snprintf(d->key[i], sizeof d->key[i], "data.%s", names[i]);
        } else {
            snprintf(d->path[i], sizeof d->path[i], "%s/%s.bin", cfg->dir, names[i]);
            snprintf(d->key[i], sizeof d->key[i], "data.dir/%s.bin", names[i]);
        }
    }
}

// Prefixes the last error with the config key a path came from: "KEY = 'PATH': message".
static moe_status name_key(moe_status st, const char *key, const char *path) {
    char old[1024];
    snprintf(old, sizeof old, "%s", moe_last_error());
    return moe_error(st, "%s = '%s': %s", key, path, old);
}

// Every data.text source exists; else an error naming it and how to point at the text.
static moe_status check_text_sources(const moe_train_config *cfg) {
    for (int i = 0; i < cfg->n_text; i++) {
        struct stat sb;
        if (stat(cfg->text[i], &sb) == 0) continue;
        const int err = errno;
        char cwd[MOE_PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "?");
        return moe_error(MOE_EIO,
                         "data.text[%d] = '%s': %s (relative paths are relative to the directory "
                         "moe runs in, %s); point at the text with --set "
                         "'data.text=[\"path/to/input.txt\"]'",
                         i, cfg->text[i], strerror(err), cwd);
    }
    return MOE_OK;
}

// Token files: data.train / data.val, else data.dir/{train,val}.bin, prepared from
// data.text when missing. Errors name the config key of the path.
static moe_status open_data(const moe_train_config *cfg, token_file *train, token_file *val) {
    data_paths d;
    data_paths_of(cfg, &d);
    moe_status st;
    // the run's tokenizer: data.tokenizer, else train.init_from's (checkpoint_save picks the same)
    char tok[MOE_PATH_MAX];
    int tok_from_init = 0;
    if ((st = tokenizer_for_run(tok, sizeof tok, cfg->tokenizer, cfg->init_from, &tok_from_init)))
        return st;
    if (tok[0])
        printf("tokenizer: %s (%s)\n", tok,
               tok_from_init ? "train.init_from's, as data.tokenizer is empty" : "data.tokenizer");
    if ((!file_exists(d.path[0]) || !file_exists(d.path[1])) && cfg->n_text > 0 && d.from_dir) {
        if ((st = check_text_sources(cfg))) return st;
        const char *sources[MOE_MAX_TEXT_SOURCES];
        for (int i = 0; i < cfg->n_text; i++) sources[i] = cfg->text[i];
        uint64_t n_train = 0, n_val = 0;
        printf("preparing %s from %d text source(s) (%s)\n", cfg->dir, cfg->n_text,
               tok[0] ? "the tokenizer above" : "byte tokenizer");
        if (tok[0]) // (scripts/hf_tokenizer.py prints the counts)
            st = hf_tokenizer_prepare(tok, sources, cfg->n_text, cfg->dir, cfg->val_fraction);
        else
            st = data_prepare_text(sources, cfg->n_text, cfg->dir, cfg->val_fraction, &n_train,
                                   &n_val);
        if (st) return name_key(st, "data.dir (prepared from data.text)", cfg->dir);
        if (!tok[0])
            printf("prepared %llu train and %llu val tokens\n", (unsigned long long)n_train,
                   (unsigned long long)n_val);
    }
    for (int i = 0; i < 2; i++) {
        token_file *tf = i ? val : train;
        if ((st = token_file_read(tf, d.path[i]))) {
            name_key(st, d.key[i], d.path[i]);
            if (d.from_dir && !cfg->n_text && !file_exists(d.path[i])) {
                char old[1024];
                snprintf(old, sizeof old, "%s", moe_last_error());
                moe_error(st,
                          "%s (set data.text to prepare data.dir from text files, or "
                          "data.train and data.val to token files)",
                          old);
            }
            return st;
        }
        if ((int64_t)tf->vocab_size > cfg->model.vocab_size)
            return moe_error(MOE_EINVAL,
                             "%s = '%s': token vocabulary %u exceeds model.vocab_size = %d",
                             d.key[i], tf->path, tf->vocab_size, cfg->model.vocab_size);
    }
    // token files of another tokenizer than the run's would train silently on wrong ids
    if ((st = tokenizer_check_data(d.path[0], tok, train->vocab_size)))
        return name_key(st, d.key[0], d.path[0]);
    return MOE_OK;
}

// Per-step aggregate of the MoE statistics over micro-batches, per layer; per expert in
// global expert order (the model's counts are in slot order under an expert placement).
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
        for (int e = 0; e < E; e++) { // slot e, global expert g
            const size_t g = (size_t)model_expert_global(m, e);
            s->routed[(size_t)l * E + g] += st->routed[e];
            s->kept[(size_t)l * E + g] += st->kept[e];
            s->micro_routed[((size_t)s->micro * L + l) * E + g] = st->routed[e];
        }
        s->entropy[l] += st->entropy;
        s->aux[l] += st->aux;
        s->seq_aux[l] += st->seq_aux;
        s->z[l] += st->z;
    }
    s->micro++;
}

// The load alert (README "Expert load: monitoring and balancing"). Steps up to
// log.alert_after are a warm-up grace: they never enter the window. The window is the last
// log.alert_window logged steps after it (a skipped step logs no load). On a step that fills
// the window, a layer is in alert when
//   - overload: the median over the window of its per-step max/mean load exceeds
//     log.load_alert, i.e. (about) half the window's steps are above it, so a spike of a few
//     steps never fires while a router that stays skewed does;
//   - dead: an expert received no token in any of the window's steps.
// So the first possible alert is at step alert_after + alert_window. Per layer a ring of the
// window's max/mean and hottest expert; per expert the last step that routed it a token
// (dead <=> that step is before the window). A resumed run fills its window again.
typedef struct {
    int64_t W, n, head; // window, entries so far (<= W), next slot (the oldest once full)
    int64_t *step;      // [W] the step of each slot
    double *mom;        // [L][W] per-step max/mean
    int *hot;           // [L][W] per-step hottest expert
    int64_t *last_seen; // [L][E] the last step with a token for the expert (0: none)
    double *scratch;    // [W]
    int *votes;         // [E]
} alert_window;

static void alert_window_free(alert_window *w) {
    free(w->step), free(w->mom), free(w->hot), free(w->last_seen), free(w->scratch), free(w->votes);
    memset(w, 0, sizeof *w);
}

static int alert_window_init(alert_window *w, int64_t W, int L, int E) {
    memset(w, 0, sizeof *w);
    w->W = W;
    w->step = calloc((size_t)W, sizeof *w->step);
    w->mom = calloc((size_t)L * W, sizeof *w->mom);
    w->hot = calloc((size_t)L * W, sizeof *w->hot);
    w->last_seen = calloc((size_t)L * E, sizeof *w->last_seen);
    w->scratch = calloc((size_t)W, sizeof *w->scratch);
    w->votes = calloc((size_t)E, sizeof *w->votes);
    if (w->step && w->mom && w->hot && w->last_seen && w->scratch && w->votes) return 0;
    alert_window_free(w);
    return -1;
}

// A layer's verdict on a full window: what fires, and what the messages name.
typedef struct {
    int overload, n_dead;
    double median;       // of max/mean over the window
    int expert;          // the expert hottest on the most of the window's steps (lowest on ties)
    long long from, to;  // the window's steps
    char dead_list[128]; // the dead experts' indexes (the first few)
} alert_verdict;

// The verdict of layer l on the window ending with the latest push (w->n == W).
static alert_verdict alert_window_eval(alert_window *w, int l, int E, double threshold) {
    alert_verdict v = {0};
    const int64_t W = w->W;
    v.from = w->step[w->head], v.to = w->step[(w->head + W - 1) % W];
    memcpy(w->scratch, w->mom + (size_t)l * W, (size_t)W * sizeof *w->scratch);
    v.median = median_of(w->scratch, (int)W);
    v.overload = v.median > threshold;
    memset(w->votes, 0, (size_t)E * sizeof *w->votes);
    for (int64_t i = 0; i < W; i++) w->votes[w->hot[(size_t)l * W + i]]++;
    for (int e = 1; e < E; e++)
        if (w->votes[e] > w->votes[v.expert]) v.expert = e;
    size_t len = 0;
    for (int e = 0; e < E; e++) {
        if (w->last_seen[(size_t)l * E + e] >= v.from) continue;
        if (v.n_dead++ < 16 && len < sizeof v.dead_list)
            len += (size_t)snprintf(v.dead_list + len, sizeof v.dead_list - len, " %d", e);
    }
    if (v.n_dead > 16 && len < sizeof v.dead_list)
        snprintf(v.dead_list + len, sizeof v.dead_list - len, " ...");
    return v;
}

// Per layer, since the previous console line: the steps in alert for each condition, the
// worst overload (the highest median) and the latest dead verdict, which the warnings name.
typedef struct {
    long long n_load, n_dead, step, dead_step;
    alert_verdict load, dead;
} load_alert;

// Test-only (tests/train/alerts.sh): MOE_TEST_LOAD_MOM="A-B:V[,A-B:V]..." makes the alert
// rule see layer 0's max/mean as V on steps A..B (the logs keep the measured value).
static double test_load_override(int64_t step, double mom) {
    const char *spec = getenv("MOE_TEST_LOAD_MOM");
    while (spec && *spec) {
        long long a, b;
        double v;
        int used = 0;
        if (sscanf(spec, "%lld-%lld:%lf%n", &a, &b, &v, &used) != 3) break;
        if (step >= a && step <= b) return v;
        spec += used;
        if (*spec == ',') spec++;
    }
    return mom;
}

// Dropless validation loss (inference mode, as `moe eval`), the same windows every time.
static moe_status validate(model *m, const token_file *val, const moe_train_config *cfg,
                           int *inputs, int *targets, double *loss) {
    data_loader vl;
    moe_status st =
        data_loader_init(&vl, val, cfg->batch_size, cfg->seq_len, (uint64_t)cfg->seed + 1, 0, 1);
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
        m->be->sum_squares(m->be, &ss, m->grads + t->offset,
                           (size_t)t->rows * (t->cols ? t->cols : 1));
        if (!isfinite(ss)) return t->name;
    }
    return "none (the loss itself)";
}

// Whether step (0-based) ends with a checkpoint: every checkpoint.interval steps and at the end.
static int checkpoint_due(const moe_train_config *cfg, const trainer_hooks *hooks, int64_t step) {
    if (hooks && hooks->no_checkpoint) return 0;
    return (cfg->ckpt_interval > 0 && (step + 1) % cfg->ckpt_interval == 0) ||
           step + 1 == cfg->steps;
}

// ---- resuming ------------------------------------------------------------------------------

// A resume of a run that is already at (or past) train.steps: *finished = its step, after
// checking that the checkpoint is intact (a damaged one is an error, as for a real resume).
// Nothing is decided (0) when the state cannot be read: checkpoint_load then says why.
static moe_status resume_finished(const char *resume, int64_t steps, int64_t *finished) {
    char folder[MOE_PATH_MAX + 64];
    checkpoint_state cs;
    *finished = 0;
    if (checkpoint_resolve(folder, sizeof folder, resume) || checkpoint_state_read(&cs, folder))
        return MOE_OK;
    if (cs.ts.step < steps) return MOE_OK;
    moe_status st = checkpoint_verify(folder);
    if (st) return st;
    *finished = cs.ts.step;
    return MOE_OK;
}

// Warnings for a schedule that changed since the checkpoint (trainer_state.json "schedule":
// kind, lr, min_lr, warmup_steps, steps): the run continues on the new schedule. A changed
// train.steps matters to the cosine schedule only (the constant one does not depend on it).
static void warn_schedule_change(const moe_train_config *cfg, const char *resume, int64_t step) {
    char folder[MOE_PATH_MAX + 64], path[MOE_PATH_MAX + 96];
    if (checkpoint_resolve(folder, sizeof folder, resume)) return;
    snprintf(path, sizeof path, "%s/trainer_state.json", folder);
    cJSON *state;
    if (file_read_json_object(path, (size_t)64 << 20, &state)) return; // checkpoint_load read it
    const cJSON *sch = cJSON_GetObjectItemCaseSensitive(state, "schedule");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(sch, "kind");
    const cJSON *num[4] = {cJSON_GetObjectItemCaseSensitive(sch, "lr"),
                           cJSON_GetObjectItemCaseSensitive(sch, "min_lr"),
                           cJSON_GetObjectItemCaseSensitive(sch, "warmup_steps"),
                           cJSON_GetObjectItemCaseSensitive(sch, "steps")};
    int ok = cJSON_IsString(kind) &&
             (!strcmp(kind->valuestring, "cosine") || !strcmp(kind->valuestring, "constant"));
    for (int i = 0; i < 4; i++) ok = ok && cJSON_IsNumber(num[i]) && isfinite(num[i]->valuedouble);
    if (!ok) { // an older or damaged state: nothing to compare with
        cJSON_Delete(state);
        return;
    }
    const int was_constant = !strcmp(kind->valuestring, "constant");
    const int constant = cfg->schedule == SCHEDULE_CONSTANT;
    const double was[4] = {num[0]->valuedouble, num[1]->valuedouble, num[2]->valuedouble,
                           num[3]->valuedouble};
    const double now[4] = {cfg->lr, cfg->min_lr, (double)cfg->warmup_steps, (double)cfg->steps};
    static const char *keys[4] = {"train.lr", "train.min_lr", "train.warmup_steps", "train.steps"};
    cJSON_Delete(state);
    int changed = 0;
    if (was_constant != constant) {
        printf("warning: train.schedule \"%s\" -> \"%s\" since the checkpoint: the learning rate "
               "follows the new schedule from step %lld on\n",
               was_constant ? "constant" : "cosine", constant ? "constant" : "cosine",
               (long long)step + 1);
        changed = 1;
    }
    for (int i = 0; i < 4; i++) {
        if (was[i] == now[i] || fabs(was[i] - now[i]) <= 1e-12 * fabs(was[i])) continue;
        if (i == 3 && constant && was_constant) continue; // no effect on a constant schedule
        if (i == 3)
            printf("warning: train.steps %.0f -> %.0f since the checkpoint: the %s schedule is "
                   "re-stretched over the new length\n",
                   was[i], now[i], constant ? "constant" : "cosine");
        else if (i == 2)
            printf("warning: train.warmup_steps %.0f -> %.0f since the checkpoint: the warmup is "
                   "re-stretched\n",
                   was[i], now[i]);
        else
            printf("warning: %s %g -> %g since the checkpoint: the schedule is rescaled\n", keys[i],
                   was[i], now[i]);
        changed = 1;
    }
    if (changed)
        printf("  the learning rate at step %lld: %.3e (the checkpoint's schedule: %.3e)\n",
               (long long)step + 1,
               lr_at_step(constant ? SCHEDULE_CONSTANT : SCHEDULE_COSINE, now[0], now[1],
                          (int64_t)now[2], (int64_t)now[3], step),
               lr_at_step(was_constant ? SCHEDULE_CONSTANT : SCHEDULE_COSINE, was[0], was[1],
                          (int64_t)was[2], (int64_t)was[3], step));
}

// ---- the run header (moe train before step 1; moe train --dry-run) ---------------------

static void human_bytes(char *buf, size_t n, double b) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, u++;
    snprintf(buf, n, "%.1f %s", b, unit[u]);
}

// 1234567 -> "1,234,567"
static const char *grouped(char *buf, size_t n, uint64_t v) {
    char digits[32];
    const int len = snprintf(digits, sizeof digits, "%llu", (unsigned long long)v);
    size_t at = 0;
    for (int i = 0; i < len && at + 2 < n; i++) {
        if (i && (len - i) % 3 == 0) buf[at++] = ',';
        buf[at++] = digits[i];
    }
    buf[at] = 0;
    return buf;
}

// 2304000 -> "2.30M" (K, M, G, T, P)
static const char *si(char *buf, size_t n, double v) {
    const char *unit[] = {"", "K", "M", "G", "T", "P"};
    int u = 0;
    while (fabs(v) >= 1000 && u < 5) v /= 1000, u++;
    snprintf(buf, n, u ? "%.2f%s" : "%.0f%s", v, unit[u]);
    return buf;
}

typedef struct {
    size_t params, grads, optimizer, activations, experts; // bytes; activations without experts
} run_memory;

// The memory of a training model as allocated (model_memory), with the optimizer's state.
static run_memory memory_of(const model *m, const moe_train_config *cfg) {
    run_memory r = {0};
    size_t acts;
    model_memory(m, &r.params, &r.grads, &acts);
    for (int l = 0; l < m->n_moe; l++) r.experts += m->moe[l].bytes;
    r.activations = acts - r.experts;
    r.optimizer =
        cfg->optimizer == OPTIM_SGD ? 0 : 2 * m->n_params * sizeof(real); // AdamW: m and v
    return r;
}

// model, parameter counts, FLOPs per token, memory (NULL: not measured, why in mem_note),
// the data line, BLAS and threads.
static void print_header(const moe_train_config *cfg, const model_config *mc, size_t n_params,
                         size_t n_dense, const run_memory *mem, const char *mem_note,
                         const char *data_line, moe_backend *be) {
    const int L = mc->n_layers, E = mc->moe.n_experts, k = mc->moe.top_k;
    const double d = mc->d_model, ff = mc->moe.d_ff, V = mc->vocab_size;
    const double hd = d / mc->n_heads, q_rows = (mc->n_heads + 2.0 * mc->n_kv_heads) * hd;
    const double expert = 3 * d * ff; // w1, w3 (stacked as w13) and w2 of one expert
    const double active = (double)n_dense + (double)L * k * expert;
    printf("model: %d layers, d=%d, %d heads (%d kv), %d experts top-%d, ff=%d: %.2fM parameters "
           "(%.2fM in experts)\n",
           L, mc->d_model, mc->n_heads, mc->n_kv_heads, E, k, mc->moe.d_ff, n_params / 1e6,
           (n_params - n_dense) / 1e6);
    char a[32], b[32], c[32], e[32];
    printf("parameters: %s total, %s active per token (%s dense + top-%d of %d experts of %s\n"
           "  in each of %d layers)\n",
           grouped(a, sizeof a, n_params), grouped(b, sizeof b, (uint64_t)active),
           grouped(c, sizeof c, n_dense), k, E, grouped(e, sizeof e, (uint64_t)expert), L);
    // forward FLOPs per token: 2 per weight of every matmul a token goes through (q/k/v, o,
    // router, its top_k experts, lm_head; the embedding is a lookup), and attention's
    // QK^T and AV: 2 x 2 x S x (heads x head_dim) per layer over the whole S x S window
    const double matmul = L * (q_rows * d + d * mc->n_heads * hd + E * d + k * expert) + V * d;
    const double attn = L * 4.0 * cfg->seq_len * mc->n_heads * hd;
    const double fwd = 2 * matmul + attn;
    char f1[32], f2[32], f3[32], f4[32];
    printf("FLOPs per token: %s forward (2 x %s matmul weights + %s attention: 4 x S x d per\n"
           "  layer at S = %d, the full S x S, not halved for the causal mask); %s to train "
           "(3 x forward)\n",
           si(f1, sizeof f1, fwd), si(f2, sizeof f2, matmul), si(f3, sizeof f3, attn), cfg->seq_len,
           si(f4, sizeof f4, 3 * fwd));
    if (mem) {
        char p[32], g[32], o[32], act[32], ex[32], all[32];
        human_bytes(p, sizeof p, (double)mem->params);
        human_bytes(g, sizeof g, (double)mem->grads);
        human_bytes(o, sizeof o, (double)mem->optimizer);
        human_bytes(act, sizeof act, (double)mem->activations);
        human_bytes(ex, sizeof ex, (double)mem->experts);
        human_bytes(
            all, sizeof all,
            (double)(mem->params + mem->grads + mem->optimizer + mem->activations + mem->experts));
        printf("memory (%s, as allocated for %d x %d tokens): %s: parameters %s, gradients %s,\n"
               "  %s %s, activations %s, expert buffers %s\n",
               mc->moe.dtype == MOE_DTYPE_BF16 ? "bf16" : "fp32", cfg->batch_size, cfg->seq_len,
               all, p, g, cfg->optimizer == OPTIM_SGD ? "SGD state" : "AdamW moments", o, act, ex);
    } else {
        printf("memory: not measured: %s\n", mem_note);
    }
    printf("%s\n", data_line);
    printf("precision: %s (train.dtype)\n",
           mc->moe.dtype == MOE_DTYPE_BF16
               ? "bf16: bf16 GEMM operands with fp32 accumulation; fp32 master weights, "
                 "optimizer, norms, softmax, routing and losses"
               : "fp32");
    printf("device: %s (model.device)\n%s%s\n", be->name, be->describe(be),
           cfg->threads > 0 ? " (train.threads)" : " (automatic)");
}

// What open_data would read, without reading or preparing anything.
static void dry_data_line(const moe_train_config *cfg, char *buf, size_t n) {
    data_paths d;
    data_paths_of(cfg, &d);
    size_t at = (size_t)snprintf(buf, n, "data:");
    for (int i = 0; i < 2 && at < n; i++) {
        struct stat sb;
        char size[32];
        const char *what = size;
        if (stat(d.path[i], &sb) == 0)
            human_bytes(size, sizeof size, (double)sb.st_size);
        else if (d.from_dir && cfg->n_text)
            what = "missing: prepared from data.text by the run";
        else
            what = "missing";
        at += (size_t)snprintf(buf + at, n - at, "%s %s (%s, %s)", i ? ",\n " : "", d.path[i],
                               d.key[i], what);
    }
    if (at < n)
        snprintf(buf + at, n - at, "; %d x %d tokens x %d micro-batch%s per step", cfg->batch_size,
                 cfg->seq_len, cfg->grad_accum, cfg->grad_accum == 1 ? "" : "es");
}

moe_status trainer_dry_run(const moe_train_config *cfg) {
    printf("# the resolved config: %s with the --set overrides, every key\n",
           cfg->source[0] ? cfg->source : "(defaults)");
    moe_status st = moe_train_config_write(cfg, stdout);
    if (st) return st;
    printf("\n");
    moe_backend *be;
    const moe_backend_options bo = {.threads = cfg->threads, .tf32 = cfg->tf32};
    if ((st = moe_backend_create(&be, cfg->device, &bo)))
        return name_key(st, "model.device", cfg->device);
    model_config mc = trainer_model_config(cfg);
    const size_t n_params = model_param_count(&mc);
    const size_t n_dense =
        n_params - (size_t)mc.n_layers * mc.moe.n_experts * 3 * (size_t)mc.d_model * mc.moe.d_ff;
    char data_line[3 * MOE_PATH_MAX + 256];
    dry_data_line(cfg, data_line, sizeof data_line);
    // the model allocated as the run would (not initialised, no data): its real buffers
    model m = {0};
    run_memory mem;
    st = model_create(&m, be, &mc, cfg->batch_size, cfg->seq_len);
    if (!st) mem = memory_of(&m, cfg);
    print_header(cfg, &mc, n_params, n_dense, st ? NULL : &mem, moe_last_error(), data_line, be);
    if (st) fprintf(stderr, "warning: the model does not allocate here: %s\n", moe_last_error());
    model_destroy(&m);
    moe_backend_destroy(be);
    data_paths d;
    data_paths_of(cfg, &d);
    if ((!file_exists(d.path[0]) || !file_exists(d.path[1])) && cfg->n_text > 0 && d.from_dir &&
        check_text_sources(cfg))
        fprintf(stderr, "warning: moe train would stop here: %s\n", moe_last_error());
    return MOE_OK;
}

// ---- the run: a trainer and its steps ------------------------------------------------------

// The state of one run, from trainer_open to trainer_close (which frees everything, whatever
// trainer_open got to).
typedef struct {
    const moe_train_config *cfg;
    const trainer_hooks *hooks;
    const char *resume;
    moe_backend *be;
    token_file train, val;
    model m;
    optimizer opt;
    data_loader loader;
    jsonl_file metrics, load_log;
    int *inputs, *targets; // [T]
    optim_region *regions;
    step_load sl;
    load_alert *alerts; // [L]
    alert_window aw;
    int L, E;
    size_t T; // tokens per micro-batch
    char ckpt_root[MOE_PATH_MAX + 8];
    int64_t start_step, consecutive_skips;
    double t_start;
    // tokens/s of the last TPS_WINDOW steps after the first, a ring: memory does not grow
    // with train.steps (which may be 1e12)
    double step_tps[TPS_WINDOW];
    int64_t n_tps;
    trainer_result res;
    // expert parallelism (DESIGN.md §4): the world, this rank's EP group and the ranks that
    // hold the same experts; one rank: a world of 1, ep and edp NULL
    moe_comm *world, *ep, *edp;
    int rank, R;
    capacity_ctl cap; // model.capacity_factor's schedule or auto (train/capacity.h)
    moe_timer timer;  // log.timing: the step's phases (layers/timing.h)
    long *coact;      // log.coactivation: [L][E][E] (i < j) since the last log step
    int64_t coact_steps;
    double ckpt_s; // the last checkpoint save's seconds (logged with the next step)
} trainer;

// What one step computed, for its logs.
typedef struct {
    int64_t step; // 0-based
    double lr, ce, aux, z, loss, grad_norm;
    int finite;      // the forward of every micro-batch was finite
    int ce_overflow; // ... but a micro-batch's cross-entropy was beyond TRAIN_MAX_CE
    double dt, tok_per_s, worst_mom, drop_frac, val_loss;
    int worst_layer, evaluated;
    double optimizer_s, val_s;  // timing: the update's and the validation's seconds
    int coact_log;              // this step's load records carry the co-activations
    double capacity_factor;     // the step's
    int capacity_decided;       // auto: this step ended a window
    capacity_decision capacity; // its decision
} step_result;

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
    moe_status st = t->rank == 0 ? open_data(t->cfg, &t->train, &t->val) : MOE_OK;
    if ((st = rank0_status(t, st, "open the data"))) return st;
    return t->rank ? open_data(t->cfg, &t->train, &t->val) : MOE_OK;
}

// The backend, the data, the model at its initialisation, the optimizer and the loader.
static moe_status trainer_open_model(trainer *t) {
    const moe_train_config *cfg = t->cfg;
    const moe_backend_options bo = {
        .threads = cfg->threads, .procs_per_node = moe_launch_local_size(), .tf32 = cfg->tf32};
    moe_status st = moe_backend_create(&t->be, cfg->device, &bo);
    if (st) return name_key(st, "model.device", cfg->device);
    if ((st = trainer_open_transport(t))) return st;
    if ((st = trainer_open_groups(t))) return st;
    if ((st = trainer_open_data(t))) return st;
    const model_config mc = trainer_model_config(cfg);
    if ((st = model_create_parallel(&t->m, t->be, &mc, cfg->batch_size, cfg->seq_len, t->ep)))
        return st;
    if (cfg->n_placement && (st = model_set_expert_placement(&t->m, cfg->expert_placement)))
        return st; // (the config checked that it is a permutation)
    model_init_weights(&t->m, (uint64_t)cfg->seed, cfg->init_std);
    // weight decay on matrices; RMSNorm weights only with train.decay_norms
    t->regions = malloc((size_t)t->m.n_tensors * sizeof *t->regions);
    if (!t->regions) return out_of_memory();
    for (int i = 0; i < t->m.n_tensors; i++) {
        const model_tensor *mt = &t->m.tensors[i];
        t->regions[i].offset = mt->offset;
        t->regions[i].count = (size_t)mt->rows * (mt->cols ? mt->cols : 1);
        t->regions[i].decay = !mt->is_norm || cfg->decay_norms;
    }
    optim_config oc = {
        .kind = cfg->optimizer,
        .beta1 = cfg->beta1,
        .beta2 = cfg->beta2,
        .eps = cfg->eps,
        .weight_decay = cfg->weight_decay,
    };
    if ((st = optimizer_create(&t->opt, t->be, &oc, t->m.n_params, t->regions, t->m.n_tensors)))
        return st;
    return data_loader_init(&t->loader, &t->train, cfg->batch_size, cfg->seq_len,
                            (uint64_t)cfg->seed, t->rank, t->R);
}

// Auto capacity continues where the checkpoint was: its factor and its window's needs.
static moe_status trainer_resume_capacity(trainer *t, const capacity_state *c) {
    if (t->cap.plan.mode != CAPACITY_AUTO) return MOE_OK;
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

// Continues from a checkpoint of this run: parameters, optimizer, step, data order, skip
// counts; the logs keep the records up to its step.
static moe_status trainer_resume(trainer *t) {
    const moe_train_config *cfg = t->cfg;
    train_state ts;
    moe_status st;
    if ((st = checkpoint_load(t->resume, &t->m, &t->opt, &ts))) return st;
    st = trainer_resume_capacity(t, &ts.capacity);
    free(ts.capacity.need);
    if (st || (st = data_loader_set_state(&t->loader, &ts.loader))) return st;
    t->start_step = ts.step, t->res.skipped = ts.skipped,
    t->consecutive_skips = ts.consecutive_skips;
    t->res.steps_done = t->start_step;
    printf("resumed from %s at step %lld\n", t->resume, (long long)t->start_step);
    warn_schedule_change(cfg, t->resume, t->start_step);
    // the logs continue from the checkpoint: records of later steps are dropped
    if (t->rank) return MOE_OK; // rank 0 writes the logs
    if ((st = jsonl_keep_until(cfg->run_dir, "metrics.jsonl", t->start_step))) return st;
    return jsonl_keep_until(cfg->run_dir, "expert_load.jsonl", t->start_step);
}

// train.init_from: the weights of an HF folder (or a checkpoint); errors name the key.
static moe_status trainer_init_from(trainer *t) {
    char from[MOE_PATH_MAX + 64]; // a folder, or a `latest` file naming one
    moe_status st;
    if ((st = checkpoint_resolve(from, sizeof from, t->cfg->init_from)) ||
        (st = hf_config_check(from, &t->m.cfg)) || (st = hf_load_weights(&t->m, from)))
        return name_key(st, "train.init_from", t->cfg->init_from);
    printf("initialised from %s\n", from);
    return MOE_OK;
}

// The buffers of the steps: a micro-batch's tokens, the step's load, the load alert's, and
// the result's sums over the run.
static moe_status trainer_alloc(trainer *t) {
    const int L = t->L, E = t->E;
    step_load *sl = &t->sl;
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
    if (!t->inputs || !t->targets || !sl->routed || !sl->kept || !sl->micro_routed ||
        !sl->entropy || !sl->aux || !sl->seq_aux || !sl->z || !t->alerts ||
        alert_window_init(&t->aw, t->cfg->alert_window, L, E))
        return out_of_memory();
    return MOE_OK;
}

// The result's per-expert sums and memory figures (after the header, as they always were).
static moe_status trainer_alloc_result(trainer *t) {
    trainer_result *r = &t->res;
    r->n_layers = t->L, r->n_experts = t->E;
    r->routed = calloc((size_t)t->L * t->E, sizeof(long));
    r->kept = calloc((size_t)t->L * t->E, sizeof(long));
    r->last_stats = calloc((size_t)t->L, sizeof(moe_stats));
    if (!r->routed || !r->kept || !r->last_stats) return out_of_memory();
    model_memory(&t->m, &r->param_bytes, &r->grad_bytes, &r->activation_bytes);
    r->optimizer_bytes = t->opt.m ? 2 * t->m.n_params * sizeof(real) : 0;
    return MOE_OK;
}

static void trainer_print_header(const trainer *t) {
    const moe_train_config *cfg = t->cfg;
    char data_line[2 * MOE_PATH_MAX + 256];
    snprintf(data_line, sizeof data_line,
             "data: %s (%llu tokens), %s (%llu tokens); %d x %d tokens x %d micro-batches per step",
             t->train.path, (unsigned long long)t->train.count, t->val.path,
             (unsigned long long)t->val.count, cfg->batch_size, cfg->seq_len, cfg->grad_accum);
    const run_memory mem = memory_of(&t->m, cfg);
    print_header(cfg, &t->m.cfg, t->m.n_params, t->m.n_dense, &mem, NULL, data_line, t->be);
    printf("note: aux is Switch/Megatron-normalised (balanced = aux_coef); HF's helper reports "
           "top_k times this\n");
    if (t->R > 1 && !t->m.placement) // the figures above are rank 0's: its experts and buffers
        printf("expert parallelism: %d ranks (%s), groups of %d: each rank holds experts %d..%d "
               "of %d and trains on its own %d x %d tokens x %d micro-batches; memory and "
               "parameters above are per rank\n",
               t->R, t->world->name, t->m.ep ? t->m.ep->size : 1, t->m.expert0,
               t->m.expert0 + t->m.E_local - 1, t->E, cfg->batch_size, cfg->seq_len,
               cfg->grad_accum);
    if (t->R > 1 && t->m.placement) { // parallel.expert_placement: the global experts of each rank
        const int El = t->m.E_local;
        printf("expert parallelism: %d ranks (%s), groups of %d, %d experts placed by "
               "parallel.expert_placement:",
               t->R, t->world->name, t->m.ep ? t->m.ep->size : 1, t->E);
        for (int s = 0; s < t->E; s++) {
            if (s % El == 0) printf("%s rank %d [", s ? "]," : "", s / El);
            printf("%s%d", s % El ? ", " : "", t->m.placement[s]);
        }
        printf("]; each trains on its own %d x %d tokens x %d micro-batches; memory and "
               "parameters above are per rank\n",
               cfg->batch_size, cfg->seq_len, cfg->grad_accum);
    }
}

// Everything up to the first step: model, optimizer, data, where the run starts (a
// checkpoint of this run, an HF folder, or the initialisation), the logs, the header.
static moe_status trainer_open(trainer *t, const moe_train_config *cfg, const char *resume,
                               const trainer_hooks *hooks) {
    t->cfg = cfg, t->resume = resume, t->hooks = hooks;
    t->res.last_val_loss = NAN;
    moe_status st;
    if ((st = trainer_open_model(t))) return st;
    t->L = t->m.cfg.n_layers, t->E = t->m.cfg.moe.n_experts;
    if ((st = capacity_ctl_init(&t->cap, &cfg->capacity, cfg->model.moe.capacity_factor, t->L)))
        return st;
    t->timer.be = t->be;
    if (cfg->timing) model_set_timer(&t->m, &t->timer);
    if (cfg->coactivation) {
        if (!(t->coact = calloc((size_t)t->L * t->E * t->E, sizeof *t->coact)))
            return out_of_memory();
        for (int l = 0; l < t->L; l++) t->m.moe[l].coactivation = 1;
    }
    snprintf(t->ckpt_root, sizeof t->ckpt_root, "%s/ckpt", cfg->run_dir);
    if (resume)
        st = trainer_resume(t);
    else if (cfg->init_from[0])
        st = trainer_init_from(t);
    if (st) return st;
    const char *log_dir = t->rank ? "/dev" : cfg->run_dir; // rank 0 writes the logs
    if ((st = jsonl_open(&t->metrics, log_dir, t->rank ? "null" : "metrics.jsonl",
                         resume != NULL)) ||
        (st = jsonl_open(&t->load_log, log_dir, t->rank ? "null" : "expert_load.jsonl",
                         resume != NULL)))
        return st;
    t->T = (size_t)cfg->batch_size * (size_t)cfg->seq_len;
    if ((st = trainer_alloc(t))) return st;
    trainer_print_header(t);
    if ((st = trainer_alloc_result(t))) return st;
    t->t_start = now_s();
    return MOE_OK;
}

// A cross-entropy whose perplexity exp(CE) overflows a double (CE > ln(DBL_MAX) = 709.78
// nats/token) is no result either: the model gives the data a probability below e^-709 per
// token, which only damaged weights do (a norm weight of 1e30 gives CE 1.7e29). Such a
// forward is skipped like a NaN (and train.max_skipped of them in a row stop the run).
#define TRAIN_MAX_CE log(DBL_MAX)

// The forward and backward of every micro-batch; a non-finite forward (or one beyond
// TRAIN_MAX_CE) stops the step with s->finite = 0 (not an error: the step is skipped).
static moe_status trainer_micro_batches(trainer *t, step_result *s) {
    const moe_train_config *cfg = t->cfg;
    moe_status st;
    // R ranks x grad_accum micro-batches are one rank's R x grad_accum: rank r's micro-batch
    // g is micro-batch g R + r of that (its data block and its jitter noise)
    const int n_micro = cfg->grad_accum * t->R;
    s->finite = 1;
    for (int micro = 0; micro < cfg->grad_accum; micro++) {
        data_loader_next(&t->loader, t->inputs, t->targets);
        t->m.noise_key = trainer_noise_key((uint64_t)cfg->seed, s->step, micro * t->R + t->rank);
        st = model_forward(&t->m, t->inputs, t->targets, cfg->batch_size, cfg->seq_len, 1);
        long bad[2] = {st == MOE_ENUMERIC || (!st && !isfinite(t->m.ce + t->m.aux + t->m.z)),
                       !st && t->m.ce > TRAIN_MAX_CE};
        if (t->R > 1) t->world->allreduce_sum_long(t->world, bad, 2); // one rank's NaN: all
        if (bad[0] || bad[1]) {
            s->finite = 0;
            s->ce_overflow = !bad[0];
            return MOE_OK;
        }
        if (st) return st;
        step_load_add(&t->sl, &t->m);
        s->ce += t->m.ce / n_micro;
        s->aux += t->m.aux / n_micro;
        s->z += t->m.z / n_micro;
        if ((st = model_backward(&t->m, 1.0 / n_micro))) return st;
    }
    return MOE_OK;
}

// Expert parallelism, after the micro-batches: gradients summed (dense over the world, experts
// over the ranks holding the same ones), the losses and the load statistics summed over the
// world, the micro-batch counts gathered in the single-rank order (g R + r).
static void trainer_reduce_step(trainer *t, step_result *s) {
    moe_comm *w = t->world;
    step_load *sl = &t->sl;
    const int L = t->L, E = t->E, G = t->cfg->grad_accum, R = t->R;
    model_reduce_grads(&t->m, w, t->edp);
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

// The gradients of one step and their norm (the update is trainer_update's).
static moe_status trainer_step(trainer *t, step_result *s) {
    const moe_train_config *cfg = t->cfg;
    const trainer_hooks *h = t->hooks;
    s->lr = lr_at_step(cfg->schedule, cfg->lr, cfg->min_lr, cfg->warmup_steps,
                       h && h->schedule_steps ? h->schedule_steps : cfg->steps, s->step);
    s->capacity_factor = capacity_ctl_factor(&t->cap, cfg->model.moe.capacity_factor, s->step);
    model_set_capacity_factor(&t->m, s->capacity_factor);
    model_zero_grads(&t->m);
    step_load_reset(&t->sl, t->L, t->E);
    for (int l = 0; l < t->L && (t->R > 1 || t->cfg->timing); l++)
        moe_layer_exchange_reset(&t->m.moe[l]);
    memset(t->timer.s, 0, sizeof t->timer.s);
    for (int l = 0; l < t->L && t->coact; l++)
        memset(t->m.moe[l].coact, 0, (size_t)t->E * t->E * sizeof(long));
    moe_status st = trainer_micro_batches(t, s);
    if (st) return st;
    if (h && s->step >= h->nan_from && s->step <= h->nan_to && h->nan_from >= 0) {
        real nan_value = NAN; // test-only: poison the last layer's w2
        const model_config *mc = &t->m.cfg;
        t->be->copy_to_device(t->be,
                              t->m.g.w2 + (size_t)(t->L - 1) * t->E * mc->d_model * mc->moe.d_ff,
                              &nan_value, sizeof nan_value);
    }
    if (t->R > 1) trainer_reduce_step(t, s);
    const double ss = model_grad_sum_squares(&t->m); // each expert once
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
    trainer_result *r = &t->res;
    r->skipped++;
    t->consecutive_skips++;
    fprintf(stderr,
            "warning: step %lld: %s; first non-finite gradient: %s; update "
            "skipped (%lld consecutive, %lld in all)\n",
            (long long)s->step + 1,
            s->ce_overflow ? "cross-entropy beyond 709.78 nats/token (its perplexity overflows: "
                             "damaged weights?)"
            : !s->finite || !isfinite(s->loss) ? "non-finite loss"
                                               : "non-finite gradient norm",
            s->finite ? first_nonfinite_grad(&t->m) : "not computed (forward failed)",
            (long long)t->consecutive_skips, (long long)r->skipped);
    cJSON *rec = cJSON_CreateObject();
    cJSON_AddNumberToObject(rec, "step", (double)s->step + 1);
    cJSON_AddNumberToObject(rec, "loss", s->finite ? s->loss : NAN);
    cJSON_AddNumberToObject(rec, "grad_norm", s->grad_norm);
    cJSON_AddBoolToObject(rec, "skipped", 1);
    cJSON_AddNumberToObject(rec, "skipped_total", (double)r->skipped);
    moe_status st = jsonl_write(&t->metrics, rec);
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
    optimizer_step(&t->opt, t->m.params, model_bf16_for_update(&t->m), t->m.grads, s->lr,
                   clip_scale(s->grad_norm, t->cfg->grad_clip));
    if (t->m.router_bias) update_router_bias(&t->m, t->sl.routed, t->cfg->bias_rate);
    if (t->be->synchronize) t->be->synchronize(t->be);
    s->optimizer_s = moe_clock_s() - o0;
    s->dt = now_s() - t0;
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
    for (int l = 0; l < t->L; l++) // slots (i, j), i < j, to global experts (gi, gj), gi < gj
        for (int i = 0; i < E; i++)
            for (int j = i + 1; j < E; j++) {
                int gi = model_expert_global(&t->m, i), gj = model_expert_global(&t->m, j);
                if (gi > gj) {
                    const int x = gi;
                    gi = gj, gj = x;
                }
                t->coact[l * EE + (size_t)gi * E + gj] += t->m.moe[l].coact[(size_t)i * E + j];
            }
    t->coact_steps++;
}

// Auto capacity, after a finite step: each layer's need from its micro-batches' counts
// (every rank has the same gathered counts); at a window's end the factor of the next steps.
static void trainer_capacity(trainer *t, step_result *s) {
    if (t->cap.plan.mode != CAPACITY_AUTO) return;
    const int L = t->L, E = t->E, G = t->sl.micro;
    double *need = malloc((size_t)L * sizeof *need);
    long *counts = malloc((size_t)G * E * sizeof *counts);
    if (!need || !counts) moe_fatal("trainer: out of memory");
    for (int l = 0; l < L; l++) {
        for (int g = 0; g < G; g++)
            memcpy(counts + (size_t)g * E, t->sl.micro_routed + ((size_t)g * L + l) * E,
                   (size_t)E * sizeof *counts);
        need[l] = capacity_needed_factor(counts, G, E, (long)t->T, t->cfg->model.moe.top_k,
                                         t->cap.plan.max_drop);
    }
    s->capacity_decided = capacity_ctl_observe(&t->cap, need, s->step, &s->capacity);
    // the same inputs give the same decision on every rank; rank 0's is the one kept anyway
    if (s->capacity_decided && t->R > 1)
        t->world->broadcast(t->world, &t->cap.factor, sizeof t->cap.factor, 0);
    if (s->capacity_decided && t->rank == 0 && s->capacity.new_factor != s->capacity.old_factor)
        printf("capacity: step %lld: capacity_factor %.4g -> %.4g (%s)\n", (long long)s->step + 1,
               s->capacity.old_factor, t->cap.factor, s->capacity.why);
    free(need), free(counts);
}

// Layer l's exchanges in the step, from every rank (collective): exchange_bytes = the bytes
// that crossed between ranks, exchange_s = the longest time a rank spent in them; per rank its
// time (the straggler signal: a rank that waits long waits for a hot one), the rows its
// experts received, and the R x R matrix of bytes rank i sent to rank j.
static void trainer_log_exchange(trainer *t, int l, cJSON *rec) {
    const moe_layer *L = &t->m.moe[l];
    const int R = t->R, ep = L->ep_size, group0 = t->rank / ep * ep;
    double *mine = calloc((size_t)R + 2, sizeof(double)),
           *all = malloc((size_t)R * (R + 2) * sizeof(double));
    if (!mine || !all) moe_fatal("trainer: out of memory");
    for (int j = 0; j < ep; j++) mine[group0 + j] = (double)L->sent_bytes[j];
    mine[R] = (double)L->received_rows, mine[R + 1] = L->exchange_s;
    t->world->allgather(t->world, all, mine, (size_t)(R + 2) * sizeof(double));
    double crossed = 0, longest = 0;
    cJSON *matrix = cJSON_CreateArray(), *rows = cJSON_CreateArray(), *wait = cJSON_CreateArray();
    for (int i = 0; i < R; i++) {
        const double *r = all + (size_t)i * (R + 2);
        cJSON *row = cJSON_CreateArray();
        for (int j = 0; j < R; j++) {
            cJSON_AddItemToArray(row, cJSON_CreateNumber(r[j]));
            if (j != i) crossed += r[j];
        }
        cJSON_AddItemToArray(matrix, row);
        cJSON_AddItemToArray(rows, cJSON_CreateNumber(r[R]));
        cJSON_AddItemToArray(wait, cJSON_CreateNumber(r[R + 1]));
        longest = r[R + 1] > longest ? r[R + 1] : longest;
    }
    cJSON_AddNumberToObject(rec, "exchange_bytes", crossed);
    cJSON_AddNumberToObject(rec, "exchange_s", longest);
    cJSON_AddItemToObject(rec, "exchange_wait_s", wait);
    cJSON_AddItemToObject(rec, "received_rows", rows);
    cJSON_AddItemToObject(rec, "exchange_matrix", matrix);
    free(mine), free(all);
}

// Layer l's expert_load.jsonl record of the step.
// The hot-expert path of layer l on this rank: its experts' seconds in the step (forward and
// backward GEMMs and SwiGLU), apportioned to its local experts by the rows each computed:
// "expert_s" {"max", "max_expert", "min", "min_expert", "all"}. An estimate: one grouped call
// computes every local expert, so their times are not measured apart.
static void trainer_log_expert_time(trainer *t, int l, cJSON *rec) {
    const moe_layer *L = &t->m.moe[l];
    const long *kept = t->sl.kept + (size_t)l * t->E; // global order
    long rows = 0;
    int hot = -1, cold = -1; // global experts of this rank's slots
    for (int s = t->m.expert0; s < t->m.expert0 + t->m.E_local; s++) {
        const int e = model_expert_global(&t->m, s);
        rows += kept[e];
        if (hot < 0 || kept[e] > kept[hot]) hot = e;
        if (cold < 0 || kept[e] < kept[cold]) cold = e;
    }
    cJSON *o = cJSON_AddObjectToObject(rec, "expert_s");
    cJSON_AddNumberToObject(o, "max", rows ? L->experts_s * kept[hot] / rows : 0);
    cJSON_AddNumberToObject(o, "max_expert", hot);
    cJSON_AddNumberToObject(o, "min", rows ? L->experts_s * kept[cold] / rows : 0);
    cJSON_AddNumberToObject(o, "min_expert", cold);
    cJSON_AddNumberToObject(o, "all", L->experts_s);
}

static moe_status trainer_log_layer(trainer *t, const step_result *s, int l, double mom, double cv,
                                    long dropped) {
    const int L = t->L, E = t->E;
    const step_load *sl = &t->sl;
    const long *routed = sl->routed + (size_t)l * E, *kept = sl->kept + (size_t)l * E;
    cJSON *rec = cJSON_CreateObject();
    cJSON_AddNumberToObject(rec, "step", (double)s->step + 1);
    cJSON_AddNumberToObject(rec, "layer", l);
    cJSON_AddNumberToObject(rec, "tokens", (double)t->T * sl->micro);
    cJSON_AddNumberToObject(rec, "capacity", t->m.moe_stats[l].capacity);
    cJSON_AddItemToObject(rec, "counts", json_int_array(routed, E));
    cJSON_AddItemToObject(rec, "kept", json_int_array(kept, E));
    if (sl->micro > 1) {
        cJSON *micro = cJSON_AddArrayToObject(rec, "micro_counts");
        for (int i = 0; i < sl->micro; i++)
            cJSON_AddItemToArray(micro,
                                 json_int_array(sl->micro_routed + ((size_t)i * L + l) * E, E));
    }
    cJSON_AddNumberToObject(rec, "dropped", (double)dropped);
    cJSON_AddNumberToObject(rec, "max_over_mean", mom);
    cJSON_AddNumberToObject(rec, "cv", cv);
    cJSON_AddNumberToObject(rec, "entropy", sl->entropy[l] / sl->micro);
    cJSON_AddNumberToObject(rec, "aux", sl->aux[l] / sl->micro);
    cJSON_AddNumberToObject(rec, "z", sl->z[l] / sl->micro);
    cJSON_AddNumberToObject(rec, "seq_aux", sl->seq_aux[l] / sl->micro);
    if (t->m.router_bias) {
        real *b = malloc((size_t)E * sizeof(real));
        if (!b) {
            cJSON_Delete(rec);
            return out_of_memory();
        }
        t->be->copy_to_host(t->be, b, t->m.router_bias + (size_t)l * E, (size_t)E * sizeof(real));
        model_placement_permute(&t->m, b, 1, 1, 1); // global expert order
        cJSON *arr = cJSON_AddArrayToObject(rec, "bias");
        for (int e = 0; e < E; e++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(b[e]));
        free(b);
    } else {
        cJSON_AddNullToObject(rec, "bias");
    }
    const moe_stats *ms = &t->m.moe_stats[l]; // router logits: the step's last micro-batch
    cJSON_AddNumberToObject(rec, "logit_mean", ms->logit_mean);
    cJSON_AddNumberToObject(rec, "logit_std", ms->logit_std);
    cJSON_AddNumberToObject(rec, "logit_max_abs", ms->logit_max_abs);
    cJSON_AddNumberToObject(rec, "lse_mean", ms->lse_mean);
    if (t->cfg->timing) trainer_log_expert_time(t, l, rec);
    if (s->coact_log) { // the upper triangle, row by row: (0,1), (0,2), ..., (E-2, E-1)
        cJSON *c = cJSON_AddArrayToObject(rec, "coactivation");
        const long *m = t->coact + (size_t)l * E * E;
        for (int i = 0; i < E; i++)
            for (int j = i + 1; j < E; j++)
                cJSON_AddItemToArray(c, cJSON_CreateNumber((double)m[(size_t)i * E + j]));
        cJSON_AddNumberToObject(rec, "coactivation_steps", (double)t->coact_steps);
    }
    if (t->R > 1) {
        cJSON_AddNumberToObject(rec, "ranks", t->R); // micro_counts: grad_accum x ranks groups
        trainer_log_exchange(t, l, rec);
    } else {
        cJSON_AddNumberToObject(rec, "exchange_bytes", 0);
        cJSON_AddNumberToObject(rec, "exchange_s", 0);
    }
    return jsonl_write(&t->load_log, rec);
}

// Expert load, one record per MoE layer; the load alert's window gets the step's values;
// the result sums the run's counts.
static moe_status trainer_log_load(trainer *t, step_result *s) {
    const int L = t->L, E = t->E;
    alert_window *aw = &t->aw;
    double drop_sum = 0, routed_sum = 0;
    moe_status st;
    s->worst_mom = 0, s->worst_layer = 0;
    const int64_t step = s->step;
    s->coact_log = t->coact && ((step + 1) % t->cfg->interval == 0 || step + 1 == t->cfg->steps);
    if (s->coact_log && t->R > 1) // every rank's tokens
        t->world->allreduce_sum_long(t->world, t->coact, (size_t)L * E * E);
    for (int l = 0; l < L; l++) {
        const long *routed = t->sl.routed + (size_t)l * E, *kept = t->sl.kept + (size_t)l * E;
        double mom, cv;
        int hot;
        moe_load_summary(routed, E, &mom, &cv, &hot);
        long dropped = 0, total = 0;
        for (int e = 0; e < E; e++) dropped += routed[e] - kept[e], total += routed[e];
        drop_sum += dropped, routed_sum += total;
        if (mom > s->worst_mom) s->worst_mom = mom, s->worst_layer = l;
        for (int e = 0; e < E; e++) // the load alert's window (pushed after the layers)
            if (routed[e] > 0) aw->last_seen[(size_t)l * E + e] = s->step + 1;
        aw->mom[(size_t)l * aw->W + aw->head] = l == 0 ? test_load_override(s->step + 1, mom) : mom;
        aw->hot[(size_t)l * aw->W + aw->head] = hot;
        if ((st = trainer_log_layer(t, s, l, mom, cv, dropped))) return st;
    }
    if (s->coact_log) {
        memset(t->coact, 0, (size_t)L * E * E * sizeof *t->coact);
        t->coact_steps = 0;
    }
    s->drop_frac = routed_sum > 0 ? drop_sum / routed_sum : 0;
    s->tok_per_s = (double)t->T * t->cfg->grad_accum * t->R / s->dt; // all ranks' tokens
    for (size_t i = 0; i < (size_t)L * E; i++)
        t->res.routed[i] += t->sl.routed[i], t->res.kept[i] += t->sl.kept[i];
    for (int l = 0; l < L; l++) t->res.last_stats[l] = t->m.moe_stats[l];
    if (s->step > t->start_step) t->step_tps[t->n_tps++ % TPS_WINDOW] = s->tok_per_s;
    return MOE_OK;
}

// Validation every train.eval_interval steps and at the last one.
static moe_status trainer_validate(trainer *t, step_result *s) {
    const moe_train_config *cfg = t->cfg;
    s->evaluated = 0, s->val_loss = NAN;
    if (!((cfg->eval_interval > 0 && (s->step + 1) % cfg->eval_interval == 0) ||
          s->step + 1 == cfg->steps))
        return MOE_OK;
    const double v0 = moe_clock_s();
    model_set_timer(&t->m, NULL); // its forwards are not the step's phases
    moe_status st = validate(&t->m, &t->val, cfg, t->inputs, t->targets, &s->val_loss);
    if (cfg->timing) model_set_timer(&t->m, &t->timer);
    if (st) return st;
    s->val_s = moe_clock_s() - v0;
    t->res.last_val_loss = s->val_loss;
    s->evaluated = 1;
    return MOE_OK;
}

// metrics.jsonl's "time": this rank's seconds per phase of the step (layers/timing.h; forward
// and backward of every micro-batch), the optimizer's, the exchanges' (the MoE layers' time in
// them: waiting included), the validation's, and the checkpoint save after the previous step.
static void trainer_log_time(trainer *t, const step_result *s, cJSON *rec) {
    cJSON *o = cJSON_AddObjectToObject(rec, "time");
    for (int p = 0; p < MOE_T_PHASES; p++)
        cJSON_AddNumberToObject(o, moe_phase_names[p], t->timer.s[p]);
    double exchange = 0;
    for (int l = 0; l < t->L; l++) exchange += t->m.moe[l].exchange_s;
    cJSON_AddNumberToObject(o, "optimizer", s->optimizer_s);
    cJSON_AddNumberToObject(o, "exchange_wait", exchange);
    cJSON_AddNumberToObject(o, "validation", s->evaluated ? s->val_s : 0);
    cJSON_AddNumberToObject(o, "checkpoint", t->ckpt_s);
    t->ckpt_s = 0;
}

// The step's metrics.jsonl record.
static moe_status trainer_log_metrics(trainer *t, const step_result *s) {
    cJSON *rec = cJSON_CreateObject();
    cJSON_AddNumberToObject(rec, "step", (double)s->step + 1);
    cJSON_AddNumberToObject(rec, "loss", s->loss);
    cJSON_AddNumberToObject(rec, "ce", s->ce);
    cJSON_AddNumberToObject(rec, "aux", s->aux);
    cJSON_AddNumberToObject(rec, "z", s->z);
    cJSON_AddNumberToObject(rec, "lr", s->lr);
    cJSON_AddNumberToObject(rec, "grad_norm", s->grad_norm);
    cJSON_AddNumberToObject(rec, "tokens_per_s", s->tok_per_s);
    cJSON_AddNumberToObject(rec, "step_s", s->dt);
    cJSON_AddNumberToObject(rec, "max_over_mean", s->worst_mom);
    cJSON_AddNumberToObject(rec, "drop_frac", s->drop_frac);
    cJSON_AddNumberToObject(rec, "skipped_total", (double)t->res.skipped);
    if (s->evaluated) cJSON_AddNumberToObject(rec, "val_loss", s->val_loss);
    cJSON_AddNumberToObject(rec, "capacity_factor", s->capacity_factor);
    if (t->cfg->timing) trainer_log_time(t, s, rec);
    if (s->capacity_decided) {
        const capacity_decision *d = &s->capacity;
        cJSON *c = cJSON_AddObjectToObject(rec, "capacity_decision");
        cJSON_AddNumberToObject(c, "old", d->old_factor);
        cJSON_AddNumberToObject(c, "new", d->new_factor);
        cJSON_AddNumberToObject(c, "p99_need", d->p99);
        cJSON_AddNumberToObject(c, "layer", d->p99_layer);
        cJSON_AddStringToObject(c, "why", d->why);
    }
    return jsonl_write(&t->metrics, rec);
}

// train.load_alert_action = "stop": the error of the first step in alert.
static moe_status alert_stop(const moe_train_config *cfg, int64_t step, int l,
                             const alert_verdict *v) {
    char why[400];
    if (v->overload)
        snprintf(why, sizeof why,
                 "median max/mean load %.2f over steps %lld-%lld, hottest expert %d "
                 "(log.load_alert = %.2f",
                 v->median, v->from, v->to, v->expert, cfg->load_alert);
    else
        snprintf(why, sizeof why, "%d dead expert%s (no token in steps %lld-%lld):%s (", v->n_dead,
                 v->n_dead == 1 ? "" : "s", v->from, v->to, v->dead_list);
    return moe_error(MOE_ENUMERIC,
                     "stopping at step %lld: layer %d: %s%slog.alert_window = %lld, "
                     "log.alert_after = %lld, train.load_alert_action = \"stop\")",
                     (long long)step + 1, l, why, v->overload ? ", " : "",
                     (long long)cfg->alert_window, (long long)cfg->alert_after);
}

// The load alert: past the grace, the step enters the window; on a full window each layer's
// verdict stops the run ("stop") or is kept for the next console line ("warn").
static moe_status trainer_alerts(trainer *t, int64_t step) {
    const moe_train_config *cfg = t->cfg;
    alert_window *aw = &t->aw;
    if (step + 1 > cfg->alert_after) {
        aw->step[aw->head] = step + 1;
        aw->head = (aw->head + 1) % aw->W;
        if (aw->n < aw->W) aw->n++;
    }
    for (int l = 0; aw->n == aw->W && l < t->L; l++) {
        const alert_verdict v = alert_window_eval(aw, l, t->E, cfg->load_alert);
        if (!v.overload && !v.n_dead) continue;
        if (cfg->load_alert_action == MOE_ALERT_STOP) return alert_stop(cfg, step, l, &v);
        load_alert *a = &t->alerts[l];
        if (v.overload) {
            if (!a->n_load || v.median > a->load.median) a->load = v, a->step = step + 1;
            a->n_load++;
        }
        if (v.n_dead) a->dead = v, a->dead_step = step + 1, a->n_dead++;
    }
    return MOE_OK;
}

// The warnings of the layers in alert since the last console line, then a fresh count.
static void trainer_print_alerts(trainer *t) {
    const moe_train_config *cfg = t->cfg;
    for (int l = 0; l < t->L; l++) {
        const load_alert *a = &t->alerts[l];
        if (a->n_load)
            fprintf(stderr,
                    "warning: step %lld layer %d: median max/mean load %.2f over steps "
                    "%lld-%lld, hottest expert %d (log.load_alert = %.2f; %lld step%s in "
                    "alert since the last report)\n",
                    a->step, l, a->load.median, a->load.from, a->load.to, a->load.expert,
                    cfg->load_alert, a->n_load, a->n_load == 1 ? "" : "s");
        if (a->n_dead)
            fprintf(stderr,
                    "warning: step %lld layer %d: %d dead expert%s (no token in steps "
                    "%lld-%lld):%s (%lld step%s in alert since the last report)\n",
                    a->dead_step, l, a->dead.n_dead, a->dead.n_dead == 1 ? "" : "s", a->dead.from,
                    a->dead.to, a->dead.dead_list, a->n_dead, a->n_dead == 1 ? "" : "s");
    }
    memset(t->alerts, 0, (size_t)t->L * sizeof *t->alerts);
}

// The console line, every log.interval steps, at the first, the last and on validation.
static void trainer_print_step(trainer *t, const step_result *s) {
    const moe_train_config *cfg = t->cfg;
    const int64_t step = s->step;
    if (!((step + 1) % cfg->interval == 0 || step == 0 || step + 1 == cfg->steps || s->evaluated))
        return;
    char eta[32];
    const double elapsed = now_s() - t->t_start;
    format_duration(eta, sizeof eta,
                    elapsed / (step + 1 - t->start_step) * (cfg->steps - step - 1));
    printf("step %5lld/%lld | loss %.4f (ce %.4f aux %.4f z %.4f) | lr %.2e | gnorm %.3f | "
           "%.0f tok/s | ETA %s | load max/mean %.2f (L%d) | drop %.2f%%",
           (long long)step + 1, (long long)cfg->steps, s->loss, s->ce, s->aux, s->z, s->lr,
           s->grad_norm, s->tok_per_s, eta, s->worst_mom, s->worst_layer, 100 * s->drop_frac);
    if (s->evaluated) printf(" | val %.4f", s->val_loss);
    printf("\n");
    fflush(stdout);
    trainer_print_alerts(t); // warn ("stop" acted in trainer_alerts, on every step)
}

// A checkpoint every checkpoint.interval steps and at the end. Under expert parallelism the
// save is collective: the ranks of the first EP group write their experts' shards, rank 0 the
// rest (train/ckpt/checkpoint.h); every rank returns the same status.
static moe_status trainer_checkpoint(trainer *t, int64_t step) {
    if (!checkpoint_due(t->cfg, t->hooks, step)) return MOE_OK;
    train_state ts = {.step = step + 1,
                      .skipped = t->res.skipped,
                      .consecutive_skips = t->consecutive_skips,
                      .world_size = t->R,
                      .ep_size = t->m.ep ? t->m.ep->size : 1,
                      .capacity = {.present = t->cap.plan.mode == CAPACITY_AUTO,
                                   .factor = t->cap.factor,
                                   .n = t->cap.n,
                                   .L = t->L,
                                   .need = t->cap.need}};
    data_loader_get_state(&ts.loader, &t->loader);
    const char *shard_env = getenv("MOE_TEST_SHARD_BYTES"); // test-only
    uint64_t shard = shard_env ? strtoull(shard_env, NULL, 10) : CHECKPOINT_SHARD_BYTES;
    const double c0 = moe_clock_s();
    moe_status st = checkpoint_save(t->ckpt_root, &t->m, &t->opt, &ts, t->cfg, t->cfg->ckpt_keep,
                                    shard, t->R > 1 ? t->world : NULL);
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
    const double t0 = now_s();
    step_result s = {.step = step};
    moe_status st = trainer_step(t, &s);
    if (st) return st;
    if (!step_is_finite(&s)) return trainer_skip(t, &s);
    trainer_update(t, &s, t0);
    trainer_capacity(t, &s);
    trainer_coactivation(t);
    if ((st = trainer_log_load(t, &s)) || (st = trainer_validate(t, &s)) ||
        (st = trainer_log_metrics(t, &s)) || (st = trainer_alerts(t, step)))
        return st;
    trainer_print_step(t, &s);
    return trainer_checkpoint(t, step);
}

// The result's timing and the closing line.
static void trainer_finish(trainer *t) {
    trainer_result *r = &t->res;
    r->seconds = now_s() - t->t_start;
    r->median_tokens_per_s =
        t->n_tps ? median_of(t->step_tps, t->n_tps < TPS_WINDOW ? (int)t->n_tps : TPS_WINDOW) : NAN;
    char val_part[64] = "no validation at the end"; // a skipped last step, or stopped early
    if (isfinite(r->last_val_loss))
        snprintf(val_part, sizeof val_part, "val loss %.4f", r->last_val_loss);
    printf("done: %lld steps in %.1f s, final loss %.4f, %s, %lld skipped\n",
           (long long)r->steps_done, r->seconds, r->last_loss, val_part, (long long)r->skipped);
}

// Frees what trainer_open got to and hands the result over; st is the run's status, or the
// logs' when they fail to close (a failed close loses the last records).
static moe_status trainer_close(trainer *t, moe_status st, trainer_result *result) {
    if (result)
        *result = t->res;
    else
        trainer_result_free(&t->res);
    for (int i = 0; i < 2; i++) {
        jsonl_file *j = i ? &t->load_log : &t->metrics;
        if (st && j->f)
            fclose(j->f);
        else if (!st)
            st = jsonl_close(j);
    }
    step_load *sl = &t->sl;
    free(t->inputs), free(t->targets), free(t->regions);
    free(sl->routed), free(sl->kept), free(sl->micro_routed), free(sl->entropy), free(sl->aux),
        free(sl->seq_aux), free(sl->z);
    free(t->alerts);
    alert_window_free(&t->aw);
    capacity_ctl_free(&t->cap);
    free(t->coact);
    data_loader_free(&t->loader);
    optimizer_destroy(&t->opt);
    model_destroy(&t->m);
    if (t->ep) t->ep->destroy(t->ep);
    if (t->edp) t->edp->destroy(t->edp);
    // a failed run keeps the world: the caller's moe_fatal ends every rank (MPI_Abort)
    if (t->world && (!st || t->R == 1)) t->world->destroy(t->world);
    moe_backend_destroy(t->be); // after the communicators (an NCCL one uses its device)
    token_file_free(&t->train);
    token_file_free(&t->val);
    return st;
}

// RUN_DIR/config.cfg: the resolved config of the run.
// Written to config.cfg.tmp and renamed: a reader (moe stats --watch on a starting run) sees
// no config.cfg or the whole one, never a partial file whose missing keys read as defaults.
static moe_status write_run_config(const moe_train_config *cfg) {
    char path[MOE_PATH_MAX + 32], tmp[MOE_PATH_MAX + 48];
    snprintf(path, sizeof path, "%s/config.cfg", cfg->run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return moe_error(MOE_EIO, "%s: cannot write the resolved config: %s", tmp, strerror(errno));
    moe_status st = moe_train_config_write(cfg, f);
    if (st) fclose(f);
    if (!st) st = file_close_checked(f, tmp); // a full disk shows here at the latest
    if (!st && rename(tmp, path) != 0)
        st = moe_error(MOE_EIO, "%s: cannot rename to config.cfg: %s", tmp, strerror(errno));
    if (st) remove(tmp);
    return st;
}

// Every rank must train the same run: the resolved configs are hashed and compared
// (train/launch.h; `moe train` compared the rest of its intent before); a rank whose config
// differs from rank 0's is named.
static moe_status trainer_same_config(trainer *t, const moe_train_config *cfg) {
    launch_intent me = {.command = "train", .config_hash = launch_config_hash(cfg)};
    me.resume_step = -1;
    return launch_agree(t->world, &me);
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
    if (t->rank == 0) st = file_make_dirs(cfg->run_dir);
    if (t->rank == 0 && !st) st = write_run_config(cfg);
    return rank0_status(t, st, "create the run directory (log.dir)");
}

moe_status trainer_run(const moe_train_config *cfg, const char *resume, const trainer_hooks *hooks,
                       trainer_result *result) {
    trainer_result empty = {0};
    empty.last_val_loss = NAN;
    if (result) *result = empty; // the early returns below leave an empty, freeable result
    moe_status st;
    if (resume) { // a finished run: nothing to do (and nothing written)
        int64_t finished;
        if ((st = resume_finished(resume, cfg->steps, &finished))) return st;
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
