// A checkpoint's tokenizer as llama.cpp's `gpt2` vocabulary (ckpt/gguf_vocab.h).
//
// llama.cpp does not run tokenizer.json: it reimplements a fixed set of pre-tokenizers, chosen
// by name (tokenizer.ggml.pre), then applies the BPE merges by rank. So a tokenizer.json is
// written only when each of its stages is one llama.cpp reproduces:
//   normalizer    none (or NFC, which llama.cpp skips: the same ids for text already in NFC)
//   pre_tokenizer ByteLevel with GPT-2's regex -> "gpt-2"; Split(llama-3's or Qwen2's regex)
//                 then ByteLevel without regex -> "llama-bpe" / "qwen2"; no prefix space
//   model         BPE, no byte fallback, no subword prefix or suffix, no dropout;
//                 ignore_merges only with "llama-bpe" (where llama.cpp ignores them too)
//   decoder       ByteLevel
//   post_processor none, ByteLevel, TemplateProcessing of [BOS] $A [EOS] (either optional),
//                 or a Sequence of those: tokenizer.ggml.add_bos_token / add_eos_token
// The byte tokenizer is the case of 256 byte tokens and no merges.
#define _GNU_SOURCE // strdup

#include "ckpt/gguf_vocab.h"

#include "data/files.h"     // moe_file_read_json_object
#include "data/prepare.h"   // DATA_BYTE_VOCAB_SIZE
#include "data/tokenizer.h" // moe_tokenizer_has_hf, moe_tokenizer_is_byte_hf, special ids

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TYPE_NORMAL 1
#define TYPE_CONTROL 3
#define TYPE_USER 4
#define TYPE_UNUSED 5

