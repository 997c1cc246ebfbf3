// Properties of the MoE layer with answers known in advance.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "moe_test_case.h"
#include "test_backend.h"

static int same_bits(const real *a, const real *b, size_t n) {
    return memcmp(a, b, n * sizeof(real)) == 0;
}

// 1. A capacity factor so large that nothing can drop equals dropless, bit for bit.
static void huge_capacity_equals_dropless(void) {
    printf("huge capacity factor == dropless\n");
    moe_config cfg = moe_config_default(16, 24, 8, 2);
    moe_case a, b;
    moe_case_random(&a, &cfg, 64, 11);
    cfg.capacity_factor = 1e9;
    moe_case_random(&b, &cfg, 64, 11);
    moe_stats sa, sb;
    moe_case_run(&a, &sa);
    moe_case_run(&b, &sb);
    size_t nx = (size_t)a.T * cfg.d_model, nw = moe_weights_count(&cfg);
    check_true("capacity clamps to T", sb.capacity == a.T);
    check_true("y bitwise equal", same_bits(a.y, b.y, nx));
    check_true("dx bitwise equal", same_bits(a.dx, b.dx, nx));
    check_true("weight grads bitwise equal", same_bits(a.grads, b.grads, nw));
    check_true("aux, z equal", sa.aux == sb.aux && sa.z == sb.z);
    moe_case_free(&a);
    moe_case_free(&b);
}

// 2. Balanced routing: f_e = 1/E for every e gives L_aux = aux_coef * E * sum_e P_e / E
//    = aux_coef exactly (sum_e P_e = 1), whatever the probabilities are.
static void balanced_routing_aux_equals_coef(int k) {
    printf("balanced routing (k=%d): L_aux == aux_coef\n", k);
    const int E = 4, T = 16;
    moe_config cfg = moe_config_default(E, 6, E, k);
    cfg.aux_coef = 0.01;
    moe_case c;
    moe_case_random(&c, &cfg, T, 12);
    memset(c.w.gate, 0, (size_t)E * E * sizeof(real));
    for (int e = 0; e < E; e++) c.w.gate[e * E + e] = 1; // logits = x
    for (int t = 0; t < T; t++) {
        real *x = c.x + (size_t)t * E;
        for (int i = 0; i < E; i++) x[i] = 0;
        x[t % E] = 3;          // first choice: expert t % E
        x[(t + 1) % E] = 1.5f; // second choice: expert (t+1) % E
    }
    moe_stats st;
    moe_case_run(&c, &st);
    int balanced = 1;
    for (int e = 0; e < E; e++) balanced &= st.routed[e] == T * k / E;
    check_true("counts are balanced", balanced);
    printf("  aux = %.9g\n", st.aux);
    check_true("L_aux == aux_coef (to fp32 rounding)", fabs(st.aux - cfg.aux_coef) <= 1e-7);
    check_true("max/mean == 1 and cv == 0", st.max_over_mean == 1 && st.cv == 0);
    moe_case_free(&c);
}

