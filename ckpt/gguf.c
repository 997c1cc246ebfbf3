// GGUF v3: the writer (ckpt/gguf.h) and moe_export_gguf, a Mixtral checkpoint as a file of
// llama.cpp's `llama` architecture with the byte tokenizer.
#define _GNU_SOURCE // fileno, access

#include "ckpt/gguf.h"

#include "ckpt/ckpt_internal.h"
#include "ckpt/path_internal.h"
#include "data/prepare.h"   // DATA_BYTE_VOCAB_SIZE
#include "data/tokenizer.h" // moe_tokenizer_has_hf, moe_tokenizer_is_byte_hf

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF writer writes the host's floats as they are: little-endian hosts only"
#endif

// ---- types ---------------------------------------------------------------------------------

moe_status moe_ggml_type_parse(const char *name, moe_ggml_type *type) {
    static const struct {
        const char *name;
        moe_ggml_type type;
    } types[] = {{"f32", MOE_GGML_F32},
                 {"f16", MOE_GGML_F16},
                 {"bf16", MOE_GGML_BF16},
                 {"q8_0", MOE_GGML_Q8_0}};
    for (size_t i = 0; name && i < sizeof types / sizeof *types; i++)
        if (!strcmp(name, types[i].name)) {
            *type = types[i].type;
            return MOE_OK;
        }
    return moe_error(MOE_EINVAL, "GGUF type '%s': expected f32, f16, bf16 or q8_0",
                     name ? name : "(none)");
}

const char *moe_ggml_type_name(moe_ggml_type type) {
    switch (type) {
    case MOE_GGML_F32: return "f32";
    case MOE_GGML_F16: return "f16";
    case MOE_GGML_BF16: return "bf16";
    case MOE_GGML_Q8_0: return "q8_0";
    }
    return "?";
}

uint64_t moe_ggml_nbytes(moe_ggml_type type, uint64_t n) {
    switch (type) {
    case MOE_GGML_F32: return 4 * n;
    case MOE_GGML_F16:
    case MOE_GGML_BF16: return 2 * n;
    case MOE_GGML_Q8_0: return n / MOE_GGML_QK8_0 * (2 + MOE_GGML_QK8_0);
    }
    return 0;
}

