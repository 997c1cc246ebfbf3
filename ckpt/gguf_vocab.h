// A checkpoint's tokenizer as llama.cpp's `gpt2` (byte-level BPE) vocabulary in a GGUF file
// (docs/checkpoints.md "GGUF for llama.cpp"): the byte tokenizer, or a tokenizer.json BPE of
// the kind llama.cpp tokenizes the same way (a byte-level BPE whose pre-tokenizer is one
// llama.cpp knows by name). Anything else is refused naming the tokenizer.json field.
#ifndef MOE_CKPT_GGUF_VOCAB_H
#define MOE_CKPT_GGUF_VOCAB_H

#include <stdint.h>

#include "ckpt/gguf.h"

typedef struct {
    int n_tokens;      // the file's vocabulary: the model's V, plus 1 when extra >= 0
    char **tokens;     // [n_tokens] UTF-8, GPT-2's byte-to-unicode spelling
    int32_t *types;    // [n_tokens] llama.cpp's token types (1 normal, 3 control, 4 user, 5 unused)
    char **merges;     // [n_merges] "a b", by rank
    int n_merges;      //
    const char *pre;   // tokenizer.ggml.pre: "gpt-2", "llama-bpe", "qwen2"
    int bos, eos, pad; // ids, -1: none (pad only; bos and eos are always ids in the file)
    int add_bos, add_eos; // what the tokenizer's post-processor adds to a single sequence
    // The extra token (-1: none): `<|endoftext|>` appended after the model's V tokens when
    // the tokenizer has no BOS or no EOS (llama.cpp would default them to id 11, a real token):
    // control type, zero rows in token_embd and output, in tokenizer.ggml.suppress_tokens.
    int extra;
} moe_gguf_vocab;

// dir's tokenizer (the byte tokenizer when it has no tokenizer.json or the byte tokenizer's)
// for a model of vocab_size tokens. MOE_EINVAL naming dir/tokenizer.json and the field when
// llama.cpp would tokenize it differently (see gguf_vocab.c), MOE_EIO for an unreadable file.
moe_status moe_gguf_vocab_read(moe_gguf_vocab *v, const char *dir, int vocab_size);

// The tokenizer.ggml.* pairs.
moe_status moe_gguf_vocab_write(moe_gguf_writer *w, const moe_gguf_vocab *v);

void moe_gguf_vocab_free(moe_gguf_vocab *v);

#endif
