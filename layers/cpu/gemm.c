// Dense and grouped (per-expert) GEMMs on the BLAS (MOE_BLAS: OpenBLAS, BLIS or MKL), and the
// grouped GEMMs' loop over experts that the bf16 twins (gemm_bf16.c) share.
//
// The grouped GEMM is one GEMM per expert over its contiguous rows. With at least four
// experts per thread the experts are spread over the OpenMP threads and each call runs on one
// thread (OpenBLAS's OpenMP build does that inside a parallel region): measured 3-5% faster
// than threading every call, on both benchmark shapes. With fewer experts, OpenBLAS threads
// each call. Experts with no rows are skipped.
#include "layers/cpu/cblas.h"
#include <omp.h>

#include "layers/cpu/cpu_kernels.h"

#ifdef MOE_REAL_DOUBLE
#define cblas_gemm cblas_dgemm
#else
#define cblas_gemm cblas_sgemm
#endif

static void gemm(int trans_a, int trans_b, int m, int n, int kd, real alpha, const real *a, int lda,
                 const real *b, int ldb, real beta, real *c, int ldc) {
    if (m == 0 || n == 0) return;
    cblas_gemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
               trans_b ? CblasTrans : CblasNoTrans, m, n, kd, alpha, a, lda, b, ldb, beta, c, ldc);
}

void cpu_matmul(moe_backend *be, real *c, const real *a, const real *b, int m, int n, int kd,
                int trans_a, int trans_b, real beta) {
    CPU_KERNEL(be);
    int lda = trans_a ? m : kd;
    int ldb = trans_b ? kd : n;
    gemm(trans_a, trans_b, m, n, kd, 1, a, lda, b, ldb, beta, c, n);
}

// ---- the grouped GEMMs' loop (fp32 here, bf16 in gemm_bf16.c) ------------------------------

// The order in which the grouped GEMMs hand their experts to the threads: most rows first
// (longest-processing-time first), so that the dynamic schedule ends balanced when routing is
// skewed (real text at initialisation: max/mean 3; measured on the bf16 shakespeare step:
// experts 37.3 -> 35.7 ms). Each expert's GEMM writes its own rows, so the order changes no
// result. Beyond EXPERT_ORDER_MAX experts: the natural order.
#define EXPERT_ORDER_MAX 1024
static void largest_first(int *order, const int *offsets, int n_experts) {
    for (int t = 0; t < n_experts; t++) {
        const int rows = offsets[t + 1] - offsets[t]; // insertion sort, stable
        int u = t;
        for (; u > 0 && offsets[order[u - 1] + 1] - offsets[order[u - 1]] < rows; u--)
            order[u] = order[u - 1];
        order[u] = t;
    }
}

void cpu_expert_gemms(cpu_expert_pass pass, real *c, const void *x, const void *y, size_t elem,
                      const int *offsets, int n_experts, int n_out, int n_in, int accumulate,
                      cpu_expert_gemm_fn gemm_e, void *ctx) {
    int order[EXPERT_ORDER_MAX];
    const int ordered = n_experts <= EXPERT_ORDER_MAX;
    if (ordered) largest_first(order, offsets, n_experts);
    const char *xb = x, *yb = y;
#pragma omp parallel for schedule(dynamic, 1) if (n_experts >= 4 * omp_get_max_threads())
    for (int t = 0; t < n_experts; t++) {
        const int e = ordered ? order[t] : t, rows = offsets[e + 1] - offsets[e];
        const size_t r0 = (size_t)offsets[e], we = (size_t)e * n_out * n_in;
        if (pass == CPU_EXPERT_FORWARD) // out_e [rows, n_out] = inp_e [rows, n_in] @ w_e^T
            gemm_e(ctx, 0, 1, rows, n_out, n_in, xb + r0 * n_in * elem, n_in, yb + we * elem, n_in,
                   0, c + r0 * n_out, n_out);
        else if (pass == CPU_EXPERT_BACKWARD_INPUT) // dinp_e (+)= dout_e [rows, n_out] @ w_e
            gemm_e(ctx, 0, 0, rows, n_in, n_out, xb + r0 * n_out * elem, n_out, yb + we * elem,
                   n_in, accumulate ? 1 : 0, c + r0 * n_in, n_in);
        else if (rows) // dw_e [n_out, n_in] += dout_e^T [n_out, rows] @ inp_e [rows, n_in]
            gemm_e(ctx, 1, 0, n_out, n_in, rows, xb + r0 * n_out * elem, n_out,
                   yb + r0 * n_in * elem, n_in, 1, c + we, n_in);
    }
}

// One fp32 expert GEMM (ctx unused).
static void expert_gemm32(void *ctx, int trans_a, int trans_b, int m, int n, int kd, const void *a,
                          int lda, const void *b, int ldb, real beta, real *c, int ldc) {
    (void)ctx;
    gemm(trans_a, trans_b, m, n, kd, 1, a, lda, b, ldb, beta, c, ldc);
}

void cpu_expert_matmul_forward(moe_backend *be, real *out, const real *inp, const real *weight,
                               const int *offsets, int n_experts, int n_out, int n_in) {
    CPU_KERNEL(be);
    cpu_expert_gemms(CPU_EXPERT_FORWARD, out, inp, weight, sizeof(real), offsets, n_experts, n_out,
                     n_in, 0, expert_gemm32, NULL);
}

void cpu_expert_matmul_backward_input(moe_backend *be, real *dinp, const real *dout,
                                      const real *weight, const int *offsets, int n_experts,
                                      int n_out, int n_in, int accumulate) {
    CPU_KERNEL(be);
    cpu_expert_gemms(CPU_EXPERT_BACKWARD_INPUT, dinp, dout, weight, sizeof(real), offsets,
                     n_experts, n_out, n_in, accumulate, expert_gemm32, NULL);
}

void cpu_expert_matmul_backward_weight(moe_backend *be, real *dweight, const real *dout,
                                       const real *inp, const int *offsets, int n_experts,
                                       int n_out, int n_in) {
    CPU_KERNEL(be);
    cpu_expert_gemms(CPU_EXPERT_BACKWARD_WEIGHT, dweight, dout, inp, sizeof(real), offsets,
                     n_experts, n_out, n_in, 0, expert_gemm32, NULL);
}