void moe_ggml_quantize_q8_0(uint8_t *out, const float *x, uint64_t n) {
    for (uint64_t b = 0; b < n / MOE_GGML_QK8_0; b++, x += MOE_GGML_QK8_0) {
        float amax = 0;
        for (int i = 0; i < MOE_GGML_QK8_0; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float want = amax / 127.0f;
        uint16_t h = moe_f32_to_f16(want);
        if (moe_f16_to_f32(h) < want) h++; // up to the next fp16 (h is positive and finite)
        const float d = moe_f16_to_f32(h);
        uint8_t *blk = out + b * (2 + MOE_GGML_QK8_0);
        blk[0] = (uint8_t)h, blk[1] = (uint8_t)(h >> 8);
        for (int i = 0; i < MOE_GGML_QK8_0; i++) {
            float q = d > 0 ? roundf(x[i] / d) : 0.0f; // |x / d| <= 127
            q = fminf(127.0f, fmaxf(-127.0f, q));
            blk[2 + i] = (uint8_t)(int8_t)q;
        }
    }
}

// ---- the writer ----------------------------------------------------------------------------

typedef struct {
    char *name;
    int n_dims;
    int64_t ne[MOE_GGUF_MAX_DIMS];
    moe_ggml_type type;
    uint64_t n, offset, nbytes; // values; bytes from the data section's start; bytes unpadded
} gguf_tensor;

struct moe_gguf_writer {
    char path[PATH_BUF], tmp[PATH_BUF + 8];
    uint8_t *kv; // the pairs, serialised as they come
    size_t kv_len, kv_cap;
    char **keys;
    uint64_t n_kv;
    gguf_tensor *t;
    int n_t, cap_t, n_written;
    uint64_t data_size; // the data section so far (padded)
    FILE *f;
    int started, finished;
    uint8_t *scratch; // one chunk of converted values
};

#define CHUNK 32768 // values converted at a time (a multiple of the Q8_0 block)

static uint64_t align_up(uint64_t x) {
    return (x + MOE_GGUF_ALIGNMENT - 1) / MOE_GGUF_ALIGNMENT * MOE_GGUF_ALIGNMENT;
}

moe_status moe_gguf_writer_create(moe_gguf_writer **out, const char *path) {
    *out = NULL;
    if (check_path_arg(path)) return MOE_EINVAL;
    moe_gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->scratch = malloc((size_t)CHUNK * 4);
    if (!w || !w->scratch) {
        if (w) free(w);
        return moe_error(MOE_ENOMEM, "%s: out of memory", path);
    }
    path_fmt(w->path, sizeof w->path, "%s", path);
    path_fmt(w->tmp, sizeof w->tmp, "%s.tmp", path);
    *out = w;
    return MOE_OK;
}

void moe_gguf_writer_free(moe_gguf_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    if (w->started && !w->finished) unlink(w->tmp);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    for (int i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->keys), free(w->t), free(w->kv), free(w->scratch), free(w);
}

static moe_status kv_put(moe_gguf_writer *w, const void *p, size_t n) {
    if (w->kv_len + n > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap : 4096;
        while (cap < w->kv_len + n) cap *= 2;
        uint8_t *kv = realloc(w->kv, cap);
        if (!kv) return moe_error(MOE_ENOMEM, "%s: out of memory", w->path);
        w->kv = kv, w->kv_cap = cap;
    }
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return MOE_OK;
}

static moe_status kv_u32(moe_gguf_writer *w, uint32_t v) { return kv_put(w, &v, 4); }
static moe_status kv_u64(moe_gguf_writer *w, uint64_t v) { return kv_put(w, &v, 8); }
static moe_status kv_string(moe_gguf_writer *w, const char *s) {
    const size_t n = strlen(s);
    moe_status st = kv_u64(w, n);
    return st ? st : kv_put(w, s, n);
}

// Bytes of a scalar value type; 0 for STRING, ARRAY and what is not a type.
static size_t scalar_size(moe_gguf_value_type t) {
    switch (t) {
    case MOE_GGUF_UINT8:
    case MOE_GGUF_INT8:
    case MOE_GGUF_BOOL: return 1;
    case MOE_GGUF_UINT16:
    case MOE_GGUF_INT16: return 2;
    case MOE_GGUF_UINT32:
    case MOE_GGUF_INT32:
    case MOE_GGUF_FLOAT32: return 4;
    case MOE_GGUF_UINT64:
    case MOE_GGUF_INT64:
    case MOE_GGUF_FLOAT64: return 8;
    case MOE_GGUF_STRING:
    case MOE_GGUF_ARRAY: return 0;
    }
    return 0;
}

// A new key (unique, non-empty, before the data): its name and value type.
static moe_status kv_begin(moe_gguf_writer *w, const char *key, moe_gguf_value_type type) {
    if (w->started)
        return moe_error(MOE_EINVAL, "%s: key '%s' after the tensor data began", w->path, key);
    if (!key[0] || strlen(key) > 65535)
        return moe_error(MOE_EINVAL, "%s: a key must have 1 to 65535 bytes", w->path);
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key))
            return moe_error(MOE_EINVAL, "%s: key '%s' written twice", w->path, key);
    char **keys = realloc(w->keys, (w->n_kv + 1) * sizeof *keys);
    if (keys) w->keys = keys;
    char *copy = keys ? strdup(key) : NULL;
    if (!copy) return moe_error(MOE_ENOMEM, "%s: out of memory", w->path);
    w->keys[w->n_kv++] = copy;
    moe_status st = kv_string(w, key);
    return st ? st : kv_u32(w, (uint32_t)type);
}

moe_status moe_gguf_kv(moe_gguf_writer *w, const char *key, moe_gguf_value_type type,
                       const void *value) {
    const size_t size = scalar_size(type);
    if (!size)
        return moe_error(MOE_EINVAL, "%s: key '%s': type %d is not a scalar type", w->path, key,
                         (int)type);
    moe_status st = kv_begin(w, key, type);
    return st ? st : kv_put(w, value, size);
}

moe_status moe_gguf_kv_u32(moe_gguf_writer *w, const char *key, uint32_t v) {
    return moe_gguf_kv(w, key, MOE_GGUF_UINT32, &v);
}
moe_status moe_gguf_kv_f32(moe_gguf_writer *w, const char *key, float v) {
    return moe_gguf_kv(w, key, MOE_GGUF_FLOAT32, &v);
}
moe_status moe_gguf_kv_bool(moe_gguf_writer *w, const char *key, int v) {
    const uint8_t b = v != 0;
    return moe_gguf_kv(w, key, MOE_GGUF_BOOL, &b);
}
moe_status moe_gguf_kv_str(moe_gguf_writer *w, const char *key, const char *v) {
    moe_status st = kv_begin(w, key, MOE_GGUF_STRING);
    return st ? st : kv_string(w, v);
}

moe_status moe_gguf_kv_array(moe_gguf_writer *w, const char *key, moe_gguf_value_type elem_type,
                             const void *elems, uint64_t n) {
    const size_t size = scalar_size(elem_type);
    if (!size)
        return moe_error(MOE_EINVAL, "%s: key '%s': element type %d is not a scalar type", w->path,
                         key, (int)elem_type);
    moe_status st = kv_begin(w, key, MOE_GGUF_ARRAY);
    if (!st) st = kv_u32(w, (uint32_t)elem_type);
    if (!st) st = kv_u64(w, n);
    return st || !n ? st : kv_put(w, elems, (size_t)n * size);
}

