// A stand-in for OpenBLAS's cblas_sbgemm, linked (and exported, -rdynamic) only into
// test_gemm_bf16_standin: Debian's OpenBLAS 0.3.21 has no sbgemm, so without this the
// native path of layers/cpu/gemm_bf16.c (its per-expert calls, leading dimensions,
// transposes, beta) would never run here. The backend finds it with dlsym as it would find
// OpenBLAS's. Written from the CBLAS contract, row-major only:
//   C = alpha op(A) op(B) + beta C,  A, B bf16, C fp32, sums in double.
// Declared in plain ints, as layers/cpu/gemm_bf16.c calls it (the CBLAS enums are ints in the
// ABI: row-major 101, transposed 112; blasint is int in an LP64 OpenBLAS), so that it builds
// with every MOE_BLAS, whose headers spell these types differently or not at all.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { ROW_MAJOR = 101, TRANS = 112 };

void cblas_sbgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha,
                  const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta, float *C,
                  int ldc);
void cblas_sbgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha,
                  const uint16_t *A, int lda, const uint16_t *B, int ldb, float beta, float *C,
                  int ldc) {
    if (order != ROW_MAJOR) abort();
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int p = 0; p < K; p++) {
                const uint16_t a = trans_a == TRANS ? A[p * lda + i] : A[i * lda + p];
                const uint16_t b = trans_b == TRANS ? B[j * ldb + p] : B[p * ldb + j];
                const uint32_t ua = (uint32_t)a << 16, ub = (uint32_t)b << 16;
                float fa, fb;
                memcpy(&fa, &ua, 4), memcpy(&fb, &ub, 4);
                s += (double)fa * fb;
            }
            float *c = &C[i * ldc + j];
            *c = (float)(alpha * s + (beta == 0 ? 0.0 : (double)beta * *c));
        }
}
