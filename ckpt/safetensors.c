// safetensors reader/writer, float32 <-> bfloat16/float16 conversion, CRC-32.
// See safetensors.h for the format and the rules the reader enforces.
#define _POSIX_C_SOURCE 200809L

#include "ckpt/safetensors.h"
#include "data/files.h"
#include "data/json_check.h"
#include "layers/bf16.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// The reference implementation refuses headers above 100 MB; so do we, before allocating.
#define ST_MAX_HEADER 100000000ull
// Integers above 2^53 do not survive cJSON's doubles.
#define ST_MAX_JSON_INT 9007199254740992.0

// ---- dtypes ------------------------------------------------------------------------------

size_t moe_st_dtype_size(moe_st_dtype dtype) {
    switch (dtype) {
    case MOE_ST_F32: return 4;
    case MOE_ST_F16: return 2;
    case MOE_ST_BF16: return 2;
    }
    return 0;
}

const char *moe_st_dtype_name(moe_st_dtype dtype) {
    switch (dtype) {
    case MOE_ST_F32: return "F32";
    case MOE_ST_F16: return "F16";
    case MOE_ST_BF16: return "BF16";
    }
    return "?";
}

static int dtype_from_name(const char *s, moe_st_dtype *out) {
    static const moe_st_dtype all[] = {MOE_ST_F32, MOE_ST_F16, MOE_ST_BF16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, moe_st_dtype_name(all[i])) == 0) {
            *out = all[i];
            return 1;
        }
    return 0;
}

// ---- conversions -------------------------------------------------------------------------

static uint32_t f32_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static float bits_f32(uint32_t b) {
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

uint16_t moe_f32_to_f16(float x) {
    uint32_t b = f32_bits(x);
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
    uint32_t a = b & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu)); // quiet NaN
    // 65520 (halfway between 65504 and 2^16) and above round to inf (the tie goes to even)
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);
    if (a >= 0x38800000u) {             // normal half: >= 2^-14
        a += 0xFFFu + ((a >> 13) & 1u); // round to nearest even on the 13 dropped bits
        a -= 0x38000000u;               // rebias the exponent: 127 - 15 = 112
        return (uint16_t)(sign | (a >> 13));
    }
    // subnormal half, in units of 2^-24; at most 2^-25 (a tie with 0) rounds to zero
    if (a <= 0x33000000u) return sign;
    uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - e; // 14..24
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) r++; // may carry into the smallest normal
    return (uint16_t)(sign | r);
}

