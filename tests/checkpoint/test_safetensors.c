// safetensors reader/writer, dtype conversions and CRC-32.
// Usage: test_safetensors SCRATCH_DIR [roundtrip|hf|errors|crc32|convert|all]
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test_util.h"
#include "ckpt/safetensors.h"

static const char *scratch;

static void path_of(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", scratch, name);
}

// Whole file into a malloc'd buffer; exits on failure (a broken test, not a finding).
static uint8_t *slurp(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(2);
    }
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, fp) != (size_t)n) exit(2);
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

static void put_bytes(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(p, 1, n, fp) != n || fclose(fp) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
}

// A safetensors file by hand: the length field (declared_len, or the header's real length when
// UINT64_MAX), the header exactly as given, then data_len bytes 0, 1, 2, ...
static void write_raw(const char *path, const char *header, uint64_t declared_len,
                      size_t data_len) {
    size_t hl = strlen(header);
    uint64_t len = declared_len == UINT64_MAX ? hl : declared_len;
    uint8_t *buf = malloc(8 + hl + data_len + 1);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(len >> (8 * i));
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) buf[8 + hl + i] = (uint8_t)i;
    put_bytes(path, buf, 8 + hl + data_len);
    free(buf);
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static float from_bits(uint32_t b) {
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

static uint32_t to_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

// ---- round trips -------------------------------------------------------------------------

static void test_roundtrip_f32(void) {
    printf("round trip F32\n");
    char path[1024];
    path_of(path, sizeof path, "rt_f32.safetensors");
    float scalar = 3.25f;
    float cube[2 * 3 * 4];
    for (int i = 0; i < 24; i++) cube[i] = (float)i * 0.37f - 4.0f;
    float odd[6] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, from_bits(1)}; // denormal, NaN, -0
    moe_st_entry e[5] = {
        {.name = "model.scalar", .data = &scalar, .ndim = 0},
        {.name = "model.layers.0.cube", .data = cube, .ndim = 3, .shape = {2, 3, 4}},
        {.name = "odd", .data = odd, .ndim = 1, .shape = {6}},
        {.name = "empty", .data = NULL, .ndim = 2, .shape = {0, 5}},
        {.name = "we\"ird\\name\n", .data = cube, .ndim = 2, .shape = {4, 2}},
    };
    check_true("moe_st_write F32", moe_st_write(path, e, 5, MOE_ST_F32) == MOE_OK);

    size_t len;
    uint8_t *raw = slurp(path, &len);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | raw[i];
    check_true("header length is a multiple of 8", hl % 8 == 0 && hl + 8 <= len);
    const char *meta = "{\"__metadata__\":{\"format\":\"pt\"},";
    check_true("header begins with __metadata__ {format: pt}",
               memcmp(raw + 8, meta, strlen(meta)) == 0);
    check_true("header padded with spaces", raw[8 + hl - 1] == ' ' || raw[8 + hl - 1] == '}');
    check_true("file size = 8 + header + data", len == 8 + hl + 4 * (1 + 24 + 6 + 0 + 8));
    free(raw);

    moe_st_file f;
    moe_status st = moe_st_read(&f, path);
    if (st != MOE_OK) printf("  %s\n", moe_last_error());
    check_true("moe_st_read F32", st == MOE_OK);
    if (st != MOE_OK) return;
    check_true("5 tensors, in the order written",
               f.n == 5 && strcmp(f.tensors[0].name, "model.scalar") == 0 &&
                   strcmp(f.tensors[4].name, "we\"ird\\name\n") == 0);
    const moe_st_tensor *t = moe_st_find(&f, "model.scalar");
    float got[32];
    check_true("scalar: ndim 0, 4 bytes",
               t && t->ndim == 0 && t->end - t->begin == 4 && t->dtype == MOE_ST_F32);
    if (t) {
        moe_st_to_f32(got, &f, t);
        check_true("scalar value", got[0] == 3.25f);
    }
    t = moe_st_find(&f, "model.layers.0.cube");
    check_true("cube: shape [2,3,4]",
               t && t->ndim == 3 && t->shape[0] == 2 && t->shape[1] == 3 && t->shape[2] == 4);
    if (t) {
        moe_st_to_f32(got, &f, t);
        int ok = 1;
        for (int i = 0; i < 24; i++) ok &= same_bits(got[i], cube[i]);
        check_true("cube bitwise", ok);
    }
    t = moe_st_find(&f, "odd");
    if (t) {
        moe_st_to_f32(got, &f, t);
        int ok = 1;
        for (int i = 0; i < 6; i++) ok &= same_bits(got[i], odd[i]);
        check_true("0, -0, inf, -inf, NaN, denormal bitwise", ok);
    }
    t = moe_st_find(&f, "empty");
    check_true("empty tensor [0, 5]", t && t->ndim == 2 && t->shape[0] == 0 && t->begin == t->end);
    t = moe_st_find(&f, "we\"ird\\name\n");
    check_true("escaped name round trips", t && t->shape[0] == 4 && t->shape[1] == 2);
    check_true("moe_st_find of an absent name is NULL", moe_st_find(&f, "nope") == NULL);
    moe_st_free(&f);
    moe_st_free(&f); // twice is harmless
}

