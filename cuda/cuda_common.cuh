// Internal to cuda/: the backend's state, the error checks and the launch helpers every .cu
// file uses (GRID_STRIDE among them). Kernel wrappers (cuda_<name>) have the signatures of
// their table entries (layers/backend.h) and are declared in cuda/cuda_kernels.cuh.
#ifndef MOE_CUDA_COMMON_CUH
#define MOE_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>

// The C headers as C++: C11's _Noreturn is C++11's [[noreturn]].
#define _Noreturn [[noreturn]]
extern "C" {
#include "layers/backend.h"
#include "layers/status.h"
}
#include "cuda/cuda_backend.h"

// Not installed: what this header declares stays inside libmoe (hidden in libmoe.so).
#pragma GCC visibility push(hidden)

// Pinned host slots for the grouped GEMM's pointer arrays: a slot is refilled only after the
// copy that last read it has finished (its event), so the host never waits on the GEMM itself.
#define CUDA_PTR_SLOTS 8

typedef struct cuda_state {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    int tf32;                     // TF32 tensor-core math for the GEMMs (else strict fp32)
    cuda_expert_gemm expert_gemm; // how the expert GEMMs run
    int grouped_refused;          // grouped calls cuBLAS refused (run as the loop instead)
    void *blas_work;              // cuBLAS's workspace (cublasSetWorkspace)
    size_t blas_work_bytes;
    void *work; // the kernels' scratch (attention's D, reduction partials): grown on demand
    size_t work_bytes;
    double *host_sum;                // pinned: a reduction's result on its way to the host
    void **ptr_host[CUDA_PTR_SLOTS]; // pinned pointer arrays of the grouped GEMM
    void **ptr_dev[CUDA_PTR_SLOTS];  // their device copies
    cudaEvent_t ptr_done[CUDA_PTR_SLOTS];
    int ptr_cap; // pointers per slot
    int ptr_next;
    cudaEvent_t t0, t1;            // cuda_backend_timer_*
    struct cudnn_attention *cudnn; // model.attention = "cudnn" (cuda/attention_cudnn.h), else NULL
    char line[640];                // describe()
} cuda_state;

static inline cuda_state *cuda_state_of(moe_backend *be) { return (cuda_state *)be->state; }

// Every CUDA runtime and cuBLAS call goes through these: a failure is fatal (kernels return
// nothing) and the message names the call, the file, the line and the device.
void cuda_check_fail(const char *what, const char *why, const char *file, int line);
static inline void cuda_check_at(cudaError_t err, const char *what, const char *file, int line) {
    if (err != cudaSuccess) cuda_check_fail(what, cudaGetErrorString(err), file, line);
}
void cuda_blas_check_at(cublasStatus_t st, const char *what, const char *file, int line);
#define CUDA_CHECK(call) cuda_check_at((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) cuda_blas_check_at((call), #call, __FILE__, __LINE__)
// After each launch: the launch's own error (bad configuration), and with $MOE_CUDA_SYNC=1 the
// kernel's (a synchronisation after every kernel names the one that faulted).
void cuda_launch_check_at(moe_backend *be, const char *kernel, const char *file, int line);
#define CUDA_LAUNCHED(be, kernel) cuda_launch_check_at((be), (kernel), __FILE__, __LINE__)

// Launch shapes. Block sizes never need to divide n: every kernel tests its index.
#define CUDA_THREADS 256
static inline unsigned cuda_grid(size_t n, int threads) {
    size_t g = (n + (size_t)threads - 1) / (size_t)threads;
    if (g < 1) g = 1;
    return (unsigned)(g > ((size_t)1 << 20) ? ((size_t)1 << 20) : g); // grid-stride beyond
}
static inline cudaStream_t cuda_stream(moe_backend *be) { return cuda_state_of(be)->stream; }
// The elementwise kernels' loop: i (size_t) over [0, n), a grid of cuda_grid's size striding
// past what it does not cover.
#define GRID_STRIDE(i, n)                                                   \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

// The kernels' scratch of at least `bytes` (stream-ordered: it is only regrown after the
// stream has drained, so no kernel still reads the old one).
void *cuda_work(moe_backend *be, size_t bytes);

#pragma GCC visibility pop

#endif