float moe_f16_to_f32(uint16_t x) {
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
    uint32_t e = (x >> 10) & 0x1Fu, m = x & 0x3FFu;
    if (e == 0) {
        if (m == 0) return bits_f32(sign);
        uint32_t ex = 113; // normalize the subnormal: value = m * 2^-24
        while (!(m & 0x400u)) {
            m <<= 1;
            ex--;
        }
        return bits_f32(sign | (ex << 23) | ((m & 0x3FFu) << 13));
    }
    if (e == 31) return bits_f32(sign | 0x7F800000u | (m << 13)); // inf, or NaN with its payload
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

// ---- CRC-32 ------------------------------------------------------------------------------

// Reflected polynomial 0xEDB88320 (zlib's crc32).
static const uint32_t crc_table[256] = {
    0x00000000u, 0x77073096u, 0xee0e612cu, 0x990951bau, 0x076dc419u, 0x706af48fu, 0xe963a535u,
    0x9e6495a3u, 0x0edb8832u, 0x79dcb8a4u, 0xe0d5e91eu, 0x97d2d988u, 0x09b64c2bu, 0x7eb17cbdu,
    0xe7b82d07u, 0x90bf1d91u, 0x1db71064u, 0x6ab020f2u, 0xf3b97148u, 0x84be41deu, 0x1adad47du,
    0x6ddde4ebu, 0xf4d4b551u, 0x83d385c7u, 0x136c9856u, 0x646ba8c0u, 0xfd62f97au, 0x8a65c9ecu,
    0x14015c4fu, 0x63066cd9u, 0xfa0f3d63u, 0x8d080df5u, 0x3b6e20c8u, 0x4c69105eu, 0xd56041e4u,
    0xa2677172u, 0x3c03e4d1u, 0x4b04d447u, 0xd20d85fdu, 0xa50ab56bu, 0x35b5a8fau, 0x42b2986cu,
    0xdbbbc9d6u, 0xacbcf940u, 0x32d86ce3u, 0x45df5c75u, 0xdcd60dcfu, 0xabd13d59u, 0x26d930acu,
    0x51de003au, 0xc8d75180u, 0xbfd06116u, 0x21b4f4b5u, 0x56b3c423u, 0xcfba9599u, 0xb8bda50fu,
    0x2802b89eu, 0x5f058808u, 0xc60cd9b2u, 0xb10be924u, 0x2f6f7c87u, 0x58684c11u, 0xc1611dabu,
    0xb6662d3du, 0x76dc4190u, 0x01db7106u, 0x98d220bcu, 0xefd5102au, 0x71b18589u, 0x06b6b51fu,
    0x9fbfe4a5u, 0xe8b8d433u, 0x7807c9a2u, 0x0f00f934u, 0x9609a88eu, 0xe10e9818u, 0x7f6a0dbbu,
    0x086d3d2du, 0x91646c97u, 0xe6635c01u, 0x6b6b51f4u, 0x1c6c6162u, 0x856530d8u, 0xf262004eu,
    0x6c0695edu, 0x1b01a57bu, 0x8208f4c1u, 0xf50fc457u, 0x65b0d9c6u, 0x12b7e950u, 0x8bbeb8eau,
    0xfcb9887cu, 0x62dd1ddfu, 0x15da2d49u, 0x8cd37cf3u, 0xfbd44c65u, 0x4db26158u, 0x3ab551ceu,
    0xa3bc0074u, 0xd4bb30e2u, 0x4adfa541u, 0x3dd895d7u, 0xa4d1c46du, 0xd3d6f4fbu, 0x4369e96au,
    0x346ed9fcu, 0xad678846u, 0xda60b8d0u, 0x44042d73u, 0x33031de5u, 0xaa0a4c5fu, 0xdd0d7cc9u,
    0x5005713cu, 0x270241aau, 0xbe0b1010u, 0xc90c2086u, 0x5768b525u, 0x206f85b3u, 0xb966d409u,
    0xce61e49fu, 0x5edef90eu, 0x29d9c998u, 0xb0d09822u, 0xc7d7a8b4u, 0x59b33d17u, 0x2eb40d81u,
    0xb7bd5c3bu, 0xc0ba6cadu, 0xedb88320u, 0x9abfb3b6u, 0x03b6e20cu, 0x74b1d29au, 0xead54739u,
    0x9dd277afu, 0x04db2615u, 0x73dc1683u, 0xe3630b12u, 0x94643b84u, 0x0d6d6a3eu, 0x7a6a5aa8u,
    0xe40ecf0bu, 0x9309ff9du, 0x0a00ae27u, 0x7d079eb1u, 0xf00f9344u, 0x8708a3d2u, 0x1e01f268u,
    0x6906c2feu, 0xf762575du, 0x806567cbu, 0x196c3671u, 0x6e6b06e7u, 0xfed41b76u, 0x89d32be0u,
    0x10da7a5au, 0x67dd4accu, 0xf9b9df6fu, 0x8ebeeff9u, 0x17b7be43u, 0x60b08ed5u, 0xd6d6a3e8u,
    0xa1d1937eu, 0x38d8c2c4u, 0x4fdff252u, 0xd1bb67f1u, 0xa6bc5767u, 0x3fb506ddu, 0x48b2364bu,
    0xd80d2bdau, 0xaf0a1b4cu, 0x36034af6u, 0x41047a60u, 0xdf60efc3u, 0xa867df55u, 0x316e8eefu,
    0x4669be79u, 0xcb61b38cu, 0xbc66831au, 0x256fd2a0u, 0x5268e236u, 0xcc0c7795u, 0xbb0b4703u,
    0x220216b9u, 0x5505262fu, 0xc5ba3bbeu, 0xb2bd0b28u, 0x2bb45a92u, 0x5cb36a04u, 0xc2d7ffa7u,
    0xb5d0cf31u, 0x2cd99e8bu, 0x5bdeae1du, 0x9b64c2b0u, 0xec63f226u, 0x756aa39cu, 0x026d930au,
    0x9c0906a9u, 0xeb0e363fu, 0x72076785u, 0x05005713u, 0x95bf4a82u, 0xe2b87a14u, 0x7bb12baeu,
    0x0cb61b38u, 0x92d28e9bu, 0xe5d5be0du, 0x7cdcefb7u, 0x0bdbdf21u, 0x86d3d2d4u, 0xf1d4e242u,
    0x68ddb3f8u, 0x1fda836eu, 0x81be16cdu, 0xf6b9265bu, 0x6fb077e1u, 0x18b74777u, 0x88085ae6u,
    0xff0f6a70u, 0x66063bcau, 0x11010b5cu, 0x8f659effu, 0xf862ae69u, 0x616bffd3u, 0x166ccf45u,
    0xa00ae278u, 0xd70dd2eeu, 0x4e048354u, 0x3903b3c2u, 0xa7672661u, 0xd06016f7u, 0x4969474du,
    0x3e6e77dbu, 0xaed16a4au, 0xd9d65adcu, 0x40df0b66u, 0x37d83bf0u, 0xa9bcae53u, 0xdebb9ec5u,
    0x47b2cf7fu, 0x30b5ffe9u, 0xbdbdf21cu, 0xcabac28au, 0x53b39330u, 0x24b4a3a6u, 0xbad03605u,
    0xcdd70693u, 0x54de5729u, 0x23d967bfu, 0xb3667a2eu, 0xc4614ab8u, 0x5d681b02u, 0x2a6f2b94u,
    0xb40bbe37u, 0xc30c8ea1u, 0x5a05df1bu, 0x2d02ef8du,
};

uint32_t moe_crc32_update(uint32_t crc, const void *buf, size_t n) {
    const uint8_t *p = buf;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
    return ~crc;
}

// path opened for reading through data/files.h (a regular file: a FIFO in a checkpoint folder
// must not block a load): MOE_EIO "PATH: cannot open: why", "PATH: not a regular file ...".
static moe_status open_regular(const char *path, FILE **fp) {
    if (!moe_file_open_input(path, "a checkpoint", UINT64_MAX, fp, NULL)) return MOE_OK;
    struct stat sb;
    if (errno) return moe_error(MOE_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return moe_error(MOE_EIO, "%s: not a regular file (a folder)", path);
    return MOE_EIO; // moe_file_open_input's message: not a regular file (a FIFO) ...
}

moe_status moe_file_crc32(const char *path, uint32_t *crc) {
    *crc = 0;
    FILE *fp;
    moe_status st = open_regular(path, &fp);
    if (st) return st;
    enum { CHUNK = 1 << 20 };
    uint8_t *buf = malloc(CHUNK);
    if (!buf) {
        fclose(fp);
        return moe_error(MOE_ENOMEM, "%s: no memory for a read buffer", path);
    }
    uint32_t c = 0;
    size_t got;
    while ((got = fread(buf, 1, CHUNK, fp)) > 0) c = moe_crc32_update(c, buf, got);
    int failed = ferror(fp), err = errno;
    free(buf);
    fclose(fp);
    if (failed) return moe_error(MOE_EIO, "%s: read error: %s", path, strerror(err));
    *crc = c;
    return MOE_OK;
}

// ---- reading -----------------------------------------------------------------------------

static uint64_t load_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void store_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

// Reads exactly n bytes; 0 on success.
static int read_exact(FILE *fp, void *dst, size_t n) {
    uint8_t *p = dst;
    while (n > 0) {
        size_t got = fread(p, 1, n, fp);
        if (got == 0) return -1;
        p += got;
        n -= got;
    }
    return 0;
}

// A non-negative JSON integer (up to 2^53), or 0 when v is anything else.
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > ST_MAX_JSON_INT || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t len = 0;
    buf[0] = 0;
    int w = snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && w >= 0 && (len += (size_t)w) < cap; d++)
        w = snprintf(buf + len, cap - len, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (w >= 0 && (len += (size_t)w) < cap) snprintf(buf + len, cap - len, "]");
}

// Bytes of a tensor of this shape and dtype; 0 with *overflow set if it does not fit 64 bits.
static uint64_t tensor_bytes(moe_st_dtype dtype, int ndim, const int64_t *shape, int *overflow) {
    *overflow = 0;
    for (int d = 0; d < ndim; d++)
        if (shape[d] == 0) return 0;
    uint64_t bytes = moe_st_dtype_size(dtype);
    for (int d = 0; d < ndim; d++) {
        uint64_t dim = (uint64_t)shape[d];
        if (bytes > UINT64_MAX / dim) {
            *overflow = 1;
            return 0;
        }
        bytes *= dim;
    }
    return bytes;
}

// The header's text near byte `pos`, printable, for an error message.
static void snippet(char *out, size_t cap, const char *hdr, size_t len, size_t pos) {
    size_t k = 0;
    for (size_t i = pos; i < len && k + 1 < cap; i++, k++) {
        unsigned char c = (unsigned char)hdr[i];
        out[k] = (c >= 0x20 && c < 0x7F) ? (char)c : '?';
    }
    out[k] = 0;
}

static int cmp_by_offsets(const void *a, const void *b) {
    const moe_st_tensor *x = *(const moe_st_tensor *const *)a,
                        *y = *(const moe_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_by_name(const void *a, const void *b) {
    const moe_st_tensor *x = *(const moe_st_tensor *const *)a,
                        *y = *(const moe_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

// Fills one tensor from its header entry.
static moe_status parse_entry(moe_st_tensor *t, const cJSON *e, const char *path,
                              uint64_t data_size) {
    const char *name = e->string;
    if (strlen(name) >= sizeof t->name)
        return moe_error(MOE_EIO, "%s: tensor name '%.64s...' is longer than %zu bytes", path, name,
                         sizeof t->name - 1);
    memcpy(t->name, name, strlen(name) + 1);
    if (!cJSON_IsObject(e))
        return moe_error(MOE_EIO, "%s: tensor '%s': entry is not an object", path, name);

    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!dt) return moe_error(MOE_EIO, "%s: tensor '%s': missing 'dtype'", path, name);
    if (!sh) return moe_error(MOE_EIO, "%s: tensor '%s': missing 'shape'", path, name);
    if (!off) return moe_error(MOE_EIO, "%s: tensor '%s': missing 'data_offsets'", path, name);

    if (!cJSON_IsString(dt))
        return moe_error(MOE_EIO, "%s: tensor '%s': 'dtype' is not a string", path, name);
    if (!dtype_from_name(dt->valuestring, &t->dtype))
        return moe_error(MOE_EIO,
                         "%s: tensor '%s': unknown dtype '%.32s' (supported: F32, F16, BF16)", path,
                         name, dt->valuestring);

    if (!cJSON_IsArray(sh))
        return moe_error(MOE_EIO, "%s: tensor '%s': 'shape' is not an array", path, name);
    int ndim = cJSON_GetArraySize(sh);
    if (ndim > MOE_ST_MAX_DIMS)
        return moe_error(MOE_EIO, "%s: tensor '%s': shape has %d dims, more than %d", path, name,
                         ndim, MOE_ST_MAX_DIMS);
    t->ndim = ndim;
    int d = 0;
    for (const cJSON *v = sh->child; v; v = v->next, d++) {
        uint64_t dim;
        if (!json_uint(v, &dim))
            return moe_error(MOE_EIO, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                             path, name, d);
        t->shape[d] = (int64_t)dim;
    }

    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !json_uint(off->child, &t->begin) ||
        !json_uint(off->child->next, &t->end))
        return moe_error(
            MOE_EIO, "%s: tensor '%s': 'data_offsets' is not [begin, end] of non-negative integers",
            path, name);
    if (t->end < t->begin)
        return moe_error(MOE_EIO,
                         "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                         "] end before they begin",
                         path, name, t->begin, t->end);

    char shape[160];
    format_shape(shape, sizeof shape, t->ndim, t->shape);
    int overflow;
    uint64_t need = tensor_bytes(t->dtype, t->ndim, t->shape, &overflow);
    if (overflow)
        return moe_error(MOE_EIO, "%s: tensor '%s': shape %s of %s is too large", path, name, shape,
                         moe_st_dtype_name(t->dtype));
    if (t->end - t->begin != need)
        return moe_error(MOE_EIO,
                         "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                         " bytes but shape %s of %s needs %" PRIu64,
                         path, name, t->begin, t->end, t->end - t->begin, shape,
                         moe_st_dtype_name(t->dtype), need);
    if (t->end > data_size)
        return moe_error(MOE_EIO,
                         "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                         "] run past the end of the data section (%" PRIu64
                         " bytes): file truncated?",
                         path, name, t->begin, t->end, data_size);
    return MOE_OK;
}

// Parses the NUL-terminated header text into f->tensors and checks the layout of the data.
static moe_status parse_header(moe_st_file *f, const char *hdr, size_t len) {
    const char *path = f->path;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(hdr, &end, 1);
    if (!root) {
        size_t pos = (end && end >= hdr && end <= hdr + len) ? (size_t)(end - hdr) : 0;
        char near[32];
        snippet(near, sizeof near, hdr, len, pos);
        return moe_error(MOE_EIO,
                         "%s: header (%zu bytes) is not valid JSON: error at byte %zu, near '%s'",
                         path, len, pos, near);
    }
    moe_status st = MOE_OK;
    moe_st_tensor **order = NULL;
    if (!cJSON_IsObject(root)) {
        st = moe_error(MOE_EIO, "%s: header is not a JSON object", path);
        goto done;
    }

    int n = 0, n_meta = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0)
            n_meta++;
        else if (n == INT32_MAX) {
            st = moe_error(MOE_EIO, "%s: too many tensors", path);
            goto done;
        } else
            n++;
    }
    if (n_meta > 1) {
        st = moe_error(MOE_EIO, "%s: duplicate name '__metadata__'", path);
        goto done;
    }
    f->tensors = calloc(n ? (size_t)n : 1, sizeof *f->tensors);
    order = malloc((n ? (size_t)n : 1) * sizeof *order);
    if (!f->tensors || !order) {
        st = moe_error(MOE_ENOMEM, "%s: no memory for %d tensor entries", path, n);
        goto done;
    }

    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(e)) {
                st = moe_error(MOE_EIO, "%s: '__metadata__' is not an object", path);
                goto done;
            }
            for (const cJSON *m = e->child; m; m = m->next)
                if (!cJSON_IsString(m)) {
                    st = moe_error(MOE_EIO, "%s: '__metadata__' entry '%s' is not a string", path,
                                   m->string);
                    goto done;
                }
            continue;
        }
        moe_st_tensor *t = &f->tensors[f->n];
        if ((st = parse_entry(t, e, path, f->data_size)) != MOE_OK) goto done;
        order[f->n++] = t;
    }

    // duplicate names (cJSON keeps every member of an object, repeated keys included)
    qsort(order, (size_t)n, sizeof *order, cmp_by_name);
    for (int i = 1; i < n; i++)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0) {
            st = moe_error(MOE_EIO, "%s: duplicate tensor name '%s'", path, order[i]->name);
            goto done;
        }
    // and a key twice inside an entry or __metadata__ ("dtype" twice: which one is it?)
    if ((st = moe_json_refuse_duplicates(root, path))) goto done;

    // the tensors must tile the data section exactly
    qsort(order, (size_t)n, sizeof *order, cmp_by_offsets);
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        const moe_st_tensor *t = order[i], *prev = i ? order[i - 1] : NULL;
        if (t->begin < at) {
            st = moe_error(MOE_EIO,
                           "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                           "] overlap tensor '%s' [%" PRIu64 ", %" PRIu64 "]",
                           path, t->name, t->begin, t->end, prev->name, prev->begin, prev->end);
            goto done;
        }
        if (t->begin > at) {
            if (prev)
                st = moe_error(MOE_EIO,
                               "%s: gap of %" PRIu64
                               " bytes in the data between tensor '%s' (ends at %" PRIu64
                               ") and tensor '%s' (begins at %" PRIu64 ")",
                               path, t->begin - at, prev->name, at, t->name, t->begin);
            else
                st = moe_error(MOE_EIO,
                               "%s: gap of %" PRIu64
                               " bytes at the start of the data: the first tensor '%s' "
                               "begins at %" PRIu64 ", not 0",
                               path, t->begin, t->name, t->begin);
            goto done;
        }
        at = t->end;
    }
    if (at != f->data_size)
        st = moe_error(MOE_EIO,
                       "%s: the tensors end at byte %" PRIu64
                       " of the data but the data section has %" PRIu64 " bytes (%" PRIu64
                       " bytes unaccounted for)",
                       path, at, f->data_size, f->data_size - at);
