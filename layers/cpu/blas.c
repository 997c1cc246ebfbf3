// The BLAS behind the CPU backend's GEMMs (CMake's MOE_BLAS: openblas, blis or mkl): its name,
// its kernel family, its threads, and the start-up check that it is not running generic
// kernels on a CPU that has better ones.
//
// Why the check: a BLAS picks its kernels from the CPU when it loads. Debian's OpenBLAS 0.3.21
// does not know CPUs newer than itself (a 2023+ Xeon) and falls back to its generic Prescott
// kernels, 3x slower than its SkylakeX ones, without a word. OpenBLAS reads OPENBLAS_CORETYPE
// in its library constructor, before main, so moe_blas_check sets the variable and re-executes
// the program once (execv of /proc/self/exe: same pid, same arguments; mpirun's ranks too); a
// value the user set is kept, with a warning that says what to set instead. BLIS and MKL pick
// their kernels from the CPU's features; a generic pick there is a warning.
#define _GNU_SOURCE // setenv, unsetenv
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "layers/blas.h"

#if defined(MOE_BLAS_BLIS)
#include <blis.h> // a system include directory (CMakeLists.txt): its helpers fail our warnings
#define BLAS_ENV "BLIS_ARCH_TYPE"
#define BLAS_SHORT "BLIS"
#elif defined(MOE_BLAS_MKL)
#include <mkl.h>
#define BLAS_ENV "MKL_ENABLE_INSTRUCTIONS" // a ceiling only: MKL dispatches by itself
#define BLAS_SHORT "MKL"
#else
#include <cblas.h>
#define BLAS_ENV "OPENBLAS_CORETYPE"
#define BLAS_SHORT "OpenBLAS"
#endif

// Set by the re-executed process's parent: the kernel family the BLAS had picked.
#define REEXEC_ENV "MOE_BLAS_REEXEC"
static char note[160]; // why the kernels are what they are, when moe chose them

// ---- the CPU and the kernel families ----------------------------------------------------

moe_isa moe_cpu_isa(int *amd, int *avx512_bf16) {
    __builtin_cpu_init();
    if (amd) *amd = __builtin_cpu_is("amd");
    if (avx512_bf16) *avx512_bf16 = __builtin_cpu_supports("avx512bf16");
    // gcc's feature bits include the OS's consent (XGETBV) for the AVX and AVX-512 registers
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return MOE_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return MOE_ISA_AVX2;
    if (__builtin_cpu_supports("avx")) return MOE_ISA_AVX;
    return MOE_ISA_SSE;
}

moe_isa moe_blas_kernel_isa(const char *family) {
    static const struct {
        const char *name;
        moe_isa isa;
    } known[] = {
        // OpenBLAS (openblas_get_corename)
        {"Prescott", MOE_ISA_SSE},
        {"Core2", MOE_ISA_SSE},
        {"Penryn", MOE_ISA_SSE},
        {"Dunnington", MOE_ISA_SSE},
        {"Nehalem", MOE_ISA_SSE},
        {"Atom", MOE_ISA_SSE},
        {"Opteron", MOE_ISA_SSE},
        {"Barcelona", MOE_ISA_SSE},
        {"Bobcat", MOE_ISA_SSE},
        {"Nano", MOE_ISA_SSE},
        {"Sandybridge", MOE_ISA_AVX},
        {"Bulldozer", MOE_ISA_AVX},
        {"Piledriver", MOE_ISA_AVX},
        {"Steamroller", MOE_ISA_AVX},
        {"Haswell", MOE_ISA_AVX2},
        {"Excavator", MOE_ISA_AVX2},
        {"Zen", MOE_ISA_AVX2},
        {"SkylakeX", MOE_ISA_AVX512},
        {"Cooperlake", MOE_ISA_AVX512},
        {"SapphireRapids", MOE_ISA_AVX512},
        // BLIS (bli_arch_string)
        {"generic", MOE_ISA_SSE},
        {"sandybridge", MOE_ISA_AVX},
        {"haswell", MOE_ISA_AVX2},
        {"zen", MOE_ISA_AVX2},
        {"zen2", MOE_ISA_AVX2},
        {"zen3", MOE_ISA_AVX2},
        {"skx", MOE_ISA_AVX512},
        {"zen4", MOE_ISA_AVX512},
        {"zen5", MOE_ISA_AVX512},
        // MKL (moe_blas_kernel's names of its code paths)
        {"compatible", MOE_ISA_SSE},
        {"SSE4.2", MOE_ISA_SSE},
        {"AVX", MOE_ISA_AVX},
        {"AVX2", MOE_ISA_AVX2},
        {"AVX-512", MOE_ISA_AVX512},
        {"AVX-512 VNNI", MOE_ISA_AVX512},
        {"AVX-512 BF16", MOE_ISA_AVX512},
        {"AVX-512 AMX", MOE_ISA_AVX512},
    };
    for (size_t i = 0; family && i < sizeof known / sizeof known[0]; i++)
        if (!strcasecmp(family, known[i].name)) return known[i].isa;
    return MOE_ISA_UNKNOWN;
}