static void test_roundtrip_half(moe_st_dtype dtype) {
    printf("round trip %s\n", moe_st_dtype_name(dtype));
    char path[1024];
    path_of(path, sizeof path, dtype == MOE_ST_F16 ? "rt_f16.safetensors" : "rt_bf16.safetensors");
    enum { N = 3 * 5 * 7 };
    float x[N];
    test_rng r;
    rng_seed(&r, 7);
    for (int i = 0; i < N; i++) x[i] = (float)(rng_normal(&r) * 10.0);
    moe_st_entry e[2] = {{.name = "w", .data = x, .ndim = 3, .shape = {3, 5, 7}},
                         {.name = "s", .data = x, .ndim = 0}};
    check_true("moe_st_write", moe_st_write(path, e, 2, dtype) == MOE_OK);
    moe_st_file f;
    moe_status st = moe_st_read(&f, path);
    check_true("moe_st_read", st == MOE_OK);
    if (st != MOE_OK) {
        printf("  %s\n", moe_last_error());
        return;
    }
    const moe_st_tensor *t = moe_st_find(&f, "w");
    check_true("dtype and 2 bytes per element",
               t && t->dtype == dtype && t->end - t->begin == 2 * N);
    float got[N];
    moe_st_to_f32(got, &f, t);
    double g[N], w[N], maxrel = 0;
    int exact = 1;
    for (int i = 0; i < N; i++) {
        g[i] = got[i];
        w[i] = x[i];
        double rel = fabs(g[i] - w[i]) / fabs(w[i]);
        if (rel > maxrel) maxrel = rel;
        uint16_t h = dtype == MOE_ST_F16 ? moe_f32_to_f16(x[i]) : moe_f32_to_bf16(x[i]);
        exact &= same_bits(got[i], dtype == MOE_ST_F16 ? moe_f16_to_f32(h) : moe_bf16_to_f32(h));
    }
    // round to nearest: at most half an ulp, relative 2^-8 (bf16, 7 stored mantissa bits) or
    // 2^-11 (f16, 10 stored bits), for normal values
    double tol = dtype == MOE_ST_F16 ? 1.0 / 2048 : 1.0 / 256;
    printf("  max elementwise relative error %.3e (bound %.3e)\n", maxrel, tol);
    check_true("every element within half an ulp", maxrel <= tol);
    check_rel("values", g, w, N, tol);
    check_true("values equal the scalar conversion", exact);
    const moe_st_tensor *s = moe_st_find(&f, "s");
    check_true("scalar: ndim 0, 2 bytes", s && s->ndim == 0 && s->end - s->begin == 2);
    moe_st_free(&f);
}

// ---- a file as the Hugging Face library writes it ----------------------------------------

