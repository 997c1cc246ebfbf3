// BLAS candidates on the GEMM shapes of the MoE layer and the model, fp32 and bf16.
//
//   bench_blas --lib openblas|blis|mkl|dnnl [--path LIB.so] [--threads 2] [--reps 7]
//   bench_blas --shapes      (the shapes as JSON lines, for bench/gemm_torch.py)
//
// The library is loaded with dlopen after the environment is set (OpenBLAS reads
// OPENBLAS_CORETYPE, BLIS BLIS_ARCH_TYPE, MKL MKL_THREADING_LAYER when they load), so one
// program measures every library; scripts/bench_blas runs it once per library and kernel
// family and prints the table. Each GEMM is timed alone (median of --reps after 2 warm-ups),
// one call threaded by the library over --threads threads. A group's rate is its FLOPs over
// the sum of its GEMMs' medians, each GEMM counted as often as the layer runs it (once per
// expert). bf16: C (fp32) = A (bf16) B (bf16), where the library has it (MKL
// cblas_gemm_bf16bf16f32, oneDNN dnnl_gemm_bf16bf16f32, OpenBLAS cblas_sbgemm).
// Output: one JSON line per group, then {"lib":...,"kernel":...} with the kernel family.
#define _POSIX_C_SOURCE 200809L // clock_gettime, setenv
#include <dlfcn.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_clock.h"

typedef struct {
    const char *group; // shapes of one workload
    int m, n, k, ta, tb, times;
} shape;

// Row-major C[m,n] = op(A) op(B), ta/tb: A / B transposed, as layers/cpu/gemm.c calls them.
// MoE experts (rows = T k / E per expert): forward h13 = x w13^T (NT), y = act w2^T (NT);
// backward input dact = dy w2 (NN), dx = dh13 w13 (NN); weight dw13 = dh13^T x (TN),
// dw2 = dy^T act (TN). Model (configs/shakespeare.cfg, B*S = 2048 tokens, d = 192):
// qkv [320, 192], o [192, 192], lm_head [256, 192], each forward, dX and dW.
#define EXPERT(g, rows, d, ff, E)                                                          \
    {g, rows, 2 * (ff), d, 0, 1, E}, {g, rows, d, ff, 0, 1, E}, {g, rows, ff, d, 0, 0, E}, \
        {g, rows, d, 2 * (ff), 0, 0, E}, {g, 2 * (ff), d, rows, 1, 0, E}, {                \
        g, d, ff, rows, 1, 0, E                                                            \
    }
#define DENSE(g, T, out, in) \
    {g, T, out, in, 0, 1, 1}, {g, T, in, out, 0, 0, 1}, { g, out, in, T, 1, 0, 1 }
static const shape shapes[] = {
    EXPERT("moe_coarse", 1024, 512, 1408, 8),            // T=4096 d=512 ff=1408 E=8 k=2
    EXPERT("moe_fine", 1024, 512, 256, 32),              // T=4096 d=512 ff=256 E=32 k=8
    EXPERT("shakespeare_experts", 512, 192, 384, 8 * 4), // 2048 tokens, E=8 k=2, 4 layers
    DENSE("shakespeare_dense", 2048, 320, 192),
    DENSE("shakespeare_dense", 2048, 192, 192),
    DENSE("shakespeare_dense", 2048, 256, 192), // qkv, o, lm_head
    {"square_2048x1024x1024", 2048, 1024, 1024, 0, 0, 1},
};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

typedef void (*sgemm_fn)(int ta, int tb, int m, int n, int k, const float *a, int lda,
                         const float *b, int ldb, float *c, int ldc);
typedef void (*bgemm_fn)(int ta, int tb, int m, int n, int k, const uint16_t *a, int lda,
                         const uint16_t *b, int ldb, float *c, int ldc);

// ---- the libraries' entry points (declared here: no library's header is needed) ----
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 }; // CBLAS's enum values
static void *lib;
static void (*cblas_s)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                       float, float *, int);
static void (*cblas_b)(int, int, int, int, int, int, float, const uint16_t *, int, const uint16_t *,
                       int, float, float *, int);
static int (*dnnl_s)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t,
                     const float *, int64_t, float, float *, int64_t);
static int (*dnnl_b)(char, char, int64_t, int64_t, int64_t, float, const uint16_t *, int64_t,
                     const uint16_t *, int64_t, float, float *, int64_t);
static int dnnl_failed;

