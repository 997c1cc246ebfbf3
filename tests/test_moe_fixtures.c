// The MoE layer against PyTorch fixtures (scripts/make_fixtures.py): routing decisions
// exactly, outputs, losses and every gradient at relative error <= 1e-5.
// With --dtype bf16 first: the layer's bf16 path (bf16 GEMM operands, fp32 accumulation,
// routing and losses in fp32) against the same float64 references, routing still exactly and
// the rest within bf16's tolerance (TOL_BF16).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe_test_case.h"

#define TOL_F32 1e-5
// bf16: norm-wise relative error of every output and gradient. Each GEMM rounds its operands
// to 8 significant bits (2^-9 relative each, random signs: a few 1e-3 norm-wise per GEMM);
// a gradient passes through up to four GEMMs (dw13 <- dh13 <- dact <- dye).
#define TOL_BF16 2e-2
static double TOL = TOL_F32;

static void check_ints(const char *what, const int *got, const fixture *fx, const char *name,
                       size_t n) {
    const fixture_tensor *t = fixture_get(fx, name, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += got[i] != (int)t->data[i];
    char label[96];
    snprintf(label, sizeof label, "%s equal (%zu differ)", what, bad);
    check_true(label, bad == 0);
}

static void check_tensor(const char *name, const real *got, const fixture *fx, size_t n) {
    check_rel(name, as_double(0, got, n), fixture_get(fx, name, n)->data, n, TOL);
}

static void check_scalar(const char *name, double got, const fixture *fx) {
    double want = fixture_double(fx, name);
    check_rel(name, &got, &want, 1, TOL);
}

static void run_fixture(const char *path) {
    fixture fx;
    fixture_load(&fx, path);
    moe_case c;
    moe_case_from_fixture(&c, &fx);
    const size_t T = c.T, E = c.cfg.n_experts, k = c.cfg.top_k, d = c.cfg.d_model, ff = c.cfg.d_ff;
    printf("%s: T=%zu d=%zu ff=%zu E=%zu k=%zu cf=%g policy=%s norm=%d scoring=%s route_scale=%g "
           "bias=%s seq_aux=%g (seq_len %d) jitter=%g\n",
           path, T, d, ff, E, k, c.cfg.capacity_factor,
           c.cfg.drop_policy == MOE_DROP_POSITION ? "position" : "probs", c.cfg.norm_topk_prob,
           c.cfg.scoring == MOE_SCORE_SIGMOID ? "sigmoid" : "softmax", c.cfg.route_scale,
           c.bias ? "on" : "off", c.cfg.seq_aux_coef, c.seq_len, c.cfg.jitter_eps);
    moe_stats st;
    moe_case_run(&c, &st); // y, dx, grads and the routing copied back to host arrays

    check_true("capacity", st.capacity == fixture_int(&fx, "capacity"));
    if (moe_case_dtype == MOE_DTYPE_F32) {
        check_ints("topk_idx", c.topk_idx, &fx, "topk_idx", T * k);
    } else { // the selected set per token; bf16 logits may swap the order of near-equal choices
        const fixture_tensor *want = fixture_get(&fx, "topk_idx", T * k);
        size_t bad = 0;
        for (size_t t = 0; t < T; t++) {
            unsigned long long got_set = 0, want_set = 0; // E <= 64 in the fixtures
            for (size_t j = 0; j < k; j++) {
                got_set |= 1ull << c.topk_idx[t * k + j];
                want_set |= 1ull << (int)want->data[t * k + j];
            }
            bad += got_set != want_set;
        }
        char label[96];
        snprintf(label, sizeof label, "topk sets equal (%zu tokens differ)", bad);
        check_true(label, bad == 0);
    }
    int *keep01 = malloc(T * k * sizeof(int));
    for (size_t i = 0; i < T * k; i++) keep01[i] = c.assign_row[i] >= 0;
    check_ints("keep", keep01, &fx, "keep", T * k);
    free(keep01);
    check_ints("counts", st.routed, &fx, "counts", E);
    check_ints("kept_counts", st.kept, &fx, "kept_counts", E);
    check_tensor("probs", c.probs, &fx, T * E);
    check_tensor("weights", c.weights, &fx, T * k);
    check_tensor("y", c.y, &fx, T * d);
    check_scalar("aux", st.aux, &fx);
    check_scalar("z", st.z, &fx);
    if (fixture_find(&fx, "seq_aux")) check_scalar("seq_aux", st.seq_aux, &fx);
    if (fixture_find(&fx, "scores")) check_tensor("scores", c.scores, &fx, T * E);
    check_scalar("entropy", st.entropy, &fx);
    check_tensor("dx", c.dx, &fx, T * d);
    check_tensor("dgate", c.g.gate, &fx, E * d);
    check_rel("dw1", w13_part_as_double(0, c.g.w13, 0, E, ff, d),
              fixture_get(&fx, "dw1", E * ff * d)->data, E * ff * d, TOL);
    check_rel("dw3", w13_part_as_double(0, c.g.w13, 1, E, ff, d),
              fixture_get(&fx, "dw3", E * ff * d)->data, E * ff * d, TOL);
    check_tensor("dw2", c.g.w2, &fx, E * d * ff);
    printf("  dropped %ld, max/mean %.3f, cv %.3f\n", st.dropped, st.max_over_mean, st.cv);

    moe_case_free(&c);
    fixture_free(&fx);
}

int main(int argc, char **argv) {
    int first = 1;
    if (argc > 2 && !strcmp(argv[1], "--dtype") && !strcmp(argv[2], "bf16")) {
        moe_case_dtype = MOE_DTYPE_BF16, TOL = TOL_BF16, first = 3;
        printf("dtype bf16: tolerance %g\n", TOL);
    }
    if (argc <= first) {
        fprintf(stderr, "usage: %s [--dtype bf16] FIXTURE.bin...\n", argv[0]);
        return 2;
    }
    for (int i = first; i < argc; i++) run_fixture(argv[i]);
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