done:
    free(order);
    cJSON_Delete(root);
    return st;
}

static moe_status read_file(moe_st_file *f, FILE *fp, char **hdr_out, size_t *hdr_len,
                            int with_data) {
    const char *path = f->path;
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0)
        return moe_error(MOE_EIO, "%s: cannot stat: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return moe_error(MOE_EIO, "%s: not a regular file", path);
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8)
        return moe_error(MOE_EIO,
                         "%s: file has %" PRIu64 " bytes, fewer than the 8-byte header length: "
                         "truncated or not a safetensors file",
                         path, size);
    uint8_t lenbuf[8];
    if (read_exact(fp, lenbuf, 8) != 0)
        return moe_error(MOE_EIO, "%s: cannot read the header length", path);
    uint64_t n = load_le64(lenbuf);
    if (n > size - 8)
        return moe_error(MOE_EIO,
                         "%s: header length %" PRIu64 " exceeds the %" PRIu64
                         " bytes after the length field: truncated or not a safetensors file",
                         path, n, size - 8);
    if (n > ST_MAX_HEADER)
        return moe_error(MOE_EIO, "%s: header length %" PRIu64 " exceeds the limit of %llu bytes",
                         path, n, ST_MAX_HEADER);
    if (size - 8 - n > (uint64_t)SIZE_MAX - 1)
        return moe_error(MOE_ENOMEM, "%s: data section too large for this machine", path);
    char *hdr = malloc((size_t)n + 1);
    if (!hdr) return moe_error(MOE_ENOMEM, "%s: no memory for a %" PRIu64 "-byte header", path, n);
    *hdr_out = hdr;
    if (read_exact(fp, hdr, (size_t)n) != 0)
        return moe_error(
            MOE_EIO, "%s: cannot read the %" PRIu64 "-byte header (file changed while reading?)",
            path, n);
    hdr[n] = 0;
    *hdr_len = (size_t)n;
    const char *nul = memchr(hdr, 0, (size_t)n);
    if (nul)
        return moe_error(MOE_EIO, "%s: header has a NUL byte at offset %zu", path,
                         (size_t)(nul - hdr));
    f->data_size = size - 8 - n;
    if (!with_data) return MOE_OK;
    f->data = malloc(f->data_size ? (size_t)f->data_size : 1);
    if (!f->data)
        return moe_error(MOE_ENOMEM, "%s: no memory for %" PRIu64 " bytes of tensor data", path,
                         f->data_size);
    if (read_exact(fp, f->data, (size_t)f->data_size) != 0)
        return moe_error(MOE_EIO,
                         "%s: cannot read %" PRIu64
                         " bytes of tensor data (file changed while reading?)",
                         path, f->data_size);
    return MOE_OK;
}

