// The MoE layer's seams (layers/moe.h moe_layer_shape): what a layer refuses, that layers
// sharing one backward scratch give the same bits as layers with their own, and that a
// forward reads back from the device exactly once (counts, offsets and losses together).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/moe.h"
#include "test_backend.h"
#include "test_util.h"

// n reals of backend memory from a host array (NULL: zeros)
static real *device_copy(moe_backend *be, const real *host, size_t n) {
    real *p = be->alloc(be, n * sizeof(real));
    if (!p) {
        fprintf(stderr, "out of backend memory\n");
        exit(1);
    }
    if (host) be->copy_to_device(be, p, host, n * sizeof(real));
    return p;
}

static real *host_copy(moe_backend *be, const real *dev, size_t n) {
    real *h = malloc(n * sizeof(real));
    be->copy_to_host(be, h, dev, n * sizeof(real));
    return h;
}

static real *random_host(test_rng *r, size_t n, double scale) {
    real *h = malloc(n * sizeof(real));
    for (size_t i = 0; i < n; i++) h[i] = (real)(scale * rng_normal(r));
    return h;
}

static void check_refusals(moe_backend *be, const moe_config *cfg) {
    moe_layer L;
    moe_layer_shape s = {.max_tokens = 16, .n_local_experts = cfg->n_experts / 2};
    check_true("E_local < E refused without an exchange",
               moe_layer_create(&L, be, cfg, &s) == MOE_EINVAL &&
                   strstr(moe_last_error(), "exchange") != NULL);
    s = (moe_layer_shape){.max_tokens = 16, .first_expert = 1};
    check_true("first_expert != 0 refused without an exchange",
               moe_layer_create(&L, be, cfg, &s) == MOE_EINVAL);
    s = (moe_layer_shape){.max_tokens = 16, .max_expert_rows = -1};
    check_true("max_expert_rows < 0 refused",
               moe_layer_create(&L, be, cfg, &s) == MOE_EINVAL &&
                   strstr(moe_last_error(), "max_expert_rows") != NULL);
    s = (moe_layer_shape){.max_tokens = 0};
    check_true("max_tokens 0 refused", moe_layer_create(&L, be, cfg, &s) == MOE_EINVAL);
}

// The copies to the host a forward makes, counted through a copy of the backend's table.
// The dropless row cap (max_expert_rows below T k on one rank): buffers of the cap's rows; a
// forward within it equals an uncapped layer's bit for bit; one beyond it stops naming the
// rows, the hottest expert and the cap, and a cap above the bound is the bound.
static void check_row_cap(moe_backend *be, const moe_config *cfg, const real *hx, const real *hw) {
    const int T = 32, small = 8, cap = 20, d = cfg->d_model;
    const size_t nx = (size_t)T * d, nw = moe_weights_count(cfg);
    moe_layer C, U, A;
    moe_layer_shape sc = {.max_tokens = T, .max_expert_rows = cap, .forward_only = 1},
                    su = {.max_tokens = T, .forward_only = 1},
                    sa = {.max_tokens = T, .max_expert_rows = 1000, .forward_only = 1};
    if (moe_layer_create(&C, be, cfg, &sc) || moe_layer_create(&U, be, cfg, &su) ||
        moe_layer_create(&A, be, cfg, &sa)) {
        check_true("capped layers create", 0);
        return;
    }
    check_true("a cap above T k is the bound", A.max_expert_rows == T * cfg->top_k);
    check_true("the capped layer's buffers are smaller", C.bytes < U.bytes);
    real *x = device_copy(be, hx, nx), *yc = device_copy(be, NULL, nx),
         *yu = device_copy(be, NULL, nx), *w = device_copy(be, hw, nw);
    moe_weights wv;
    moe_weights_view(&wv, w, cfg);
    const int ok = !moe_layer_forward(&C, yc, x, &wv, small, 0, moe_pass_infer(), NULL) &&
                   !moe_layer_forward(&U, yu, x, &wv, small, 0, moe_pass_infer(), NULL);
    real *hc = host_copy(be, yc, (size_t)small * d), *hu = host_copy(be, yu, (size_t)small * d);
    check_true("a forward within the cap runs, equal to the uncapped layer's bit for bit",
               ok && !memcmp(hc, hu, (size_t)small * d * sizeof(real)));
    const moe_status st = moe_layer_forward(&C, yc, x, &wv, T, 0, moe_pass_infer(), NULL);
    printf("beyond the cap: %s\n", moe_last_error());
    check_true("a dropless forward of 64 rows beyond a cap of 20 stops, naming rows, expert, cap",
               st == MOE_EINVAL && strstr(moe_last_error(), "dropless row cap") &&
                   strstr(moe_last_error(), "64 rows") &&
                   strstr(moe_last_error(), "hottest: expert") &&
                   strstr(moe_last_error(), "cap of 20 rows"));
    free(hc), free(hu);
    real *bufs[] = {x, yc, yu, w};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    moe_layer_free(&A), moe_layer_free(&U), moe_layer_free(&C);
}

static int d2h_copies;
static void (*real_copy_to_host)(moe_backend *, void *, const void *, size_t);
static void counting_copy_to_host(moe_backend *be, void *dst, const void *src, size_t n) {
    d2h_copies++;
    real_copy_to_host(be, dst, src, n);
}

