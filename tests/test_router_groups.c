// Group-limited routing (DeepSeek-V3) against transformers' own DeepseekV3TopkRouter: the
// fixtures tests/router_groups_hf.py writes from it (logits, correction bias, its top-k
// experts and combine weights) through the backend's router_topk. The chosen experts of each
// token equal as a set, their weights within 1e-5 (HF returns them unsorted).
//   test_router_groups FIXTURE.bin...
#include <stdio.h>
#include <stdlib.h>

#include "test_backend.h"
#include "test_util.h"

static void *dev_copy(moe_backend *be, const void *host, size_t bytes) {
    void *p = be->alloc(be, bytes);
    if (!p) {
        fprintf(stderr, "test_router_groups: out of device memory\n");
        exit(1);
    }
    if (host) be->copy_to_device(be, p, host, bytes);
    return p;
}

static void run(const char *path) {
    fixture fx;
    fixture_load(&fx, path);
    const int T = fixture_int(&fx, "T"), E = fixture_int(&fx, "E"), k = fixture_int(&fx, "k");
    const moe_router_hparams hp = {.scoring = MOE_SCORE_SIGMOID,
                                   .norm_topk_prob = fixture_int(&fx, "norm_topk_prob"),
                                   .route_scale = (real)fixture_double(&fx, "route_scale"),
                                   .n_group = fixture_int(&fx, "n_group"),
                                   .topk_group = fixture_int(&fx, "topk_group")};
    printf("%s: T=%d E=%d k=%d n_group=%d topk_group=%d norm=%d route_scale=%g\n", path, T, E, k,
           hp.n_group, hp.topk_group, hp.norm_topk_prob, (double)hp.route_scale);
    const size_t te = (size_t)T * E, tk = (size_t)T * k;
    real *z = malloc(te * sizeof(real)), *bias = malloc((size_t)E * sizeof(real));
    real *w = malloc(tk * sizeof(real));
    int *idx = malloc(tk * sizeof(int));
    const fixture_tensor *fz = fixture_get(&fx, "logits", te), *fb = fixture_get(&fx, "bias", E);
    for (size_t i = 0; i < te; i++) z[i] = (real)fz->data[i];
    for (int e = 0; e < E; e++) bias[e] = (real)fb->data[e];

    moe_backend *be = test_backend();
    real *dz = dev_copy(be, z, te * sizeof(real)), *db = dev_copy(be, bias, E * sizeof(real));
    real *ds = dev_copy(be, NULL, te * sizeof(real)), *dp = dev_copy(be, NULL, te * sizeof(real));
    real *dl = dev_copy(be, NULL, (size_t)T * sizeof(real)),
         *dw = dev_copy(be, NULL, tk * sizeof(real));
    int *di = dev_copy(be, NULL, tk * sizeof(int));
    const moe_router_shape sh = {.T = T, .E = E, .k = k, .seq_len = T};
    be->router_topk(be, ds, dp, dl, di, dw, dz, db, sh, hp);
    be->copy_to_host(be, idx, di, tk * sizeof(int));
    be->copy_to_host(be, w, dw, tk * sizeof(real));

    // match HF's (unsorted) choices to ours by expert: same set, the weight of each expert
    const fixture_tensor *want_i = fixture_get(&fx, "topk_idx", tk),
                         *want_w = fixture_get(&fx, "weights", tk);
    double *got = malloc(tk * sizeof(double)), *want = malloc(tk * sizeof(double));
    size_t bad_sets = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            const int e = (int)want_i->data[(size_t)t * k + j];
            int at = -1;
            for (int i = 0; i < k; i++)
                if (idx[(size_t)t * k + i] == e) at = i;
            bad_sets += at < 0;
            got[(size_t)t * k + j] = at < 0 ? 0 : w[(size_t)t * k + at];
            want[(size_t)t * k + j] = want_w->data[(size_t)t * k + j];
        }
    char label[96];
    snprintf(label, sizeof label, "chosen experts equal transformers' (%zu differ)", bad_sets);
    check_true(label, bad_sets == 0);
    check_rel("combine weights", got, want, tk, 1e-5);

    void *dev[] = {dz, db, ds, dp, dl, dw, di};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) be->free(be, dev[i]);
    free(z), free(bias), free(w), free(idx), free(got), free(want);
    fixture_free(&fx);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FIXTURE.bin...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) run(argv[i]);
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