// The regexes of the Split pre-tokenizers llama.cpp has by name (as tokenizer.json spells
// them; llama.cpp's llama-vocab.cpp keeps each as a comment beside its rewrite).
static const struct {
    const char *pre, *regex;
} known_splits[] = {
    {"llama-bpe", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {"qwen2", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
              "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
};

typedef struct {
    const char *path; // dir/tokenizer.json, for messages
    const cJSON *tok; // its root
} hf_file;

static moe_status refuse(const hf_file *f, const char *field, const char *why) {
    return moe_error(MOE_EINVAL, "%s: %s: not written to GGUF: %s", f->path, field, why);
}

static const char *str_of(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int is_type(const cJSON *o, const char *type) {
    const char *t = str_of(o, "type");
    return t && !strcmp(t, type);
}

// A boolean member: 1, 0, or dflt when absent or null.
static int flag_of(const cJSON *o, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

// ByteLevel as a pre-tokenizer without a prefix space (tokenizers' default adds one).
static int byte_level(const cJSON *p, int use_regex) {
    return is_type(p, "ByteLevel") && !flag_of(p, "add_prefix_space", 1) &&
           flag_of(p, "use_regex", 1) == use_regex;
}

// The pre-tokenizer's llama.cpp name, NULL when llama.cpp has none that splits the same.
static const char *pre_name(const cJSON *p) {
    if (byte_level(p, 1)) return "gpt-2";
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
    if (!is_type(p, "Sequence") || cJSON_GetArraySize(seq) != 2) return NULL;
    const cJSON *split = cJSON_GetArrayItem(seq, 0);
    const char *regex = str_of(cJSON_GetObjectItemCaseSensitive(split, "pattern"), "Regex");
    const char *behavior = str_of(split, "behavior");
    if (!is_type(split, "Split") || !regex || !behavior || strcmp(behavior, "Isolated") ||
        flag_of(split, "invert", 0) || !byte_level(cJSON_GetArrayItem(seq, 1), 0))
        return NULL;
    for (size_t i = 0; i < sizeof known_splits / sizeof *known_splits; i++)
        if (!strcmp(regex, known_splits[i].regex)) return known_splits[i].pre;
    return NULL;
}

// The model, normalizer, pre-tokenizer and decoder stages (the file's header comment).
static moe_status check_stages(moe_gguf_vocab *v, const hf_file *f, const cJSON *model) {
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(f->tok, "normalizer"),
                *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    const char *suffix = str_of(model, "end_of_word_suffix"),
               *prefix = str_of(model, "continuing_subword_prefix");
    if (!is_type(model, "BPE")) return refuse(f, "model.type", "a BPE model only");
    if (flag_of(model, "byte_fallback", 0))
        return refuse(f, "model.byte_fallback", "llama.cpp's gpt2 vocabulary has no byte fallback");
    if ((prefix && *prefix) || (suffix && *suffix))
        return refuse(
            f, prefix && *prefix ? "model.continuing_subword_prefix" : "model.end_of_word_suffix",
            "llama.cpp's byte-level BPE has no subword markers");
    if (dropout && !cJSON_IsNull(dropout))
        return refuse(f, "model.dropout", "BPE dropout is random at every encode");
    if (norm && !cJSON_IsNull(norm) && !is_type(norm, "NFC"))
        return refuse(f, "normalizer", "llama.cpp applies no normalizer (NFC is accepted)");
    if (!(v->pre = pre_name(cJSON_GetObjectItemCaseSensitive(f->tok, "pre_tokenizer"))))
        return refuse(f, "pre_tokenizer",
                      "not one llama.cpp has by name (ByteLevel with GPT-2's regex, or a Split "
                      "with llama-3's or Qwen2's regex then ByteLevel; no prefix space)");
    if (flag_of(model, "ignore_merges", 0) != !strcmp(v->pre, "llama-bpe"))
        return refuse(f, "model.ignore_merges",
                      "llama.cpp ignores the merges for llama-3's pre-tokenizer only");
    if (!is_type(cJSON_GetObjectItemCaseSensitive(f->tok, "decoder"), "ByteLevel"))
        return refuse(f, "decoder", "a ByteLevel decoder only");
    return MOE_OK;
}

// Token id -> text: model.vocab, then added_tokens (control when special, else user
// defined); ids the tokenizer leaves out are "[PADn]", unused (llama.cpp's converter's).
static moe_status read_tokens(moe_gguf_vocab *v, const hf_file *f, const cJSON *model, int V) {
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab"), *t;
    if (!cJSON_IsObject(vocab)) return refuse(f, "model.vocab", "not an object");
    cJSON_ArrayForEach(t, vocab) {
        const double id = cJSON_IsNumber(t) ? t->valuedouble : -1;
        if (!(id >= 0 && id < V && id == (int)id))
            return moe_error(MOE_EINVAL,
                             "%s: model.vocab: \"%s\" has id %g, outside the model's vocabulary "
                             "of %d (config.json vocab_size)",
                             f->path, t->string, cJSON_IsNumber(t) ? t->valuedouble : -1.0, V);
        if (v->tokens[(int)id])
            return moe_error(MOE_EINVAL, "%s: model.vocab: id %d twice", f->path, (int)id);
        if (!(v->tokens[(int)id] = strdup(t->string))) return MOE_ENOMEM;
        v->types[(int)id] = TYPE_NORMAL;
    }
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(f->tok, "added_tokens")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(t, "id");
        const char *content = str_of(t, "content");
        if (!cJSON_IsNumber(id) || !content)
            return refuse(f, "added_tokens", "an entry without id or content");
        const int i = id->valueint; // moe_tokenizer_special_ids checked each id is in [0, V)
        if (v->tokens[i] && strcmp(v->tokens[i], content))
            return moe_error(MOE_EINVAL,
                             "%s: added_tokens: id %d is \"%s\" but model.vocab has \"%s\"",
                             f->path, i, content, v->tokens[i]);
        free(v->tokens[i]);
        if (!(v->tokens[i] = strdup(content))) return MOE_ENOMEM;
        v->types[i] = flag_of(t, "special", 0) ? TYPE_CONTROL : TYPE_USER;
    }
    for (int i = 0; i < V; i++)
        if (!v->tokens[i]) {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%d]", i);
            if (!(v->tokens[i] = strdup(pad))) return MOE_ENOMEM;
            v->types[i] = TYPE_UNUSED;
        }
    return MOE_OK;
}

// model.merges: "a b" strings, or [a, b] pairs (tokenizers >= 0.20) joined by a space.
static moe_status read_merges(moe_gguf_vocab *v, const hf_file *f, const cJSON *model) {
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges"), *m;
    if (!cJSON_IsArray(merges)) return refuse(f, "model.merges", "not an array");
    if (!(v->merges = calloc((size_t)cJSON_GetArraySize(merges) + 1, sizeof *v->merges)))
        return MOE_ENOMEM;
    cJSON_ArrayForEach(m, merges) {
        const cJSON *a = cJSON_GetArrayItem(m, 0), *b = cJSON_GetArrayItem(m, 1);
        char *s = NULL;
        if (cJSON_IsString(m))
            s = strdup(m->valuestring);
        else if (cJSON_GetArraySize(m) == 2 && cJSON_IsString(a) && cJSON_IsString(b)) {
            if (asprintf(&s, "%s %s", a->valuestring, b->valuestring) < 0) s = NULL;
        } else
            return refuse(f, "model.merges", "an entry neither \"a b\" nor [a, b]");
        if (!s) return MOE_ENOMEM;
        v->merges[v->n_merges++] = s;
    }
    return MOE_OK;
}

// A TemplateProcessing's single-sequence template: [SpecialToken] Sequence [SpecialToken].
// Each special token's id comes from the processor's special_tokens map (one id each).
static moe_status read_template(moe_gguf_vocab *v, const hf_file *f, const cJSON *p) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single"), *item;
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    int seen_seq = 0, n_before = 0, n_after = 0;
    cJSON_ArrayForEach(item, single) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(item, "SpecialToken");
        if (cJSON_GetObjectItemCaseSensitive(item, "Sequence")) {
            seen_seq++;
            continue;
        }
        const char *name = str_of(sp, "id");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(specials, name ? name : ""), "ids");
        if (!name || cJSON_GetArraySize(ids) != 1 || !cJSON_IsNumber(cJSON_GetArrayItem(ids, 0)))
            return refuse(f, "post_processor.single", "a special token without one id");
        const int id = cJSON_GetArrayItem(ids, 0)->valueint;
        if (id < 0 || id >= v->n_tokens)
            return refuse(f, "post_processor.special_tokens", "an id outside the vocabulary");
        if (seen_seq)
            n_after++, v->add_eos = 1, v->eos = id;
        else
            n_before++, v->add_bos = 1, v->bos = id;
    }
    if (seen_seq != 1 || n_before > 1 || n_after > 1)
        return refuse(f, "post_processor.single",
                      "llama.cpp adds at most one BOS before and one EOS after the text");
    return MOE_OK;
}