int main(void) {
    moe_backend *be = test_backend();
    const int T = 32, d = 16, ff = 24, E = 8, k = 2;
    moe_config cfg = moe_config_default(d, ff, E, k);
    cfg.capacity_factor = 1.25; // some drops: the kept rows differ per layer
    check_refusals(be, &cfg);

    // Two layers, A then B forward, B then A backward (a model's order), once with one
    // shared scratch and once with their own: the same outputs and gradients, bit for bit.
    test_rng r;
    rng_seed(&r, 7);
    const size_t nw = moe_weights_count(&cfg), nx = (size_t)T * d;
    real *hw[2], *hx = random_host(&r, nx, 1), *hdout = random_host(&r, nx, 1);
    for (int i = 0; i < 2; i++) hw[i] = random_host(&r, nw, 0.3);
    real *got[2][3]; // [shared?][y, dx, grads of both]
    for (int shared = 0; shared < 2; shared++) {
        moe_layer L[2];
        moe_layer_shape sa = {.max_tokens = T};
        if (moe_layer_create(&L[0], be, &cfg, &sa)) return 1;
        moe_layer_shape sb = {.max_tokens = T, .scratch = shared ? L[0].bwd : NULL};
        if (moe_layer_create(&L[1], be, &cfg, &sb)) return 1;
        check_true("a shared scratch is not counted twice",
                   !shared || L[1].bytes + L[0].bwd->bytes == L[0].bytes);
        real *x = device_copy(be, hx, nx), *h = device_copy(be, NULL, nx);
        real *y = device_copy(be, NULL, nx), *dout = device_copy(be, hdout, nx);
        real *dh = device_copy(be, NULL, nx), *dx = device_copy(be, NULL, nx);
        real *w[2], *g = device_copy(be, NULL, 2 * nw);
        moe_weights wv[2], gv[2];
        for (int i = 0; i < 2; i++) {
            w[i] = device_copy(be, hw[i], nw);
            moe_weights_view(&wv[i], w[i], &cfg);
            moe_weights_view(&gv[i], g + i * nw, &cfg);
        }
        int ok = !moe_layer_forward(&L[0], h, x, &wv[0], T, 0,
                                    moe_pass_train(L[0].cfg.capacity_factor), NULL) &&
                 !moe_layer_forward(&L[1], y, h, &wv[1], T, 0,
                                    moe_pass_train(L[1].cfg.capacity_factor), NULL) &&
                 !moe_layer_backward(&L[1], dh, &gv[1], dout, h, &wv[1], 1.0) &&
                 !moe_layer_backward(&L[0], dx, &gv[0], dh, x, &wv[0], 1.0);
        check_true(shared ? "shared scratch: forward and backward run" : "own scratch: run", ok);
        got[shared][0] = host_copy(be, y, nx);
        got[shared][1] = host_copy(be, dx, nx);
        got[shared][2] = host_copy(be, g, 2 * nw);
        real *bufs[] = {x, h, y, dout, dh, dx, w[0], w[1], g};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
        moe_layer_free(&L[1]);
        moe_layer_free(&L[0]);
    }
    check_true("shared scratch == own scratch: outputs, bit for bit",
               !memcmp(got[0][0], got[1][0], nx * sizeof(real)));
    check_true("shared scratch == own scratch: input gradient, bit for bit",
               !memcmp(got[0][1], got[1][1], nx * sizeof(real)));
    check_true("shared scratch == own scratch: weight gradients, bit for bit",
               !memcmp(got[0][2], got[1][2], 2 * nw * sizeof(real)));
    double gn = 0;
    for (size_t i = 0; i < 2 * nw; i++) gn += fabs((double)got[1][2][i]);
    check_true("the gradients are not all zero", gn > 0);

    check_row_cap(be, &cfg, hx, hw[0]);

    // one device-to-host copy per forward; a forward-only layer refuses a backward
    moe_backend counting = *be;
    real_copy_to_host = be->copy_to_host;
    counting.copy_to_host = counting_copy_to_host;
    moe_layer F;
    moe_layer_shape sf = {.max_tokens = T, .forward_only = 1};
    if (moe_layer_create(&F, &counting, &cfg, &sf)) return 1;
    real *x = device_copy(be, hx, nx), *y = device_copy(be, NULL, nx),
         *w = device_copy(be, hw[0], nw);
    moe_weights wv;
    moe_weights_view(&wv, w, &cfg);
    moe_stats st;
    d2h_copies = 0;
    check_true("forward-only layer: forward runs",
               !moe_layer_forward(&F, y, x, &wv, T, 0, moe_pass_train(F.cfg.capacity_factor), &st));
    printf("device-to-host copies in one forward: %d\n", d2h_copies);
    check_true("one device-to-host copy per forward", d2h_copies == 1);
    check_true("the readback carries counts and losses", st.aux > 0 && st.entropy > 0 &&
                                                             st.routed[0] + st.routed[E - 1] >= 0 &&
                                                             st.dropped >= 0);
    check_true("forward-only layer: backward refused",
               moe_layer_backward(&F, y, &wv, x, x, &wv, 1.0) == MOE_EINVAL);
    moe_layer_free(&F);
    be->free(be, x), be->free(be, y), be->free(be, w);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 3; i++) free(got[s][i]);
    free(hw[0]), free(hw[1]), free(hx), free(hdout);
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
