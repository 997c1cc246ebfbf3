// Dense and grouped (per-expert) GEMMs on the BLAS (MOE_BLAS: OpenBLAS, BLIS or MKL).
//
// The grouped GEMM is one cblas call per expert over its contiguous rows. With at least four
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

void cpu_expert_matmul_forward(moe_backend *be, real *out, const real *inp, const real *weight,
                               const int *offsets, int n_experts, int n_out, int n_in) {
    CPU_KERNEL(be);
    EXPERT_ORDER;
#pragma omp parallel for schedule(dynamic, 1) if (n_experts >= 4 * omp_get_max_threads())
    for (int t = 0; t < n_experts; t++) {
        const int e = EXPERT_AT(t), rows = offsets[e + 1] - offsets[e];
        const real *w = weight + (size_t)e * n_out * n_in;
        // out_e [rows, n_out] = inp_e [rows, n_in] @ w^T
        gemm(0, 1, rows, n_out, n_in, 1, inp + (size_t)offsets[e] * n_in, n_in, w, n_in, 0,
             out + (size_t)offsets[e] * n_out, n_out);
    }
}

void cpu_expert_matmul_backward_input(moe_backend *be, real *dinp, const real *dout,
                                      const real *weight, const int *offsets, int n_experts,
                                      int n_out, int n_in, int accumulate) {
    CPU_KERNEL(be);
    EXPERT_ORDER;
#pragma omp parallel for schedule(dynamic, 1) if (n_experts >= 4 * omp_get_max_threads())
    for (int t = 0; t < n_experts; t++) {
        const int e = EXPERT_AT(t), rows = offsets[e + 1] - offsets[e];
        const real *w = weight + (size_t)e * n_out * n_in;
        // dinp_e [rows, n_in] (+)= dout_e [rows, n_out] @ w [n_out, n_in]
        gemm(0, 0, rows, n_in, n_out, 1, dout + (size_t)offsets[e] * n_out, n_out, w, n_in,
             accumulate ? 1 : 0, dinp + (size_t)offsets[e] * n_in, n_in);
    }
}

void cpu_expert_matmul_backward_weight(moe_backend *be, real *dweight, const real *dout,
                                       const real *inp, const int *offsets, int n_experts,
                                       int n_out, int n_in) {
    CPU_KERNEL(be);
    EXPERT_ORDER;
#pragma omp parallel for schedule(dynamic, 1) if (n_experts >= 4 * omp_get_max_threads())
    for (int t = 0; t < n_experts; t++) {
        const int e = EXPERT_AT(t), rows = offsets[e + 1] - offsets[e];
        if (rows == 0) continue;
        // dw_e [n_out, n_in] += dout_e^T [n_out, rows] @ inp_e [rows, n_in]
        gemm(1, 0, n_out, n_in, rows, 1, dout + (size_t)offsets[e] * n_out, n_out,
             inp + (size_t)offsets[e] * n_in, n_in, 1, dweight + (size_t)e * n_out * n_in, n_in);
    }
}
