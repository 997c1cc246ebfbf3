// A run directory (train/run_dir.h): what it holds, clearing it for --overwrite, resolving
// --resume, the run's config.cfg, and what a resume learns from its checkpoint before the
// trainer opens anything: that the run is already finished, or that its schedule changed.
#define _POSIX_C_SOURCE 200809L // lstat, dirent

#include "train/run_dir.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/files.h"
#include "optim/optimizer.h"
#include "ckpt/checkpoint.h"
#include "train/log.h"

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

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

int moe_trainer_run_dir_holds(const char *run_dir, char *what, size_t n) {
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

moe_status moe_trainer_clear_run_dir(const char *run_dir) {
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

moe_status moe_trainer_resolve_resume(char *out, size_t n, const char *arg) {
    char path[MOE_PATH_MAX + 32];
    struct stat sb;
    snprintf(out, n, "%s", arg);
    if (stat(arg, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return MOE_OK;                                       // `latest`, or missing:
                                                             // moe_checkpoint_load says so
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

// Written to config.cfg.tmp and renamed: a reader (moe stats --watch on a starting run) sees
// no config.cfg or the whole one, never a partial file whose missing keys read as defaults.
moe_status moe_run_dir_write_config(const moe_train_config *cfg) {
    char path[MOE_PATH_MAX + 32], tmp[MOE_PATH_MAX + 48];
    snprintf(path, sizeof path, "%s/config.cfg", cfg->run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return moe_error(MOE_EIO, "%s: cannot write the resolved config: %s", tmp, strerror(errno));
    moe_status st = moe_train_config_write(cfg, f);
    if (st) fclose(f);
    if (!st) st = moe_file_close_checked(f, tmp); // a full disk shows here at the latest
    if (!st && rename(tmp, path) != 0)
        st = moe_error(MOE_EIO, "%s: cannot rename to config.cfg: %s", tmp, strerror(errno));
    if (st) remove(tmp);
    return st;
}

// ---- resuming: what the checkpoint says before the run opens ----------------------------

// A resume of a run that is already at (or past) train.steps: *finished = its step, after
// checking that the checkpoint is intact (a damaged one is an error, as for a real resume).
// Nothing is decided (0) when the state cannot be read: moe_checkpoint_load then says why.
moe_status moe_run_dir_resume_finished(const char *resume, int64_t steps, int64_t *finished) {
    char folder[MOE_PATH_MAX + 64];
    moe_checkpoint_state cs;
    *finished = 0;
    if (moe_checkpoint_resolve(folder, sizeof folder, resume) ||
        moe_checkpoint_state_read(&cs, folder))
        return MOE_OK;
    if (cs.ts.step < steps) return MOE_OK;
    moe_status st = moe_checkpoint_verify(folder);
    if (st) return st;
    *finished = cs.ts.step;
    return MOE_OK;
}

// Warnings for a schedule that changed since the checkpoint (trainer_state.json "schedule":
// kind, lr, min_lr, warmup_steps, steps): the run continues on the new schedule. A changed
// train.steps matters to the cosine schedule only (the constant one does not depend on it).
void moe_run_dir_warn_schedule_change(const moe_train_config *cfg, const char *resume,
                                      int64_t step) {
    char folder[MOE_PATH_MAX + 64], path[MOE_PATH_MAX + 96];
    if (moe_checkpoint_resolve(folder, sizeof folder, resume)) return;
    snprintf(path, sizeof path, "%s/trainer_state.json", folder);
    cJSON *state;
    if (moe_file_read_json_object(path, (size_t)64 << 20, &state))
        return; // moe_checkpoint_load read it
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
    const int constant = cfg->schedule == MOE_SCHEDULE_CONSTANT;
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
               moe_lr_at_step(constant ? MOE_SCHEDULE_CONSTANT : MOE_SCHEDULE_COSINE, now[0],
                              now[1], (int64_t)now[2], (int64_t)now[3], step),
               moe_lr_at_step(was_constant ? MOE_SCHEDULE_CONSTANT : MOE_SCHEDULE_COSINE, was[0],
                              was[1], (int64_t)was[2], (int64_t)was[3], step));
}