static moe_status read_post(moe_gguf_vocab *v, const hf_file *f, const cJSON *p) {
    if (!p || cJSON_IsNull(p) || is_type(p, "ByteLevel")) return MOE_OK;
    if (is_type(p, "TemplateProcessing")) return read_template(v, f, p);
    if (!is_type(p, "Sequence"))
        return refuse(f, "post_processor",
                      "TemplateProcessing, ByteLevel or a Sequence of them only");
    const cJSON *q;
    cJSON_ArrayForEach(q, cJSON_GetObjectItemCaseSensitive(p, "processors")) {
        moe_status st = read_post(v, f, q);
        if (st) return st;
    }
    return MOE_OK;
}

static moe_status alloc_tokens(moe_gguf_vocab *v, int V) {
    v->n_tokens = V;
    v->tokens = calloc((size_t)V + 1, sizeof *v->tokens); // + the extra token
    v->types = calloc((size_t)V + 1, sizeof *v->types);
    return v->tokens && v->types ? MOE_OK : MOE_ENOMEM;
}

// GPT-2's bytes_to_unicode as UTF-8: the printable Latin-1 bytes stand for themselves, the
// other 68 for U+0100.. in byte order (what a byte-level BPE vocabulary spells).
static void byte_token(char out[4], int b) {
#define PRINTABLE(c) (((c) >= '!' && (c) <= '~') || ((c) >= 0xA1 && (c) <= 0xAC) || (c) >= 0xAE)
    unsigned u = (unsigned)b;
    if (!PRINTABLE(b)) {
        u = 256;
        for (int c = 0; c < b; c++) u += !PRINTABLE(c);
    }
#undef PRINTABLE
    if (u < 0x80)
        out[0] = (char)u, out[1] = 0;
    else
        out[0] = (char)(0xC0 | (u >> 6)), out[1] = (char)(0x80 | (u & 0x3F)), out[2] = 0;
}

static moe_status read_bytes(moe_gguf_vocab *v, const char *dir, int V) {
    if (V != DATA_BYTE_VOCAB_SIZE)
        return moe_error(MOE_EINVAL,
                         "%s/config.json: vocab_size = %d without a tokenizer.json: not written "
                         "to GGUF (the byte tokenizer has %d tokens)",
                         dir, V, DATA_BYTE_VOCAB_SIZE);
    moe_status st = alloc_tokens(v, V);
    if (!st) st = (v->merges = calloc(1, sizeof *v->merges)) ? MOE_OK : MOE_ENOMEM;
    for (int b = 0; b < V && !st; b++) {
        char sym[4];
        byte_token(sym, b);
        st = (v->tokens[b] = strdup(sym)) ? MOE_OK : MOE_ENOMEM;
        v->types[b] = TYPE_NORMAL;
    }
    v->pre = "gpt-2";
    return st;
}

