// The byte tokenizer and corpus preparation (`moe prepare --text FILE... --out DIR`).
#ifndef MOE_DATA_PREPARE_H
#define MOE_DATA_PREPARE_H

#include <stddef.h>
#include <stdint.h>

#include "layers/status.h"

// ---- byte tokenizer: token id = byte value (0..255), vocabulary of 256 -------------

#define DATA_BYTE_VOCAB_SIZE 256

// tokens[i] = (unsigned char)text[i] for i < n.
void moe_byte_tokenize(int *tokens, const char *text, size_t n);

// text[i] = tokens[i] for i < n (no terminating NUL is written). A token outside
// [0, 256) is refused with MOE_EINVAL naming its index and value; text is then undefined.
moe_status moe_byte_detokenize(char *text, const int *tokens, size_t n);

// ---- corpus preparation ------------------------------------------------------------

// Files larger than this are skipped when a folder is walked (generated or data files).
#define DATA_PREPARE_MAX_FILE_BYTES (8u << 20)

// Byte-tokenizes text sources into `out_dir/train.bin` and `out_dir/val.bin` (token
// files, vocab 256).
//
// A source is a file (taken as it is, whatever its name and size) or a folder, walked
// recursively in sorted (strcmp) order, taking regular files with a text name (see
// moe_prepare_is_text_name) of at most DATA_PREPARE_MAX_FILE_BYTES; hidden entries (names starting
// with '.') and folders whose names start with "build" are skipped, and symbolic links to
// folders are not followed (no cycles). Each file taken is appended to the corpus followed
// by one '\n'. The last floor(val_fraction * bytes) bytes become val.bin, the rest
// train.bin. out_dir is created (mkdir -p).
//
// Refusals (MOE_EINVAL unless noted): no sources; a source that does not exist (MOE_EIO);
// no text found; val_fraction not in (0, 0.5]; fewer than 2 tokens in either split (a
// split needs at least one input/target pair). I/O failures are MOE_EIO.
// n_train and n_val (either may be NULL) receive the token counts written.
moe_status data_prepare_text(const char *const *sources, int n_sources, const char *out_dir,
                             double val_fraction, uint64_t *n_train, uint64_t *n_val);

// 1 if a file name looks like text the walker takes: an extension among .c .h .cc .cpp
// .hpp .cu .cuh .py .md .txt .rst .cfg .conf .ini .toml .yaml .yml .json .sh .cmake .in,
// or the names Makefile, README, LICENSE.
int moe_prepare_is_text_name(const char *name);

#endif