// 3. Dropped assignments known in advance. E=2, k=1, d=2, gate = identity, so token t's
//    logits are x[t]. Tokens 0..4 pick expert 0 with p_0 = sigmoid(a_t), token 5 expert 1.
//    T=6, cf=1 => C = ceil(6*1/2 * 1) = 3: expert 0 keeps 3 of its 5 tokens.
static void hand_built_drops(moe_drop_policy policy, int norm, const int *expect_dropped,
                             const char *title) {
    printf("hand-built drops: %s\n", title);
    const real a[6] = {1, 3, 0.5f, 2, 4, -2};
    moe_config cfg = moe_config_default(2, 4, 2, 1);
    cfg.capacity_factor = 1.0;
    cfg.drop_policy = policy;
    cfg.norm_topk_prob = norm;
    moe_case c;
    moe_case_random(&c, &cfg, 6, 13);
    c.w.gate[0] = 1, c.w.gate[1] = 0, c.w.gate[2] = 0, c.w.gate[3] = 1;
    for (int t = 0; t < 6; t++) c.x[2 * t] = a[t], c.x[2 * t + 1] = 0;
    moe_stats st;
    moe_case_run(&c, &st);
    check_true("capacity == 3", st.capacity == 3);
    check_true("2 assignments dropped", st.dropped == 2);
    int ok = 1;
    for (int t = 0; t < 6; t++) {
        int dropped = c.assign_row[t] < 0;
        ok &= dropped == expect_dropped[t];
        // a dropped token passes through on the residual: the layer adds exactly 0
        if (dropped)
            ok &= c.y[2 * t] == 0 && c.y[2 * t + 1] == 0;
        else
            ok &= c.y[2 * t] != 0 || c.y[2 * t + 1] != 0;
    }
    check_true("the expected tokens dropped, their output is 0", ok);
    moe_case_free(&c);
}

// 4. Inference never drops, whatever the capacity factor; it equals dropless training.
static void inference_never_drops(void) {
    printf("inference never drops\n");
    moe_config cfg = moe_config_default(16, 24, 8, 2);
    moe_case a, b;
    moe_case_random(&a, &cfg, 64, 14);
    cfg.capacity_factor = 0.5;
    moe_case_random(&b, &cfg, 64, 14);
    moe_stats sa, sb, strain;
    moe_case_forward(&a, a.T, 1, &sa);
    moe_case_forward(&b, b.T, 0, &sb);
    check_true("dropless training == capacity-mode inference, bitwise",
               same_bits(a.y, b.y, (size_t)a.T * cfg.d_model));
    check_true("inference dropped == 0", sb.dropped == 0 && sb.capacity == 0);
    moe_case_forward(&b, b.T, 1, &strain);
    check_true("the same layer in training mode drops", strain.dropped > 0);
    moe_case_free(&a);
    moe_case_free(&b);
}

// 5. Ties in top-k go to the lower expert index.
static void topk_ties_lower_index(void) {
    printf("top-k ties: lower index wins\n");
    moe_config cfg = moe_config_default(4, 4, 6, 3);
    moe_case c;
    moe_case_random(&c, &cfg, 4, 15);
    memset(c.w.gate, 0, 6 * 4 * sizeof(real)); // every logit 0: all experts tie
    moe_stats st;
    moe_case_run(&c, &st);
    int ok = 1;
    for (int t = 0; t < 4; t++)
        for (int j = 0; j < 3; j++) ok &= c.topk_idx[t * 3 + j] == j;
    check_true("topk_idx == 0,1,2 for every token", ok);
    check_true("weights == 1/3", fabs(c.weights[0] - 1.0 / 3) < 1e-7);
    moe_case_free(&c);
}

// 6. Statistics from known counts.
static void stats_from_known_counts(void) {
    printf("load statistics from known counts\n");
    const int routed[4] = {10, 2, 4, 0}, kept[4] = {6, 2, 4, 0};
    moe_stats st;
    moe_stats_from_counts(&st, routed, kept, 4, 8, 6);
    // mean 4, max 10 -> 2.5; var = (36+4+0+16)/4 = 14 -> cv = sqrt(14)/4
    check_true("max/mean == 2.5", fabs(st.max_over_mean - 2.5) < 1e-12);
    check_true("cv == sqrt(14)/4", fabs(st.cv - sqrt(14.0) / 4) < 1e-12);
    check_true("dropped == 4", st.dropped == 4);
}

