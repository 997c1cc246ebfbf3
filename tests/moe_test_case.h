// A MoE layer set up from a fixture (config, inputs) on the CPU backend, in whichever
// precision `real` is for the test being compiled. Shared by the fixture, property
// and gradient-check tests.
#ifndef MOE_TEST_CASE_H
#define MOE_TEST_CASE_H

#include "layers/moe.h"
#include "test_util.h"

typedef struct {
    moe_config cfg;
    int T;
    int seq_len; // for moe_case_run's forward: 0 = one sequence
    moe_layer layer;
    real *params, *grads; // flat, moe_weights_count(cfg) each
    moe_weights w, g;
    real *x, *dout, *y, *dx; // [T, d]
    real *bias;              // [E] selection bias (fixture option), or NULL
    real *jitter;            // [T, d] router jitter noise (fixture option), or NULL
} moe_case;

// Reads config and inputs (x, gate, w1, w2, w3, dout) from the fixture.
void moe_case_from_fixture(moe_case *c, const fixture *fx);
// Allocates a case with random inputs: x, dout ~ N(0,1), weights ~ N(0, 1/fan_in).
void moe_case_random(moe_case *c, const moe_config *cfg, int T, uint64_t seed);
void moe_case_free(moe_case *c);
// Forward (training) then backward with dloss = 1; zeroes dx and grads first.
void moe_case_run(moe_case *c, moe_stats *stats);
// Copies n reals to doubles (a static buffer per call slot 0..3).
double *as_double(int slot, const real *x, size_t n);
// Part 0 (w1) or 1 (w3) of a stacked w13 [E, 2ff, d] as [E, ff, d] doubles.
double *w13_part_as_double(int slot, const real *w13, int part, int E, int ff, int d);
double *int_as_double(int slot, const int *x, size_t n);

#endif
