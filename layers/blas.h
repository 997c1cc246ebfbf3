// The BLAS of the CPU backend (CMake's MOE_BLAS: openblas, the default, blis or mkl): what it
// is, which kernels it runs, and the start-up check that they fit the CPU (layers/cpu/blas.c).
#ifndef MOE_BLAS_H
#define MOE_BLAS_H

#include <stddef.h>

// What a CPU can run, and what a kernel family needs.
typedef enum {
    MOE_ISA_UNKNOWN = -1,
    MOE_ISA_SSE = 0, // the generic x86-64 kernels (OpenBLAS Prescott, BLIS generic)
    MOE_ISA_AVX = 1,
    MOE_ISA_AVX2 = 2, // AVX2 + FMA
    MOE_ISA_AVX512 = 3,
} moe_isa;

// "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Zen MAX_THREADS=64", "BLIS 0.9.0", "MKL 2026.0.2".
const char *moe_blas_name(void);
// The kernel family it runs: OpenBLAS's core name ("Zen", "Haswell", "SkylakeX", "Prescott"),
// BLIS's configuration ("zen3", "skx", "generic"), MKL's code path ("AVX2", "AVX-512").
const char *moe_blas_kernel(void);
// Why the kernels are what they are when moe chose them ("set by moe: OPENBLAS_CORETYPE had
// picked Prescott on this AVX2 CPU"), else "".
const char *moe_blas_note(void);
// The BLAS's own threads where it does not follow OpenMP's count (BLIS, MKL); called by the
// CPU backend's thread setting.
void moe_blas_set_threads(int n);

// This CPU's level (gcc's feature bits, which include the OS's consent to the registers);
// *amd: an AMD CPU; *avx512_bf16: it has AVX512_BF16. Either pointer may be NULL.
moe_isa moe_cpu_isa(int *amd, int *avx512_bf16);
// The level a kernel family needs (OpenBLAS or BLIS names, any case); UNKNOWN for other names.
moe_isa moe_blas_kernel_isa(const char *family);
// The family of this build's BLAS that fits a CPU ("Zen", "Haswell", "SkylakeX", "Cooperlake";
// BLIS: "zen3", "zen4", "haswell", "skx"); NULL below AVX. AVX-512 kernels wherever the CPU
// has AVX-512, AMD's too (measured: 2x the Zen kernels on a Zen 5).
const char *moe_blas_best_kernel(moe_isa cpu, int amd, int avx512_bf16);

typedef enum { MOE_BLAS_FITS = 0, MOE_BLAS_GENERIC = 1 } moe_blas_verdict;
// GENERIC when `kernel` needs less than the CPU has, with the
// family to use in fix; FITS otherwise, unknown names included (fix is then "").
moe_blas_verdict moe_blas_judge(const char *kernel, moe_isa cpu, int amd, int avx512_bf16,
                                char *fix, size_t n);

// The start-up check of moe train/eval/generate/smoke, first thing in main. When the BLAS runs
// generic kernels on a CPU with better ones: if the user set OPENBLAS_CORETYPE it warns on
// stderr, naming the value to set, and goes on; else it sets the variable and re-executes the
// program (argv as main got it) once, so that OpenBLAS loads with the right kernels; where that
// cannot help (BLIS, MKL, an OpenBLAS without DYNAMIC_ARCH), it warns. Returns 0 when the kernels fit, 1 after
// a warning (it does not return when it re-executes). Test hook: MOE_BLAS_TEST_KERNEL=NAME
// makes it judge NAME instead of the loaded family (the re-executed process judges the real one).
int moe_blas_check(char **argv);

#endif