static void test_hf_file(void) {
    printf("file laid out like Hugging Face's safetensors\n");
    char path[1024];
    path_of(path, sizeof path, "hf.safetensors");
    // HF: no padding in this one, keys sorted by name, data ordered otherwise (here "b" first).
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[0,2]},"
                      "\"c\":{\"dtype\":\"F16\",\"shape\":[1,1],\"data_offsets\":[2,4]}}";
    size_t hl = strlen(hdr);
    uint8_t buf[512];
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, hdr, hl);
    uint8_t *d = buf + 8 + hl;
    d[0] = 0xC0;
    d[1] = 0x3F; // b: bf16 1.5
    d[2] = 0x00;
    d[3] = 0xC0; // c: f16 -2.0
    d[4] = 0x00;
    d[5] = 0x00;
    d[6] = 0x80;
    d[7] = 0x3F; // a[0] = 1.0f
    d[8] = 0x00;
    d[9] = 0x00;
    d[10] = 0x20;
    d[11] = 0xC1; // a[1] = -10.0f
    put_bytes(path, buf, 8 + hl + 12);

    moe_st_file f;
    moe_status st = moe_st_read(&f, path);
    if (st != MOE_OK) printf("  %s\n", moe_last_error());
    check_true("reads an unpadded header", st == MOE_OK);
    if (st != MOE_OK) return;
    float v[2];
    const moe_st_tensor *a = moe_st_find(&f, "a"), *b = moe_st_find(&f, "b"),
                        *c = moe_st_find(&f, "c");
    check_true("3 tensors", f.n == 3 && a && b && c);
    if (a && b && c) {
        moe_st_to_f32(v, &f, a);
        check_true("a = [1, -10] (F32)", v[0] == 1.0f && v[1] == -10.0f);
        moe_st_to_f32(v, &f, b);
        check_true("b = 1.5 (BF16 scalar)", v[0] == 1.5f && b->ndim == 0);
        moe_st_to_f32(v, &f, c);
        check_true("c = -2 (F16 [1,1])", v[0] == -2.0f && c->ndim == 2);
    }
    moe_st_free(&f);

    // no __metadata__ at all, and padding spaces after the JSON: also valid
    path_of(path, sizeof path, "hf_nometa.safetensors");
    write_raw(path, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}      ",
              UINT64_MAX, 4);
    st = moe_st_read(&f, path);
    if (st != MOE_OK) printf("  %s\n", moe_last_error());
    check_true("reads a file without __metadata__, padded", st == MOE_OK && f.n == 1);
    moe_st_free(&f);

    // no tensors at all
    path_of(path, sizeof path, "hf_empty.safetensors");
    write_raw(path, "{\"__metadata__\":{\"format\":\"pt\"}}", UINT64_MAX, 0);
    st = moe_st_read(&f, path);
    check_true("reads a file with no tensors", st == MOE_OK && f.n == 0);
    moe_st_free(&f);
}

// ---- the loader's refusals -----------------------------------------------------------------

// moe_st_read(path) must fail with MOE_EIO and a message naming the file and holding `detail`.
static void expect_refusal(const char *what, const char *file, const char *detail) {
    char path[1024];
    path_of(path, sizeof path, file);
    moe_st_file f;
    moe_status st = moe_st_read(&f, path);
    const char *msg = moe_last_error();
    printf("  [%s] %s\n", what, st == MOE_OK ? "(accepted!)" : msg);
    int ok = st == MOE_EIO && strstr(msg, file) && strstr(msg, detail) && f.n == 0 && !f.data &&
             !f.tensors;
    if (!ok && st != MOE_OK) printf("    wanted MOE_EIO naming '%s' and '%s'\n", file, detail);
    check_true(what, ok);
    if (st == MOE_OK) moe_st_free(&f);
}

// write_raw into the scratch dir, then expect_refusal.
static void refuse(const char *what, const char *file, const char *header, uint64_t declared,
                   size_t data_len, const char *detail) {
    char path[1024];
    path_of(path, sizeof path, file);
    write_raw(path, header, declared, data_len);
    expect_refusal(what, file, detail);
}

#define T(name, dtype, shape, b, e) \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"
#define META "\"__metadata__\":{\"format\":\"pt\"},"