static void via_cblas_s(int ta, int tb, int m, int n, int k, const float *a, int lda,
                        const float *b, int ldb, float *c, int ldc) {
    cblas_s(ROW_MAJOR, ta ? TRANS : NO_TRANS, tb ? TRANS : NO_TRANS, m, n, k, 1, a, lda, b, ldb, 0,
            c, ldc);
}
static void via_cblas_b(int ta, int tb, int m, int n, int k, const uint16_t *a, int lda,
                        const uint16_t *b, int ldb, float *c, int ldc) {
    cblas_b(ROW_MAJOR, ta ? TRANS : NO_TRANS, tb ? TRANS : NO_TRANS, m, n, k, 1, a, lda, b, ldb, 0,
            c, ldc);
}
static void via_dnnl_s(int ta, int tb, int m, int n, int k, const float *a, int lda, const float *b,
                       int ldb, float *c, int ldc) {
    dnnl_failed |= dnnl_s(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1, a, lda, b, ldb, 0, c, ldc);
}
static void via_dnnl_b(int ta, int tb, int m, int n, int k, const uint16_t *a, int lda,
                       const uint16_t *b, int ldb, float *c, int ldc) {
    dnnl_failed |= dnnl_b(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1, a, lda, b, ldb, 0, c, ldc);
}

static void *sym(const char *name) { return lib ? dlsym(lib, name) : NULL; }

static void die(const char *msg, const char *arg) {
    fprintf(stderr, "bench_blas: %s%s\n", msg, arg ? arg : "");
    exit(1);
}

// The library's kernel family (or ISA level) after it ran, into buf.
static void kernel_family(const char *name, char *buf, size_t n) {
    snprintf(buf, n, "unknown");
    if (!strcmp(name, "openblas")) {
        const char *(*core)(void) = (const char *(*)(void))sym("openblas_get_corename");
        if (core) snprintf(buf, n, "%s", core());
    } else if (!strcmp(name, "blis")) {
        int (*id)(void) = (int (*)(void))sym("bli_arch_query_id");
        const char *(*str)(int) = (const char *(*)(int))sym("bli_arch_string");
        if (id && str) snprintf(buf, n, "%s", str(id()));
    } else if (!strcmp(name, "mkl")) { // MKLVersion's Processor: the code path it runs
        typedef struct {
            int major, minor, update;
            char *status, *build, *processor, *platform;
        } mkl_version;
        void (*ver)(mkl_version *) = (void (*)(mkl_version *))sym("MKL_Get_Version");
        mkl_version v = {0};
        if (ver) ver(&v);
        // "Intel(R) Advanced Vector Extensions 512 (Intel(R) AVX-512) with support for INT8,
        // BF16, FP16 (limited) instructions, and Intel(R) Advanced Matrix Extensions ...": the
        // short name in its first parentheses, and AMX when it says so
        const char *p = v.processor, *l = p ? strstr(p, "(Intel(R) ") : NULL,
                   *r = l ? strchr(l + 10, ')') : NULL;
        if (l && r)
            snprintf(buf, n, "%d.%d: %.*s%s", v.major, v.update, (int)(r - l - 10), l + 10,
                     strstr(p, "Matrix Extensions") ? " + AMX" : "");
        else if (p)
            snprintf(buf, n, "%d.%d: %.60s", v.major, v.update, p);
    } else if (!strcmp(name, "dnnl")) {
        int (*isa)(void) = (int (*)(void))sym("dnnl_get_effective_cpu_isa");
        static const struct {
            int v;
            const char *s;
        } names[] = {{0x1, "sse41"},
                     {0x3, "avx"},
                     {0x7, "avx2"},
                     {0x407, "avx2_vnni"},
                     {0x27, "avx512_core"},
                     {0x67, "avx512_core_vnni"},
                     {0xe7, "avx512_core_bf16"},
                     {0x3e7, "avx512_core_amx"}};
        const int v = isa ? isa() : -1;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (names[i].v == v) snprintf(buf, n, "%s", names[i].s);
    }
}

// Median seconds of one GEMM of shape s (fp32 when bg is NULL, else bf16 inputs).
static double time_gemm(const shape *s, sgemm_fn sg, bgemm_fn bg, const float *a, const float *b,
                        const uint16_t *ab, const uint16_t *bb, float *c, int reps) {
    const int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
    double t[64];
    for (int r = -2; r < reps; r++) {
        const double t0 = bench_now();
        if (bg)
            bg(s->ta, s->tb, s->m, s->n, s->k, ab, lda, bb, ldb, c, s->n);
        else
            sg(s->ta, s->tb, s->m, s->n, s->k, a, lda, b, ldb, c, s->n);
        if (r >= 0) t[r] = bench_now() - t0;
    }
    return bench_median(t, reps);
}

