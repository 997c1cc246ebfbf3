// The CUDA backend: device memory (cudaMalloc, never managed memory), the typed copies, one
// stream, a cuBLAS handle with its own workspace, the kernels' scratch, and the error checks.
// Every kernel runs on the backend's stream; the host waits only where a result must reach it
// (copy_to_host, sum, sum_squares) or where its buffer must stay valid (copy_to_device).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_kernels.cuh"

void cuda_check_fail(const char *what, const char *why, const char *file, int line) {
    int dev = -1;
    cudaGetDevice(&dev);
    moe_fatal("cuda: %s failed: %s (%s:%d, device %d)", what, why, file, line, dev);
}

void cuda_blas_check_at(cublasStatus_t st, const char *what, const char *file, int line) {
    if (st != CUBLAS_STATUS_SUCCESS) cuda_check_fail(what, cublasGetStatusString(st), file, line);
}

void cuda_launch_check_at(moe_backend *be, const char *kernel, const char *file, int line) {
    cuda_check_at(cudaGetLastError(), kernel, file, line);
    static int sync = -1; // $MOE_CUDA_SYNC, read once
    if (sync < 0) sync = getenv("MOE_CUDA_SYNC") && atoi(getenv("MOE_CUDA_SYNC")) > 0;
    if (sync) cuda_check_at(cudaStreamSynchronize(cuda_stream(be)), kernel, file, line);
}

void *cuda_work(moe_backend *be, size_t bytes) {
    cuda_state *s = cuda_state_of(be);
    if (bytes > s->work_bytes) {
        CUDA_CHECK(cudaStreamSynchronize(s->stream)); // no kernel still uses the old one
        if (s->work) CUDA_CHECK(cudaFree(s->work));
        s->work = NULL;
        size_t grown = bytes + bytes / 2;
        CUDA_CHECK(cudaMalloc(&s->work, grown));
        s->work_bytes = grown;
    }
    return s->work;
}

// ---- memory --------------------------------------------------------------------------
static void *cuda_alloc(moe_backend *be, size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError(); // an out-of-memory is returned as NULL, not sticky
        return NULL;
    }
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda_stream(be)));
    return p;
}
static void cuda_free(moe_backend *be, void *ptr) {
    (void)be;
    if (ptr) CUDA_CHECK(cudaFree(ptr)); // cudaFree waits for the device
}
// Host -> device: returns once the host buffer may be reused (the caller's buffer may be
// pinned, when cudaMemcpyAsync would not have read it yet).
static void cuda_copy_to_device(moe_backend *be, void *dst, const void *host_src, size_t bytes) {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, cuda_stream(be)));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream(be)));
}
static void cuda_copy_to_host(moe_backend *be, void *host_dst, const void *src, size_t bytes) {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, cuda_stream(be)));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream(be)));
}
static void cuda_copy_on_device(moe_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_stream(be)));
}
static void cuda_zero(moe_backend *be, void *ptr, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, cuda_stream(be)));
}
// layers/timing.h's laps: the phase's kernels have finished, not just been launched
static void cuda_synchronize(moe_backend *be) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream(be)));
}

// ---- the object ------------------------------------------------------------------------
static const char *cuda_describe(moe_backend *be) {
    cuda_state *s = cuda_state_of(be);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, s->device));
    int blas = 0, rt = 0;
    CUBLAS_CHECK(cublasGetVersion(s->blas, &blas));
    CUDA_CHECK(cudaRuntimeGetVersion(&rt));
    snprintf(s->line, sizeof s->line,
             "CUDA: device %d %s (sm_%d%d, %.0f GiB), runtime %d.%d, cuBLAS %d; math: %s; "
             "expert GEMMs: %s",
             s->device, prop.name, prop.major, prop.minor,
             (double)prop.totalGlobalMem / (1024.0 * 1024 * 1024), rt / 1000, rt % 1000 / 10, blas,
             s->tf32 ? "tf32" : "fp32",
             s->expert_gemm == CUDA_EXPERT_GEMM_GROUPED ? "cublasGemmGroupedBatchedEx"
                                                        : "cublasGemmEx per expert");
    if (s->cudnn) {
        const size_t len = strlen(s->line);
        snprintf(s->line + len, sizeof s->line - len, "; attention: %s",
                 cuda_cudnn_describe(s->cudnn));
    }
    return s->line;
}

