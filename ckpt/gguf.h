// GGUF v3 files (llama.cpp's model container): a small writer, and moe_export_gguf, a
// checkpoint as a GGUF file of its family's llama.cpp architecture with its tokenizer
// (docs/checkpoints.md "GGUF for llama.cpp").
//
// The format (little-endian): "GGUF", uint32 version 3, uint64 tensor_count, uint64
// kv_count; the key-value pairs (key: uint64 length + bytes; uint32 value type; the value; an
// array is uint32 element type, uint64 count, the elements); the tensor infos (name, uint32
// n_dims, uint64 ne[n_dims] with ne[0] the fastest-varying dimension, uint32 ggml type, uint64
// offset from the start of the data section, a multiple of the alignment); zero padding to
// the alignment (32, written as general.alignment by the caller when it wants); the data,
// each tensor padded to the alignment.
#ifndef MOE_CKPT_GGUF_H
#define MOE_CKPT_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "layers/status.h"

// A key-value pair's value type.
typedef enum {
    MOE_GGUF_UINT8 = 0,
    MOE_GGUF_INT8 = 1,
    MOE_GGUF_UINT16 = 2,
    MOE_GGUF_INT16 = 3,
    MOE_GGUF_UINT32 = 4,
    MOE_GGUF_INT32 = 5,
    MOE_GGUF_FLOAT32 = 6,
    MOE_GGUF_BOOL = 7,
    MOE_GGUF_STRING = 8,
    MOE_GGUF_ARRAY = 9,
    MOE_GGUF_UINT64 = 10,
    MOE_GGUF_INT64 = 11,
    MOE_GGUF_FLOAT64 = 12,
} moe_gguf_value_type;

// The tensor types the writer converts fp32 to. Q8_0: blocks of 32 values along ne[0], each
// an fp16 scale d then 32 int8 q; x = q d.
typedef enum {
    MOE_GGML_F32 = 0,
    MOE_GGML_F16 = 1,
    MOE_GGML_Q8_0 = 8,
    MOE_GGML_BF16 = 30,
} moe_ggml_type;

#define MOE_GGUF_VERSION 3
#define MOE_GGUF_ALIGNMENT 32
#define MOE_GGUF_MAX_DIMS 4
#define MOE_GGML_QK8_0 32 // values per Q8_0 block

// "f32", "f16", "bf16", "q8_0" -> *type; MOE_EINVAL naming the accepted ones otherwise.
moe_status moe_ggml_type_parse(const char *name, moe_ggml_type *type);
const char *moe_ggml_type_name(moe_ggml_type type);
// Bytes of n values of type (Q8_0: n a multiple of 32).
uint64_t moe_ggml_nbytes(moe_ggml_type type, uint64_t n);

// Q8_0 of n values (a multiple of 32) into out (n / 32 * 34 bytes): per block the scale d =
// the smallest fp16 >= max|x| / 127 (rounded up, not to nearest: x / d then never exceeds 127,
// also where fp16 is subnormal) and q = round(x / d), so that |x - q d| <= d / 2 for every
// value. (llama.cpp's own quantizer rounds d to nearest and may clip by a little more.)
void moe_ggml_quantize_q8_0(uint8_t *out, const float *x, uint64_t n);

// The writer: key-value pairs and tensor infos first (in the order the file will hold them),
// then each tensor's data in that order (moe_gguf_write_tensor, fp32 converted to the
// tensor's type), then moe_gguf_finish. The file is written to PATH.tmp and renamed to PATH
// after fflush + fsync (then the folder is fsynced); any failed write (a full disk, a file
// size limit) is MOE_EIO naming PATH.tmp and the reason, and moe_gguf_writer_free removes
// PATH.tmp: PATH is either the whole file or absent. Keys and tensor names are unique (a
// second one is MOE_EINVAL).
typedef struct moe_gguf_writer moe_gguf_writer;

moe_status moe_gguf_writer_create(moe_gguf_writer **w, const char *path);
// Frees w; PATH.tmp is removed unless moe_gguf_finish succeeded.
void moe_gguf_writer_free(moe_gguf_writer *w);

// A scalar pair (type neither STRING nor ARRAY; value points at the C type of that size:
// uint8_t ... double; BOOL: a uint8_t 0 or 1).
moe_status moe_gguf_kv(moe_gguf_writer *w, const char *key, moe_gguf_value_type type,
                       const void *value);
moe_status moe_gguf_kv_u32(moe_gguf_writer *w, const char *key, uint32_t v);
moe_status moe_gguf_kv_f32(moe_gguf_writer *w, const char *key, float v);
moe_status moe_gguf_kv_bool(moe_gguf_writer *w, const char *key, int v);
moe_status moe_gguf_kv_str(moe_gguf_writer *w, const char *key, const char *v);
// An array of n scalars of elem_type (not STRING or ARRAY), packed as that C type.
moe_status moe_gguf_kv_array(moe_gguf_writer *w, const char *key, moe_gguf_value_type elem_type,
                             const void *elems, uint64_t n);
// An array of n strings (n may be 0).
moe_status moe_gguf_kv_str_array(moe_gguf_writer *w, const char *key, const char *const *v,
                                 uint64_t n);

// A tensor info: n_dims in [1, MOE_GGUF_MAX_DIMS], ne[0] fastest; Q8_0 needs ne[0] % 32 == 0.
moe_status moe_gguf_add_tensor(moe_gguf_writer *w, const char *name, int n_dims, const int64_t *ne,
                               moe_ggml_type type);
// The next tensor's values (the product of its ne, fp32, ne[0] fastest). The first call
// writes the header, the pairs and the infos.
moe_status moe_gguf_write_tensor(moe_gguf_writer *w, const float *data);
// After every tensor: flush, fsync, rename PATH.tmp to PATH, fsync the folder.
moe_status moe_gguf_finish(moe_gguf_writer *w);

// A checkpoint (a step folder, a `latest` file, or an HF folder; a moe.c checkpoint is
// verified first) as a GGUF file at out_path of the llama.cpp architecture of its family
// (mixtral: `llama`, qwen3_moe: `qwen3moe`, qwen2_moe: `qwen2moe`, olmoe: `olmoe`), the
// weights in type ("f32", "f16", "bf16", "q8_0"; vectors and the router stay f32, and a Q8_0
// tensor whose ne[0] is not a multiple of 32 is written f16, as llama.cpp's converter does),
// with its tokenizer (ckpt/gguf_vocab.h). Refused, naming the field, before anything is
// written: what the architecture cannot compute (gguf_export.c: unsupported) and a tokenizer
// llama.cpp would tokenize differently. out_path must not exist.
moe_status moe_export_gguf(const char *ckpt_folder, const char *out_path, const char *type);

#endif