static uint16_t to_bf16(float f) { // round to nearest even (inputs are finite)
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

int main(int argc, char **argv) {
    const char *name = NULL, *path = NULL;
    int threads = 2, reps = 7;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--lib") && i + 1 < argc)
            name = argv[++i];
        else if (!strcmp(argv[i], "--path") && i + 1 < argc)
            path = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shapes")) {
            for (int j = 0; j < N_SHAPES; j++)
                printf("{\"group\":\"%s\",\"m\":%d,\"n\":%d,\"k\":%d,\"ta\":%d,\"tb\":%d,"
                       "\"times\":%d}\n",
                       shapes[j].group, shapes[j].m, shapes[j].n, shapes[j].k, shapes[j].ta,
                       shapes[j].tb, shapes[j].times);
            return 0;
        } else
            die("unknown argument ", argv[i]);
    }
    if (!name) die("--lib openblas|blis|mkl|dnnl is required", NULL);
    if (threads < 1 || reps < 1 || reps > 64) die("bad --threads or --reps", NULL);
    if (!path) {
        path = !strcmp(name, "openblas") ? "libopenblas.so.0"
               : !strcmp(name, "blis")   ? "libblis.so.4"
               : !strcmp(name, "mkl")    ? "libmkl_rt.so.2"
                                         : "libdnnl.so.2";
    }
    lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!lib) die("cannot load ", dlerror());
    sgemm_fn sg = NULL;
    bgemm_fn bg = NULL;
    omp_set_num_threads(threads);
    if (!strcmp(name, "dnnl")) {
        dnnl_s = (int (*)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t,
                          const float *, int64_t, float, float *, int64_t))sym("dnnl_sgemm");
        dnnl_b = (int (*)(char, char, int64_t, int64_t, int64_t, float, const uint16_t *, int64_t,
                          const uint16_t *, int64_t, float, float *,
                          int64_t))sym("dnnl_gemm_bf16bf16f32");
        sg = dnnl_s ? via_dnnl_s : NULL;
        bg = dnnl_b ? via_dnnl_b : NULL;
    } else {
        cblas_s = (void (*)(int, int, int, int, int, int, float, const float *, int, const float *,
                            int, float, float *, int))sym("cblas_sgemm");
        cblas_b =
            (void (*)(int, int, int, int, int, int, float, const uint16_t *, int, const uint16_t *,
                      int, float, float *, int))sym(!strcmp(name, "mkl") ? "cblas_gemm_bf16bf16f32"
                                                                         : "cblas_sbgemm");
        sg = cblas_s ? via_cblas_s : NULL;
        bg = cblas_b ? via_cblas_b : NULL;
        void (*set)(int) = (void (*)(int))sym(!strcmp(name, "openblas") ? "openblas_set_num_threads"
                                              : !strcmp(name, "blis") ? "bli_thread_set_num_threads"
                                                                      : "MKL_Set_Num_Threads");
        if (set) set(threads);
    }
    if (!sg) die("no sgemm in ", path);

    size_t big = 0; // the largest operand
    for (int i = 0; i < N_SHAPES; i++) {
        const size_t s[3] = {(size_t)shapes[i].m * shapes[i].k, (size_t)shapes[i].k * shapes[i].n,
                             (size_t)shapes[i].m * shapes[i].n};
        for (int j = 0; j < 3; j++) big = s[j] > big ? s[j] : big;
    }
    float *a = malloc(big * 4), *b = malloc(big * 4), *c = malloc(big * 4);
    uint16_t *ab = malloc(big * 2), *bb = malloc(big * 2);
    if (!a || !b || !c || !ab || !bb) die("out of memory", NULL);
    for (size_t i = 0; i < big; i++) {
        a[i] = (float)((int)(i % 13) - 6) * 0.01f, b[i] = (float)((int)(i % 7) - 3) * 0.01f;
        ab[i] = to_bf16(a[i]), bb[i] = to_bf16(b[i]);
    }
    // per group: FLOPs, fp32 seconds, bf16 seconds (each GEMM x its count)
    for (int i = 0; i < N_SHAPES;) {
        const char *g = shapes[i].group;
        double flops = 0, t32 = 0, t16 = 0;
        int bf16_ok = bg != NULL;
        for (; i < N_SHAPES && !strcmp(shapes[i].group, g); i++) {
            const shape *s = &shapes[i];
            const double f = 2.0 * s->m * s->n * s->k * s->times;
            flops += f;
            t32 += s->times * time_gemm(s, sg, NULL, a, b, ab, bb, c, reps);
            if (bf16_ok) {
                dnnl_failed = 0;
                t16 += s->times * time_gemm(s, NULL, bg, a, b, ab, bb, c, reps);
                if (dnnl_failed) bf16_ok = 0; // oneDNN: no bf16 GEMM for this CPU
            }
        }
        printf("{\"group\":\"%s\",\"fp32_gflops\":%.2f,\"bf16_gflops\":", g, flops / t32 * 1e-9);
        if (bf16_ok)
            printf("%.2f}\n", flops / t16 * 1e-9);
        else
            printf("null}\n");
        fflush(stdout);
    }
    char kernel[128];
    kernel_family(name, kernel, sizeof kernel);
    printf("{\"lib\":\"%s\",\"path\":\"%s\",\"kernel\":\"%s\",\"threads\":%d,\"bf16\":%s}\n", name,
           path, kernel, threads, bg ? "true" : "false");
    free(a), free(b), free(c), free(ab), free(bb);
    return 0;
}
