// Token files: u16/u32 round trips with the header checked byte by byte, and every
// malformation refused with a message that names the file and what is wrong.
// Usage: test_data_token_file SCRATCH_DIR
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/token_file.h"
#include "tests/data/data_test.h"

static const char *dir;

static void put_le(unsigned char *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

// Hand-made token file: header fields as given, then `n_payload` tokens of `tok_bytes`
// bytes each with values from `vals` (or 0..n-1).
static const char *raw_file(const char *name, const char *magic8, uint32_t version, uint32_t dtype,
                            uint64_t count, uint32_t vocab, uint32_t reserved, size_t n_payload,
                            int tok_bytes, const uint32_t *vals) {
    size_t n = 32 + n_payload * (size_t)tok_bytes;
    unsigned char *b = calloc(n, 1);
    memcpy(b, magic8, 8);
    put_le(b + 8, version, 4);
    put_le(b + 12, dtype, 4);
    put_le(b + 16, count, 8);
    put_le(b + 24, vocab, 4);
    put_le(b + 28, reserved, 4);
    for (size_t i = 0; i < n_payload; i++)
        put_le(b + 32 + i * (size_t)tok_bytes, vals ? vals[i] : (uint32_t)i, tok_bytes);
    const char *path = test_path(dir, name);
    test_write_file(path, b, n);
    free(b);
    return path;
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void round_trip(uint32_t vocab, uint64_t n, uint32_t want_dtype) {
    printf("round trip: vocab %u, %llu tokens (expect dtype %u)\n", vocab, (unsigned long long)n,
           want_dtype);
    test_rng r;
    rng_seed(&r, vocab + n);
    uint32_t *tok = malloc((n ? n : 1) * sizeof *tok);
    for (uint64_t i = 0; i < n; i++) tok[i] = (uint32_t)(rng_uniform(&r) * vocab);
    if (n > 2) { // the extremes of the range must survive
        tok[0] = 0;
        tok[n - 1] = vocab - 1;
    }
    char name[64];
    snprintf(name, sizeof name, "rt_%u_%llu.bin", vocab, (unsigned long long)n);
    const char *path = test_path(dir, name);
    moe_status s = moe_token_file_write(path, tok, n, vocab);
    check_true("write ok", s == MOE_OK);
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    check_true("no .tmp left behind", file_size(tmp) == -1);
    check_true("file size = 32 + count * dtype", file_size(path) == (long)(32 + n * want_dtype));

    unsigned char h[32] = {0};
    FILE *f = fopen(path, "rb");
    check_true("header readable", f && fread(h, 1, 32, f) == 32);
    if (f) fclose(f);
    unsigned char want[32] = {'M', 'O', 'E', 'T', 'O', 'K', '1', 0};
    put_le(want + 8, 1, 4);
    put_le(want + 12, want_dtype, 4);
    put_le(want + 16, n, 8);
    put_le(want + 24, vocab, 4);
    check_true("header bytes as specified", memcmp(h, want, 32) == 0);

    moe_token_file tf;
    s = moe_token_file_read(&tf, path);
    check_true("read ok", s == MOE_OK);
    if (s == MOE_OK) {
        check_true("count, vocab, dtype",
                   tf.count == n && tf.vocab_size == vocab && tf.dtype == want_dtype);
        check_true("tokens equal", n == 0 || memcmp(tf.tokens, tok, n * sizeof *tok) == 0);
        check_true("path recorded", strcmp(tf.path, path) == 0);
    } else {
        printf("  %s\n", moe_last_error());
    }
    moe_token_file_free(&tf);
    moe_token_file_free(&tf); // twice is harmless
    free(tok);
}

static void refuse_read(const char *what, const char *path, const char *keyword) {
    moe_token_file tf;
    memset(&tf, 0xAB, sizeof tf);
    moe_status s = moe_token_file_read(&tf, path);
    check_refused(what, s, path, keyword);
    check_true("  nothing left to free", tf.tokens == NULL && tf.count == 0);
    moe_token_file_free(&tf);
}

static void bad_files(void) {
    printf("malformed files are refused\n");
    const char *M = "MOETOK1"; // 8 bytes with the NUL
    uint32_t v[12] = {1, 2, 3, 4, 5, 300, 7, 8, 9, 10, 11, 12};

    refuse_read("missing file", test_path(dir, "does_not_exist.bin"), "cannot open");
    const char *p = test_path(dir, "short.bin");
    test_write_file(p, "MOETOK1\0\1\0\0\0", 12);
    refuse_read("shorter than the header", p, "shorter than the 32-byte header");
    refuse_read("empty file", (test_write_file(p, "", 0), p), "shorter");
    refuse_read("wrong magic", raw_file("magic.bin", "MOETOK2", 1, 2, 4, 300, 0, 4, 2, NULL),
                "wrong magic");
    refuse_read("unknown version", raw_file("version.bin", M, 2, 2, 4, 300, 0, 4, 2, NULL),
                "unknown version 2");
    refuse_read("unknown dtype", raw_file("dtype.bin", M, 1, 3, 4, 300, 0, 4, 3, NULL),
                "unknown token dtype 3");
    refuse_read("dtype 1 (u8) is unknown", raw_file("dtype1.bin", M, 1, 1, 4, 300, 0, 4, 1, NULL),
                "unknown token dtype 1");
    refuse_read("truncated", raw_file("trunc.bin", M, 1, 2, 10, 300, 0, 9, 2, NULL),
                "truncated: header says 10 tokens of 2 bytes = 52 bytes expected, file has 50");
    refuse_read("truncated mid-token", raw_file("trunc4.bin", M, 1, 4, 3, 70000, 0, 5, 2, NULL),
                "truncated");
    refuse_read("trailing bytes", raw_file("trail.bin", M, 1, 2, 10, 300, 0, 11, 2, NULL),
                "trailing bytes after the tokens: header says 10 tokens of 2 bytes = 52 bytes "
                "expected, file has 54");
    refuse_read("one trailing byte", raw_file("trail1.bin", M, 1, 2, 1, 300, 0, 3, 1, NULL),
                "trailing bytes");
    refuse_read("count overflows", raw_file("huge.bin", M, 1, 4, UINT64_MAX, 300, 0, 4, 4, NULL),
                "truncated");
    refuse_read("vocab_size 0", raw_file("vocab0.bin", M, 1, 2, 4, 0, 0, 4, 2, NULL),
                "vocab_size is 0");
    refuse_read("token id >= vocab (u16)", raw_file("oov.bin", M, 1, 2, 12, 300, 0, 12, 2, v),
                "token 5 has id 300 >= vocab_size 300");
    uint32_t big[3] = {69999, 70000, 0};
    refuse_read("token id >= vocab (u32)", raw_file("oov4.bin", M, 1, 4, 3, 70000, 0, 3, 4, big),
                "token 1 has id 70000 >= vocab_size 70000");
    refuse_read("reserved field set", raw_file("reserved.bin", M, 1, 2, 4, 300, 7, 4, 2, NULL),
                "reserved");
    refuse_read("a folder", dir, NULL);

    // A well-formed hand-made file is accepted (the checks above are not over-strict).
    moe_token_file tf;
    moe_status s = moe_token_file_read(&tf, raw_file("good.bin", M, 1, 2, 12, 301, 0, 12, 2, v));
    check_true("hand-made valid file accepted",
               s == MOE_OK && tf.count == 12 && tf.tokens[5] == 300);
    moe_token_file_free(&tf);
}

static void bad_writes(void) {
    printf("the writer refuses bad input\n");
    uint32_t t[4] = {0, 1, 256, 3};
    const char *p = test_path(dir, "w_oov.bin");
    check_refused("token id >= vocab", moe_token_file_write(p, t, 4, 256), p, "token 2 has id 256");
    check_true("  nothing written", file_size(p) == -1);
    check_refused("vocab_size 0", moe_token_file_write(p, t, 4, 0), p, "vocab_size is 0");
    p = test_path(dir, "no_such_dir/x.bin");
    check_refused("folder does not exist", moe_token_file_write(p, t, 2, 256), p, "cannot create");
}

int main(int argc, char **argv) {
    dir = test_scratch_dir(argc, argv);
    round_trip(300, 1000, 2);
    round_trip(256, 0, 2);
    round_trip(65536, 5000, 2); // the largest vocabulary stored as u16 (ids up to 65535)
    round_trip(65537, 5000, 4);
    round_trip(70000, 1000, 4);
    round_trip(4000000000u, 100, 4);
    bad_files();
    bad_writes();
    return test_result();
}
