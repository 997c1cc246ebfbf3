// What only the CPU backend has: its state, its constructors, and the knobs its tests and
// benchmarks turn. Nothing above layers/ includes this file except benchmarks and tests
// (they print the BLAS kernels and pin thread counts); the trainer and inference find the
// backend by name (layers/backend.h) and print its describe() line.
#ifndef MOE_CPU_BACKEND_H
#define MOE_CPU_BACKEND_H

#include <stdint.h>

#include "layers/backend.h"
#include "layers/blas.h"

// Not installed: what this header declares stays inside libmoe (hidden in libmoe.so).
#pragma GCC visibility push(hidden)

// oneDNN (layers/cpu/onednn.c), loaded on the first call: its bf16 GEMM and its sgemm, each
// NULL when absent or when its probe failed; name: "oneDNN 2.6.3", or why there is none.
typedef int (*cpu_onednn_bf16_fn)(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k,
                                  float alpha, const moe_bf16 *a, int64_t lda, const moe_bf16 *b,
                                  int64_t ldb, float beta, float *c, int64_t ldc);
typedef int (*cpu_onednn_f32_fn)(char trans_a, char trans_b, int64_t m, int64_t n, int64_t k,
                                 float alpha, const float *a, int64_t lda, const float *b,
                                 int64_t ldb, float beta, float *c, int64_t ldc);
typedef struct {
    int loaded; // the library is loaded (its GEMMs may still have failed their probes)
    cpu_onednn_bf16_fn gemm_bf16;
    cpu_onednn_f32_fn sgemm;
    char name[64];
} cpu_onednn;
const cpu_onednn *cpu_onednn_load(void);

// One mapping of strict-mode memory: a whole number of pages, PROT_NONE outside kernels.
typedef struct {
    void *base;
    size_t len;
} cpu_region;

typedef struct cpu_state {
    int threads;         // OpenMP threads the kernels use (set at create)
    int strict;          // "cpu-strict": backend memory is PROT_NONE outside kernel calls
    int depth;           // strict: nesting of open kernel scopes (unprotected while > 0)
    cpu_region *regions; // strict: the live allocations
    int n_regions, cap_regions;
    int row_invariant; // moe_backend_options.row_invariant (or MOE_ROW_INVARIANT=1): the fp32
                       // GEMMs are cpu_gemm_row_invariant, the bf16 ones the reference path,
                       // the cached attention one query row at a time (layers/cpu/gemm.c)
    char line[640];    // describe()
    // fp32 GEMMs (layers/cpu/gemm.c): oneDNN's sgemm, or NULL for the BLAS's
    cpu_onednn_f32_fn fp32_onednn;
    char fp32_line[128]; // the path, for describe() ("" for the BLAS)
    // bf16 GEMMs (layers/cpu/gemm_bf16.c)
    int bf16_native;     // the *_bf16 GEMMs' path: CPU_BF16_EMULATED (widen, then sgemm),
                         // CPU_BF16_SBGEMM (OpenBLAS), CPU_BF16_ONEDNN or CPU_BF16_REFERENCE
    char bf16_line[256]; // the path, for describe()
    real *bf16_ws;       // the emulated path's widening workspace (host), bf16_ws_n reals
    size_t bf16_ws_n;
} cpu_state;

// "cpu" (strict = 0) and the test-only "cpu-strict" (strict = 1): every allocation is its own
// mapping, unreadable and unwritable by the host except inside a kernel or a typed copy, so
// any host dereference of backend memory faults (and the SIGSEGV handler names the address).
moe_status cpu_backend_create(moe_backend **out, const moe_backend_options *opt, int strict);
// The same as the registry's constructors (layers/backend.c, through the generated
// moe_backends.h): "cpu" and "cpu-strict".
moe_status cpu_backend_create_plain(moe_backend **out, const moe_backend_options *opt);
moe_status cpu_backend_create_strict(moe_backend **out, const moe_backend_options *opt);

