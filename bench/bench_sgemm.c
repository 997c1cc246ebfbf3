// The machine's GEMM rate: median GFLOP/s of C[M,N] = A[M,K] B[K,N], the yardstick the
// training benchmark divides the model's FLOP rate by, on the CPU backend's path that a
// training run takes here ("gemm_path" names it): fp32 its matmul (the BLAS's sgemm, or
// oneDNN's on an Intel CPU with AVX-512: layers/cpu/gemm.c), bf16 its matmul_bf16 (A, B bf16,
// C fp32: moe's AMX kernel, OpenBLAS sbgemm, oneDNN or emulated).
// --ta / --tb transpose A / B (stored [K, M] / [N, K]), as the model's GEMMs do: the rate of
// each GEMM of a training step at its own shape (docs/measurements/*-cpu-profile-*.md).
//   bench_sgemm [--m 2048] [--n 1024] [--k 1024] [--ta] [--tb] [--reps 7] [--dtype fp32|bf16]
//               [--json]
#define _POSIX_C_SOURCE 200809L // clock_gettime
#include "layers/cpu/cblas.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_clock.h"
#include "layers/backend.h"
#include "layers/bf16.h"
#include "layers/cpu/cpu_backend.h"
#include "layers/status.h"

int main(int argc, char **argv) {
    int m = 2048, n = 1024, k = 1024, reps = 7, json = 0, bf16 = 0, ta = 0, tb = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--m") && i + 1 < argc)
            m = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--n") && i + 1 < argc)
            n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--k") && i + 1 < argc)
            k = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            if (strcmp(d, "fp32") && strcmp(d, "bf16"))
                moe_fatal("bench_sgemm: --dtype '%s': fp32 or bf16", d);
            bf16 = !strcmp(d, "bf16");
        } else if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--ta"))
            ta = 1;
        else if (!strcmp(argv[i], "--tb"))
            tb = 1;
        else
            moe_fatal("bench_sgemm: unknown argument '%s'", argv[i]);
    }
    if (m < 1 || n < 1 || k < 1 || reps < 1 || reps > 1000) moe_fatal("bench_sgemm: bad sizes");
    float *a = malloc((size_t)m * k * 4), *b = malloc((size_t)k * n * 4),
          *c = malloc((size_t)m * n * 4);
    for (size_t i = 0; i < (size_t)m * k; i++) a[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)k * n; i++) b[i] = (float)(i % 7) * 0.01f;
    // both precisions through the CPU backend, so that the rate is that of the path a training
    // run takes here: fp32 the BLAS's sgemm or oneDNN's (gemm.c), bf16 gemm_bf16.c's path
    moe_backend *be = NULL;
    if (moe_backend_create(&be, "cpu", NULL)) moe_fatal("%s", moe_last_error());
    const cpu_state *st = be->state;
    moe_bf16 *a16 = NULL, *b16 = NULL;
    const char *path = st->fp32_onednn ? "oneDNN sgemm" : "sgemm";
    if (bf16) {
        a16 = malloc((size_t)m * k * 2), b16 = malloc((size_t)k * n * 2);
        for (size_t i = 0; i < (size_t)m * k; i++) a16[i] = moe_f32_to_bf16(a[i]);
        for (size_t i = 0; i < (size_t)k * n; i++) b16[i] = moe_f32_to_bf16(b[i]);
        path = cpu_bf16_path_name(st->bf16_native);
    }
    double *t = malloc(reps * sizeof(double));
    for (int r = -2; r < reps; r++) {
        double t0 = bench_now();
        if (bf16)
            be->matmul_bf16(be, c, a16, b16, m, n, k, ta, tb, 0);
        else
            be->matmul(be, c, a, b, m, n, k, ta, tb, 0);
        if (r >= 0) t[r] = bench_now() - t0;
    }
    const double med = bench_median(t, reps);
    double gflops = 2.0 * m * n * k / med * 1e-9;
    const char *dtype = bf16 ? "bf16" : "fp32";
    // the BLAS's name and version, without OpenBLAS's build options ("OpenBLAS 0.3.21 ...")
    const char *name = moe_blas_name(), *sp = strchr(name, ' '),
               *sp2 = sp ? strchr(sp + 1, ' ') : 0;
    const int name_len = sp2 ? (int)(sp2 - name) : (int)strlen(name);
    if (json)
        printf("{\"m\":%d,\"n\":%d,\"k\":%d,\"op\":\"%c%c\",\"dtype\":\"%s\",\"median_s\":%.6f,"
               "\"gflops\":%.2f,\"blas\":\"%.*s\",\"blas_kernel\":\"%s\",\"gemm_path\":\"%s\"}\n",
               m, n, k, ta ? 'T' : 'N', tb ? 'T' : 'N', dtype, med, gflops, name_len, name,
               moe_blas_kernel(), path);
    else
        printf("%s GEMM %dx%dx%d %c%c: %.2f GFLOP/s (median of %d, %.*s, kernels %s, %s)\n", dtype,
               m, n, k, ta ? 'T' : 'N', tb ? 'T' : 'N', gflops, reps, name_len, name,
               moe_blas_kernel(), path);
    be->destroy(be);
    free(a), free(b), free(c), free(t), free(a16), free(b16);
    return 0;
}