static void test_errors(void) {
    printf("loader refusals\n");
    char path[1024];
    const uint64_t REAL = UINT64_MAX;

    expect_refusal("missing file", "does_not_exist.safetensors", "cannot open");

    path_of(path, sizeof path, "short5.safetensors");
    put_bytes(path, "\x10\0\0\0\0", 5);
    expect_refusal("shorter than 8 bytes", "short5.safetensors", "fewer than the 8-byte");

    path_of(path, sizeof path, "zero.safetensors");
    put_bytes(path, "", 0);
    expect_refusal("empty file", "zero.safetensors", "fewer than the 8-byte");

    refuse("data shorter than offsets say", "trunc_data.safetensors",
           "{" META T("w", "F32", "[4]", 0, 16) "}", REAL, 10, "file truncated");
    refuse("header length beyond the file", "hdr_beyond.safetensors", "{}", 1000, 0,
           "header length 1000 exceeds");
    refuse("header length absurd", "hdr_huge.safetensors", "{}", 0xFFFFFFFFFFFFFFF0ull, 0,
           "exceeds");
    refuse("JSON does not parse", "bad_json.safetensors", "{\"w\":{\"dtype\":\"F32\",", REAL, 0,
           "not valid JSON");
    refuse("JSON with trailing garbage", "trailing_json.safetensors", "{} x", REAL, 0,
           "not valid JSON");
    refuse("JSON not an object", "array.safetensors", "[1,2]", REAL, 0, "not a JSON object");
    refuse("overlapping offsets", "overlap.safetensors",
           "{" META T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 4, 12) "}", REAL, 12,
           "overlap tensor 'a'");
    refuse("gapped offsets", "gap.safetensors",
           "{" META T("a", "F32", "[2]", 0, 8) "," T("b", "F32", "[2]", 12, 20) "}", REAL, 20,
           "gap of 4 bytes");
    refuse("gap at the start", "gap_start.safetensors", "{" META T("a", "F32", "[2]", 4, 12) "}",
           REAL, 12, "begins at 4, not 0");
    refuse("data longer than the tensors", "trailing_data.safetensors",
           "{" META T("a", "F32", "[2]", 0, 8) "}", REAL, 12, "4 bytes unaccounted");
    refuse("unknown dtype", "i64.safetensors", "{" META T("a", "I64", "[1]", 0, 8) "}", REAL, 8,
           "unknown dtype 'I64'");
    refuse("size mismatch shape vs offsets", "model-00001-of-00002.safetensors",
           "{" META T("model.embed_tokens.weight", "F32", "[10,4]", 0, 100) "}", REAL, 100,
           "tensor 'model.embed_tokens.weight': data_offsets [0, 100] hold 100 bytes but shape "
           "[10, 4] of F32 "
           "needs 160");
    refuse("duplicate name", "dup.safetensors",
           "{" META T("a", "F32", "[2]", 0, 8) "," T("a", "F32", "[2]", 8, 16) "}", REAL, 16,
           "duplicate tensor name 'a'");
    // a key twice inside an entry or __metadata__: cJSON reads the first, Python's json the last
    refuse("a key twice in an entry", "dup_dtype.safetensors",
           "{" META "\"a\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[2],"
           "\"data_offsets\":[0,8]}}",
           REAL, 8, "key \"dtype\" appears twice in a");
    refuse(
        "a key twice in __metadata__", "dup_meta.safetensors",
        "{\"__metadata__\":{\"format\":\"pt\",\"format\":\"np\"}," T("a", "F32", "[2]", 0, 8) "}",
        REAL, 8, "key \"format\" appears twice in __metadata__");
    refuse("entry missing data_offsets", "no_offsets.safetensors",
           "{" META "\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", REAL, 8,
           "tensor 'a': missing 'data_offsets'");
    refuse("entry missing dtype", "no_dtype.safetensors",
           "{" META "\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", REAL, 8,
           "tensor 'a': missing 'dtype'");
    refuse("entry missing shape", "no_shape.safetensors",
           "{" META "\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", REAL, 8,
           "tensor 'a': missing 'shape'");
    refuse("entry not an object", "not_obj.safetensors", "{" META "\"a\":5}", REAL, 0,
           "'a': entry is not an object");
    refuse("negative dim", "neg_dim.safetensors", "{" META T("a", "F32", "[-1]", 0, 0) "}", REAL, 0,
           "shape[0] is not a non-negative integer");
    refuse("fractional dim", "frac_dim.safetensors", "{" META T("a", "F32", "[1.5]", 0, 6) "}",
           REAL, 6, "shape[0] is not a non-negative integer");
    refuse("too many dims", "nine_dims.safetensors",
           "{" META T("a", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", REAL, 4, "9 dims, more than 8");
    refuse("offsets not a pair", "offsets3.safetensors",
           "{" META "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}", REAL, 8,
           "'data_offsets' is not [begin, end]");
    refuse("offsets reversed", "reversed.safetensors", "{" META T("a", "F32", "[0]", 8, 0) "}",
           REAL, 8, "end before they begin");
    refuse("dtype not a string", "dtype_num.safetensors",
           "{" META "\"a\":{\"dtype\":1,\"shape\":[2],\"data_offsets\":[0,8]}}", REAL, 8,
           "'dtype' is not a string");
    refuse("__metadata__ value not a string", "meta_num.safetensors",
           "{\"__metadata__\":{\"format\":1}," T("a", "F32", "[2]", 0, 8) "}", REAL, 8,
           "'__metadata__' entry 'format' is not a string");
    refuse("__metadata__ not an object", "meta_str.safetensors", "{\"__metadata__\":\"pt\"}", REAL,
           0, "'__metadata__' is not an object");
    refuse("shape overflows 64 bits", "overflow.safetensors",
           "{" META T("a", "F32", "[4294967296,4294967296]", 0, 8) "}", REAL, 8, "too large");

    // a NUL byte inside the header
    path_of(path, sizeof path, "nul.safetensors");
    const uint8_t nul[8 + 8] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, ' ', ' ', ' ', ' ', ' '};
    put_bytes(path, nul, sizeof nul);
    expect_refusal("NUL byte in the header", "nul.safetensors", "NUL byte at offset 2");

    // a directory
    path_of(path, sizeof path, "a_dir.safetensors");
    mkdir(path, 0755);
    expect_refusal("a directory", "a_dir.safetensors", "not a regular file");

    // the writer refuses bad arguments and unwritable paths
    float x[2] = {1, 2};
    moe_st_entry dup[2] = {{.name = "a", .data = x, .ndim = 1, .shape = {1}},
                           {.name = "a", .data = x, .ndim = 1, .shape = {1}}};
    path_of(path, sizeof path, "w_dup.safetensors");
    moe_status st = moe_st_write(path, dup, 2, MOE_ST_F32);
    printf("  [writer: duplicate] %s\n", moe_last_error());
    check_true("writer refuses duplicate names",
               st == MOE_EINVAL && strstr(moe_last_error(), "'a'"));
    moe_st_entry bad[1] = {{.name = "a", .data = x, .ndim = 9}};
    st = moe_st_write(path, bad, 1, MOE_ST_F32);
    printf("  [writer: ndim 9] %s\n", moe_last_error());
    check_true("writer refuses ndim 9", st == MOE_EINVAL);
    moe_st_entry meta[1] = {{.name = "__metadata__", .data = x, .ndim = 1, .shape = {1}}};
    check_true("writer refuses the name __metadata__",
               moe_st_write(path, meta, 1, MOE_ST_F32) == MOE_EINVAL);
    path_of(path, sizeof path, "no_such_dir/w.safetensors");
    st = moe_st_write(path, dup, 1, MOE_ST_F32);
    printf("  [writer: no folder] %s\n", moe_last_error());
    check_true("writer: unwritable path is MOE_EIO naming it",
               st == MOE_EIO && strstr(moe_last_error(), "no_such_dir/w.safetensors"));
}