// Sets the process's OpenMP thread count and returns it. requested > 0: that many; 0:
// automatic, i.e. OMP_NUM_THREADS when set, else the cores this process may run on capped by
// its cgroup CPU quota. (OpenMP's count is process-wide: the CPU backend applies its
// `threads` option through this at create.)
int moe_cpu_threads(int requested);
// Changes a CPU backend's thread count (tests: a kernel gives the same bits on 1 and 2 threads);
// returns what moe_cpu_threads(requested) applied.
int cpu_backend_set_threads(moe_backend *be, int requested);
// bf16 GEMM path (layers/cpu/gemm_bf16.c): picks native (OpenBLAS's cblas_sbgemm, else
// oneDNN's dnnl_gemm_bf16bf16f32, on a CPU with bf16 instructions) or emulated for a new
// backend's state from the CPU, the libraries found and MOE_BF16_GEMM; MOE_EINVAL for a bad
// MOE_BF16_GEMM or a forced native path without its library. CPU_BF16_REFERENCE (only when
// asked for: tests, MOE_BF16_GEMM=reference) is a plain loop whose every output is one sum in
// k order, so a row's result never depends on how many rows the GEMM has (a BLAS's does:
// other row counts, other kernels), which parity tests between row groupings need in bf16.
// CPU_BF16_AMX (layers/cpu/amx.c) is moe.c's own GEMM on AMX tiles, where the CPU has AMX-BF16
// and Linux grants the process its tile state.
enum {
    CPU_BF16_EMULATED = 0,
    CPU_BF16_SBGEMM = 1,
    CPU_BF16_ONEDNN = 2,
    CPU_BF16_REFERENCE = 3,
    CPU_BF16_AMX = 4,
};
// CPU_ASAN: 1 in AddressSanitizer builds (GCC's or clang's).
#if defined(__SANITIZE_ADDRESS__)
#define CPU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CPU_ASAN 1
#endif
#endif
#ifndef CPU_ASAN
#define CPU_ASAN 0
#endif
// AddressSanitizer builds leave oneDNN out (CPU_NO_ONEDNN 1): once libdnnl is loaded,
// LeakSanitizer's exit-time scan of thread-local storage crashes ("Tracer caught signal 11";
// GCC 12's ASan, oneDNN 2.6.3), and ASan cannot see into oneDNN's JIT kernels anyway. Those
// builds run bf16 emulated where no sbgemm is loaded, and fp32 on the BLAS.
#define CPU_NO_ONEDNN CPU_ASAN
// The fp32 GEMMs' path (layers/cpu/gemm.c), from MOE_FP32_GEMM=auto|blas|onednn (read at
// create; auto: oneDNN's sgemm on an Intel CPU with AVX-512 where oneDNN loads, else the
// BLAS; row_invariant: neither, its GEMMs are plain loops); an error for another value, or for
// onednn where it does not load.
moe_status cpu_fp32_select(cpu_state *s);
// 1 on an Intel CPU with AVX-512F (where auto picks oneDNN's sgemm).
int cpu_intel_avx512(void);
// Tests: 1 selects oneDNN's sgemm (returns 0, changing nothing, where it does not load), 0 the
// BLAS (returns 1).
int cpu_backend_set_fp32_gemm(moe_backend *be, int onednn);
moe_status cpu_bf16_select(cpu_state *s);
// "OpenBLAS sbgemm", "oneDNN dnnl_gemm_bf16bf16f32", "emulated", "reference".
const char *cpu_bf16_path_name(int path);
// 1 when the CPU has AVX512-BF16 or AMX-BF16 (CPUID).
int cpu_has_bf16_instructions(void);
// Tests: selects a path (CPU_BF16_*) whatever the CPU; returns 1 when applied, 0 (changing
// nothing) when its library is not here.
int cpu_backend_set_bf16_gemm(moe_backend *be, int path);
// c [m, n] = alpha op(a) op(b) + beta c, a and b bf16 with row strides lda, ldb (of a and b
// as stored), c fp32 with ldc: one GEMM on the state's bf16 path. Native: the library reads a
// and b in place. Emulated: op(a) and op(b) are widened into ws (cpu_gemm_bf16_ws(m, n, kd)
// reals; the calling thread's when inside a parallel region) and cblas_sgemm multiplies them.
// Reference: the loop (ws unused).
void cpu_gemm_bf16(const cpu_state *s, real *ws, int trans_a, int trans_b, int m, int n, int kd,
                   real alpha, const moe_bf16 *a, int lda, const moe_bf16 *b, int ldb, real beta,
                   real *c, int ldc);
size_t cpu_gemm_bf16_ws(int m, int n, int kd);
// layers/cpu/amx.c: 1 when this build has the AMX kernel, the CPU AMX-BF16 (and AVX512-BW/VL/BF16)
// and Linux gave this process the tile state (arch_prctl); then cpu_amx_gemm_bf16 computes
// c [m, n] = alpha op(a) op(b) + beta c as cpu_gemm_bf16 does (beta 0: c is not read), spread
// over the threads when called outside a parallel region.
int cpu_amx_available(void);
void cpu_amx_gemm_bf16(int trans_a, int trans_b, int m, int n, int kd, float alpha,
                       const moe_bf16 *a, int lda, const moe_bf16 *b, int ldb, float beta, float *c,
                       int ldc);
