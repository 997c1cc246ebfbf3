// What only the CUDA backend has: its constructor and the knobs its tests and benchmarks turn.
// C-callable (the registry, tests and benchmarks are C). Nothing above layers/ includes this
// file except tests and benchmarks; the trainer finds the backend by name ("cuda").
#ifndef MOE_CUDA_BACKEND_H
#define MOE_CUDA_BACKEND_H

#include "layers/backend.h"

// Not installed: what this header declares stays inside libmoe (hidden in libmoe.so).
#pragma GCC visibility push(hidden)

#ifdef __cplusplus
extern "C" {
#endif

// The expert GEMMs: one cublasGemmGroupedBatchedEx call per grouped GEMM (shapes and scalars on
// the host, pointer arrays on the device), or one cublasGemmEx per expert with rows.
typedef enum {
    CUDA_EXPERT_GEMM_LOOP = 0,    // the default
    CUDA_EXPERT_GEMM_GROUPED = 1, // cublasGemmGroupedBatchedEx
} cuda_expert_gemm;

// "cuda": device $MOE_CUDA_DEVICE (default 0), one stream, a cuBLAS handle with its own
// workspace. opt->tf32 (or $MOE_CUDA_TF32=1) selects TF32 tensor-core math for the GEMMs;
// $MOE_CUDA_EXPERT_GEMM=grouped|loop the expert GEMMs. MOE_EINVAL "cuda: no CUDA device ..."
// when the machine has none (or the driver cannot be reached).
moe_status cuda_backend_create(moe_backend **out, const moe_backend_options *opt);

cuda_expert_gemm cuda_backend_set_expert_gemm(moe_backend *be, cuda_expert_gemm mode); // old mode
int cuda_backend_set_tf32(moe_backend *be, int on);                                    // old value
// Grouped GEMM calls this cuBLAS refused as not supported (they ran as the loop instead).
int cuda_backend_grouped_refused(moe_backend *be);
// Waits for the backend's stream (benchmarks time with CUDA events around it).
void cuda_backend_synchronize(moe_backend *be);
// Milliseconds between two moments of the stream: cuda_backend_timer_start, then _stop after
// the work (benchmarks; CUDA events, so launch overheads on the host are not counted).
void cuda_backend_timer_start(moe_backend *be);
double cuda_backend_timer_stop_ms(moe_backend *be);

#ifdef __cplusplus
}
#endif

#pragma GCC visibility pop

#endif