static moe_status read_hf(moe_gguf_vocab *v, const char *dir, int V) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cJSON *tok = NULL;
    int pad;
    moe_status st = moe_tokenizer_special_ids(dir, V, &v->bos, &v->eos, &pad);
    if (!st) st = moe_file_read_json_object(path, (size_t)1 << 30, &tok);
    const hf_file f = {path, tok};
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(tok, "model");
    v->pad = pad;
    if (!st) st = check_stages(v, &f, model);
    if (!st) st = alloc_tokens(v, V);
    if (!st) st = read_tokens(v, &f, model, V);
    if (!st) st = read_merges(v, &f, model);
    if (!st) st = read_post(v, &f, cJSON_GetObjectItemCaseSensitive(tok, "post_processor"));
    cJSON_Delete(tok);
    return st == MOE_ENOMEM ? moe_error(st, "%s: out of memory", path) : st;
}

// The extra token for a missing BOS or EOS, named so that it is no other token's text.
static moe_status add_extra(moe_gguf_vocab *v) {
    static const char *const names[] = {"<|endoftext|>", "<|moe.c extra token|>"};
    const char *name = NULL;
    for (size_t k = 0; k < sizeof names / sizeof *names && !name; k++) {
        name = names[k];
        for (int i = 0; i < v->n_tokens && name; i++)
            if (!strcmp(v->tokens[i], names[k])) name = NULL;
    }
    if (!name) return moe_error(MOE_EINVAL, "GGUF export: no free name for the extra token");
    v->extra = v->n_tokens++;
    if (!(v->tokens[v->extra] = strdup(name))) return moe_error(MOE_ENOMEM, "out of memory");
    v->types[v->extra] = TYPE_CONTROL;
    if (v->bos < 0) v->bos = v->extra;
    if (v->eos < 0) v->eos = v->extra;
    return MOE_OK;
}

moe_status moe_gguf_vocab_read(moe_gguf_vocab *v, const char *dir, int vocab_size) {
    memset(v, 0, sizeof *v);
    v->bos = v->eos = v->pad = v->extra = -1;
    const int hf = moe_tokenizer_has_hf(dir) && !moe_tokenizer_is_byte_hf(dir);
    moe_status st = hf ? read_hf(v, dir, vocab_size) : read_bytes(v, dir, vocab_size);
    if (!st && (v->bos < 0 || v->eos < 0)) st = add_extra(v);
    if (st == MOE_ENOMEM) st = moe_error(st, "GGUF export: out of memory");
    if (st) moe_gguf_vocab_free(v);
    return st;
}

moe_status moe_gguf_vocab_write(moe_gguf_writer *w, const moe_gguf_vocab *v) {
    const uint64_t n = (uint64_t)v->n_tokens;
    const int32_t suppress = v->extra;
    moe_status st = moe_gguf_kv_str(w, "tokenizer.ggml.model", "gpt2");
    if (!st) st = moe_gguf_kv_str(w, "tokenizer.ggml.pre", v->pre);
    if (!st)
        st = moe_gguf_kv_str_array(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, n);
    if (!st) st = moe_gguf_kv_array(w, "tokenizer.ggml.token_type", MOE_GGUF_INT32, v->types, n);
    if (!st)
        st = moe_gguf_kv_str_array(w, "tokenizer.ggml.merges", (const char *const *)v->merges,
                                   (uint64_t)v->n_merges);
    if (!st) st = moe_gguf_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
    if (!st) st = moe_gguf_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos);
    if (!st && v->pad >= 0)
        st = moe_gguf_kv_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad);
    if (!st) st = moe_gguf_kv_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos);
    if (!st) st = moe_gguf_kv_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos);
    if (!st && v->extra >= 0)
        st = moe_gguf_kv_array(w, "tokenizer.ggml.suppress_tokens", MOE_GGUF_INT32, &suppress, 1);
    return st;
}

void moe_gguf_vocab_free(moe_gguf_vocab *v) {
    for (int i = 0; v->tokens && i < v->n_tokens; i++) free(v->tokens[i]);
    for (int i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens), free(v->types), free(v->merges);
    v->tokens = NULL, v->merges = NULL, v->types = NULL, v->n_tokens = v->n_merges = 0;
}
