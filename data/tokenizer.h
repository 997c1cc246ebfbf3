// Tokenizers beyond the byte tokenizer: Hugging Face tokenizer folders (tokenizer.json and
// its companions), run through scripts/hf_tokenizer.py (the `tokenizers` library does the BPE;
// we never re-implement it), and the HF files that make our byte tokenizer loadable by
// transformers' AutoTokenizer.
//
// A tokenizer folder is any folder with a tokenizer.json: an HF model folder, a checkpoint or
// export of ours, a data folder `moe prepare --tokenizer` wrote. The byte tokenizer's own
// tokenizer.json (moe_tokenizer_write_byte_hf) is recognised by its exact text, so a folder holding
// it counts as "byte tokenizer" everywhere (no script needed).
#ifndef MOE_DATA_TOKENIZER_H
#define MOE_DATA_TOKENIZER_H

#include <stddef.h>

#include "layers/status.h"

// ---- running scripts/hf_tokenizer.py ---------------------------------------------------

// The script: $MOE_TOKENIZER_SCRIPT, else <dir of the moe executable>/../share/moe/
// hf_tokenizer.py (an installed tree), else the source tree's scripts/hf_tokenizer.py (the
// build's MOE_SOURCE_DIR). MOE_EIO naming the places looked at when none exists.
moe_status moe_hf_tokenizer_script(char *path, size_t n);

// Runs `PYTHON SCRIPT args...` (PYTHON: $MOE_PYTHON, else python3 from PATH) with fork/exec,
// no shell. `in` (n_in bytes; NULL for none) is written to its stdin. Its stdout is collected
// into *out (malloc'ed, NUL-terminated, *n_out bytes without the NUL) when out is not NULL,
// else it goes to ours. Its stderr is collected and, on success, copied to ours; a failure
// (exit status, signal, python not found) is MOE_EIO naming the command and the last line of
// its stderr (exit status 2: the tokenizers package is missing).
moe_status moe_hf_tokenizer_run(const char *const *args, int n_args, const char *in, size_t n_in,
                                char **out, size_t *n_out);

// text (n bytes of UTF-8) -> *ids (malloc'ed, *n_ids), with the tokenizer's special tokens
// (e.g. a leading BOS) as transformers' tokenizer(text) adds them.
moe_status moe_hf_tokenizer_encode(const char *tok_dir, const char *text, size_t n, int **ids,
                                   int *n_ids);

// ids -> *text (malloc'ed, NUL-terminated, *len bytes), special tokens skipped (as the
// text-generation pipeline decodes).
moe_status moe_hf_tokenizer_decode(const char *tok_dir, const int *ids, int n_ids, char **text,
                                   size_t *len);

// `hf_tokenizer.py prepare`: the text sources -> out_dir/train.bin, val.bin (and a copy of the
// tokenizer's files), split like data_prepare_text. Its summary line goes to stdout.
moe_status moe_hf_tokenizer_prepare(const char *tok_dir, const char *const *sources, int n_sources,
                                    const char *out_dir, double val_fraction);

// ---- tokenizer files ---------------------------------------------------------------------

// 1 when dir/tokenizer.json exists.
int moe_tokenizer_has_hf(const char *dir);

// 1 when dir/tokenizer.json is the byte tokenizer's (the exact text moe_tokenizer_write_byte_hf
// writes); 0 when it is another tokenizer's or absent.
int moe_tokenizer_is_byte_hf(const char *dir);

// Writes dir/tokenizer.json (BPE over the 256 GPT-2 byte-to-unicode symbols, id = byte value,
// no merges, ByteLevel pre-tokenizer without regex or prefix space, ByteLevel decoder, no
// special tokens) and dir/tokenizer_config.json, so that AutoTokenizer.from_pretrained(dir)
// encodes text to its UTF-8 bytes and decodes them back. Each file fsynced.
moe_status moe_tokenizer_write_byte_hf(const char *dir);

// The byte tokenizer's tokenizer.json text (static storage; what moe_tokenizer_write_byte_hf
// writes), NULL when out of memory.
const char *moe_tokenizer_byte_json(void);

// Copies the tokenizer files of src_dir (tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, added_tokens.json, chat_template.jinja, chat_template.json:
// whichever exist) into dst_dir, each fsynced. *copied (may be NULL) = how many.
moe_status moe_tokenizer_copy_hf(const char *src_dir, const char *dst_dir, int *copied);

// Names of the files moe_tokenizer_copy_hf copies, NULL-terminated.
extern const char *const moe_tokenizer_hf_files[];

// *same = whether a/tokenizer.json and b/tokenizer.json have the same bytes (0 when either
// is missing).
moe_status moe_tokenizer_same_hf(const char *a, const char *b, int *same);

// The BOS, EOS and PAD ids of dir's tokenizer (-1 each when it defines none): the tokens
// tokenizer_config.json (or special_tokens_map.json) names, looked up in tokenizer.json's
// added_tokens, then its model vocabulary. A folder without tokenizer.json gives -1s. Every
// added token's id and each special token's id must be an integer in [0, vocab_size) (the
// model's vocabulary; vocab_size <= 0: unknown, [0, INT_MAX]): else MOE_EIO naming the file,
// the token and the id. A key twice in any of the files is MOE_EIO too (data/json_check.h).
moe_status moe_tokenizer_special_ids(const char *dir, int vocab_size, int *bos, int *eos, int *pad);

// generation_config.json for an export into out_dir: a copy of src_dir's when it has one
// (an HF model folder), else {bos/eos/pad_token_id (those the tokenizer in tok_dir defines),
// "transformers_version"}. tok_dir may be NULL (no token ids); vocab_size bounds them as in
// moe_tokenizer_special_ids.
moe_status moe_tokenizer_write_generation_config(const char *src_dir, const char *tok_dir,
                                                 int vocab_size, const char *out_dir);

// The tokenizer of a training run: data.tokenizer when set (it must hold a tokenizer.json),
// else train.init_from's folder (a folder, or a `latest` file naming one) when that holds a
// tokenizer.json other than the byte tokenizer's, else "" (the byte tokenizer). *from_init
// (may be NULL) = 1 in the second case.
moe_status moe_tokenizer_for_run(char *dir, size_t n, const char *data_tokenizer,
                                 const char *init_from, int *from_init);

// The token files beside token_file (its folder) were made by the run's tokenizer tok (""
// = the byte tokenizer). MOE_EINVAL when that folder holds another tokenizer's
// tokenizer.json (`moe prepare --tokenizer` copies the tokenizer's files beside the token
// files), or when tok is set and the files look byte-tokenized (vocab_size 256 and no
// tokenizer.json): such a run would train on ids that mean something else.
moe_status moe_tokenizer_check_data(const char *token_file, const char *tok, unsigned vocab_size);

#endif
