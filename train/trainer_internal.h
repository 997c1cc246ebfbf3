// The trainer's state, private to the run's files in train/ (trainer.c, which runs the steps,
// and step_log.c, which logs them): only train/ includes this header; the interface of a run
// is train/trainer.h.
#ifndef MOE_TRAINER_INTERNAL_H
#define MOE_TRAINER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "data/loader.h"
#include "data/token_file.h"
#include "layers/exchange.h"
#include "layers/model.h"
#include "layers/timing.h"
#include "optim/optimizer.h"
#include "train/capacity.h"
#include "config/config.h"
#include "train/log.h"
#include "train/step_log.h"
#include "train/trainer.h"
#include "train/zero.h"

// Not installed: what this header declares stays inside libmoe (hidden in libmoe.so).
#pragma GCC visibility push(hidden)

#define TPS_WINDOW 1024 // steps in the median tokens/s (trainer.h)

// The state of one run, from trainer_open to trainer_close (which frees everything, whatever
// trainer_open got to).
typedef struct trainer {
    const moe_train_config *cfg;
    const moe_trainer_hooks *hooks;
    const char *resume;
    moe_backend *be;
    moe_token_file train, val;
    moe_model m;
    moe_optimizer opt;
    data_loader loader;
    moe_jsonl_file metrics, load_log;
    int *inputs, *targets; // [T]
    // global-batch balancing (model.aux_scope "global"): the step's micro-batches [grad_accum]
    // [inputs T, targets T], read once for the routing pre-pass; its counts [L, E]
    int *step_tokens;
    long *aux_counts;
    optim_region *regions;
    moe_step_load sl;
    moe_load_alert *alerts; // [L]
    moe_alert_window aw;
    int L, E;
    size_t T; // tokens per micro-batch
    char ckpt_root[MOE_PATH_MAX + 8];
    int64_t start_step, consecutive_skips;
    double t_start;
    // tokens/s of the last TPS_WINDOW steps after the first, a ring: memory does not grow
    // with train.steps (which may be 1e12)
    double step_tps[TPS_WINDOW];
    int64_t n_tps;
    moe_trainer_result res;
    // expert parallelism (DESIGN.md §4): the world, this rank's EP group and the ranks that
    // hold the same experts; one rank: a world of 1, ep and edp NULL
    moe_comm *world, *ep, *edp;
    int rank, R;
    // parallel.shard_optimizer over R > 1 ranks (train/zero.h): the opt holds the moments of
    // zero's piece of the dense parameters and of this rank's experts
    int sharded;
    moe_zero zero;
    moe_capacity_ctl cap; // model.capacity_factor's schedule or auto (train/capacity.h)
    moe_timer timer;      // log.timing: the step's phases (layers/timing.h)
    long *coact;          // log.coactivation: [L][E][E] (i < j) since the last log step
    int64_t coact_steps;
    double ckpt_s; // the last checkpoint save's seconds (logged with the next step)
} trainer;

// What one step computed, for its logs.
typedef struct step_result {
    int64_t step; // 0-based
    double lr, ce, aux, z, loss, grad_norm;
    int finite;      // the forward of every micro-batch was finite
    int ce_overflow; // ... but a micro-batch's cross-entropy was not a result (moe_model_ce_is_result)
    double dt, tok_per_s, worst_mom, drop_frac, val_loss;
    int worst_layer, evaluated;
    double optimizer_s, val_s;      // timing: the update's and the validation's seconds
    int coact_log;                  // this step's load records carry the co-activations
    double capacity_factor;         // the step's
    int capacity_decided;           // auto: this step ended a window
    moe_capacity_decision capacity; // its decision
} step_result;

#pragma GCC visibility pop

#endif
