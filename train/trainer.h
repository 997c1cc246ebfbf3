// The training loop: data -> model forward/backward (gradient accumulation) -> grad norm ->
// clip -> optimizer -> logs, with validation and non-finite step skipping.
#ifndef MOE_TRAINER_H
#define MOE_TRAINER_H

#include <stddef.h>
#include <stdint.h>

#include "layers/model.h"
#include "config/config.h"
#include "train/run_dir.h" // the run directory: moe train clears it, resolves --resume

// Test-only hooks (never set from a config file): plant a NaN in one gradient element of
// the last layer's w2 at step indexes [nan_from, nan_to] (0-based, inclusive; -1 = never).
// Everything the user sees counts steps from 1: "step s" is the s-th update.
typedef struct {
    int64_t nan_from, nan_to;
    int no_checkpoint;      // moe smoke: save nothing
    int64_t schedule_steps; // moe smoke: the schedule of a run this long (0: train.steps)
    int64_t stop_after;     // tests: run this many steps in this call, then return (0: all)
} moe_trainer_hooks;

typedef struct {
    int64_t steps_done;
    int64_t skipped;              // updates skipped for a non-finite loss or gradient norm
    double first_loss, last_loss; // total loss of the first and last step
    double last_val_loss;         // NaN if never evaluated
    double seconds;
    double median_tokens_per_s; // over the last 1024 steps after the first (a bounded window:
                                // memory does not grow with train.steps)
    // expert load summed over the run's steps, per layer and expert: [L * E] (owned: free
    // with moe_trainer_result_free); the router logit statistics of the last step per layer
    int n_layers, n_experts;
    long *routed, *kept;
    moe_stats *last_stats; // [L] (routed/kept pointers inside are not valid)
    size_t param_bytes, grad_bytes, optimizer_bytes, activation_bytes;
} moe_trainer_result;

void moe_trainer_result_free(moe_trainer_result *r);

// Runs cfg to the end. MOE_ENUMERIC when train.max_skipped consecutive steps were skipped;
// other errors for bad data, files, or allocation. Writes RUN_DIR/config.cfg,
// metrics.jsonl, expert_load.jsonl and checkpoints (RUN_DIR/ckpt); prints a console line
// every log.interval steps. resume (or NULL): a checkpoint folder or `latest` file to
// continue from exactly (parameters, optimizer, step, data order, skip counts).
// A step whose update was skipped saves no checkpoint (not even at the end), so the newest
// checkpoint is the state after a good step and `keep` never rotates the last good one out.
// A failed write of config.cfg or a log stops the run: MOE_EIO "PATH: write failed: why".
// Before step 1 it prints the run header (as moe_trainer_dry_run). Resuming a checkpoint at or
// past train.steps prints "run already finished at step N ..." and returns MOE_OK having
// written nothing (steps_done = N); resuming with another schedule (train.steps, warmup,
// lr, min_lr, schedule) than the checkpoint's warns that the schedule is re-stretched.
// Data errors name the config key of the path ("data.train = 'x.bin': ...",
// "data.dir/train.bin = ...", "data.text[2] = ..."), init_from errors "train.init_from = ...".
moe_status moe_trainer_run(const moe_train_config *cfg, const char *resume,
                           const moe_trainer_hooks *hooks, moe_trainer_result *result);

// moe train --dry-run: prints the resolved config (every key), then the run header: the model,
// parameter counts (total; active per token = dense + top_k experts per layer), FLOPs per
// token (forward = 2 x matmul weights + attention over the full S x S; training = 3 x
// forward), the memory of the model allocated as the run would (parameters, gradients,
// optimizer state, activations, expert buffers), the data paths, BLAS and threads. Reads and
// prepares no data and creates no run directory; a model that does not allocate is a
// warning, not an error.
moe_status moe_trainer_dry_run(const moe_train_config *cfg);

// The router-jitter noise key of micro-batch `micro` of step `step` (both 0-based), a
// function of (seed, step, micro) alone, so a resumed run draws the same noise. Distinct for
// every (step, micro) of a run: step << 20 | micro is one-to-one for micro < 2^20
// (train.grad_accum <= 2^20) and step < 2^44 (train.steps <= 1e12), and moe_mix64 and the
// xor with the seed are bijections.
uint64_t moe_trainer_noise_key(uint64_t seed, int64_t step, int micro);

// The model config a train config describes.
moe_model_config moe_trainer_model_config(const moe_train_config *cfg);

#endif
