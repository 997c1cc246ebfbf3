// oneDNN, found at run time: dlopen of its shared library (Debian: libdnnl2, which
// scripts/test.sh installs), so that no build depends on it, and only by a run that would use
// it. Two of its GEMMs are used, each kept only when a 2 x 2 probe gives the right answer:
//   dnnl_gemm_bf16bf16f32  the bf16 path "onednn" (gemm_bf16.c), on CPUs with bf16
//                          instructions (oneDNN refuses the others);
//   dnnl_sgemm             the fp32 GEMMs' path on Intel CPUs with AVX-512 (gemm.c).
// Both are row-major C = alpha op(A) op(B) + beta C with 'N' or 'T' per operand (dnnl.h, not
// needed to build), returning dnnl_status_t, 0 on success.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "layers/cpu/cpu_kernels.h"

typedef struct {
    int major, minor, patch;
    const char *hash;
    unsigned cpu_runtime, gpu_runtime;
} dnnl_version_info;

static cpu_onednn found;
static pthread_once_t once = PTHREAD_ONCE_INIT;

#if !defined(MOE_REAL_DOUBLE) && !CPU_NO_ONEDNN
// [1 2; 3 4] [5 6; 7 8] = [19 22; 43 50], exact in bf16 and fp32
static int right(const float c[4]) { return c[0] == 19 && c[1] == 22 && c[2] == 43 && c[3] == 50; }

static void load(void) {
    static const char *names[] = {"libdnnl.so.3", "libdnnl.so.2"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++)
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(found.name, sizeof found.name, "no oneDNN (libdnnl2)");
        return;
    }
    found.loaded = 1;
    void *g16 = dlsym(lib, "dnnl_gemm_bf16bf16f32"), *g32 = dlsym(lib, "dnnl_sgemm"),
         *v = dlsym(lib, "dnnl_version");
    cpu_onednn_bf16_fn bf16 = NULL;
    cpu_onednn_f32_fn f32 = NULL;
    const dnnl_version_info *(*version)(void) = NULL;
    memcpy(&bf16, &g16, sizeof bf16); // object to function pointer, as POSIX allows
    memcpy(&f32, &g32, sizeof f32);
    memcpy(&version, &v, sizeof version);
    const dnnl_version_info *ver = version ? version() : NULL;
    if (ver)
        snprintf(found.name, sizeof found.name, "oneDNN %d.%d.%d", ver->major, ver->minor,
                 ver->patch);
    else
        snprintf(found.name, sizeof found.name, "oneDNN");
    // the library stays loaded whatever the probes say: unloading C++ runtimes is not worth it
    const moe_bf16 a16[4] = {0x3f80, 0x4000, 0x4040, 0x4080},
                   b16[4] = {0x40a0, 0x40c0, 0x40e0, 0x4100};
    const float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8};
    float c[4] = {0};
    if (bf16 && bf16('N', 'N', 2, 2, 2, 1.0f, a16, 2, b16, 2, 0.0f, c, 2) == 0 && right(c))
        found.gemm_bf16 = bf16;
    memset(c, 0, sizeof c);
    if (f32 && f32('N', 'N', 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2) == 0 && right(c))
        found.sgemm = f32;
}
#else
static void load(void) {
#ifdef MOE_REAL_DOUBLE
    snprintf(found.name, sizeof found.name, "no oneDNN in the f64 build");
#else
    snprintf(found.name, sizeof found.name, "oneDNN left out of sanitizer builds");
#endif
}
#endif

const cpu_onednn *cpu_onednn_load(void) {
    pthread_once(&once, load);
    return &found;
}