const char *moe_blas_best_kernel(moe_isa isa, int amd, int avx512_bf16) {
#if defined(MOE_BLAS_BLIS)
    (void)avx512_bf16; // one AVX-512 configuration per vendor
    if (isa >= MOE_ISA_AVX512) return amd ? "zen4" : "skx";
    if (isa >= MOE_ISA_AVX2) return amd ? "zen3" : "haswell";
    return isa >= MOE_ISA_AVX ? "sandybridge" : NULL;
#else
    // AMD with AVX-512 (Zen 4, Zen 5) too: measured on a Zen 5 EPYC, OpenBLAS 0.3.21's
    // Cooperlake/SkylakeX sgemm ran at 2x its Zen (AVX2) kernels (README "BLAS"); Debian's
    // 0.3.21 picks Cooperlake itself on the Zen 4 and Zen 5 EPYCs measured, so there this
    // matters when the environment forces less (OPENBLAS_CORETYPE=Haswell)
    if (isa >= MOE_ISA_AVX512) return avx512_bf16 ? "Cooperlake" : "SkylakeX";
    if (isa >= MOE_ISA_AVX2) return amd ? "Zen" : "Haswell";
    return isa >= MOE_ISA_AVX ? "Sandybridge" : NULL;
#endif
}

static const char *isa_name(moe_isa isa) {
    static const char *names[] = {"SSE", "AVX", "AVX2", "AVX-512"};
    return isa >= MOE_ISA_SSE && isa <= MOE_ISA_AVX512 ? names[isa] : "unknown";
}

// ---- the BLAS of this build ---------------------------------------------------------------

#if defined(MOE_BLAS_BLIS)
const char *moe_blas_kernel(void) { return bli_arch_string(bli_arch_query_id()); }
const char *moe_blas_name(void) {
    static char s[64];
    snprintf(s, sizeof s, "BLIS %s", bli_info_get_version_str());
    return s;
}
void moe_blas_set_threads(int n) { bli_thread_set_num_threads(n); } // else BLIS runs 1
// BLIS_ARCH_TYPE names a configuration by a number whose meaning depends on the build (measured
// with Debian's 0.9: an id that bli_arch_string names "zen3" aborts at load as uninitialised),
// so moe does not set it: a generic BLIS is a warning.
static int env_value(const char *family, char *buf, size_t n) {
    (void)family, (void)buf, (void)n;
    return 0;
}
#elif defined(MOE_BLAS_MKL)
const char *moe_blas_kernel(void) {
    static const struct {
        int branch;
        const char *name;
    } paths[] = {{MKL_CBWR_AVX2, "AVX2"},
                 {MKL_CBWR_AVX512, "AVX-512"},
#ifdef MKL_CBWR_AVX512_E1
                 {MKL_CBWR_AVX512_E1, "AVX-512 VNNI"},
#endif
#ifdef MKL_CBWR_AVX512_E2
                 {MKL_CBWR_AVX512_E2, "AVX-512 BF16"},
#endif
#ifdef MKL_CBWR_AVX512_E3
                 {MKL_CBWR_AVX512_E3, "AVX-512 AMX"},
#endif
                 {MKL_CBWR_SSE4_2, "SSE4.2"},
                 {MKL_CBWR_COMPATIBLE, "compatible"}};
    const int b = mkl_cbwr_get_auto_branch();
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        if (paths[i].branch == b) return paths[i].name;
    static char other[32];
    snprintf(other, sizeof other, "code path %d", b); // mkl_types.h's MKL_CBWR_* numbers
    return other;
}
const char *moe_blas_name(void) {
    static char s[64];
    MKLVersion v;
    mkl_get_version(&v);
    snprintf(s, sizeof s, "MKL %d.%d.%d", v.MajorVersion, v.MinorVersion, v.UpdateVersion);
    return s;
}
void moe_blas_set_threads(int n) {
    mkl_set_threading_layer(MKL_THREADING_GNU); // our OpenMP (libgomp), not a second pool
    mkl_set_num_threads(n);
}
static int env_value(const char *family, char *buf, size_t n) {
    (void)family, (void)buf, (void)n;
    return 0;
}
#else
const char *moe_blas_kernel(void) { return openblas_get_corename(); }
const char *moe_blas_name(void) {
    const char *c = openblas_get_config();
    return c ? c : "OpenBLAS";
}
void moe_blas_set_threads(int n) { (void)n; } // the OpenMP build follows omp_set_num_threads
// Only a DYNAMIC_ARCH build reads OPENBLAS_CORETYPE (a single-target build runs its one
// family whatever the variable says).
static int env_value(const char *family, char *buf, size_t n) {
    return strstr(moe_blas_name(), "DYNAMIC_ARCH") && snprintf(buf, n, "%s", family) > 0;
}
#endif