// One expert's h = a w13^T followed by SwiGLU (layers/cpu/amx.c): act16 [m, ff] =
// bf16(silu(h1) h3), h13_16 [m, 2ff] = bf16(h) unless NULL, the same bits as
// cpu_amx_gemm_bf16 into h13 then swiglu_forward_bf16; h13 [m, 2ff] is scratch, written only
// for the shapes that run unfused. a [m, kd] (row stride lda), w13 [2ff, kd] bf16.
void cpu_amx_swiglu_bf16(int m, int ff, int kd, const moe_bf16 *a, int lda, const moe_bf16 *w13,
                         moe_bf16 *act16, moe_bf16 *h13_16, float *h13);
// bf16 attention's backward for one block of n query rows (queries i0 .. i0+n-1) of one head
// against its columns j < cols (layers/cpu/amx.c): S = q k^T, dP = do v^T on AMX tiles, then
//   p16 = bf16(exp(scale S - lse_i)), ds16 = bf16(p (dP - D_i) scale)   (j <= i0 + i; else 0)
// the same bits as cpu_amx_gemm_bf16's two products followed by attention.c's row loops.
// Returns 0 (nothing done) in a build without it (no AMX, or no AVX-512 target).
typedef struct {
    int n, cols, hd, i0;
    float scale;
    const moe_bf16 *q, *dO; // [n, hd] at row strides ldq, ldo
    int ldq, ldo;
    const moe_bf16 *k, *v; // [cols, hd] at row stride ldk
    int ldk;
    const float *lse, *D; // [n]
    moe_bf16 *p16, *ds16; // [n, ld16]: columns [0, cols) written
    int ld16;
} cpu_amx_attn_bwd;
int cpu_amx_attention_scores_bwd(const cpu_amx_attn_bwd *x);
// bf16 attention's forward of one block of n query rows against its columns j < cols: 16 rows
// at a time, s = fl(scale q k^T) [rows, lds] on AMX tiles, then softmax(ctx, s, lds, e16, lde,
// inv, r0, rows) (the caller's: e16 [rows, lde] bf16 with columns [cols, lde) left 0, inv
// [rows] = 1 / the rows' sums, rows r0 .. of the block), then out = (e16 v) inv. The same bits
// as cpu_amx_gemm_bf16's two products around the caller's softmax. 0: not in this build.
typedef struct {
    int n, cols, hd;
    float scale;
    const moe_bf16 *q; // [n, hd] at row stride ldq
    int ldq;
    const moe_bf16 *k, *v; // [cols, hd] at row stride ldk
    int ldk;
    float *out; // [n, hd] at row stride ldo
    int ldo;
    void (*softmax)(const void *ctx, float *s, int lds, moe_bf16 *e16, int lde, float *inv, int r0,
                    int rows);
    const void *ctx;
} cpu_amx_attn_fwd;
int cpu_amx_attention_forward_block(const cpu_amx_attn_fwd *x);
// moe_blas_kernel(), the BLAS's kernel family, which sets the sgemm rate (on an AVX-512 Xeon:
// 250 GFLOP/s with OpenBLAS's Haswell kernels, 450-470 with SkylakeX), is in layers/blas.h.
// The whole CPUs of a cgroup CPU quota, rounded up: v2's cpu.max ("QUOTA PERIOD" or "max
// PERIOD"), else v1's cfs_quota_us / cfs_period_us; 0 when there is no quota or no file.
int moe_cpu_quota_cores(const char *cpu_max_path, const char *cfs_quota_path,
                        const char *cfs_period_path);

// Strict mode's kernel scope (layers/cpu/strict.c): backend memory is accessible from
// cpu_strict_open until the matching cpu_strict_close. No-ops on the plain "cpu" backend.
void cpu_strict_open(moe_backend *be);
void cpu_strict_close(moe_backend **be);
void *cpu_strict_alloc(moe_backend *be, size_t bytes);
void cpu_strict_free(moe_backend *be, void *ptr);
void cpu_strict_release(moe_backend *be); // unmaps what is left (destroy)

// The plain backend's memory (layers/cpu/host_memory.c): bytes zeroed, or NULL when out of
// memory; buffers of 2 MiB or more on transparent huge pages (MOE_HUGE_PAGES=0: not).
void *cpu_host_alloc(size_t bytes);
void cpu_host_free(void *p);

#pragma GCC visibility pop

#endif
