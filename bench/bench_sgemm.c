// The machine's sgemm rate: median GFLOP/s of C[M,N] = A[M,K] B[K,N] with OpenBLAS, the
// yardstick the training benchmark divides the model's FLOP rate by.
//   bench_sgemm [--m 2048] [--n 1024] [--k 1024] [--reps 7] [--json]
#define _POSIX_C_SOURCE 200809L // clock_gettime
#include "layers/cpu/cblas.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "layers/cpu/cpu_backend.h"
#include "layers/status.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int m = 2048, n = 1024, k = 1024, reps = 7, json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--m") && i + 1 < argc)
            m = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--n") && i + 1 < argc)
            n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--k") && i + 1 < argc)
            k = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else
            moe_fatal("bench_sgemm: unknown argument '%s'", argv[i]);
    }
    if (m < 1 || n < 1 || k < 1 || reps < 1 || reps > 1000) moe_fatal("bench_sgemm: bad sizes");
    float *a = malloc((size_t)m * k * 4), *b = malloc((size_t)k * n * 4),
          *c = malloc((size_t)m * n * 4);
    for (size_t i = 0; i < (size_t)m * k; i++) a[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)k * n; i++) b[i] = (float)(i % 7) * 0.01f;
    double *t = malloc(reps * sizeof(double));
    for (int r = -2; r < reps; r++) {
        double t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, a, k, b, n, 0, c, n);
        if (r >= 0) t[r] = now() - t0;
    }
    qsort(t, reps, sizeof *t, cmp);
    double gflops = 2.0 * m * n * k / t[reps / 2] * 1e-9;
    if (json)
        printf("{\"m\":%d,\"n\":%d,\"k\":%d,\"median_s\":%.6f,\"gflops\":%.2f,\"blas_kernel\":\"%"
               "s\"}\n",
               m, n, k, t[reps / 2], gflops, moe_blas_kernel());
    else
        printf("sgemm %dx%dx%d: %.2f GFLOP/s (median of %d, BLAS kernels %s)\n", m, n, k, gflops,
               reps, moe_blas_kernel());
    free(a), free(b), free(c), free(t);
    return 0;
}