moe_status moe_gguf_kv_str_array(moe_gguf_writer *w, const char *key, const char *const *v,
                                 uint64_t n) {
    moe_status st = kv_begin(w, key, MOE_GGUF_ARRAY);
    if (!st) st = kv_u32(w, MOE_GGUF_STRING);
    if (!st) st = kv_u64(w, n);
    for (uint64_t i = 0; i < n && !st; i++) st = kv_string(w, v[i]);
    return st;
}

moe_status moe_gguf_add_tensor(moe_gguf_writer *w, const char *name, int n_dims, const int64_t *ne,
                               moe_ggml_type type) {
    if (w->started)
        return moe_error(MOE_EINVAL, "%s: tensor '%s' after the tensor data began", w->path, name);
    if (!name[0] || strlen(name) > 63) // llama.cpp's names are at most 63 bytes (GGML_MAX_NAME)
        return moe_error(MOE_EINVAL, "%s: tensor name '%s' must have 1 to 63 bytes", w->path, name);
    if (n_dims < 1 || n_dims > MOE_GGUF_MAX_DIMS)
        return moe_error(MOE_EINVAL, "%s: tensor '%s': %d dimensions (1 to %d)", w->path, name,
                         n_dims, MOE_GGUF_MAX_DIMS);
    if (!moe_ggml_nbytes(type, MOE_GGML_QK8_0))
        return moe_error(MOE_EINVAL, "%s: tensor '%s': ggml type %d is not written", w->path, name,
                         (int)type);
    uint64_t n = 1;
    for (int i = 0; i < n_dims; i++) {
        if (ne[i] < 1 || (uint64_t)ne[i] > (UINT64_C(1) << 60) / n)
            return moe_error(MOE_EINVAL, "%s: tensor '%s': ne[%d] = %" PRId64 " is out of range",
                             w->path, name, i, ne[i]);
        n *= (uint64_t)ne[i];
    }
    if (type == MOE_GGML_Q8_0 && ne[0] % MOE_GGML_QK8_0)
        return moe_error(MOE_EINVAL,
                         "%s: tensor '%s': q8_0 needs ne[0] = %" PRId64 " to be a multiple of %d",
                         w->path, name, ne[0], MOE_GGML_QK8_0);
    for (int i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return moe_error(MOE_EINVAL, "%s: tensor '%s' added twice", w->path, name);
    if (w->n_t == w->cap_t) {
        int cap = w->cap_t ? 2 * w->cap_t : 256;
        gguf_tensor *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) return moe_error(MOE_ENOMEM, "%s: out of memory", w->path);
        w->t = t, w->cap_t = cap;
    }
    gguf_tensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return moe_error(MOE_ENOMEM, "%s: out of memory", w->path);
    t->n_dims = n_dims;
    memcpy(t->ne, ne, (size_t)n_dims * sizeof *ne);
    t->type = type, t->n = n;
    t->nbytes = moe_ggml_nbytes(type, n);
    t->offset = w->data_size;
    w->data_size += align_up(t->nbytes);
    w->n_t++;
    return MOE_OK;
}

// n bytes to the file; a short write (a full disk, a file size limit) names the reason.
static moe_status put(moe_gguf_writer *w, const void *p, size_t n) {
    errno = 0;
    if (n && fwrite(p, 1, n, w->f) != n)
        return moe_error(MOE_EIO, "%s: write failed: %s", w->tmp,
                         errno ? strerror(errno) : "short write");
    return MOE_OK;
}

static moe_status put_zeros(moe_gguf_writer *w, size_t n) {
    static const uint8_t zeros[MOE_GGUF_ALIGNMENT];
    return put(w, zeros, n); // n < the alignment
}

// The header, the pairs and the tensor infos, then the padding to the data section.
static moe_status begin(moe_gguf_writer *w) {
    w->started = 1;
    if (!(w->f = fopen(w->tmp, "wb")))
        return moe_error(MOE_EIO, "%s: cannot create: %s", w->tmp, strerror(errno));
    const uint32_t version = MOE_GGUF_VERSION;
    const uint64_t n_t = (uint64_t)w->n_t;
    moe_status st = put(w, "GGUF", 4);
    if (!st) st = put(w, &version, 4);
    if (!st) st = put(w, &n_t, 8);
    if (!st) st = put(w, &w->n_kv, 8);
    if (!st) st = put(w, w->kv, w->kv_len);
    uint64_t pos = 24 + w->kv_len;
    for (int i = 0; i < w->n_t && !st; i++) {
        const gguf_tensor *t = &w->t[i];
        const uint64_t len = strlen(t->name);
        const uint32_t n_dims = (uint32_t)t->n_dims, type = (uint32_t)t->type;
        st = put(w, &len, 8);
        if (!st) st = put(w, t->name, len);
        if (!st) st = put(w, &n_dims, 4);
        for (int d = 0; d < t->n_dims && !st; d++) st = put(w, &t->ne[d], 8);
        if (!st) st = put(w, &type, 4);
        if (!st) st = put(w, &t->offset, 8);
        pos += 8 + len + 4 + 8 * (uint64_t)t->n_dims + 4 + 8;
    }
    if (!st) st = put_zeros(w, (size_t)(align_up(pos) - pos));
    return st;
}

