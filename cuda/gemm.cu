// Dense and grouped (per-expert) GEMMs on cuBLAS, fp32 storage; compute in strict fp32
// (CUBLAS_COMPUTE_32F) or TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32, model.tf32). The
// GEMMs of any operand type are here (cuda/gemm.cuh); their bf16 twins are gemm_bf16.cu's.
//
// Row-major to cuBLAS's column-major: a row-major X [r, c] is the column-major X^T, so
// C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T with the operands swapped.
//
// The expert GEMMs are one GEMM per expert with rows (the offsets are on the host): either a
// loop of cublasGemmEx, or one cublasGemmGroupedBatchedEx with a group per expert (shapes and
// alpha/beta host arrays; the A/B/C pointer arrays copied to the device from a pinned slot).
// Which is faster depends on the shape (scripts/bench_gpu measures both).
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_kernels.cuh" // first: the C headers as C++
#include "cuda/gemm.cuh"

// One row-major GEMM: c [m, n] = alpha op(a) op(b) + beta c, with leading dimensions; a and
// b are fp32 or bf16 (ab), c is fp32.
typedef struct {
    int m, n, kd, trans_a, trans_b;
    const void *a, *b;
    float *c;
    int lda, ldb, ldc;
    float beta;
    cudaDataType_t ab;
} gemm_spec;

static cublasComputeType_t compute_type(moe_backend *be, cudaDataType_t ab) {
    if (ab == CUDA_R_16BF) return CUBLAS_COMPUTE_32F; // tf32 is a mode of fp32 operands
    return cuda_state_of(be)->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

static int ld(int x) { return x > 1 ? x : 1; } // cuBLAS wants leading dimensions >= 1

static void gemm_one(moe_backend *be, const gemm_spec *g) {
    if (g->m == 0 || g->n == 0) return;
    const float one = 1;
    CUBLAS_CHECK(cublasGemmEx(cuda_state_of(be)->blas, g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, g->n, g->m, g->kd, &one, g->b,
                              g->ab, ld(g->ldb), g->a, g->ab, ld(g->lda), &g->beta, g->c,
                              CUDA_R_32F, ld(g->ldc), compute_type(be, g->ab),
                              CUBLAS_GEMM_DEFAULT));
}

void cuda_matmul_typed(moe_backend *be, real *c, const void *a, const void *b, int m, int n, int kd,
                       int trans_a, int trans_b, real beta, cudaDataType_t ab) {
    gemm_spec g = {m, n,    kd, trans_a, trans_b, a, b, c, trans_a ? m : kd, trans_b ? kd : n,
                   n, beta, ab};
    gemm_one(be, &g);
}
void cuda_matmul(moe_backend *be, real *c, const real *a, const real *b, int m, int n, int kd,
                 int trans_a, int trans_b, real beta) {
    cuda_matmul_typed(be, c, a, b, m, n, kd, trans_a, trans_b, beta, CUDA_R_32F);
}

// The next pinned pointer slot, once the copy that last read it has completed.
static int ptr_slot(cuda_state *s) {
    const int i = s->ptr_next;
    s->ptr_next = (i + 1) % CUDA_PTR_SLOTS;
    CUDA_CHECK(cudaEventSynchronize(s->ptr_done[i]));
    return i;
}

// The GEMMs g[0..n) (same transposes, leading dimensions and beta; m, n, kd per GEMM): a loop
// of cublasGemmEx, or one grouped call. GEMMs with an empty output or, with beta = 1, no
// inner dimension (nothing to add) are left out.
static void gemm_many(moe_backend *be, gemm_spec *g, int count) {
    cuda_state *s = cuda_state_of(be);
    int n = 0;
    for (int i = 0; i < count; i++)
        if (g[i].m > 0 && g[i].n > 0 && !(g[i].kd == 0 && g[i].beta == 1)) g[n++] = g[i];
    if (n == 0) return;
    if (s->expert_gemm == CUDA_EXPERT_GEMM_LOOP || n == 1 || g[0].ab != CUDA_R_32F) {
        for (int i = 0; i < n; i++) gemm_one(be, &g[i]);
        return;
    }
    if (3 * n > s->ptr_cap)
        moe_fatal("cuda: grouped GEMM of %d experts (at most %d)", n, s->ptr_cap / 3);
    // host arrays per group (one matrix per group): cuBLAS's column-major view, operands swapped
    enum { MAXG = 4096 };
    static thread_local cublasOperation_t ta[MAXG], tb[MAXG];
    static thread_local int mm[MAXG], nn[MAXG], kk[MAXG], la[MAXG], lb[MAXG], lc[MAXG], size[MAXG];
    static thread_local float alpha[MAXG], beta[MAXG];
    const int slot = ptr_slot(s);
    void **ptr = s->ptr_host[slot];
    for (int i = 0; i < n; i++) {
        ta[i] = g[i].trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
        tb[i] = g[i].trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
        mm[i] = g[i].n, nn[i] = g[i].m, kk[i] = g[i].kd;
        la[i] = ld(g[i].ldb), lb[i] = ld(g[i].lda), lc[i] = ld(g[i].ldc);
        alpha[i] = 1, beta[i] = g[i].beta, size[i] = 1;
        ptr[i] = (void *)g[i].b;
        ptr[n + i] = (void *)g[i].a;
        ptr[2 * n + i] = g[i].c;
    }
    void **dev = s->ptr_dev[slot];
    CUDA_CHECK(cudaMemcpyAsync(dev, ptr, (size_t)3 * n * sizeof(void *), cudaMemcpyHostToDevice,
                               s->stream));
    CUDA_CHECK(cudaEventRecord(s->ptr_done[slot], s->stream));
    const cublasStatus_t st = cublasGemmGroupedBatchedEx(
        s->blas, ta, tb, mm, nn, kk, alpha, (const void *const *)dev, CUDA_R_32F, la,
        (const void *const *)(dev + n), CUDA_R_32F, lb, beta, dev + 2 * n, CUDA_R_32F, lc, n, size,
        compute_type(be, CUDA_R_32F));
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) { // this cuBLAS lacks the mode (e.g. TF32): the loop
        if (!s->grouped_refused++)
            fprintf(stderr,
                    "moe: warning: cuda: cublasGemmGroupedBatchedEx does not support %s math "
                    "here; the expert GEMMs run as a cublasGemmEx loop\n",
                    s->tf32 ? "tf32" : "fp32");
        for (int i = 0; i < n; i++) gemm_one(be, &g[i]);
        return;
    }
    CUBLAS_CHECK(st);
}

