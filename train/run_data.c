// The token files of a run (train/run_data.h): where a config's data is, its text sources,
// and opening the token files, prepared from data.text when they are missing.
#define _POSIX_C_SOURCE 200809L // getcwd

#include "train/run_data.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/prepare.h"
#include "data/tokenizer.h"

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

void moe_run_data_paths(const moe_train_config *cfg, data_paths *d) {
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

moe_status moe_trainer_key_error(moe_status st, const char *key, const char *path) {
    char old[1024];
    snprintf(old, sizeof old, "%s", moe_last_error());
    return moe_error(st, "%s = '%s': %s", key, path, old);
}

int moe_run_data_from_text(const moe_train_config *cfg, const data_paths *d) {
    return (!file_exists(d->path[0]) || !file_exists(d->path[1])) && cfg->n_text > 0 && d->from_dir;
}

moe_status moe_run_data_check_text(const moe_train_config *cfg) {
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

moe_status moe_run_data_open(const moe_train_config *cfg, moe_token_file *train,
                             moe_token_file *val) {
    data_paths d;
    moe_run_data_paths(cfg, &d);
    moe_status st;
    // the run's tokenizer: data.tokenizer, else train.init_from's (moe_checkpoint_save picks the same)
    char tok[MOE_PATH_MAX];
    int tok_from_init = 0;
    if ((st = moe_tokenizer_for_run(tok, sizeof tok, cfg->tokenizer, cfg->init_from,
                                    &tok_from_init)))
        return st;
    if (tok[0])
        printf("tokenizer: %s (%s)\n", tok,
               tok_from_init ? "train.init_from's, as data.tokenizer is empty" : "data.tokenizer");
    if (moe_run_data_from_text(cfg, &d)) {
        if ((st = moe_run_data_check_text(cfg))) return st;
        const char *sources[MOE_MAX_TEXT_SOURCES];
        for (int i = 0; i < cfg->n_text; i++) sources[i] = cfg->text[i];
        uint64_t n_train = 0, n_val = 0;
        printf("preparing %s from %d text source(s) (%s)\n", cfg->dir, cfg->n_text,
               tok[0] ? "the tokenizer above" : "byte tokenizer");
        if (tok[0]) // (scripts/hf_tokenizer.py prints the counts)
            st = moe_hf_tokenizer_prepare(tok, sources, cfg->n_text, cfg->dir, cfg->val_fraction);
        else
            st = data_prepare_text(sources, cfg->n_text, cfg->dir, cfg->val_fraction, &n_train,
                                   &n_val);
        if (st) return moe_trainer_key_error(st, "data.dir (prepared from data.text)", cfg->dir);
        if (!tok[0])
            printf("prepared %llu train and %llu val tokens\n", (unsigned long long)n_train,
                   (unsigned long long)n_val);
    }
    for (int i = 0; i < 2; i++) {
        moe_token_file *tf = i ? val : train;
        if ((st = moe_token_file_read(tf, d.path[i]))) {
            moe_trainer_key_error(st, d.key[i], d.path[i]);
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
    if ((st = moe_tokenizer_check_data(d.path[0], tok, train->vocab_size)))
        return moe_trainer_key_error(st, d.key[0], d.path[0]);
    return MOE_OK;
}