moe_status moe_gguf_write_tensor(moe_gguf_writer *w, const float *data) {
    moe_status st = w->started ? MOE_OK : begin(w);
    if (st) return st;
    if (w->n_written >= w->n_t)
        return moe_error(MOE_EINVAL, "%s: more tensor data than the %d tensors", w->path, w->n_t);
    const gguf_tensor *t = &w->t[w->n_written];
    for (uint64_t i = 0; i < t->n && !st; i += CHUNK) {
        const uint64_t n = t->n - i < CHUNK ? t->n - i : CHUNK;
        const float *x = data + i;
        uint8_t *out = w->scratch;
        switch (t->type) {
        case MOE_GGML_F32: memcpy(out, x, (size_t)n * 4); break;
        case MOE_GGML_F16:
        case MOE_GGML_BF16:
            for (uint64_t j = 0; j < n; j++) {
                const uint16_t h =
                    t->type == MOE_GGML_F16 ? moe_f32_to_f16(x[j]) : moe_f32_to_bf16(x[j]);
                memcpy(out + 2 * j, &h, 2);
            }
            break;
        case MOE_GGML_Q8_0: moe_ggml_quantize_q8_0(out, x, n); break;
        }
        st = put(w, out, (size_t)moe_ggml_nbytes(t->type, n));
    }
    if (!st) st = put_zeros(w, (size_t)(align_up(t->nbytes) - t->nbytes));
    if (!st) w->n_written++;
    return st;
}

