// Where a training step's time goes: wall-clock laps by phase (README "Where the time goes").
//
// A timer accumulates the seconds since its previous lap into the phase each lap names, so
// the layers mark the end of each phase with one call (`moe_lap(t, MOE_T_ROUTER)` after the
// router's kernels). NULL timers are no-ops: timing off costs nothing. On a backend whose
// kernels run asynchronously (be->synchronize set: a GPU), each lap first waits for them, so
// the phase is the kernels' time, not their launch's; the CPU's kernels are synchronous.
// A lap is a clock_gettime (~20 ns) plus that wait.
#ifndef MOE_TIMING_H
#define MOE_TIMING_H

#include "layers/backend.h"

typedef enum {
    MOE_T_ATTENTION = 0, // q/k/v projection, RoPE, attention, output projection, residual
    MOE_T_ROUTER,        // router GEMM, scores, top-k, counts, capacity, router losses (+ bwd)
    MOE_T_DISPATCH,      // permute and the dispatch exchange (+ bwd: the return of dx)
    MOE_T_EXPERTS,       // the experts' grouped GEMMs and SwiGLU
    MOE_T_COMBINE,       // the combine exchange and the weighted sum (+ bwd)
    MOE_T_DENSE,         // embedding, RMSNorms, lm_head, cross-entropy
    MOE_T_PHASES
} moe_phase;

// The JSON names of the phases, in moe_phase order.
static const char *const moe_phase_names[MOE_T_PHASES] = {"attention", "router",  "dispatch",
                                                          "experts",   "combine", "dense"};

typedef struct moe_timer {
    moe_backend *be; // its synchronize, when it has one
    double last;     // the time of the previous lap (moe_lap_start sets it)
    double s[MOE_T_PHASES];
} moe_timer;

// Seconds of CLOCK_MONOTONIC (layers/timing.c).
double moe_clock_s(void);

// Starts a timed region: the next lap counts from here.
static inline void moe_lap_start(moe_timer *t) {
    if (!t) return;
    if (t->be && t->be->synchronize) t->be->synchronize(t->be);
    t->last = moe_clock_s();
}

// The time since the previous lap goes to phase p.
static inline void moe_lap(moe_timer *t, moe_phase p) {
    if (!t) return;
    if (t->be && t->be->synchronize) t->be->synchronize(t->be);
    const double now = moe_clock_s();
    t->s[p] += now - t->last;
    t->last = now;
}

#endif