extern "C" int cuda_backend_grouped_refused(moe_backend *be) {
    return cuda_state_of(be)->grouped_refused;
}

// The per-expert GEMMs of one call, built on the host from the host offsets.
static gemm_spec *expert_specs(int n_experts) {
    static thread_local gemm_spec specs[4096];
    if (n_experts > 4096)
        moe_fatal("cuda: %d experts in one grouped GEMM (at most 4096)", n_experts);
    return specs;
}

// The expert GEMMs of a call (operands of `size` bytes per element, type ab), one per expert.
// Forward: out_e [rows, n_out] = inp_e [rows, n_in] @ w_e^T.
void cuda_expert_forward_typed(moe_backend *be, real *out, const void *inp, const void *weight,
                               const int *offsets, int n_experts, int n_out, int n_in,
                               cudaDataType_t ab, size_t size) {
    gemm_spec *g = expert_specs(n_experts);
    for (int e = 0; e < n_experts; e++) {
        const int rows = offsets[e + 1] - offsets[e];
        g[e] = (gemm_spec){rows,
                           n_out,
                           n_in,
                           0,
                           1,
                           (const char *)inp + (size_t)offsets[e] * n_in * size,
                           (const char *)weight + (size_t)e * n_out * n_in * size,
                           out + (size_t)offsets[e] * n_out,
                           n_in,
                           n_in,
                           n_out,
                           0,
                           ab};
    }
    gemm_many(be, g, n_experts);
}

