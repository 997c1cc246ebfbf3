// The CPU backend: host memory, the reference kernels, and its state (thread count; in
// strict mode the registry of protected allocations, layers/cpu/strict.c).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/blas.h"
#include "layers/cpu/cpu_kernels.h"

static cpu_state *state_of(moe_backend *be) { return be->state; }

static void *cpu_alloc(moe_backend *be, size_t bytes) {
    if (state_of(be)->strict) return cpu_strict_alloc(be, bytes);
    return cpu_host_alloc(bytes);
}
static void cpu_free(moe_backend *be, void *ptr) {
    if (state_of(be)->strict)
        cpu_strict_free(be, ptr);
    else
        cpu_host_free(ptr);
}
// One copy for all three directions: host and device memory are the same here. Each is a
// kernel scope, so strict mode opens the device side (and the host side is plain memory).
static void cpu_copy(moe_backend *be, void *dst, const void *src, size_t bytes) {
    CPU_KERNEL(be);
    if (bytes) memcpy(dst, src, bytes);
}
// Large buffers (the gradients: 30 MB for shakespeare.cfg) are cleared in 1 MiB slices over
// the threads: one core's stores do not reach the memory's write bandwidth.
static void cpu_zero(moe_backend *be, void *ptr, size_t bytes) {
    CPU_KERNEL(be);
    const size_t slice = (size_t)1 << 20;
    if (bytes < 4 * slice) {
        if (bytes) memset(ptr, 0, bytes);
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t o = 0; o < bytes; o += slice)
        memset((char *)ptr + o, 0, bytes - o < slice ? bytes - o : slice);
}

static const char *cpu_describe(moe_backend *be) {
    cpu_state *s = state_of(be);
    const char *note = moe_blas_note();
    snprintf(s->line, sizeof s->line, "BLAS: %s (kernels %s%s%s); %s%s%s; threads: %d%s%s",
             moe_blas_name(), moe_blas_kernel(), *note ? ", " : "", note, s->fp32_line,
             *s->fp32_line ? "; " : "", s->bf16_line, s->threads,
             s->row_invariant ? "; row-invariant (GEMMs and attention as plain loops, slow)" : "",
             s->strict ? "; strict memory (test mode, slow)" : "");
    return s->line;
}

int cpu_backend_set_threads(moe_backend *be, int requested) {
    return state_of(be)->threads = moe_cpu_threads(requested);
}

static void cpu_destroy(moe_backend *be) {
    cpu_strict_release(be);
    free(state_of(be)->bf16_ws);
    free(be->state);
    free(be);
}

