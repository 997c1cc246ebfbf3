// A MoE layer set up from a fixture (config, inputs) on the test backend (test_backend(),
// $MOE_TEST_DEVICE), in whichever precision `real` is for the test being compiled. Shared by
// the fixture, property and gradient-check tests.
//
// The tests set inputs and weights in host arrays (x, dout, params through w, bias) and read
// results from host arrays (y, dx, grads through g, the routing copies). The layer only ever
// sees backend memory (dev_*): moe_case_forward / moe_case_run copy the inputs to the device
// first and the results back after, so the case runs under "cpu-strict" too.
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
    // backend memory: what the layer reads and writes (dev_w and dev_g view dev_params and
    // dev_grads; dev_w.bias is dev_bias when w.bias is set)
    real *dev_params, *dev_grads, *dev_x, *dev_dout, *dev_y, *dev_dx, *dev_bias, *dev_jitter;
    moe_bf16 *dev_params16; // bf16 (cfg.dtype): the weights rounded, viewed by dev_w's *16
    moe_weights dev_w, dev_g;
    // host copies of the layer's routing buffers after the last forward of the case
    int *topk_idx, *assign_row; // [T, k]
    real *probs, *scores;       // [T, E]
    real *weights;              // [T, k]
} moe_case;

// The GEMM precision of the cases made from fixtures (moe_case_from_fixture): fp32 unless a
// test sets it. A bf16 case keeps the bf16 copy of its weights (dev_params16), refreshed from
// the fp32 ones at every upload.
extern moe_dtype moe_case_dtype;

// Reads config and inputs (x, gate, w1, w2, w3, dout) from the fixture.
void moe_case_from_fixture(moe_case *c, const fixture *fx);
// Allocates a case with random inputs: x, dout ~ N(0,1), weights ~ N(0, 1/fan_in).
void moe_case_random(moe_case *c, const moe_config *cfg, int T, uint64_t seed);
void moe_case_free(moe_case *c);
// Forward (training) then backward with dloss = 1; zeroes dx and grads first. Copies x, dout,
// the weights and the bias to the device before, and y, dx, the grads and the routing back.
void moe_case_run(moe_case *c, moe_stats *stats);
// Forward only, of the first T tokens (T <= the case's T): copies x, the weights and the bias to
// the device, runs moe_layer_forward, and on success copies y and the routing back.
moe_status moe_case_forward(moe_case *c, int T, int training, moe_stats *stats);
// Copies n reals to doubles (a static buffer per call slot 0..3).
double *as_double(int slot, const real *x, size_t n);
// Part 0 (w1) or 1 (w3) of a stacked w13 [E, 2ff, d] as [E, ff, d] doubles.
double *w13_part_as_double(int slot, const real *w13, int part, int E, int ff, int d);

// The routing of a layer's last training forward per (token, expert), copied from its device
// buffers (be->copy_to_host): what a finite-difference gradient check must not flip. Selection
// is the top-k of v = s + bias (ties: lower index); under the probs policy an over-full
// expert keeps its `capacity` largest combine weights w (ties: earlier token). The loss is
// smooth in the parameters as long as `state` stays the same (the order of the k choices
// of a token and the row order of the grouped experts do not change the loss beyond
// rounding: sums are order-free, rows follow from `state` in token order).
typedef struct {
    int T, E, k, capacity; // capacity 0: dropless
    moe_drop_policy policy;
    double *v;          // [T, E] selection value s + bias
    double *w;          // [T, E] combine weight of a selected expert, 0 otherwise
    signed char *state; // [T, E] 0 not selected, 1 selected and kept, 2 selected and dropped
} moe_routing;

// Fills r from L (r zeroed before the first call; reallocates when the shape changes); bias is
// a host array [E] or NULL.
void moe_routing_capture(moe_routing *r, const moe_layer *L, const real *bias);
void moe_routing_free(moe_routing *r);
// Selection margin: min over tokens of v_(k) - v_(k+1), the k-th minus the (k+1)-th largest
// v of the token; INFINITY when k == E (nothing to choose). *token (if not NULL): the token
// that attains it, -1 if none.
double moe_routing_select_margin(const moe_routing *r, int *token);
// Drop margin (probs policy): min over over-full experts e of min_kept w - max_dropped w;
// INFINITY when no decision depends on w (dropless, position policy, no expert over
// capacity). *token: the first dropped assignment's token of the worst expert, -1 if none.
double moe_routing_drop_margin(const moe_routing *r, int *token);
// Number of (t, e) whose state differs between a and b (same shape); *dv = max |v_a - v_b|
// and *dw = max |w_a - w_b| over all (t, e) (NULL to skip).
size_t moe_routing_diff(const moe_routing *a, const moe_routing *b, double *dv, double *dw);
// Number of experts with at least one kept assignment.
int moe_routing_experts_used(const moe_routing *r);

// The gradient check's routing assertions: selection margin ms and drop margin md are at least
// margin_min and more than safety x 2 x the largest score / weight change under +-h (dv, dw),
// and none of the evals evaluations flipped a decision.
void check_routing_margins(double ms, double md, double dv, double dw, size_t flipped, size_t evals,
                           double margin_min, double safety);

#endif