// ---- CRC-32 ------------------------------------------------------------------------------

static void test_crc32(void) {
    printf("CRC-32\n");
    const char *v = "123456789";
    check_true("crc32('123456789') = 0xCBF43926", moe_crc32_update(0, v, 9) == 0xCBF43926u);
    check_true("crc32('') = 0", moe_crc32_update(0, "", 0) == 0);
    check_true("crc32('a') = 0xE8B7BE43", moe_crc32_update(0, "a", 1) == 0xE8B7BE43u);
    int chain = 1;
    for (size_t k = 0; k <= 9; k++)
        chain &= moe_crc32_update(moe_crc32_update(0, v, k), v + k, 9 - k) == 0xCBF43926u;
    check_true("chaining at every split point", chain);

    char path[1024];
    path_of(path, sizeof path, "crc.safetensors");
    float x[300];
    for (int i = 0; i < 300; i++) x[i] = (float)i / 7.0f;
    moe_st_entry e[1] = {{.name = "x", .data = x, .ndim = 2, .shape = {20, 15}}};
    check_true("moe_st_write", moe_st_write(path, e, 1, MOE_ST_BF16) == MOE_OK);
    size_t len;
    uint8_t *raw = slurp(path, &len);
    uint32_t c = 1;
    check_true("moe_file_crc32 ok", moe_file_crc32(path, &c) == MOE_OK);
    check_true("moe_file_crc32 = moe_crc32_update of the bytes",
               c == moe_crc32_update(0, raw, len));
    free(raw);

    path_of(path, sizeof path, "crc_missing.bin");
    moe_status st = moe_file_crc32(path, &c);
    printf("  [missing] %s\n", moe_last_error());
    check_true("moe_file_crc32 of a missing file: MOE_EIO naming it",
               st == MOE_EIO && strstr(moe_last_error(), "crc_missing.bin"));
}