static const moe_backend cpu_table = {
    .destroy = cpu_destroy,
    .describe = cpu_describe,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .copy_on_device = cpu_copy,
    .zero = cpu_zero,
    .matmul = cpu_matmul,
    .expert_matmul_forward = cpu_expert_matmul_forward,
    .expert_matmul_backward_input = cpu_expert_matmul_backward_input,
    .expert_matmul_backward_weight = cpu_expert_matmul_backward_weight,
    .matmul_bf16 = cpu_matmul_bf16,
    .expert_matmul_forward_bf16 = cpu_expert_matmul_forward_bf16,
    .expert_matmul_backward_input_bf16 = cpu_expert_matmul_backward_input_bf16,
    .expert_matmul_backward_weight_bf16 = cpu_expert_matmul_backward_weight_bf16,
    .to_bf16 = cpu_to_bf16,
    .from_bf16 = cpu_from_bf16,
    .router_topk = cpu_router_topk,
    .moe_dispatch_counts = cpu_moe_dispatch_counts,
    .moe_seq_counts = cpu_moe_seq_counts,
    .moe_capacity_keep = cpu_moe_capacity_keep,
    .moe_permute_index = cpu_moe_permute_index,
    .moe_permute = cpu_moe_permute,
    .moe_copy_chunks = cpu_moe_copy_chunks,
    .moe_combine_forward = cpu_moe_combine_forward,
    .moe_combine_backward = cpu_moe_combine_backward,
    .moe_permute_bf16 = cpu_moe_permute_bf16,
    .moe_combine_backward_bf16 = cpu_moe_combine_backward_bf16,
    .moe_unpermute_add = cpu_moe_unpermute_add,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .swiglu_forward_bf16 = cpu_swiglu_forward_bf16,
    .expert_swiglu_forward = cpu_expert_swiglu_forward,
    .expert_swiglu_backward = cpu_expert_swiglu_backward,
    .expert_swiglu_forward_bf16 = cpu_expert_swiglu_forward_bf16,
    .expert_swiglu_backward_bf16 = cpu_expert_swiglu_backward_bf16,
    .swiglu_backward_bf16 = cpu_swiglu_backward_bf16,
    .router_losses = cpu_router_losses,
    .router_backward = cpu_router_backward,
    .uniform_noise = cpu_uniform_noise,
    .mul = cpu_mul,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .head_rmsnorm_forward = cpu_head_rmsnorm_forward,
    .head_rmsnorm_backward = cpu_head_rmsnorm_backward,
    .bias_add = cpu_bias_add,
    .bias_backward = cpu_bias_backward,
    .sigmoid_gate_forward = cpu_sigmoid_gate_forward,
    .sigmoid_gate_backward = cpu_sigmoid_gate_backward,
    .rope = cpu_rope,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_forward_bf16 = cpu_attention_forward_bf16,
    .attention_backward_bf16 = cpu_attention_backward_bf16,
    .attention_scratch_size = cpu_attention_scratch_size,
    .attention_cached_forward = cpu_attention_cached_forward,
    .kv_cache_append = cpu_kv_cache_append,
    .cross_entropy_forward = cpu_cross_entropy_forward,
    .cross_entropy_backward = cpu_cross_entropy_backward,
    .add = cpu_add,
    .sum_squares = cpu_sum_squares,
    .sum = cpu_sum,
    .adamw_update = cpu_adamw_update,
    .sgd_update = cpu_sgd_update,
};

moe_status cpu_backend_create(moe_backend **out, const moe_backend_options *opt, int strict) {
    *out = NULL;
    if (opt && opt->attention_cudnn)
        return moe_error(MOE_EINVAL, "model.attention = \"cudnn\" needs model.device = \"cuda\" "
                                     "(cuDNN's attention runs on NVIDIA GPUs; \"native\" runs "
                                     "everywhere)");
    moe_backend *be = malloc(sizeof *be);
    cpu_state *s = calloc(1, sizeof *s);
    if (!be || !s) {
        free(be);
        free(s);
        return moe_error(MOE_ENOMEM, "cpu backend: out of memory");
    }
    *be = cpu_table;
    be->name = strict ? "cpu-strict" : "cpu";
    be->state = s;
    be->host_memory = !strict;
    s->strict = strict;
    const char *ri = getenv("MOE_ROW_INVARIANT");
    s->row_invariant = (opt && opt->row_invariant) || (ri && !strcmp(ri, "1"));
    moe_status st = cpu_bf16_select(s); // after row_invariant: it picks the reference path
    if (!st) st = cpu_fp32_select(s);
    if (st) {
        free(be);
        free(s);
        return st;
    }
    int threads = opt ? opt->threads : 0;
    if (threads == 0 && opt && opt->procs_per_node > 1) { // ranks share the node's cores
        threads = moe_cpu_threads(0) / opt->procs_per_node;
        if (threads < 1) threads = 1;
    }
    s->threads = moe_cpu_threads(threads);
    *out = be;
    return MOE_OK;
}

moe_status cpu_backend_create_plain(moe_backend **out, const moe_backend_options *opt) {
    return cpu_backend_create(out, opt, 0);
}
moe_status cpu_backend_create_strict(moe_backend **out, const moe_backend_options *opt) {
    return cpu_backend_create(out, opt, 1);
}