static moe_status st_open(moe_st_file *f, const char *path, int with_data) {
    memset(f, 0, sizeof *f);
    if (!path) return moe_error(MOE_EINVAL, "moe_st_read: no path");
    size_t plen = strlen(path);
    if (plen >= sizeof f->path) plen = sizeof f->path - 1;
    memcpy(f->path, path, plen);
    f->path[plen] = 0;

    FILE *fp;
    moe_status st0 = open_regular(path, &fp);
    if (st0) return st0;
    char *hdr = NULL;
    size_t hdr_len = 0;
    moe_status st = read_file(f, fp, &hdr, &hdr_len, with_data);
    fclose(fp);
    if (st == MOE_OK) st = parse_header(f, hdr, hdr_len);
    free(hdr);
    if (st != MOE_OK) {
        char keep[sizeof f->path];
        memcpy(keep, f->path, sizeof keep);
        moe_st_free(f);
        memcpy(f->path, keep, sizeof keep);
    }
    return st;
}

moe_status moe_st_read(moe_st_file *f, const char *path) { return st_open(f, path, 1); }

moe_status moe_st_read_header(moe_st_file *f, const char *path) { return st_open(f, path, 0); }

void moe_st_free(moe_st_file *f) {
    if (!f) return;
    free(f->tensors);
    free(f->data);
    memset(f, 0, sizeof *f);
}

