// One MoE layer (layers/moe.h) forward and backward on a backend (layers/backend.h), random
// weights. The tensors live in the backend's memory: the host fills them through
// copy_to_device and reads results back with copy_to_host, as on a GPU.
// Build: examples/CMakeLists.txt, or  cc moe_layer.c $(pkg-config --cflags --libs moe)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "layers/moe.h"

// n reals of backend memory: uniform in [-scale, scale], or zero when scale == 0
static real *device_uniform(moe_backend *be, size_t n, double scale) {
    real *host = malloc(n * sizeof(real)), *dev = be->alloc(be, n * sizeof(real));
    if (!host || !dev) moe_fatal("out of memory");
    for (size_t i = 0; i < n; i++) host[i] = (real)(scale * (2.0 * rand() / RAND_MAX - 1.0));
    be->copy_to_device(be, dev, host, n * sizeof(real));
    free(host);
    return dev;
}

// ||x|| of n reals of backend memory
static double device_norm(moe_backend *be, const real *x, size_t n) {
    double s;
    be->sum_squares(be, &s, x, n);
    return sqrt(s);
}

int main(void) {
    int T = 64, d = 32, ff = 64, E = 8, k = 2; // tokens, model dim, expert hidden, experts, top-k
    moe_config cfg = moe_config_default(d, ff, E, k);
    moe_backend *be;
    if (moe_backend_create(&be, "cpu", NULL)) moe_fatal("%s", moe_last_error());
    moe_layer L;
    if (moe_layer_init(&L, be, &cfg, T)) moe_fatal("%s", moe_last_error());
    size_t nw = moe_weights_count(&cfg), nx = (size_t)T * d;
    srand(1);
    real *params = device_uniform(be, nw, 0.2), *x = device_uniform(be, nx, 1.0);
    real *dout = device_uniform(be, nx, 1.0), *y = device_uniform(be, nx, 0);
    real *grads = device_uniform(be, nw, 0), *dx = device_uniform(be, nx, 0); // backward: +=
    moe_weights w, g;
    moe_weights_view(&w, params, &cfg);
    moe_weights_view(&g, grads, &cfg);
    moe_stats st;
    if (moe_layer_forward(&L, y, x, &w, T, 0, moe_pass_train(L.cfg.capacity_factor), &st))
        moe_fatal("%s", moe_last_error());
    if (moe_layer_backward(&L, dx, &g, dout, x, &w, 1.0)) moe_fatal("%s", moe_last_error());
    printf("moe layer T=%d d=%d ff=%d E=%d k=%d: |y| %.6f |dx| %.6f |dgate| %.6f aux %.6f\n", T, d,
           ff, E, k, device_norm(be, y, nx), device_norm(be, dx, nx),
           device_norm(be, g.gate, (size_t)E * d), st.aux);
    moe_layer_free(&L);
    real *bufs[] = {params, grads, x, dout, y, dx};
    for (int i = 0; i < 6; i++) be->free(be, bufs[i]);
    moe_backend_destroy(be);
    return 0;
}