moe_status moe_gguf_finish(moe_gguf_writer *w) {
    moe_status st = w->started ? MOE_OK : begin(w);
    if (st) return st;
    if (w->n_written != w->n_t)
        return moe_error(MOE_EINVAL, "%s: %d of the %d tensors written", w->path, w->n_written,
                         w->n_t);
    errno = 0;
    if (fflush(w->f) != 0 || ferror(w->f))
        return moe_error(MOE_EIO, "%s: write failed: %s", w->tmp,
                         errno ? strerror(errno) : "stream error");
    if (fsync(fileno(w->f)) != 0)
        return moe_error(MOE_EIO, "%s: fsync failed: %s", w->tmp, strerror(errno));
    const int rc = fclose(w->f);
    w->f = NULL;
    if (rc != 0) return moe_error(MOE_EIO, "%s: close failed: %s", w->tmp, strerror(errno));
    if (rename(w->tmp, w->path) != 0)
        return moe_error(MOE_EIO, "%s: cannot rename to %s: %s", w->tmp, w->path, strerror(errno));
    w->finished = 1;
    char dir[PATH_BUF];
    path_fmt(dir, sizeof dir, "%s", w->path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        path_fmt(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    return ckpt_fsync_path(dir);
}

// ---- the export ----------------------------------------------------------------------------

// What llama.cpp's `llama` architecture computes (src/models/llama.cpp): RMSNorm, q/k/v/o
// without biases, RoPE on the whole head (GGML's pairs of consecutive values), softmax
// attention scaled by 1/sqrt(head_dim), and per MoE layer a softmax router over every expert,
// the top k renormalised (norm_w), SwiGLU experts; no shared expert, no selection bias, no
// scaling of the weights (it does not read expert_weights_scale), no groups. A model it
// cannot compute is refused naming the config.json field.
static moe_status check_llama(const moe_model_config *c, const char *folder) {
    const char *why = NULL, *field = NULL;
    char value[64] = "";
    if (c->family != MOE_FAMILY_MIXTRAL) {
        field = "model_type";
        snprintf(value, sizeof value, "\"%s\"", moe_model_family_name(c->family));
        why = "only mixtral is written to GGUF for now (llama.cpp's qwen3moe, qwen2moe and "
              "olmoe architectures are not written yet)";
    } else if (c->shared_d_ff) {
        field = "shared_expert_intermediate_size";
        snprintf(value, sizeof value, "%d", c->shared_d_ff);
        why = "llama.cpp's llama architecture has no shared expert";
    } else if (c->qkv_bias) {
        field = "attention_bias", snprintf(value, sizeof value, "true");
        why = "llama.cpp's llama architecture reads no q/k/v biases";
    } else if (c->qk_norm) {
        field = "q_norm/k_norm", snprintf(value, sizeof value, "present");
        why = "llama.cpp's llama architecture has no q/k norm";
    } else if (moe_model_n_moe_layers(c) < c->n_layers) {
        field = "mlp_only_layers", snprintf(value, sizeof value, "non-empty");
        why = "this export writes MoE layers only";
    } else if (!c->moe.norm_topk_prob) {
        field = "norm_topk_prob", snprintf(value, sizeof value, "false");
        why = "llama.cpp's llama architecture always renormalises the top-k weights";
    } else if (c->moe.scoring != MOE_SCORE_SOFTMAX) {
        field = "scoring_func", snprintf(value, sizeof value, "\"sigmoid\"");
        why = "llama.cpp's llama architecture gates with a softmax";
    } else if (c->moe.route_scale != 1.0) {
        field = "routed_scaling_factor", snprintf(value, sizeof value, "%g", c->moe.route_scale);
        why = "llama.cpp's llama architecture does not scale the expert weights";
    } else if (c->router_bias) {
        field = "router_bias", snprintf(value, sizeof value, "true");
        why = "llama.cpp's llama architecture has no selection bias";
    } else if (c->moe.n_group > 1) {
        field = "n_group", snprintf(value, sizeof value, "%d", c->moe.n_group);
        why = "llama.cpp's llama architecture has no group-limited routing";
    }
    if (why)
        return moe_error(MOE_EINVAL, "%s/config.json: %s = %s: not written to GGUF: %s", folder,
                         field, value, why);
    return MOE_OK;
}

// The byte tokenizer only: vocabulary 256 and no tokenizer.json but the byte tokenizer's.
static moe_status check_tokenizer(const moe_model_config *c, const char *folder) {
    if (moe_tokenizer_has_hf(folder) && !moe_tokenizer_is_byte_hf(folder))
        return moe_error(MOE_EINVAL,
                         "%s/tokenizer.json: a Hugging Face tokenizer other than the byte "
                         "tokenizer: not written to GGUF yet (the byte tokenizer only)",
                         folder);
    if (c->vocab_size != DATA_BYTE_VOCAB_SIZE)
        return moe_error(MOE_EINVAL,
                         "%s/config.json: vocab_size = %d without a tokenizer.json: not written "
                         "to GGUF (the byte tokenizer has %d tokens)",
                         folder, c->vocab_size, DATA_BYTE_VOCAB_SIZE);
    return MOE_OK;
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

// The extra token: BOS and EOS of the GGUF file (moe.c's byte tokenizer has none, and every
// id below 256 is a byte); its rows of token_embd and output are zero, and it is in
// tokenizer.ggml.suppress_tokens (llama.cpp's samplers give it -inf).
#define EXTRA_TOKEN "<|endoftext|>"
#define TOKEN_TYPE_NORMAL 1
#define TOKEN_TYPE_CONTROL 3

static moe_status write_tokenizer(moe_gguf_writer *w) {
    const int V = DATA_BYTE_VOCAB_SIZE + 1;
    char sym[DATA_BYTE_VOCAB_SIZE][4];
    const char *tokens[DATA_BYTE_VOCAB_SIZE + 1];
    int32_t types[DATA_BYTE_VOCAB_SIZE + 1];
    for (int b = 0; b < DATA_BYTE_VOCAB_SIZE; b++) {
        byte_token(sym[b], b);
        tokens[b] = sym[b], types[b] = TOKEN_TYPE_NORMAL;
    }
    tokens[V - 1] = EXTRA_TOKEN, types[V - 1] = TOKEN_TYPE_CONTROL;
    const int32_t suppress = V - 1;
    moe_status st = moe_gguf_kv_str(w, "tokenizer.ggml.model", "gpt2");
    if (!st) st = moe_gguf_kv_str(w, "tokenizer.ggml.pre", "gpt-2");
    if (!st) st = moe_gguf_kv_str_array(w, "tokenizer.ggml.tokens", tokens, (uint64_t)V);
    if (!st)
        st = moe_gguf_kv_array(w, "tokenizer.ggml.token_type", MOE_GGUF_INT32, types, (uint64_t)V);
    if (!st) st = moe_gguf_kv_str_array(w, "tokenizer.ggml.merges", NULL, 0);
    if (!st) st = moe_gguf_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)(V - 1));
    if (!st) st = moe_gguf_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)(V - 1));
    if (!st) st = moe_gguf_kv_bool(w, "tokenizer.ggml.add_bos_token", 0);
    if (!st) st = moe_gguf_kv_bool(w, "tokenizer.ggml.add_eos_token", 0);
    if (!st)
        st = moe_gguf_kv_array(w, "tokenizer.ggml.suppress_tokens", MOE_GGUF_INT32, &suppress, 1);
    return st;
}

// general.file_type: llama.cpp's LLAMA_FTYPE of the whole file.
static uint32_t file_type(moe_ggml_type t) {
    switch (t) {
    case MOE_GGML_F32: return 0;   // ALL_F32
    case MOE_GGML_F16: return 1;   // MOSTLY_F16
    case MOE_GGML_Q8_0: return 7;  // MOSTLY_Q8_0
    case MOE_GGML_BF16: return 32; // MOSTLY_BF16
    }
    return 0;
}

