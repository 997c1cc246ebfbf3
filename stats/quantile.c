// The numbers of moe stats (quantile.h): numpy's percentile, the capacity a set of counts
// needs, and capacity factors and capacities as the layer computes them.
#define _POSIX_C_SOURCE 200809L

#include "stats/quantile.h"

#include <math.h>

#include "layers/moe.h"

double stats_percentile_sorted(const double *a, size_t n, double p) {
    if (n == 0) return NAN;
    // numpy: q = p / 100; virtual index (n-1)*q; _lerp(previous, next, gamma).
    const double q = p / 100.0;
    const double vi = (double)(n - 1) * q;
    if (!(vi > 0)) return a[0];
    if (vi >= (double)(n - 1)) return a[n - 1];
    const double lo = floor(vi);
    const size_t i = (size_t)lo;
    const double g = vi - lo, prev = a[i], next = a[i + 1], diff = next - prev;
    return g >= 0.5 ? next - diff * (1 - g) : prev + diff * g;
}

long stats_needed_capacity(const long *counts, int rows, int E, int groups_per_row,
                           double max_drop) {
    // Row r stands for n = groups_per_row equal groups with c_e = counts[r][e] / n each; the
    // dropped assignments at capacity C are sum_r sum_e n * max(0, c_e - C)
    // = sum_r sum_e max(0, counts[r][e] - n*C), an exact integer sum compared with
    // max_drop * sum of all counts. The smallest C that passes is found by bisection.
    if (E <= 0 || rows <= 0 || groups_per_row <= 0) return 1;
    const long n = groups_per_row;
    const size_t cells = (size_t)rows * (size_t)E;
    long max = 0;
    double total = 0;
    for (size_t i = 0; i < cells; i++) {
        if (counts[i] > max) max = counts[i];
        total += (double)counts[i];
    }
    const double allowed = max_drop * total;
    long lo = 0, hi = (max + n - 1) / n; // at hi nothing overflows
    while (lo < hi) {
        const long mid = lo + (hi - lo) / 2;
        double over = 0;
        for (size_t i = 0; i < cells; i++)
            if (counts[i] > n * mid) over += (double)(counts[i] - n * mid);
        if (over <= allowed)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo < 1 ? 1 : lo; // capacity 0 means dropless in the config
}

long stats_capacity_of(double cf, long T, int k, int E) {
    if (!(cf > 0)) return 0; // (a NaN too)
    const moe_config c = {.n_experts = E, .top_k = k};
    return moe_capacity(&c, (int)T, cf); // T <= MOE_CONFIG_MAX_TOKENS (stats.h)
}

double stats_capacity_factor(long C, long T, int k, int E) {
    double cf = (double)C * E / ((double)T * k);
    for (int i = 0; i < 64; i++) {
        const long got = stats_capacity_of(cf, T, k, E);
        if (got == C || (C >= T && got >= T)) break;
        cf = nextafter(cf, got > C ? 0.0 : INFINITY);
    }
    return cf;
}
