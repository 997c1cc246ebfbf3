// The token files of a run: the paths a config names (data.train / data.val, else
// data.dir/{train,val}.bin) and the key each comes from, the data.text sources, and opening
// the files, preparing data.dir from the text when they are missing. The trainer opens them;
// `moe train --dry-run` (train/run_header.c) names them without reading anything.
#ifndef MOE_RUN_DATA_H
#define MOE_RUN_DATA_H

#include "data/token_file.h"
#include "layers/status.h"
#include "config/config.h"

// The token files a config names and the key each comes from (for messages): data.train /
// data.val, else data.dir/{train,val}.bin.
typedef struct {
    char path[2][MOE_PATH_MAX + 16]; // train, val
    char key[2][24];                 // "data.train" or "data.dir/train.bin", ...
    int from_dir;                    // both come from data.dir
} data_paths;

void moe_run_data_paths(const moe_train_config *cfg, data_paths *d);

// Whether the run prepares data.dir from data.text: a token file of d is missing, data.text
// names sources, and both files come from data.dir.
int moe_run_data_from_text(const moe_train_config *cfg, const data_paths *d);

// Every data.text source exists; else an error naming it and how to point at the text.
moe_status moe_run_data_check_text(const moe_train_config *cfg);

// Token files: data.train / data.val, else data.dir/{train,val}.bin, prepared from
// data.text when missing. Prints the run's tokenizer and what it prepared. Errors name the
// config key of the path.
moe_status moe_run_data_open(const moe_train_config *cfg, moe_token_file *train,
                             moe_token_file *val);

// Prefixes the last error with the config key a path came from: "KEY = 'PATH': message"
// (the data keys here; the trainer names model.device and train.init_from the same way).
moe_status moe_trainer_key_error(moe_status st, const char *key, const char *path);

#endif
