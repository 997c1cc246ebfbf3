// The CPU backend's reductions (layers/cpu/elementwise.c): sum_squares against a long double
// sum, on sizes that hit its paths (empty, a tail shorter than one lane group, one partial
// block, more blocks than its on-stack partials), the same bits on 1 and 2 threads (its
// order is fixed: lanes, blocks), and NaN / Inf propagating; sum against the same reference.
// And zero (layers/cpu/backend_cpu.c), which clears large buffers in slices over the threads:
// every byte cleared and none outside, either side of its threshold and with a partial slice.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/cpu/cpu_backend.h"
#include "test_util.h"

static moe_backend *be;

static double sum_squares_on(int threads, const real *x, size_t n) {
    double out = -1;
    cpu_backend_set_threads(be, threads);
    be->sum_squares(be, &out, x, n);
    return out;
}

static void check_size(test_rng *rng, size_t n) {
    real *x = malloc((n + 1) * sizeof(real));
    long double ref = 0, ref_sum = 0;
    for (size_t i = 0; i < n; i++) {
        x[i] = (real)rng_normal(rng);
        ref += (long double)x[i] * x[i];
        ref_sum += x[i];
    }
    const double one = sum_squares_on(1, x, n), two = sum_squares_on(2, x, n);
    char what[128];
    snprintf(what, sizeof what, "sum_squares n=%zu: %.17g vs long double %.17Lg", n, two, ref);
    check_true(what, fabs(two - (double)ref) <= 1e-12 * (double)(ref > 0 ? ref : 1));
    snprintf(what, sizeof what, "sum_squares n=%zu: the same bits on 1 and 2 threads", n);
    check_true(what, one == two);
    double s = 0;
    be->sum(be, &s, x, n);
    snprintf(what, sizeof what, "sum n=%zu", n);
    check_true(what, fabs(s - (double)ref_sum) <= 1e-12 * (double)(ref > 0 ? ref : 1));
    free(x);
}

static void check_zero(size_t n) {
    unsigned char *b = malloc(n + 2);
    memset(b, 0xA5, n + 2);
    be->zero(be, b + 1, n);
    size_t left = 0;
    for (size_t i = 1; i <= n; i++) left += b[i] != 0;
    char what[128];
    snprintf(what, sizeof what, "zero n=%zu: %zu bytes not cleared", n, left);
    check_true(what, left == 0);
    snprintf(what, sizeof what, "zero n=%zu: the bytes either side untouched", n);
    check_true(what, b[0] == 0xA5 && b[n + 1] == 0xA5);
    free(b);
}

int main(void) {
    if (cpu_backend_create(&be, NULL, 0)) return 1;
    cpu_backend_set_threads(be, 2);
    const size_t MiB = (size_t)1 << 20,
                 zero_sizes[] = {0, 1, 4 * MiB - 1, 4 * MiB, 5 * MiB + 12345};
    for (size_t i = 0; i < sizeof zero_sizes / sizeof zero_sizes[0]; i++) check_zero(zero_sizes[i]);
    test_rng rng;
    rng_seed(&rng, 11);
    const size_t sizes[] = {0, 3, 8, 8191, 8192, 8193, 100000, 8192 * 70 + 13};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) check_size(&rng, sizes[i]);
    real v[20000];
    for (int i = 0; i < 20000; i++) v[i] = 1;
    v[17000] = NAN;
    check_true("sum_squares: a NaN propagates", isnan(sum_squares_on(2, v, 20000)));
    v[17000] = INFINITY;
    check_true("sum_squares: an Inf propagates", isinf(sum_squares_on(2, v, 20000)));
    be->destroy(be);
    printf("%s\n", test_failures() ? "FAILED" : "all passed");
    return test_failures() != 0;
}