// 7. Invalid arguments return an error with a message; nothing crashes.
static void invalid_arguments(void) {
    printf("invalid arguments are refused with a message\n");
    moe_layer L;
    moe_config cfg = moe_config_default(8, 8, 4, 5);
    check_true("k > E refused", moe_layer_init(&L, test_backend(), &cfg, 4) == MOE_EINVAL &&
                                    strstr(moe_last_error(), "top_k") != NULL);
    printf("    -> %s\n", moe_last_error());
    cfg = moe_config_default(8, 8, 0, 1);
    check_true("E < 1 refused", moe_layer_init(&L, test_backend(), &cfg, 4) == MOE_EINVAL &&
                                    strstr(moe_last_error(), "n_experts") != NULL);
    printf("    -> %s\n", moe_last_error());
    cfg = moe_config_default(8, 8, 4, 2);
    cfg.aux_coef = NAN;
    check_true("NaN aux_coef refused", moe_layer_init(&L, test_backend(), &cfg, 4) == MOE_EINVAL &&
                                           strstr(moe_last_error(), "aux_coef") != NULL);
    printf("    -> %s\n", moe_last_error());
    cfg = moe_config_default(8, 8, 4, 2);
    cfg.z_coef = -1;
    check_true("negative z_coef refused",
               moe_layer_init(&L, test_backend(), &cfg, 4) == MOE_EINVAL);
    cfg = moe_config_default(8, 8, 4, 2);
    cfg.capacity_factor = INFINITY;
    check_true("infinite capacity_factor refused",
               moe_layer_init(&L, test_backend(), &cfg, 4) == MOE_EINVAL);

    moe_case c;
    cfg = moe_config_default(8, 8, 4, 2);
    moe_case_random(&c, &cfg, 4, 16);
    check_true("T > max_tokens refused",
               moe_layer_forward(&c.layer, c.dev_y, c.dev_x, &c.dev_w, 5, 0,
                                 moe_pass_train(c.layer.cfg.capacity_factor), NULL) == MOE_EINVAL &&
                   strstr(moe_last_error(), "max_tokens") != NULL);
    printf("    -> %s\n", moe_last_error());
    check_true("NULL input refused",
               moe_layer_forward(&c.layer, c.dev_y, NULL, &c.dev_w, 4, 0,
                                 moe_pass_train(c.layer.cfg.capacity_factor), NULL) == MOE_EINVAL);
    moe_weights broken = c.dev_w;
    broken.w13 = NULL;
    check_true("missing weight refused",
               moe_layer_forward(&c.layer, c.dev_y, c.dev_x, &broken, 4, 0,
                                 moe_pass_train(c.layer.cfg.capacity_factor), NULL) == MOE_EINVAL);
    check_true("backward before forward refused",
               moe_layer_backward(&c.layer, c.dev_dx, &c.dev_g, c.dev_dout, c.dev_x, &c.dev_w, 1) ==
                   MOE_EINVAL);
    moe_case_forward(&c, 4, 1, NULL);
    check_true("NaN dloss refused", moe_layer_backward(&c.layer, c.dev_dx, &c.dev_g, c.dev_dout,
                                                       c.dev_x, &c.dev_w, NAN) == MOE_EINVAL);
    c.x[0] = NAN;
    check_true("NaN input reported as non-finite router loss",
               moe_case_forward(&c, 4, 1, NULL) == MOE_ENUMERIC);
    printf("    -> %s\n", moe_last_error());
    moe_case_free(&c);
}