static void cuda_destroy(moe_backend *be) {
    cuda_state *s = cuda_state_of(be);
    if (s) {
        cudaSetDevice(s->device);
        if (s->stream) cudaStreamSynchronize(s->stream);
        for (int i = 0; i < CUDA_PTR_SLOTS; i++) {
            if (s->ptr_host[i]) cudaFreeHost(s->ptr_host[i]);
            if (s->ptr_dev[i]) cudaFree(s->ptr_dev[i]);
            if (s->ptr_done[i]) cudaEventDestroy(s->ptr_done[i]);
        }
        if (s->t0) cudaEventDestroy(s->t0);
        if (s->t1) cudaEventDestroy(s->t1);
        if (s->host_sum) cudaFreeHost(s->host_sum);
        if (s->work) cudaFree(s->work);
        if (s->cudnn) cuda_cudnn_destroy(s->cudnn);
        if (s->blas) cublasDestroy(s->blas);
        if (s->blas_work) cudaFree(s->blas_work);
        if (s->stream) cudaStreamDestroy(s->stream);
        free(s);
    }
    free(be);
}

static void cuda_fill_table(moe_backend *be) {
    be->destroy = cuda_destroy;
    be->describe = cuda_describe;
    be->alloc = cuda_alloc;
    be->free = cuda_free;
    be->copy_to_device = cuda_copy_to_device;
    be->copy_to_host = cuda_copy_to_host;
    be->copy_on_device = cuda_copy_on_device;
    be->zero = cuda_zero;
    be->synchronize = cuda_synchronize;
    be->matmul = cuda_matmul;
    be->expert_matmul_forward = cuda_expert_matmul_forward;
    be->expert_matmul_backward_input = cuda_expert_matmul_backward_input;
    be->expert_matmul_backward_weight = cuda_expert_matmul_backward_weight;
    be->matmul_bf16 = cuda_matmul_bf16;
    be->expert_matmul_forward_bf16 = cuda_expert_matmul_forward_bf16;
    be->expert_matmul_backward_input_bf16 = cuda_expert_matmul_backward_input_bf16;
    be->expert_matmul_backward_weight_bf16 = cuda_expert_matmul_backward_weight_bf16;
    be->to_bf16 = cuda_to_bf16;
    be->from_bf16 = cuda_from_bf16;
#ifdef MOE_HAVE_NCCL
    be->device_comm = cuda_device_comm; // cuda/exchange_nccl.cu
#endif
    be->router_topk = cuda_router_topk;
    be->moe_dispatch_counts = cuda_moe_dispatch_counts;
    be->moe_seq_counts = cuda_moe_seq_counts;
    be->moe_capacity_keep = cuda_moe_capacity_keep;
    be->moe_permute_index = cuda_moe_permute_index;
    be->moe_permute = cuda_moe_permute;
    be->moe_copy_chunks = cuda_moe_copy_chunks;
    be->moe_combine_forward = cuda_moe_combine_forward;
    be->moe_combine_backward = cuda_moe_combine_backward;
    be->moe_permute_bf16 = cuda_moe_permute_bf16;
    be->moe_combine_backward_bf16 = cuda_moe_combine_backward_bf16;
    be->moe_unpermute_add = cuda_moe_unpermute_add;
    be->swiglu_forward = cuda_swiglu_forward;
    be->swiglu_backward = cuda_swiglu_backward;
    be->swiglu_forward_bf16 = cuda_swiglu_forward_bf16;
    be->expert_swiglu_forward_bf16 = cuda_expert_swiglu_forward_bf16;
    be->expert_swiglu_backward_bf16 = cuda_expert_swiglu_backward_bf16;
    be->expert_swiglu_forward = cuda_expert_swiglu_forward;
    be->expert_swiglu_backward = cuda_expert_swiglu_backward;
    be->swiglu_backward_bf16 = cuda_swiglu_backward_bf16;
    be->router_losses = cuda_router_losses;
    be->router_backward = cuda_router_backward;
    be->uniform_noise = cuda_uniform_noise;
    be->mul = cuda_mul;
    be->embedding_forward = cuda_embedding_forward;
    be->embedding_backward = cuda_embedding_backward;
    be->rmsnorm_forward = cuda_rmsnorm_forward;
    be->rmsnorm_backward = cuda_rmsnorm_backward;
    be->head_rmsnorm_forward = cuda_head_rmsnorm_forward;
    be->head_rmsnorm_backward = cuda_head_rmsnorm_backward;
    be->bias_add = cuda_bias_add;
    be->bias_backward = cuda_bias_backward;
    be->sigmoid_gate_forward = cuda_sigmoid_gate_forward;
    be->sigmoid_gate_backward = cuda_sigmoid_gate_backward;
    be->rope = cuda_rope;
    be->attention_forward = cuda_attention_forward;
    be->attention_backward = cuda_attention_backward;
    be->attention_forward_bf16 = cuda_attention_forward_bf16;
    be->attention_backward_bf16 = cuda_attention_backward_bf16;
    be->attention_scratch_size = cuda_attention_scratch_size;
    be->attention_cached_forward = cuda_attention_cached_forward;
    be->kv_cache_append = cuda_kv_cache_append;
    be->cross_entropy_forward = cuda_cross_entropy_forward;
    be->cross_entropy_backward = cuda_cross_entropy_backward;
    be->add = cuda_add;
    be->sum_squares = cuda_sum_squares;
    be->sum = cuda_sum;
    be->adamw_update = cuda_adamw_update;
    be->sgd_update = cuda_sgd_update;
}

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