static moe_status write_keys(moe_gguf_writer *w, const moe_model_config *c, const char *name,
                             moe_ggml_type type) {
    const int hd = moe_model_head_dim(c);
    const uint32_t alignment = MOE_GGUF_ALIGNMENT, quant_version = 2;
    moe_status st = moe_gguf_kv_str(w, "general.architecture", "llama");
    if (!st) st = moe_gguf_kv_str(w, "general.name", name);
    if (!st) st = moe_gguf_kv_u32(w, "general.file_type", file_type(type));
    if (!st) st = moe_gguf_kv_u32(w, "general.quantization_version", quant_version);
    if (!st) st = moe_gguf_kv_u32(w, "general.alignment", alignment);
    if (!st) st = moe_gguf_kv_u32(w, "llama.vocab_size", (uint32_t)c->vocab_size + 1);
    if (!st) st = moe_gguf_kv_u32(w, "llama.context_length", (uint32_t)c->max_seq_len);
    if (!st) st = moe_gguf_kv_u32(w, "llama.embedding_length", (uint32_t)c->d_model);
    if (!st) st = moe_gguf_kv_u32(w, "llama.block_count", (uint32_t)c->n_layers);
    if (!st) st = moe_gguf_kv_u32(w, "llama.feed_forward_length", (uint32_t)c->moe.d_ff);
    if (!st) st = moe_gguf_kv_u32(w, "llama.attention.head_count", (uint32_t)c->n_heads);
    if (!st) st = moe_gguf_kv_u32(w, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    if (!st && hd * c->n_heads != c->d_model) {
        st = moe_gguf_kv_u32(w, "llama.attention.key_length", (uint32_t)hd);
        if (!st) st = moe_gguf_kv_u32(w, "llama.attention.value_length", (uint32_t)hd);
    }
    if (!st) st = moe_gguf_kv_u32(w, "llama.rope.dimension_count", (uint32_t)hd);
    if (!st) st = moe_gguf_kv_f32(w, "llama.rope.freq_base", (float)c->rope_theta);
    if (!st)
        st = moe_gguf_kv_f32(w, "llama.attention.layer_norm_rms_epsilon", (float)c->rms_norm_eps);
    if (!st) st = moe_gguf_kv_u32(w, "llama.expert_count", (uint32_t)c->moe.n_experts);
    if (!st) st = moe_gguf_kv_u32(w, "llama.expert_used_count", (uint32_t)c->moe.top_k);
    return st ? st : write_tokenizer(w);
}

// One GGUF tensor and where its values come from in the checkpoint's host image.
typedef enum {
    SRC_COPY,    // one HF tensor as it is, then extra_rows zero rows
    SRC_ROPE,    // q_proj/k_proj with each head's rows permuted to GGML's RoPE pairs
    SRC_EXPERTS, // the experts' HF tensors of a layer (expert_fmt) stacked
} src_kind;

typedef struct {
    char name[64];
    src_kind kind;
    const moe_model_tensor *src; // SRC_COPY, SRC_ROPE
    int heads, extra_rows;       // SRC_ROPE: heads of src; SRC_COPY: zero rows after src
    int layer;                   // SRC_EXPERTS
    const char *expert_fmt;      // SRC_EXPERTS: "...experts.%d.w1.weight" after the layer
    int n_dims;
    int64_t ne[3];
    moe_ggml_type type;
} gguf_item;

typedef struct {
    const moe_model_tensor *tab;
    int n_tab;
    const real *host;
    const moe_model_config *cfg;
    moe_ggml_type type;
    gguf_item *items;
    int n_items;
} export_plan;

static const moe_model_tensor *find(const export_plan *p, const char *name) {
    for (int i = 0; i < p->n_tab; i++)
        if (!strcmp(p->tab[i].name, name)) return &p->tab[i];
    return NULL;
}

// The item's type: norms (1-D) and the router stay f32 (llama.cpp's converter keeps them so);
// a q8_0 tensor whose rows are not whole blocks is f16 (the converter's fallback).
static moe_ggml_type item_type(const export_plan *p, const gguf_item *it, int is_router) {
    if (it->n_dims == 1 || is_router) return MOE_GGML_F32;
    if (p->type == MOE_GGML_Q8_0 && it->ne[0] % MOE_GGML_QK8_0) return MOE_GGML_F16;
    return p->type;
}

static moe_status add_item(export_plan *p, const char *name, src_kind kind, const char *hf_name,
                           int heads, int extra_rows, int layer, const char *expert_fmt,
                           int is_router) {
    gguf_item *it = &p->items[p->n_items];
    memset(it, 0, sizeof *it);
    snprintf(it->name, sizeof it->name, "%s", name);
    it->kind = kind, it->heads = heads, it->extra_rows = extra_rows, it->layer = layer;
    it->expert_fmt = expert_fmt;
    if (kind == SRC_EXPERTS) {
        char first[128];
        int u = snprintf(first, sizeof first, "model.layers.%d.", layer);
        snprintf(first + u, sizeof first - (size_t)u, expert_fmt, 0);
        const moe_model_tensor *e0 = find(p, first);
        if (!e0) return moe_error(MOE_EIO, "GGUF export: no tensor '%s'", first);
        it->n_dims = 3;
        it->ne[0] = e0->cols, it->ne[1] = e0->rows, it->ne[2] = p->cfg->moe.n_experts;
    } else {
        if (!(it->src = find(p, hf_name)))
            return moe_error(MOE_EIO, "GGUF export: no tensor '%s'", hf_name);
        it->n_dims = it->src->cols ? 2 : 1;
        if (it->src->cols)
            it->ne[0] = it->src->cols, it->ne[1] = it->src->rows + extra_rows;
        else
            it->ne[0] = it->src->rows;
    }
    it->type = item_type(p, it, is_router);
    p->n_items++;
    return MOE_OK;
}

// llama.cpp's tensors of the model, in the order of its converter.
static moe_status plan_items(export_plan *p) {
    const moe_model_config *c = p->cfg;
    p->items = calloc((size_t)(3 + 12 * c->n_layers), sizeof *p->items);
    if (!p->items) return moe_error(MOE_ENOMEM, "GGUF export: out of memory");
    char g[64], h[128];
    moe_status st =
        add_item(p, "token_embd.weight", SRC_COPY, "model.embed_tokens.weight", 0, 1, -1, NULL, 0);
    for (int l = 0; l < c->n_layers && !st; l++) {
        static const struct {
            const char *gguf, *hf;
            src_kind kind;
            int router;
        } per_layer[] = {
            {"attn_norm", "input_layernorm", SRC_COPY, 0},
            {"attn_q", "self_attn.q_proj", SRC_ROPE, 0},
            {"attn_k", "self_attn.k_proj", SRC_ROPE, 0},
            {"attn_v", "self_attn.v_proj", SRC_COPY, 0},
            {"attn_output", "self_attn.o_proj", SRC_COPY, 0},
            {"ffn_norm", "post_attention_layernorm", SRC_COPY, 0},
            {"ffn_gate_inp", "block_sparse_moe.gate", SRC_COPY, 1},
            {"ffn_gate_exps", "block_sparse_moe.experts.%d.w1.weight", SRC_EXPERTS, 0},
            {"ffn_down_exps", "block_sparse_moe.experts.%d.w2.weight", SRC_EXPERTS, 0},
            {"ffn_up_exps", "block_sparse_moe.experts.%d.w3.weight", SRC_EXPERTS, 0},
        };
        for (size_t i = 0; i < sizeof per_layer / sizeof *per_layer && !st; i++) {
            snprintf(g, sizeof g, "blk.%d.%s.weight", l, per_layer[i].gguf);
            snprintf(h, sizeof h, "model.layers.%d.%s.weight", l, per_layer[i].hf);
            const int heads = i == 1 ? c->n_heads : c->n_kv_heads;
            st = add_item(p, g, per_layer[i].kind, h, heads, 0, l, per_layer[i].hf,
                          per_layer[i].router);
        }
    }
    if (!st)
        st = add_item(p, "output_norm.weight", SRC_COPY, "model.norm.weight", 0, 0, -1, NULL, 0);
    // tied embeddings: no output.weight (llama.cpp's llama then uses token_embd)
    if (!st && !c->tie_embeddings)
        st = add_item(p, "output.weight", SRC_COPY, "lm_head.weight", 0, 1, -1, NULL, 0);
    return st;
}

static uint64_t item_values(const gguf_item *it) {
    uint64_t n = 1;
    for (int d = 0; d < it->n_dims; d++) n *= (uint64_t)it->ne[d];
    return n;
}

// The item's values (ne[0] fastest) into dst.
static moe_status fill_item(const export_plan *p, const gguf_item *it, float *dst) {
    if (it->kind == SRC_EXPERTS) {
        const size_t per = (size_t)it->ne[0] * (size_t)it->ne[1];
        for (int e = 0; e < p->cfg->moe.n_experts; e++) {
            char name[128];
            int u = snprintf(name, sizeof name, "model.layers.%d.", it->layer);
            snprintf(name + u, sizeof name - (size_t)u, it->expert_fmt, e);
            const moe_model_tensor *t = find(p, name);
            if (!t) return moe_error(MOE_EIO, "GGUF export: no tensor '%s'", name);
            memcpy(dst + e * per, p->host + t->offset, per * sizeof *dst);
        }
        return MOE_OK;
    }
    const moe_model_tensor *t = it->src;
    const size_t cols = t->cols ? (size_t)t->cols : 1, n = (size_t)t->rows * cols;
    const real *src = p->host + t->offset;
    if (it->kind == SRC_COPY) {
        memcpy(dst, src, n * sizeof *dst);
        memset(dst + n, 0, (size_t)it->extra_rows * cols * sizeof *dst);
        return MOE_OK;
    }
    // SRC_ROPE: HF rotates halves (pairs i, i + hd/2 of a head), GGML's normal RoPE rotates
    // neighbours (2i, 2i + 1): row 2i + j of a head in the file is its HF row j hd/2 + i,
    // as llama.cpp's converter permutes q and k for the llama architecture
    const int hd = t->rows / it->heads, half = hd / 2;
    for (int hh = 0; hh < it->heads; hh++)
        for (int i = 0; i < half; i++)
            for (int j = 0; j < 2; j++)
                memcpy(dst + ((size_t)hh * hd + 2 * i + j) * cols,
                       src + ((size_t)hh * hd + (size_t)j * half + i) * cols, cols * sizeof *dst);
    return MOE_OK;
}

// A folder named step_NNNNNNNN or holding trainer_state.json is a moe.c checkpoint (as
// moe_hf_load_weights decides): verified before it is read.
static moe_status verify_if_checkpoint(const char *folder) {
    char path[PATH_BUF];
    long long step;
    path_fmt(path, sizeof path, "%s/trainer_state.json", folder);
    const int has_state = access(path, F_OK) == 0;
    if (!has_state && !ckpt_folder_step(folder, &step)) return MOE_OK;
    if (!has_state)
        return moe_error(MOE_EIO,
                         "%s: a moe.c checkpoint folder without its trainer_state.json "
                         "(damaged or incomplete; an HF folder must not be named step_N)",
                         folder);
    return moe_checkpoint_verify(folder);
}

// general.name: the folder's name, or RUN/step_N for RUN/ckpt/step_N.
static void model_name(char *out, size_t n, const char *folder) {
    char f[PATH_BUF];
    path_fmt(f, sizeof f, "%s", folder);
    size_t len = strlen(f);
    while (len > 1 && f[len - 1] == '/') f[--len] = '\0';
    char *base = strrchr(f, '/');
    long long step;
    if (base && ckpt_folder_step(f, &step)) {
        *base = '\0';
        char *parent = strrchr(f, '/');
        parent = parent ? parent + 1 : f;
        if (!strcmp(parent, "ckpt") && parent > f + 1) {
            parent[-1] = '\0';
            char *run = strrchr(f, '/');
            snprintf(out, n, "%s/%s", run ? run + 1 : f, base + 1);
            return;
        }
        snprintf(out, n, "%s", base + 1);
        return;
    }
    snprintf(out, n, "%s", base ? base + 1 : f);
}

moe_status moe_export_gguf(const char *ckpt_folder, const char *out_path, const char *type_name) {
    char folder[PATH_BUF], name[256];
    moe_ggml_type type = MOE_GGML_F32;
    moe_model_config cfg;
    struct stat sb;
    moe_status st = moe_ggml_type_parse(type_name, &type);
    if (!st && check_path_arg(out_path)) st = MOE_EINVAL;
    if (!st) st = moe_checkpoint_resolve(folder, sizeof folder, ckpt_folder);
    if (!st) st = moe_hf_config_read(&cfg, folder);
    if (!st) st = check_llama(&cfg, folder);
    if (!st) st = check_tokenizer(&cfg, folder);
    if (st) return st;
    if (stat(out_path, &sb) == 0)
        return moe_error(MOE_EINVAL, "%s: already exists (export never overwrites)", out_path);
    if ((st = moe_hf_check_sizes(folder, &cfg)) || (st = verify_if_checkpoint(folder))) return st;

    export_plan p = {.cfg = &cfg, .type = type};
    p.n_tab = (int)moe_model_tensor_count(&cfg);
    p.tab = moe_model_tensor_table(&cfg);
    real *host = malloc(moe_model_param_count(&cfg) * sizeof(real));
    p.host = host;
    float *scratch = NULL;
    moe_gguf_writer *w = NULL;
    if (!p.tab || !host) st = moe_error(MOE_ENOMEM, "GGUF export: out of memory");
    if (!st) st = ckpt_load_tensors(host, p.tab, p.n_tab, folder, NULL, NULL);
    if (!st) st = plan_items(&p);
    uint64_t most = 0;
    for (int i = 0; i < p.n_items; i++)
        most = item_values(&p.items[i]) > most ? item_values(&p.items[i]) : most;
    if (!st && !(scratch = malloc((size_t)most * sizeof *scratch)))
        st = moe_error(MOE_ENOMEM, "GGUF export: out of memory");
    if (!st) st = moe_gguf_writer_create(&w, out_path);
    if (!st) model_name(name, sizeof name, folder), st = write_keys(w, &cfg, name, type);
    for (int i = 0; i < p.n_items && !st; i++)
        st = moe_gguf_add_tensor(w, p.items[i].name, p.items[i].n_dims, p.items[i].ne,
                                 p.items[i].type);
    for (int i = 0; i < p.n_items && !st; i++) {
        st = fill_item(&p, &p.items[i], scratch);
        if (!st) st = moe_gguf_write_tensor(w, scratch);
    }
    if (!st) st = moe_gguf_finish(w);
    moe_gguf_writer_free(w);
    free(scratch), free(p.items), free(host), free((void *)p.tab);
    return st;
}