const moe_st_tensor *moe_st_find(const moe_st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

void moe_st_to_f32(float *dst, const moe_st_file *f, const moe_st_tensor *t) {
    const uint8_t *p = f->data + t->begin;
    size_t n = (size_t)((t->end - t->begin) / moe_st_dtype_size(t->dtype));
    switch (t->dtype) {
    case MOE_ST_F32:
        for (size_t i = 0; i < n; i++, p += 4)
            dst[i] = bits_f32((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                              (uint32_t)p[3] << 24);
        break;
    case MOE_ST_F16:
        for (size_t i = 0; i < n; i++, p += 2)
            dst[i] = moe_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
        break;
    case MOE_ST_BF16:
        for (size_t i = 0; i < n; i++, p += 2)
            dst[i] = moe_bf16_to_f32((uint16_t)(p[0] | p[1] << 8));
        break;
    }
}

// ---- writing -----------------------------------------------------------------------------

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_str(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_u64(strbuf *b, uint64_t v) {
    char tmp[24];
    int w = snprintf(tmp, sizeof tmp, "%" PRIu64, v);
    sb_put(b, tmp, (size_t)w);
}

// A JSON string literal: quotes, backslashes and control bytes escaped; other bytes as they are.
static void sb_json_string(strbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            char esc[8];
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// Checks the entries and returns the bytes each takes (bytes[i]) and the header JSON.
static moe_status build_header(strbuf *hb, uint64_t *bytes, const char *path,
                               const moe_st_entry *entries, int n, moe_st_dtype dtype) {
    for (int i = 0; i < n; i++) {
        const moe_st_entry *e = &entries[i];
        if (!e->name || !e->name[0])
            return moe_error(MOE_EINVAL, "%s: tensor %d has no name", path, i);
        if (strlen(e->name) >= sizeof(((moe_st_tensor *)0)->name))
            return moe_error(MOE_EINVAL, "%s: tensor name '%.64s...' is longer than %zu bytes",
                             path, e->name, sizeof(((moe_st_tensor *)0)->name) - 1);
        if (strcmp(e->name, "__metadata__") == 0)
            return moe_error(MOE_EINVAL, "%s: '__metadata__' is not a tensor name", path);
        if (e->ndim < 0 || e->ndim > MOE_ST_MAX_DIMS)
            return moe_error(MOE_EINVAL, "%s: tensor '%s': ndim %d is not in 0..%d", path, e->name,
                             e->ndim, MOE_ST_MAX_DIMS);
        for (int d = 0; d < e->ndim; d++)
            if (e->shape[d] < 0)
                return moe_error(MOE_EINVAL, "%s: tensor '%s': shape[%d] = %" PRId64 " is negative",
                                 path, e->name, d, e->shape[d]);
        int overflow;
        bytes[i] = tensor_bytes(dtype, e->ndim, e->shape, &overflow);
        if (overflow)
            return moe_error(MOE_EINVAL, "%s: tensor '%s': shape is too large", path, e->name);
        if (bytes[i] > 0 && !e->data)
            return moe_error(MOE_EINVAL, "%s: tensor '%s' has no data", path, e->name);
    }
    const char **names = malloc((n ? (size_t)n : 1) * sizeof *names);
    if (!names) return moe_error(MOE_ENOMEM, "%s: no memory for %d names", path, n);
    for (int i = 0; i < n; i++) names[i] = entries[i].name;
    qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
    for (int i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            moe_status st = moe_error(MOE_EINVAL, "%s: duplicate tensor name '%s'", path, names[i]);
            free(names);
            return st;
        }
    free(names);

    sb_str(hb, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        const moe_st_entry *e = &entries[i];
        sb_str(hb, ",");
        sb_json_string(hb, e->name);
        sb_str(hb, ":{\"dtype\":\"");
        sb_str(hb, moe_st_dtype_name(dtype));
        sb_str(hb, "\",\"shape\":[");
        for (int d = 0; d < e->ndim; d++) {
            if (d) sb_str(hb, ",");
            sb_u64(hb, (uint64_t)e->shape[d]);
        }
        sb_str(hb, "],\"data_offsets\":[");
        sb_u64(hb, at);
        sb_str(hb, ",");
        at += bytes[i];
        sb_u64(hb, at);
        sb_str(hb, "]}");
    }
    sb_str(hb, "}");
    while (hb->len % 8) sb_str(hb, " ");
    if (hb->oom) return moe_error(MOE_ENOMEM, "%s: no memory for the header", path);
    return MOE_OK;
}

// Converts count floats to dtype, little-endian, into out.
static void encode(uint8_t *out, const float *src, size_t count, moe_st_dtype dtype) {
    for (size_t i = 0; i < count; i++) {
        switch (dtype) {
        case MOE_ST_F32: {
            uint32_t b = f32_bits(src[i]);
            out[4 * i] = (uint8_t)b;
            out[4 * i + 1] = (uint8_t)(b >> 8);
            out[4 * i + 2] = (uint8_t)(b >> 16);
            out[4 * i + 3] = (uint8_t)(b >> 24);
            break;
        }
        case MOE_ST_F16:
        case MOE_ST_BF16: {
            uint16_t h = dtype == MOE_ST_F16 ? moe_f32_to_f16(src[i]) : moe_f32_to_bf16(src[i]);
            out[2 * i] = (uint8_t)h;
            out[2 * i + 1] = (uint8_t)(h >> 8);
            break;
        }
        }
    }
}

static int write_all(FILE *fp, const void *p, size_t n) {
    return fwrite(p, 1, n, fp) == n ? 0 : -1;
}

moe_status moe_st_write(const char *path, const moe_st_entry *entries, int n, moe_st_dtype dtype) {
    if (!path) return moe_error(MOE_EINVAL, "moe_st_write: no path");
    if (n < 0 || (n > 0 && !entries))
        return moe_error(MOE_EINVAL, "%s: %d tensors to write", path, n);
    size_t esize = moe_st_dtype_size(dtype);
    if (esize == 0) return moe_error(MOE_EINVAL, "%s: unknown dtype %d", path, (int)dtype);

    uint64_t *bytes = malloc((n ? (size_t)n : 1) * sizeof *bytes);
    if (!bytes) return moe_error(MOE_ENOMEM, "%s: no memory for %d tensor sizes", path, n);
    strbuf hb = {0};
    moe_status st = build_header(&hb, bytes, path, entries, n, dtype);
    if (st != MOE_OK) {
        free(bytes);
        free(hb.p);
        return st;
    }

    enum { CHUNK = 1 << 14 }; // elements converted per write
    uint8_t *buf = malloc(CHUNK * 4);
    FILE *fp = buf ? fopen(path, "wb") : NULL;
    const char *what = "open";
    int err = 0;
    if (!buf) {
        st = moe_error(MOE_ENOMEM, "%s: no memory for a write buffer", path);
        goto done;
    }
    if (!fp) {
        st = moe_error(MOE_EIO, "%s: cannot open for writing: %s", path, strerror(errno));
        goto done;
    }
    uint8_t lenbuf[8];
    store_le64(lenbuf, (uint64_t)hb.len);
    what = "write";
    if (write_all(fp, lenbuf, 8) != 0 || write_all(fp, hb.p, hb.len) != 0) goto io_error;
    for (int i = 0; i < n; i++) {
        size_t count = (size_t)(bytes[i] / esize);
        for (size_t at = 0; at < count; at += CHUNK) {
            size_t k = count - at < CHUNK ? count - at : CHUNK;
            encode(buf, entries[i].data + at, k, dtype);
            if (write_all(fp, buf, k * esize) != 0) goto io_error;
        }
    }
    if (fflush(fp) != 0) goto io_error;
    what = "fsync";
    if (fsync(fileno(fp)) != 0) goto io_error;
    what = "close";
    FILE *closing = fp;
    fp = NULL;
    if (fclose(closing) != 0) goto io_error;
    goto done;

io_error:
    err = errno;
    st = moe_error(MOE_EIO, "%s: %s failed: %s", path, what, err ? strerror(err) : "short write");
    if (fp) fclose(fp);
    fp = NULL;
    remove(path); // no half-written file under the final name
done:
    if (fp) fclose(fp);
    free(buf);
    free(bytes);
    free(hb.p);
    return st;
}
