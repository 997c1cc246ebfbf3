// safetensors files (the Hugging Face tensor container) and CRC32.
//
// Format: 8-byte little-endian header length N, then N bytes of JSON, then the data.
// JSON: {"__metadata__": {"format": "pt"}, "<name>": {"dtype": "F32"|"F16"|"BF16",
// "shape": [...], "data_offsets": [begin, end]}, ...}; offsets are relative to the start of
// the data, and the tensors tile the data exactly: contiguous, non-overlapping, no gaps,
// ending at the end of the file. We write the header padded with spaces to a multiple of 8
// bytes and the tensors in the order given.
#ifndef MOE_SAFETENSORS_H
#define MOE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "layers/bf16.h" // moe_f32_to_bf16, moe_bf16_to_f32
#include "layers/status.h"

typedef enum { MOE_ST_F32 = 0, MOE_ST_F16 = 1, MOE_ST_BF16 = 2 } moe_st_dtype;

#define MOE_ST_MAX_DIMS 8

typedef struct {
    char name[256];
    moe_st_dtype dtype;
    int ndim;
    int64_t shape[MOE_ST_MAX_DIMS];
    uint64_t begin, end; // byte offsets in the data section
} moe_st_tensor;

typedef struct {
    char path[1024];
    int n; // tensors (the __metadata__ entry is not one)
    moe_st_tensor *tensors;
    uint8_t *data; // the data section (owned)
    uint64_t data_size;
} moe_st_file;

// Reads and validates a whole file. Refuses, with MOE_EIO and a message naming the file and
// (where there is one) the tensor: missing file; shorter than 8 bytes; header length beyond
// the file; JSON that does not parse or is not an object; an entry that is not an object or
// lacks dtype/shape/data_offsets; unknown dtype; a shape with negative or too many dims;
// data_offsets whose size differs from shape x dtype size; overlapping or gapped offsets, or
// data not ending at the end of the file; duplicate names, and a key twice in any object of
// the header (data/json_check.h).
moe_status moe_st_read(moe_st_file *f, const char *path);
// moe_st_read without the data (f->data stays NULL; data_size is the file's): the same checks,
// for looking at the tensors' names and shapes before allocating anything for them.
moe_status moe_st_read_header(moe_st_file *f, const char *path);
void moe_st_free(moe_st_file *f);

// The tensor named `name`, or NULL.
const moe_st_tensor *moe_st_find(const moe_st_file *f, const char *name);

// Converts a tensor's data to float32 into dst (count = product of the shape).
void moe_st_to_f32(float *dst, const moe_st_file *f, const moe_st_tensor *t);

// One tensor to write: float32 data, converted to `dtype` in the file.
typedef struct {
    const char *name;
    const float *data;
    int ndim;
    int64_t shape[MOE_ST_MAX_DIMS];
} moe_st_entry;

// Writes the tensors (in order) to path, converting float32 to dtype (round to nearest
// even for F16/BF16), with {"__metadata__": {"format": "pt"}}; fsyncs the file.
moe_status moe_st_write(const char *path, const moe_st_entry *entries, int n, moe_st_dtype dtype);

// Bytes per element of dtype; the safetensors name of a dtype ("F32", ...).
size_t moe_st_dtype_size(moe_st_dtype dtype);
const char *moe_st_dtype_name(moe_st_dtype dtype);

// float32 <-> float16 (round to nearest even; NaN stays NaN). bfloat16: layers/bf16.h.
uint16_t moe_f32_to_f16(float x);
float moe_f16_to_f32(uint16_t x);

// CRC-32 (IEEE 802.3, as zlib's crc32): moe_crc32_update(0, buf, n) for a whole buffer.
uint32_t moe_crc32_update(uint32_t crc, const void *buf, size_t n);
// CRC-32 of a file's bytes; MOE_EIO naming the file if it cannot be read.
moe_status moe_file_crc32(const char *path, uint32_t *crc);

#endif
