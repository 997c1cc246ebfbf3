// The run header: what `moe train` prints before step 1 and `moe train --dry-run`
// (moe_trainer_dry_run, train/trainer.h) prints without training: the model, parameter counts,
// FLOPs per token, memory as allocated, the data, precision, device, BLAS and threads.
#ifndef MOE_RUN_HEADER_H
#define MOE_RUN_HEADER_H

#include <stddef.h>

#include "data/token_file.h"
#include "layers/model.h"
#include "config/config.h"

// The header of a run about to start on model m (rank 0's view of it) with its token files
// open; under expert parallelism (ranks > 1; transport: the world's name) also which experts
// each rank holds.
void moe_run_header_print(const moe_train_config *cfg, const moe_model *m, moe_backend *be,
                          const moe_token_file *train, const moe_token_file *val, int ranks,
                          const char *transport);

// b bytes in words for the header and moe smoke: "233.6 KiB", "1.2 GiB" (one decimal).
void moe_run_header_bytes(char *buf, size_t n, double b);

#endif
