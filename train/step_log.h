// The per-step records of a run: the MoE load of a step summed over its micro-batches, the
// metrics.jsonl and expert_load.jsonl records, the load alert's window and warnings, and the
// console line. The functions on the trainer read its state (train/trainer_internal.h, which
// includes this header for the types below); trainer.c calls them once per finite step.
#ifndef MOE_STEP_LOG_H
#define MOE_STEP_LOG_H

#include <stdint.h>

#include "layers/model.h"
#include "layers/status.h"

struct trainer;     // train/trainer_internal.h
struct step_result; // train/trainer_internal.h

// Per-step aggregate of the MoE statistics over micro-batches, per layer; per expert in
// global expert order (the model's counts are in slot order under an expert placement).
typedef struct {
    long *routed, *kept; // [L][E]
    long *micro_routed;  // [grad_accum][L][E]: capacity applies per micro-batch, so
                         // capacity planning (moe stats --capacity) needs each one's counts
    double *entropy, *aux, *seq_aux, *z; // [L], summed over micro-batches
    int micro;
} moe_step_load;

void moe_step_load_reset(moe_step_load *s, int L, int E);

// Adds the model's statistics of the micro-batch it just ran (s->micro-th of the step).
void moe_step_load_add(moe_step_load *s, const moe_model *m);

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
} moe_alert_window;

// 0, or -1 (nothing allocated) when out of memory.
int moe_alert_window_init(moe_alert_window *w, int64_t W, int L, int E);
void moe_alert_window_free(moe_alert_window *w);

// A layer's verdict on a full window: what fires, and what the messages name.
typedef struct {
    int overload, n_dead;
    double median;       // of max/mean over the window
    int expert;          // the expert hottest on the most of the window's steps (lowest on ties)
    long long from, to;  // the window's steps
    char dead_list[128]; // the dead experts' indexes (the first few)
} moe_alert_verdict;

// Per layer, since the previous console line: the steps in alert for each condition, the
// worst overload (the highest median) and the latest dead verdict, which the warnings name.
typedef struct {
    long long n_load, n_dead, step, dead_step;
    moe_alert_verdict load, dead;
} moe_load_alert;

// The median of v[0..n) (n > 0); sorts v.
double moe_step_log_median(double *v, int n);

// Expert load, one expert_load.jsonl record per MoE layer; the load alert's window gets the
// step's values; the result sums the run's counts (and the step's tokens/s enters the median's
// window). Sets s's load fields (worst_mom, worst_layer, drop_frac, tok_per_s, coact_log).
moe_status moe_trainer_log_load(struct trainer *t, struct step_result *s);

// The step's metrics.jsonl record.
moe_status moe_trainer_log_metrics(struct trainer *t, const struct step_result *s);

// The load alert of step (0-based): past the grace, the step enters the window; on a full
// window each layer's verdict stops the run (MOE_ENUMERIC, train.load_alert_action = "stop")
// or is kept for the next console line ("warn").
moe_status moe_trainer_alerts(struct trainer *t, int64_t step);

// The console line, every log.interval steps, at the first, the last and on validation, and
// the load warnings since the previous one.
void moe_trainer_print_step(struct trainer *t, const struct step_result *s);

#endif
