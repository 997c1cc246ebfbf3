// One MoE layer (layers/moe.h) forward and backward on the CPU backend, random weights.
// Build: examples/CMakeLists.txt, or  cc moe_layer.c $(pkg-config --cflags --libs moe)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "layers/moe.h"

// uniform in [-scale, scale]; the CPU backend's device memory is host memory
static real *rand_uniform(size_t n, double scale) {
    real *x = malloc(n * sizeof(real));
    for (size_t i = 0; i < n; i++) x[i] = (real)(scale * (2.0 * rand() / RAND_MAX - 1.0));
    return x;
}
static double norm(const real *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
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
    real *params = rand_uniform(nw, 0.2), *x = rand_uniform(nx, 1.0), *dout = rand_uniform(nx, 1.0);
    real *grads = calloc(nw, sizeof(real)), *y = malloc(nx * sizeof(real));
    real *dx = calloc(nx, sizeof(real)); // backward accumulates (+=) into dx and grads
    moe_weights w, g;
    moe_weights_view(&w, params, &cfg);
    moe_weights_view(&g, grads, &cfg);
    moe_stats st;
    if (moe_layer_forward(&L, y, x, &w, T, 0, 1, &st)) moe_fatal("%s", moe_last_error());
    if (moe_layer_backward(&L, dx, &g, dout, x, &w, 1.0)) moe_fatal("%s", moe_last_error());
    printf("moe layer T=%d d=%d ff=%d E=%d k=%d: |y| %.6f |dx| %.6f |dgate| %.6f aux %.6f\n", T, d,
           ff, E, k, norm(y, nx), norm(dx, nx), norm(g.gate, (size_t)E * d), st.aux);
    moe_layer_free(&L);
    free(params), free(grads), free(x), free(dout), free(y), free(dx);
    moe_backend_destroy(be);
    return 0;
}
