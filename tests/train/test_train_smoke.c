#define _POSIX_C_SOURCE 200809L // mkdtemp, dup
// Training smoke tests: 30 steps of a tiny config lower the loss and write consistent logs;
// a planted NaN gradient (test-only hook) is skipped, counted and named; consecutive
// non-finite steps beyond train.max_skipped stop the run with MOE_ENUMERIC; a log or state
// file on a full disk stops the run naming it.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"
#include "train/log.h"
#include "train/trainer.h"

static char workdir[512];


static void tiny_config(moe_train_config *c, const char *run) {
    moe_train_config_default(c);
    c->model.d_model = 32, c->model.n_layers = 2, c->model.n_heads = 2;
    c->model.n_kv_heads = 1, c->model.max_seq_len = 32;
    c->model.moe.d_ff = 32, c->model.moe.n_experts = 4, c->model.moe.top_k = 2;
    c->model.moe.capacity_factor = 1.25;
    c->steps = 30, c->batch_size = 4, c->seq_len = 32, c->lr = 1e-2, c->min_lr = 1e-3;
    c->warmup_steps = 3, c->eval_interval = 0, c->eval_batches = 2, c->interval = 10;
    c->threads = 2;
    snprintf(c->dir, sizeof c->dir, "%s/data", workdir);
    c->n_text = 1;
    snprintf(c->text[0], sizeof c->text[0], "%s/corpus.txt", workdir);
    snprintf(c->run_dir, sizeof c->run_dir, "%s/%s", workdir, run);
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void loss_falls_and_logs(void) {
    printf("30 steps lower the loss, logs are consistent\n");
    moe_train_config c;
    tiny_config(&c, "smoke");
    moe_trainer_result r;
    moe_status st = moe_trainer_run(&c, NULL, NULL, &r);
    moe_trainer_result_free(&r);
    if (st) printf("    -> %s\n", moe_last_error());
    check_true("moe_trainer_run succeeds", st == MOE_OK);
    printf("  first loss %.4f, last loss %.4f, val %.4f\n", r.first_loss, r.last_loss,
           r.last_val_loss);
    check_true("30 steps done, none skipped", r.steps_done == 30 && r.skipped == 0);
    check_true("loss falls by > 30%", r.last_loss < 0.7 * r.first_loss);
    check_true("validation ran at the end", isfinite(r.last_val_loss));

    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", c.run_dir);
    char *metrics = test_read_file(path);
    check_true("metrics.jsonl has 30 records", metrics && count_lines(metrics) == 30);
    snprintf(path, sizeof path, "%s/expert_load.jsonl", c.run_dir);
    char *load = test_read_file(path);
    check_true("expert_load.jsonl has one record per step and layer",
               load && count_lines(load) == 30 * c.model.n_layers);
    // every record: counts sum to T*k, kept <= counts, dropped = sum(counts - kept)
    int ok = load != NULL;
    for (char *line = load; ok && line && *line;) {
        char *nl = strchr(line, '\n');
        *nl = 0;
        cJSON *rec = cJSON_Parse(line);
        ok &= rec != NULL;
        if (!rec) break;
        cJSON *counts = cJSON_GetObjectItem(rec, "counts"),
              *kept = cJSON_GetObjectItem(rec, "kept");
        long sum = 0, dropped = 0;
        for (int e = 0; e < c.model.moe.n_experts; e++) {
            long ce = (long)cJSON_GetArrayItem(counts, e)->valuedouble;
            long ke = (long)cJSON_GetArrayItem(kept, e)->valuedouble;
            sum += ce, dropped += ce - ke;
            ok &= ke <= ce;
        }
        ok &= sum == (long)c.batch_size * c.seq_len * c.model.moe.top_k;
        ok &= dropped == (long)cJSON_GetObjectItem(rec, "dropped")->valuedouble;
        cJSON_Delete(rec);
        line = nl + 1;
    }
    check_true("expert_load records are consistent (sum, kept, dropped)", ok);
    snprintf(path, sizeof path, "%s/config.cfg", c.run_dir);
    moe_train_config back;
    check_true("the resolved config is written and loads back",
               moe_train_config_load(&back, path, 0, NULL) == MOE_OK && back.steps == 30 &&
                   back.model.d_model == 32);
    free(metrics);
    free(load);
}

static void planted_nan_is_skipped(void) {
    printf("a planted NaN gradient is skipped, counted and named\n");
    moe_train_config c;
    tiny_config(&c, "nan");
    c.steps = 12;
    moe_trainer_hooks hooks = {.nan_from = 5, .nan_to = 5}; // the 6th step
    char errpath[600];
    snprintf(errpath, sizeof errpath, "%s/nan.stderr", workdir);
    fflush(stderr);
    int saved = dup(2);
    if (!freopen(errpath, "w", stderr)) exit(1);
    moe_trainer_result r;
    moe_status st = moe_trainer_run(&c, NULL, &hooks, &r);
    moe_trainer_result_free(&r);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char *err = test_read_file(errpath);
    printf("  stderr: %s", err ? err : "(none)\n");
    check_true("run completes", st == MOE_OK && r.steps_done == 12);
    check_true("one step skipped", r.skipped == 1);
    check_true("the message names the step and the first non-finite gradient",
               err && strstr(err, "step 6:") &&
                   strstr(err, "model.layers.1.block_sparse_moe.experts.0.w2.weight"));
    free(err);
}

static void max_skipped_stops(void) {
    printf("max_skipped consecutive non-finite steps stop the run\n");
    moe_train_config c;
    tiny_config(&c, "nanstop");
    c.max_skipped = 4;
    moe_trainer_hooks hooks = {.nan_from = 3, .nan_to = 1000};
    fflush(stderr);
    moe_trainer_result r;
    moe_status st = moe_trainer_run(&c, NULL, &hooks, &r);
    moe_trainer_result_free(&r);
    printf("    -> %s\n", moe_last_error());
    check_true("MOE_ENUMERIC with a message naming train.max_skipped",
               st == MOE_ENUMERIC && strstr(moe_last_error(), "train.max_skipped"));
    check_true("3 good steps, then 4 skipped", r.steps_done == 3 && r.skipped == 4);
}

// A diverging run (every step from the 6th on is non-finite) saves no checkpoint of a
// skipped step: with keep = 2 the good checkpoints of steps 2 and 4 survive, `latest`
// names step 4, and a resume from it trains on.
static void skipped_steps_do_not_checkpoint(void) {
    printf("a skipped step writes no checkpoint: keep does not rotate out the last good one\n");
    moe_train_config c;
    tiny_config(&c, "diverge");
    c.steps = 12, c.ckpt_interval = 2, c.ckpt_keep = 2, c.max_skipped = 4;
    moe_trainer_hooks hooks = {.nan_from = 5,
                               .nan_to = 1000}; // steps 6..9 skipped, the 4th stops the run
    moe_trainer_result r;
    moe_status st = moe_trainer_run(&c, NULL, &hooks, &r);
    moe_trainer_result_free(&r);
    check_true("the run stops at step 9 (MOE_ENUMERIC)", st == MOE_ENUMERIC && r.skipped == 4);
    char path[1200];
    int ok = 1;
    for (int s = 2; s <= 8; s += 2) {
        snprintf(path, sizeof path, "%s/ckpt/step_%08d", c.run_dir, s);
        ok &= (access(path, F_OK) == 0) == (s <= 4);
    }
    check_true("step_2 and step_4 are kept; no step_6, no step_8", ok);
    snprintf(path, sizeof path, "%s/ckpt/latest", c.run_dir);
    char *latest = test_read_file(path);
    check_true("latest names step 4", latest && !strcmp(latest, "step_00000004\n"));
    free(latest);
    st = moe_trainer_run(&c, path, NULL, &r);
    moe_trainer_result_free(&r);
    if (st) printf("    -> %s\n", moe_last_error());
    check_true("resuming from latest trains on to step 12", st == MOE_OK && r.steps_done == 12);
}

// train.steps = 1e12 (the config's maximum) allocates nothing per step: the run starts and
// trains (stop_after: the first 3 steps of it).
static void huge_step_count_starts(void) {
    printf("train.steps = 1e12 starts (nothing is allocated per step)\n");
    moe_train_config c;
    tiny_config(&c, "huge");
    c.steps = 1000000000000L;
    moe_trainer_hooks hooks = {.nan_from = -1, .nan_to = -1, .no_checkpoint = 1, .stop_after = 3};
    moe_trainer_result r;
    moe_status st = moe_trainer_run(&c, NULL, &hooks, &r);
    moe_trainer_result_free(&r);
    if (st) printf("    -> %s\n", moe_last_error());
    check_true("3 steps done, a finite median tokens/s",
               st == MOE_OK && r.steps_done == 3 && isfinite(r.median_tokens_per_s));
}

// /dev/full fails every write with ENOSPC: a file of the run linked to it is a full disk for
// that file only. config.cfg fails before the first step, each log at the first step; the
// run stops with the path and the OS error instead of training on with empty logs.
static void full_disk_stops(void) {
    printf("a log or config.cfg on a full disk (/dev/full) stops the run, naming the file\n");
    // config.cfg is written to config.cfg.tmp and renamed (a reader never sees part of it)
    const char *files[] = {"config.cfg.tmp", "metrics.jsonl", "expert_load.jsonl"};
    for (int i = 0; i < 3; i++) {
        moe_train_config c;
        tiny_config(&c, "full");
        c.steps = 3;
        char cmd[2200], path[1100], want[1200], what[200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", c.run_dir, c.run_dir);
        if (system(cmd) != 0) exit(1);
        snprintf(path, sizeof path, "%s/%s", c.run_dir, files[i]);
        if (symlink("/dev/full", path) != 0) exit(1);
        moe_trainer_result r;
        moe_status st = moe_trainer_run(&c, NULL, NULL, &r);
        moe_trainer_result_free(&r);
        printf("    -> %s\n", st ? moe_last_error() : "(no error)");
        snprintf(want, sizeof want, "%s: write failed: No space left on device", path);
        snprintf(what, sizeof what,
                 "%s: MOE_EIO with the path and ENOSPC, no step after the failing one", files[i]);
        check_true(what,
                   st == MOE_EIO && strstr(moe_last_error(), want) && r.steps_done == (i ? 1 : 0));
        if (i == 0) {
            char cfg_path[1100];
            snprintf(cfg_path, sizeof cfg_path, "%s/config.cfg", c.run_dir);
            check_true("no config.cfg after the failed write, the temporary file removed",
                       access(cfg_path, F_OK) != 0 && access(path, F_OK) != 0);
        }
    }

    printf("moe_jsonl_keep_until (resume) on a full disk fails and keeps the log as it was\n");
    char path[700], tmp[720];
    snprintf(path, sizeof path, "%s/keep.jsonl", workdir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(path, "w");
    for (int s = 1; s <= 3; s++) fprintf(f, "{\"step\":%d}\n", s);
    fclose(f);
    remove(tmp);
    if (symlink("/dev/full", tmp) != 0) exit(1);
    moe_status st = moe_jsonl_keep_until(workdir, "keep.jsonl", 2);
    printf("    -> %s\n", st ? moe_last_error() : "(no error)");
    char *text = test_read_file(path);
    check_true("MOE_EIO: write failed: No space left on device",
               st == MOE_EIO && strstr(moe_last_error(),
                                       "keep.jsonl.tmp: write failed: No space left on device"));
    check_true("the log keeps its 3 records, the temporary file is removed",
               text && count_lines(text) == 3 && access(tmp, F_OK) != 0);
    free(text);
}

int main(void) {
    snprintf(workdir, sizeof workdir, "%s", "/tmp/moe_train_smoke_XXXXXX");
    if (!mkdtemp(workdir)) return 1;
    // a corpus with structure to learn: repeated sentences
    char path[600];
    snprintf(path, sizeof path, "%s/corpus.txt", workdir);
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 400; i++)
        fprintf(f, "the quick brown fox %d jumps over the lazy dog. ", i % 7);
    fclose(f);
    loss_falls_and_logs();
    planted_nan_is_skipped();
    max_skipped_stops();
    skipped_steps_do_not_checkpoint();
    huge_step_count_starts();
    full_disk_stops();
    printf("%d failure(s)\n", test_failures());
    char rm[600];
    snprintf(rm, sizeof rm, "rm -rf %s", workdir);
    if (!test_failures() && system(rm) != 0) printf("note: could not remove %s\n", workdir);
    return test_failures() != 0;
}
