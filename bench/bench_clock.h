// The benchmarks' clock and median, shared by the bench programs (each is one file; the
// includer defines _POSIX_C_SOURCE >= 199309L first, for clock_gettime).
#ifndef MOE_BENCH_CLOCK_H
#define MOE_BENCH_CLOCK_H

#include <stdlib.h>
#include <time.h>

// Seconds on the monotonic clock.
static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The median of v[0..n) (v is sorted in place): the middle value, or the mean of the two.
static inline double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