// ---- conversions -------------------------------------------------------------------------

static int f16_is_nan(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu); }
static int bf16_is_nan(uint16_t h) { return (h & 0x7F80u) == 0x7F80u && (h & 0x7Fu); }

static void test_convert(void) {
    printf("conversions\n");
    // bfloat16
    check_true("bf16(0) = 0x0000", moe_f32_to_bf16(0.0f) == 0x0000);
    check_true("bf16(-0) = 0x8000", moe_f32_to_bf16(-0.0f) == 0x8000);
    check_true("bf16(1) = 0x3F80", moe_f32_to_bf16(1.0f) == 0x3F80);
    check_true("bf16(65504) = 0x4780 (65536)", moe_f32_to_bf16(65504.0f) == 0x4780);
    check_true("bf16(inf), bf16(-inf)",
               moe_f32_to_bf16(INFINITY) == 0x7F80 && moe_f32_to_bf16(-INFINITY) == 0xFF80);
    check_true("bf16(NaN) is a quiet NaN",
               bf16_is_nan(moe_f32_to_bf16(NAN)) && (moe_f32_to_bf16(NAN) & 0x40));
    check_true("bf16(NaN, low payload only) stays NaN",
               bf16_is_nan(moe_f32_to_bf16(from_bits(0x7F800001u))));
    check_true("bf16(-NaN) keeps its sign", moe_f32_to_bf16(from_bits(0xFF800001u)) & 0x8000);
    check_true("bf16 tie 1+2^-8 -> 1 (even)", moe_f32_to_bf16(from_bits(0x3F808000u)) == 0x3F80);
    check_true("bf16 tie 0x3F818000 -> 0x3F82 (even)",
               moe_f32_to_bf16(from_bits(0x3F818000u)) == 0x3F82);
    check_true("bf16 just above a tie rounds up",
               moe_f32_to_bf16(from_bits(0x3F808001u)) == 0x3F81);
    check_true("bf16 just below a tie rounds down",
               moe_f32_to_bf16(from_bits(0x3F807FFFu)) == 0x3F80);
    check_true("bf16(FLT_MAX) overflows to inf", moe_f32_to_bf16(from_bits(0x7F7FFFFFu)) == 0x7F80);
    float b8 = moe_bf16_to_f32(moe_f32_to_bf16(1e-8f));
    check_true("bf16(1e-8) within 2^-9", fabsf(b8 - 1e-8f) <= 1e-8f / 512);
    check_true("bf16 denormal kept", moe_f32_to_bf16(from_bits(0x00010000u)) == 0x0001);
    check_true("moe_bf16_to_f32(0x3FC0) = 1.5", moe_bf16_to_f32(0x3FC0) == 1.5f);

    // float16
    check_true("f16(0) = 0x0000", moe_f32_to_f16(0.0f) == 0x0000);
    check_true("f16(-0) = 0x8000", moe_f32_to_f16(-0.0f) == 0x8000);
    check_true("f16(1) = 0x3C00", moe_f32_to_f16(1.0f) == 0x3C00);
    check_true("f16(-2) = 0xC000", moe_f32_to_f16(-2.0f) == 0xC000);
    check_true("f16(65504) = 0x7BFF", moe_f32_to_f16(65504.0f) == 0x7BFF);
    check_true("f16(65519.99) = 0x7BFF", moe_f32_to_f16(65519.99f) == 0x7BFF);
    check_true("f16(65520) = inf (tie to even)", moe_f32_to_f16(65520.0f) == 0x7C00);
    check_true("f16(1e5) = inf, f16(-1e5) = -inf",
               moe_f32_to_f16(1e5f) == 0x7C00 && moe_f32_to_f16(-1e5f) == 0xFC00);
    check_true("f16(inf), f16(-inf)",
               moe_f32_to_f16(INFINITY) == 0x7C00 && moe_f32_to_f16(-INFINITY) == 0xFC00);
    check_true("f16(NaN) is a quiet NaN",
               f16_is_nan(moe_f32_to_f16(NAN)) && (moe_f32_to_f16(NAN) & 0x200));
    check_true("f16(NaN, low payload only) stays NaN",
               f16_is_nan(moe_f32_to_f16(from_bits(0x7F800001u))));
    check_true("f16(1e-8) = 0 (below half the smallest subnormal)",
               moe_f32_to_f16(1e-8f) == 0x0000);
    check_true("f16(-1e-8) = -0", moe_f32_to_f16(-1e-8f) == 0x8000);
    check_true("f16(2^-24) = 0x0001", moe_f32_to_f16(ldexpf(1, -24)) == 0x0001);
    check_true("f16(2^-25) = 0 (tie to even)", moe_f32_to_f16(ldexpf(1, -25)) == 0x0000);
    check_true("f16(2^-25 + ulp) = 0x0001",
               moe_f32_to_f16(from_bits(to_bits(ldexpf(1, -25)) + 1)) == 0x0001);
    check_true("f16(3 * 2^-25) = 0x0002 (tie to even)",
               moe_f32_to_f16(3 * ldexpf(1, -25)) == 0x0002);
    check_true("f16(5 * 2^-25) = 0x0002 (tie to even)",
               moe_f32_to_f16(5 * ldexpf(1, -25)) == 0x0002);
    check_true("f16(6e-8) = 0x0001", moe_f32_to_f16(6e-8f) == 0x0001);
    check_true("f16(1023.5 * 2^-24) = 0x0400 (tie up to the smallest normal)",
               moe_f32_to_f16(1023.5f * ldexpf(1, -24)) == 0x0400);
    check_true("f16(2^-14) = 0x0400", moe_f32_to_f16(ldexpf(1, -14)) == 0x0400);
    check_true("f16 tie 1+2^-11 -> 1 (even)", moe_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3C00);
    check_true("f16 tie 1+3*2^-11 -> 0x3C02 (even)",
               moe_f32_to_f16(1.0f + 3 * ldexpf(1, -11)) == 0x3C02);
    check_true("f16 2049 -> 2048, 2051 -> 2052",
               moe_f32_to_f16(2049.0f) == 0x6800 && moe_f32_to_f16(2051.0f) == 0x6802);
    check_true("moe_f16_to_f32(0x0001) = 2^-24", moe_f16_to_f32(0x0001) == ldexpf(1, -24));
    check_true("moe_f16_to_f32(0x03FF) = 1023 * 2^-24",
               moe_f16_to_f32(0x03FF) == 1023 * ldexpf(1, -24));
    check_true("moe_f16_to_f32(0x7BFF) = 65504", moe_f16_to_f32(0x7BFF) == 65504.0f);
    check_true("moe_f16_to_f32(0x8000) = -0", same_bits(moe_f16_to_f32(0x8000), -0.0f));
    check_true("moe_f16_to_f32(0x7C00) = inf", moe_f16_to_f32(0x7C00) == INFINITY);
    check_true("moe_f16_to_f32(0x7E00) is NaN", isnan(moe_f16_to_f32(0x7E00)));

    // every 16-bit pattern survives f32 and back; NaNs stay NaN
    int f16_ok = 1, bf16_ok = 1;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t x = (uint16_t)h;
        uint16_t y = moe_f32_to_f16(moe_f16_to_f32(x));
        f16_ok &= f16_is_nan(x) ? f16_is_nan(y) && (x & 0x8000) == (y & 0x8000) : y == x;
        uint16_t z = moe_f32_to_bf16(moe_bf16_to_f32(x));
        bf16_ok &= bf16_is_nan(x) ? bf16_is_nan(z) : z == x;
    }
    check_true("all 65536 f16 patterns round trip", f16_ok);
    check_true("all 65536 bf16 patterns round trip", bf16_ok);

    // round to nearest, checked against the exact neighbours on a sweep of float bit patterns
    int near_ok = 1;
    for (uint64_t b = 0; b < 0x100000000ull; b += 40503) {
        float x = from_bits((uint32_t)b);
        if (isnan(x)) continue;
        uint16_t h = moe_f32_to_f16(x);
        double got = moe_f16_to_f32(h), xd = x;
        if (fabs(xd) >= 65520.0) {
            near_ok &= isinf(got) && (got > 0) == (xd > 0);
            continue;
        }
        // neighbours of h (same sign): no other f16 is strictly closer
        uint16_t up = (uint16_t)(h + 1), dn = (uint16_t)(h - 1);
        double err = fabs(got - xd);
        if ((h & 0x7FFF) != 0x7C00 && (up & 0x7FFF) < 0x7C00 && (up & 0x8000) == (h & 0x8000))
            near_ok &= err <= fabs((double)moe_f16_to_f32(up) - xd);
        if ((h & 0x7FFF) != 0 && (dn & 0x8000) == (h & 0x8000))
            near_ok &= err <= fabs((double)moe_f16_to_f32(dn) - xd);
        uint16_t g = moe_f32_to_bf16(x);
        double gb = moe_bf16_to_f32(g);
        if (!isinf(gb)) {
            uint16_t gu = (uint16_t)(g + 1), gd = (uint16_t)(g - 1);
            double eb = fabs(gb - xd);
            if ((gu & 0x7FFF) < 0x7F80 && (gu & 0x8000) == (g & 0x8000))
                near_ok &= eb <= fabs((double)moe_bf16_to_f32(gu) - xd);
            if ((g & 0x7FFF) != 0 && (gd & 0x8000) == (g & 0x8000))
                near_ok &= eb <= fabs((double)moe_bf16_to_f32(gd) - xd);
        }
    }
    check_true("sweep: f16 and bf16 are nearest", near_ok);