const char *moe_blas_note(void) { return note; }

// ---- the start-up check -------------------------------------------------------------------

moe_blas_verdict moe_blas_judge(const char *kernel, moe_isa cpu, int amd, int avx512_bf16,
                                char *fix, size_t n) {
    const moe_isa have = moe_blas_kernel_isa(kernel);
    const char *best = moe_blas_best_kernel(cpu, amd, avx512_bf16);
    if (fix && n) fix[0] = 0;
    if (have == MOE_ISA_UNKNOWN || have >= cpu || !best) return MOE_BLAS_FITS;
    if (fix) snprintf(fix, n, "%s", best);
    return MOE_BLAS_GENERIC;
}

int moe_blas_check(char **argv) {
    int amd, bf16;
    const moe_isa cpu = moe_cpu_isa(&amd, &bf16);
    // a test pretends the BLAS picked this family (the re-executed process sees the real one)
    const char *test = getenv("MOE_BLAS_TEST_KERNEL");
    const char *prev = getenv(REEXEC_ENV);
    const char *kernel = test && *test && !prev ? test : moe_blas_kernel();
    char best[32], value[32];
    if (prev) { // we are the re-executed process: say what happened, once
        snprintf(note, sizeof note, "%s=%s set by moe: %s had picked %s on this %s CPU", BLAS_ENV,
                 getenv(BLAS_ENV) ? getenv(BLAS_ENV) : "?", BLAS_SHORT, prev, isa_name(cpu));
        unsetenv(REEXEC_ENV);
    }
    if (moe_blas_judge(kernel, cpu, amd, bf16, best, sizeof best) == MOE_BLAS_FITS) return 0;
    const char *user = getenv(BLAS_ENV);
    const int can = env_value(best, value, sizeof value);
    if (prev || !can) {
        fprintf(stderr,
                "moe: warning: %s runs its %s kernels (%s) on this CPU, which has %s%s%s%s: its "
                "GEMMs are 2-4x slower than they could be. Build with another BLAS "
                "(-DMOE_BLAS=openblas|blis, docs in README 'BLAS')\n",
                BLAS_SHORT, kernel, isa_name(moe_blas_kernel_isa(kernel)), isa_name(cpu),
                prev ? ", even with " : "", prev ? BLAS_ENV : "", prev ? " set" : "");
        return 1;
    }
    if (user && *user) { // the user's choice stands; say what it costs
        fprintf(stderr,
                "moe: warning: %s=%s gives %s's %s kernels (%s) on this CPU, which has %s: "
                "unset %s (moe then picks) or set %s=%s\n",
                BLAS_ENV, user, BLAS_SHORT, kernel, isa_name(moe_blas_kernel_isa(kernel)),
                isa_name(cpu), BLAS_ENV, BLAS_ENV, value);
        return 1;
    }
    // re-execute once with the variable set; the constructor of the BLAS then reads it
    setenv(BLAS_ENV, value, 1);
    setenv(REEXEC_ENV, kernel, 1);
    fflush(NULL);
    execv("/proc/self/exe", argv);
    fprintf(stderr,
            "moe: warning: %s runs its %s kernels on this %s CPU and moe could not restart "
            "itself: set %s=%s\n",
            BLAS_SHORT, kernel, isa_name(cpu), BLAS_ENV, value);
    unsetenv(REEXEC_ENV);
    return 1;
}
