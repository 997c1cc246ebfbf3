// cuDNN's fused attention (SDPA, FlashAttention-style) behind a C interface: the one C++
// translation unit of the tree (cuda/attention_cudnn.cpp, cudnn-frontend's graph API) and
// what cuda/attention.cu calls for model.attention = "cudnn". bf16 in and out, fp32 softmax
// statistics; causal; GQA. Graphs are built once per shape and kept.
#ifndef MOE_CUDA_ATTENTION_CUDNN_H
#define MOE_CUDA_ATTENTION_CUDNN_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cudnn_attention cudnn_attention;

// A cuDNN handle on `stream` (a cudaStream_t). NULL on failure, with the reason in err.
cudnn_attention *cuda_cudnn_attention_create(void *stream, char *err, size_t err_size);
void cuda_cudnn_attention_destroy(cudnn_attention *a);
// "cuDNN 9.19.0, cudnn-frontend 1.23.0" (the runtime library's version)
const char *cuda_cudnn_attention_describe(cudnn_attention *a);

// Forward, on the stream: rows qkv16 [B*S, (H+2KV)*hd] = [q | k | v] (bf16);
//   o16 [B*S, H*hd] (bf16) = softmax(q k^T hd^-1/2, causal) v,  lse [B, H, S] (fp32,
//   natural log: lse_i = log sum_j exp(S_ij), the statistics the backward reads).
// Returns 0, else -1 with the reason (the shape and cuDNN's words) in err.
int cuda_cudnn_attention_forward(cudnn_attention *a, void *o16, float *lse, const void *qkv16,
                                 int B, int S, int H, int KV, int hd, char *err, size_t err_size);
// Backward: dqkv16 [B*S, (H+2KV)*hd] (bf16, every element written) from do16, o16 [B*S, H*hd],
// qkv16 and lse as above. Deterministic (cuDNN's deterministic algorithm: no atomics in dQ).
int cuda_cudnn_attention_backward(cudnn_attention *a, void *dqkv16, const void *do16,
                                  const void *qkv16, const void *o16, const float *lse, int B,
                                  int S, int H, int KV, int hd, char *err, size_t err_size);

#ifdef __cplusplus
}
#endif

#endif