#ifdef __FLT16_MAX__
    // the compiler's own IEEE half conversion (F16C or soft-float), where it has one
    int same = 1;
    for (uint64_t b = 0; b < 0x100000000ull; b += 40503) {
        float x = from_bits((uint32_t)b);
        if (isnan(x)) continue;
        _Float16 h = (_Float16)x;
        uint16_t hb;
        memcpy(&hb, &h, sizeof hb);
        same &= hb == moe_f32_to_f16(x) && same_bits((float)h, moe_f16_to_f32(hb));
    }
    check_true("sweep: f16 equals the compiler's _Float16", same);
#endif
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SCRATCH_DIR [roundtrip|hf|errors|crc32|convert|all]\n", argv[0]);
        return 2;
    }
    scratch = argv[1];
    if (mkdir(scratch, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "cannot create %s: %s\n", scratch, strerror(errno));
        return 2;
    }
    const char *what = argc > 2 ? argv[2] : "all";
    int all = strcmp(what, "all") == 0;
    if (all || strcmp(what, "roundtrip") == 0) {
        test_roundtrip_f32();
        test_roundtrip_half(MOE_ST_BF16);
        test_roundtrip_half(MOE_ST_F16);
    }
    if (all || strcmp(what, "hf") == 0) test_hf_file();
    if (all || strcmp(what, "errors") == 0) test_errors();
    if (all || strcmp(what, "crc32") == 0) test_crc32();
    if (all || strcmp(what, "convert") == 0) test_convert();
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
