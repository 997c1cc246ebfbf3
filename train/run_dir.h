// A run directory (log.dir): what it holds, clearing it (--overwrite), the checkpoint
// --resume names, and what a resume reads from that checkpoint before the run starts (a
// finished run, a changed schedule). train/trainer.h includes it, so that `moe train` and the
// tests reach these through the trainer's header.
#ifndef MOE_RUN_DIR_H
#define MOE_RUN_DIR_H

#include <stddef.h>
#include <stdint.h>

#include "layers/status.h"
#include "config/config.h"

// Run directories (moe train applies these; moe_trainer_run itself truncates the logs of a new
// run). A run directory holds a previous run when metrics.jsonl or expert_load.jsonl is not
// empty or ckpt/ has anything in it: moe_trainer_run_dir_holds says which of them ("what", e.g.
// "metrics.jsonl, ckpt/"), 0 when none.
int moe_trainer_run_dir_holds(const char *run_dir, char *what, size_t n);

// Deletes what a run writes into run_dir and nothing else: metrics.jsonl, expert_load.jsonl,
// config.cfg (and their .tmp files), ckpt/latest, and the ckpt/step_* folders (the plain
// files in them). MOE_EIO naming the path when one cannot be deleted (for instance a step
// folder holding a folder of the user's).
moe_status moe_trainer_clear_run_dir(const char *run_dir);

// The checkpoint --resume ARG names: for a run directory, RUN_DIR/ckpt/latest; for a ckpt
// folder, its `latest`; else ARG (a step folder or a `latest` file). MOE_EIO saying so when
// ARG is a run directory without a checkpoint.
moe_status moe_trainer_resolve_resume(char *out, size_t n, const char *arg);

// RUN_DIR/config.cfg: the resolved config of the run, written to config.cfg.tmp and renamed.
moe_status moe_run_dir_write_config(const moe_train_config *cfg);

// A resume of a run that is already at (or past) `steps`: *finished = its step, after
// checking that the checkpoint is intact; 0 when it is not finished or its state cannot be
// read (the resume itself then says why).
moe_status moe_run_dir_resume_finished(const char *resume, int64_t steps, int64_t *finished);

// Prints a warning for each part of the schedule (train.schedule, lr, min_lr, warmup_steps,
// steps) that changed since the checkpoint resume names, and the learning rate of step + 1
// under both schedules. Prints nothing for an older or unreadable trainer_state.json.
void moe_run_dir_warn_schedule_change(const moe_train_config *cfg, const char *resume,
                                      int64_t step);

#endif
