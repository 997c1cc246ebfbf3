// Token files: the on-disk form of a tokenized corpus (DESIGN.md §5).
//
// Format, all integers little-endian, 32-byte header then the tokens:
//
//   offset  size  field
//        0     8  magic       "MOETOK1\0"
//        8     4  version     u32, 1
//       12     4  dtype       u32, bytes per token: 2 (u16) or 4 (u32)
//       16     8  count       u64, number of tokens
//       24     4  vocab_size  u32, every token id is < vocab_size (so vocab_size >= 1)
//       28     4  reserved    u32, 0
//       32     count * dtype bytes of tokens
//
// The writer uses u16 whenever vocab_size <= 65536 (every id fits), else u32. The
// file size is exactly 32 + count * dtype: anything else is a truncated or padded
// file and is refused.
#ifndef MOE_DATA_TOKEN_FILE_H
#define MOE_DATA_TOKEN_FILE_H

#include <stdint.h>

#include "layers/status.h"

#define MOE_TOKEN_FILE_MAGIC "MOETOK1" // 7 characters + the terminating NUL = 8 bytes
#define MOE_TOKEN_FILE_VERSION 1u
#define MOE_TOKEN_FILE_HEADER_BYTES 32u

// A token file read whole into memory; u16 tokens are widened to u32.
typedef struct {
    char path[1024];     // the file it was read from (for messages)
    uint64_t count;      // number of tokens
    uint32_t vocab_size; // every tokens[i] < vocab_size
    uint32_t dtype;      // bytes per token in the file: 2 or 4
    uint32_t *tokens;    // [count], owned
} moe_token_file;

// Writes `n` tokens to `path` atomically: to `path.tmp`, fsync, then rename.
// Refuses vocab_size 0 and a token id >= vocab_size (MOE_EINVAL); I/O failures are MOE_EIO.
moe_status moe_token_file_write(const char *path, const uint32_t *tokens, uint64_t n,
                                uint32_t vocab_size);

// Reads and validates a whole token file. On failure *tf is left empty (nothing to free)
// and the message names the file and what is wrong: MOE_EIO for an unreadable or
// malformed file, MOE_ENOMEM when the tokens do not fit in memory.
moe_status moe_token_file_read(moe_token_file *tf, const char *path);

// The token count of the file at path from its header (checked as moe_token_file_read checks
// it), without reading the tokens: what a reader will hold in memory, count * 4 bytes.
moe_status moe_token_file_count(const char *path, uint64_t *count);

// Frees the tokens; safe on an empty or already freed token_file.
void moe_token_file_free(moe_token_file *tf);

#endif