// Backward input: dinp_e [rows, n_in] (+)= dout_e @ w_e [n_out, n_in].
void cuda_expert_backward_input_typed(moe_backend *be, real *dinp, const void *dout,
                                      const void *weight, const int *offsets, int n_experts,
                                      int n_out, int n_in, int accumulate, cudaDataType_t ab,
                                      size_t size) {
    gemm_spec *g = expert_specs(n_experts);
    for (int e = 0; e < n_experts; e++) {
        const int rows = offsets[e + 1] - offsets[e];
        g[e] = (gemm_spec){rows,
                           n_in,
                           n_out,
                           0,
                           0,
                           (const char *)dout + (size_t)offsets[e] * n_out * size,
                           (const char *)weight + (size_t)e * n_out * n_in * size,
                           dinp + (size_t)offsets[e] * n_in,
                           n_out,
                           n_in,
                           n_in,
                           accumulate ? 1.0f : 0.0f,
                           ab};
    }
    gemm_many(be, g, n_experts);
}

// Backward weight: dw_e [n_out, n_in] += dout_e^T @ inp_e.
void cuda_expert_backward_weight_typed(moe_backend *be, real *dweight, const void *dout,
                                       const void *inp, const int *offsets, int n_experts,
                                       int n_out, int n_in, cudaDataType_t ab, size_t size) {
    gemm_spec *g = expert_specs(n_experts);
    for (int e = 0; e < n_experts; e++) {
        const int rows = offsets[e + 1] - offsets[e];
        g[e] = (gemm_spec){n_out,
                           n_in,
                           rows,
                           1,
                           0,
                           (const char *)dout + (size_t)offsets[e] * n_out * size,
                           (const char *)inp + (size_t)offsets[e] * n_in * size,
                           dweight + (size_t)e * n_out * n_in,
                           n_out,
                           n_in,
                           n_in,
                           1,
                           ab};
    }
    gemm_many(be, g, n_experts);
}

void cuda_expert_matmul_forward(moe_backend *be, real *out, const real *inp, const real *weight,
                                const int *offsets, int n_experts, int n_out, int n_in) {
    cuda_expert_forward_typed(be, out, inp, weight, offsets, n_experts, n_out, n_in, CUDA_R_32F,
                              sizeof(real));
}
void cuda_expert_matmul_backward_input(moe_backend *be, real *dinp, const real *dout,
                                       const real *weight, const int *offsets, int n_experts,
                                       int n_out, int n_in, int accumulate) {
    cuda_expert_backward_input_typed(be, dinp, dout, weight, offsets, n_experts, n_out, n_in,
                                     accumulate, CUDA_R_32F, sizeof(real));
}
void cuda_expert_matmul_backward_weight(moe_backend *be, real *dweight, const real *dout,
                                        const real *inp, const int *offsets, int n_experts,
                                        int n_out, int n_in) {
    cuda_expert_backward_weight_typed(be, dweight, dout, inp, offsets, n_experts, n_out, n_in,
                                      CUDA_R_32F, sizeof(real));
}
// The compositions the contracts name (cuBLAS, then the SwiGLU kernel): no fused form on CUDA
// yet, where h13 and dact round-trip through HBM at a small fraction of the GEMMs' time.
void cuda_expert_swiglu_forward(moe_backend *be, real *act, real *h13, const real *inp,
                                const real *w13, const int *offsets, int n_experts, int ff, int d) {
    cuda_expert_matmul_forward(be, h13, inp, w13, offsets, n_experts, 2 * ff, d);
    const size_t r0 = (size_t)offsets[0];
    cuda_swiglu_forward(be, act + r0 * ff, h13 + r0 * 2 * ff, offsets[n_experts] - offsets[0], ff);
}
void cuda_expert_swiglu_backward(moe_backend *be, real *dh13, real *dact, const real *dout,
                                 const real *w2, const real *h13, const int *offsets, int n_experts,
                                 int ff, int d) {
    cuda_expert_matmul_backward_input(be, dact, dout, w2, offsets, n_experts, d, ff, 0);
    const size_t r0 = (size_t)offsets[0];
    cuda_swiglu_backward(be, dh13 + r0 * 2 * ff, dact + r0 * ff, h13 + r0 * 2 * ff,
                         offsets[n_experts] - offsets[0], ff);
}