// 8. Aux-loss-free bias balancing: on a router skewed toward experts 0 and 1, updating the
//    selection bias after every step (no gradient involved) moves the load toward balance.
static void bias_balances_skewed_router(void) {
    printf("aux-loss-free bias moves a skewed router toward balance\n");
    const int E = 8, T = 256;
    moe_config cfg = moe_config_default(16, 8, E, 2);
    moe_case c;
    moe_case_random(&c, &cfg, T, 17);
    for (int i = 0; i < 16; i++) c.w.gate[0 * 16 + i] += 0.6f, c.w.gate[1 * 16 + i] += 0.4f;
    for (int t = 0; t < T; t++) c.x[(size_t)t * 16] = fabsf(c.x[(size_t)t * 16]) + 1; // skew
    real bias[8] = {0};
    c.w.bias = bias;
    long counts[8];
    double first = 0, last = 0;
    for (int step = 0; step < 300; step++) {
        moe_stats st;
        moe_case_forward(&c, T, 1, &st); // uploads the host bias each step
        if (step == 0) first = st.max_over_mean;
        last = st.max_over_mean;
        for (int e = 0; e < E; e++) counts[e] = st.routed[e];
        moe_router_bias_update(bias, counts, E, 1e-3);
    }
    printf("  max/mean load: %.3f before, %.3f after 300 bias updates (bias[0] = %.4f)\n", first,
           last, bias[0]);
    check_true("the router starts skewed (max/mean > 2)", first > 2);
    check_true("the bias brings max/mean below 1.3", last < 1.3);
    check_true("the overloaded expert's bias went down", bias[0] < 0);
    moe_case_free(&c);
}

// 10. The thread count does not change the result. The shape is large enough that every
//     kernel forks (see cpu_parallel_worth); with 1 thread none does. Row-wise kernels are
//     bitwise equal; the loss reductions and BLAS may sum in another order, hence a tolerance.
static void threads_match_serial(void) {
    printf("2 threads == 1 thread (capacity mode, shape where every kernel forks)\n");
    moe_config cfg = moe_config_default(32, 16, 16, 2);
    cfg.capacity_factor = 1.0;
    cfg.drop_policy = MOE_DROP_PROBS;
    cfg.z_coef = 1e-3;
    const int T = 2048;
    moe_case a, b;
    moe_stats sa, sb;
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    moe_case_random(&a, &cfg, T, 19);
    moe_case_run(&a, &sa);
    omp_set_num_threads(2);
    moe_case_random(&b, &cfg, T, 19);
    moe_case_run(&b, &sb);
    omp_set_num_threads(threads);
    size_t nx = (size_t)T * cfg.d_model, nw = moe_weights_count(&cfg);
    check_true("the same assignments dropped", sa.dropped == sb.dropped && sa.dropped > 0);
    check_true("same routing",
               memcmp(a.topk_idx, b.topk_idx, (size_t)T * cfg.top_k * sizeof(int)) == 0);
    check_rel("y", as_double(0, b.y, nx), as_double(1, a.y, nx), nx, 1e-6);
    check_rel("dx", as_double(0, b.dx, nx), as_double(1, a.dx, nx), nx, 1e-6);
    check_rel("weight grads", as_double(0, b.grads, nw), as_double(1, a.grads, nw), nw, 1e-6);
    check_true("aux, z equal to fp32 rounding",
               fabs(sa.aux - sb.aux) <= 1e-6 * fabs(sa.aux) && fabs(sa.z - sb.z) <= 1e-6 * sa.z);
    moe_case_free(&a);
    moe_case_free(&b);
}

int main(void) {
    huge_capacity_equals_dropless();
    balanced_routing_aux_equals_coef(1);
    balanced_routing_aux_equals_coef(2);
    // probs policy, raw probs: keeps the 3 largest p_0 (tokens 4, 1, 3), drops 0 and 2
    const int drop_probs[6] = {1, 0, 1, 0, 0, 0};
    hand_built_drops(MOE_DROP_PROBS, 0, drop_probs, "probs policy");
    // position policy: keeps the first 3 (tokens 0, 1, 2), drops 3 and 4
    const int drop_position[6] = {0, 0, 0, 1, 1, 0};
    hand_built_drops(MOE_DROP_POSITION, 0, drop_position, "position policy");
    // probs policy with k=1 and renormalisation: every weight is 1, a tie, so earlier
    // tokens win and the result equals the position policy
    hand_built_drops(MOE_DROP_PROBS, 1, drop_position, "probs policy, all weights tie");
    inference_never_drops();
    topk_ties_lower_index();
    stats_from_known_counts();
    invalid_arguments();
    bias_balances_skewed_router();
    threads_match_serial();
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
