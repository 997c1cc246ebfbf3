// A stand-in for OpenBLAS's cblas_sbgemm, linked (and exported, -rdynamic) only into
// test_gemm_bf16_standin: Debian's OpenBLAS 0.3.21 has no sbgemm, so without this the
// native path of layers/cpu/gemm_bf16.c (its per-expert calls, leading dimensions,
// transposes, beta) would never run here. The backend finds it with dlsym as it would find
// OpenBLAS's. Written from the CBLAS contract, row-major only:
//   C = alpha op(A) op(B) + beta C,  A, B bf16, C fp32, sums in double.
#include <cblas.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void cblas_sbgemm(OPENBLAS_CONST enum CBLAS_ORDER Order, OPENBLAS_CONST enum CBLAS_TRANSPOSE TransA,
                  OPENBLAS_CONST enum CBLAS_TRANSPOSE TransB, OPENBLAS_CONST blasint M,
                  OPENBLAS_CONST blasint N, OPENBLAS_CONST blasint K, OPENBLAS_CONST float alpha,
                  OPENBLAS_CONST bfloat16 *A, OPENBLAS_CONST blasint lda,
                  OPENBLAS_CONST bfloat16 *B, OPENBLAS_CONST blasint ldb, OPENBLAS_CONST float beta,
                  float *C, OPENBLAS_CONST blasint ldc) {
    if (Order != CblasRowMajor) abort();
    for (blasint i = 0; i < M; i++)
        for (blasint j = 0; j < N; j++) {
            double s = 0;
            for (blasint p = 0; p < K; p++) {
                const uint16_t a = TransA == CblasTrans ? A[p * lda + i] : A[i * lda + p];
                const uint16_t b = TransB == CblasTrans ? B[j * ldb + p] : B[p * ldb + j];
                const uint32_t ua = (uint32_t)a << 16, ub = (uint32_t)b << 16;
                float fa, fb;
                memcpy(&fa, &ua, 4), memcpy(&fb, &ub, 4);
                s += (double)fa * fb;
            }
            float *c = &C[i * ldc + j];
            *c = (float)(alpha * s + (beta == 0 ? 0.0 : (double)beta * *c));
        }
}
