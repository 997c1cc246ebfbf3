// GGUF v3: the writer (ckpt/gguf.h). What is written for a checkpoint: gguf_export.c.
#define _GNU_SOURCE // fileno

#include "ckpt/gguf.h"

#include "ckpt/ckpt_internal.h"
#include "ckpt/path_internal.h"

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