// A failure while setting up: the message names the call; what was made is destroyed.
#define SETUP(call)                                                                          \
    do {                                                                                     \
        cudaError_t err_ = (call);                                                           \
        if (err_ != cudaSuccess) {                                                           \
            moe_status st_ = moe_error(MOE_ENOMEM, "cuda: %s failed: %s (device %d)", #call, \
                                       cudaGetErrorString(err_), s->device);                 \
            cuda_destroy(be);                                                                \
            return st_;                                                                      \
        }                                                                                    \
    } while (0)

// This process's rank among the node's (Open MPI, MPICH/Hydra, Slurm), 0 outside a launcher.
static int local_rank(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
    for (int i = 0; i < 3; i++) {
        const int r = env_int(vars[i], -1);
        if (r >= 0) return r;
    }
    return 0;
}

extern "C" moe_status cuda_backend_create(moe_backend **out, const moe_backend_options *opt) {
    *out = NULL;
    if (opt && opt->row_invariant) // cuBLAS picks its kernels (and sums) by the row count
        return moe_error(MOE_EINVAL, "row_invariant: not supported by the cuda backend");
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return moe_error(MOE_EINVAL, "cuda: no CUDA device (cudaGetDeviceCount: %s)",
                         err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    }
    // MOE_CUDA_DEVICE, else one GPU per rank of a node (mpirun's local rank modulo the devices)
    const int device = env_int("MOE_CUDA_DEVICE", local_rank() % n);
    if (device < 0 || device >= n)
        return moe_error(MOE_EINVAL, "cuda: MOE_CUDA_DEVICE=%d, but this machine has %d device%s",
                         device, n, n == 1 ? "" : "s");
    moe_backend *be = (moe_backend *)calloc(1, sizeof *be);
    cuda_state *s = (cuda_state *)calloc(1, sizeof *s);
    if (!be || !s) {
        free(be);
        free(s);
        return moe_error(MOE_ENOMEM, "cuda backend: out of memory");
    }
    cuda_fill_table(be);
    be->name = "cuda";
    be->state = s;
    be->host_memory = 0;
    s->device = device;
    s->tf32 = (opt && opt->tf32) || env_int("MOE_CUDA_TF32", 0) > 0;
    const char *g = getenv("MOE_CUDA_EXPERT_GEMM");
    s->expert_gemm = g && !strcmp(g, "grouped") ? CUDA_EXPERT_GEMM_GROUPED : CUDA_EXPERT_GEMM_LOOP;
    if (g && *g && strcmp(g, "grouped") && strcmp(g, "loop")) {
        cuda_destroy(be);
        return moe_error(MOE_EINVAL, "cuda: MOE_CUDA_EXPERT_GEMM='%s' (expected grouped or loop)",
                         g);
    }
    SETUP(cudaSetDevice(device));
    SETUP(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    if (cublasCreate(&s->blas) != CUBLAS_STATUS_SUCCESS) {
        s->blas = NULL;
        cuda_destroy(be);
        return moe_error(MOE_EINVAL, "cuda: cublasCreate failed (device %d)", device);
    }
    s->blas_work_bytes = (size_t)32 << 20; // cuBLAS's recommendation for Hopper
    SETUP(cudaMalloc(&s->blas_work, s->blas_work_bytes));
    if (cublasSetStream(s->blas, s->stream) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(s->blas, s->blas_work, s->blas_work_bytes) != CUBLAS_STATUS_SUCCESS) {
        cuda_destroy(be);
        return moe_error(MOE_EINVAL, "cuda: cuBLAS stream/workspace setup failed (device %d)",
                         device);
    }
    SETUP(cudaMallocHost((void **)&s->host_sum, sizeof(double)));
    s->ptr_cap = 3 * 4096; // A, B, C pointers of up to 4096 experts
    for (int i = 0; i < CUDA_PTR_SLOTS; i++) {
        SETUP(cudaMallocHost((void **)&s->ptr_host[i], (size_t)s->ptr_cap * sizeof(void *)));
        SETUP(cudaMalloc((void **)&s->ptr_dev[i], (size_t)s->ptr_cap * sizeof(void *)));
        SETUP(cudaEventCreateWithFlags(&s->ptr_done[i], cudaEventDisableTiming));
        SETUP(cudaEventRecord(s->ptr_done[i], s->stream));
    }
    SETUP(cudaEventCreate(&s->t0));
    SETUP(cudaEventCreate(&s->t1));
    if (opt && opt->attention_cudnn) {
        moe_status st = cuda_cudnn_enable(be);
        if (st) {
            cuda_destroy(be);
            return st;
        }
    }
    *out = be;
    return MOE_OK;
}

extern "C" cuda_expert_gemm cuda_backend_set_expert_gemm(moe_backend *be, cuda_expert_gemm mode) {
    cuda_expert_gemm old = cuda_state_of(be)->expert_gemm;
    cuda_state_of(be)->expert_gemm = mode;
    return old;
}
extern "C" int cuda_backend_set_tf32(moe_backend *be, int on) {
    int old = cuda_state_of(be)->tf32;
    cuda_state_of(be)->tf32 = on;
    return old;
}
extern "C" void cuda_backend_synchronize(moe_backend *be) {
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream(be)));
}
extern "C" void cuda_backend_timer_start(moe_backend *be) {
    CUDA_CHECK(cudaEventRecord(cuda_state_of(be)->t0, cuda_stream(be)));
}
extern "C" double cuda_backend_timer_stop_ms(moe_backend *be) {
    cuda_state *s = cuda_state_of(be);
    CUDA_CHECK(cudaEventRecord(s->t1, s->stream));
    CUDA_CHECK(cudaEventSynchronize(s->t1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, s->t0, s->t1));
    return ms;
}
