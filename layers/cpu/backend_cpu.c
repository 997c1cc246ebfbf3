// The CPU backend table: host memory and the reference kernels.
#include <stdlib.h>
#include <string.h>

#include "layers/cpu/cpu_kernels.h"

static void *cpu_alloc(size_t bytes) { return calloc(1, bytes ? bytes : 1); }
static void cpu_free(void *ptr) { free(ptr); }
static void cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) memcpy(dst, src, bytes);
}
static void cpu_zero(void *ptr, size_t bytes) {
    if (bytes) memset(ptr, 0, bytes);
}

static const moe_backend cpu_backend = {
    .name = "cpu-" MOE_REAL_NAME,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .zero = cpu_zero,
    .matmul = cpu_matmul,
    .expert_matmul_forward = cpu_expert_matmul_forward,
    .expert_matmul_backward_input = cpu_expert_matmul_backward_input,
    .expert_matmul_backward_weight = cpu_expert_matmul_backward_weight,
    .router_topk = cpu_router_topk,
    .moe_dispatch_counts = cpu_moe_dispatch_counts,
    .moe_seq_counts = cpu_moe_seq_counts,
    .moe_capacity_keep = cpu_moe_capacity_keep,
    .moe_permute_index = cpu_moe_permute_index,
    .moe_permute = cpu_moe_permute,
    .moe_combine_forward = cpu_moe_combine_forward,
    .moe_combine_backward = cpu_moe_combine_backward,
    .moe_unpermute_add = cpu_moe_unpermute_add,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .router_losses = cpu_router_losses,
    .router_backward = cpu_router_backward,
    .uniform_noise = cpu_uniform_noise,
    .mul = cpu_mul,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope = cpu_rope,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .attention_scratch_size = cpu_attention_scratch_size,
    .attention_cached_forward = cpu_attention_cached_forward,
    .kv_cache_append = cpu_kv_cache_append,
    .cross_entropy_forward = cpu_cross_entropy_forward,
    .cross_entropy_backward = cpu_cross_entropy_backward,
    .add = cpu_add,
    .sum_squares = cpu_sum_squares,
    .adamw_update = cpu_adamw_update,
    .sgd_update = cpu_sgd_update,
};

const moe_backend *moe_backend_cpu(void) { return &cpu_backend; }
