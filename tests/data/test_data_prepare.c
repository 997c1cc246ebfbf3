// Corpus preparation and the byte tokenizer: text -> train.bin + val.bin -> the same bytes,
// the folder walk's rules (sorted, hidden/build*/non-text/oversized skipped), refusals.
// Usage: test_data_prepare SCRATCH_DIR
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/prepare.h"
#include "data/token_file.h"
#include "tests/data/data_test.h"

static const char *dir;

static void write_text(const char *path, const char *text) {
    test_write_file(path, text, strlen(text));
}

static void tokenizer(void) {
    printf("byte tokenizer\n");
    char text[256], back[256];
    int tok[256];
    for (int i = 0; i < 256; i++) text[i] = (char)(unsigned char)(255 - i);
    moe_byte_tokenize(tok, text, 256);
    int ok = 1;
    for (int i = 0; i < 256; i++) ok &= tok[i] == 255 - i;
    check_true("token = byte value (0..255, no sign extension)", ok);
    check_true("detokenize ok", moe_byte_detokenize(back, tok, 256) == MOE_OK);
    check_true("round trip of all 256 bytes", memcmp(back, text, 256) == 0);
    tok[7] = 256;
    check_refused("token 256", moe_byte_detokenize(back, tok, 256), NULL, "token 7 has id 256");
    tok[7] = -1;
    check_refused("token -1", moe_byte_detokenize(back, tok, 256), NULL, "token 7 has id -1");
}

static void text_names(void) {
    printf("text file names\n");
    const char *yes[] = {"a.c",  "a.h",   "k.cu",   "README.md", "notes.txt", "CMakeLists.txt",
                         "x.py", "m.cfg", "run.sh", "f.cmake",   "Makefile",  "LICENSE"};
    const char *no[] = {"a.bin", "a.o", "img.png", "train", ".txt", "a.c.orig", "libx.so"};
    int ok = 1;
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) ok &= moe_prepare_is_text_name(yes[i]);
    check_true("text names taken", ok);
    ok = 1;
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) ok &= !moe_prepare_is_text_name(no[i]);
    check_true("other names skipped", ok);
}

// Reads a token file back as bytes (vocab 256 expected); returns the byte count or -1.
static long read_bytes(const char *path, unsigned char *out, size_t cap) {
    moe_token_file tf;
    if (moe_token_file_read(&tf, path) != MOE_OK) {
        printf("  %s\n", moe_last_error());
        return -1;
    }
    long n = (long)tf.count;
    check_true("vocab 256, u16 tokens", tf.vocab_size == 256 && tf.dtype == 2);
    if (tf.count > cap) n = -1;
    for (long i = 0; i < n; i++) out[i] = (unsigned char)tf.tokens[i];
    moe_token_file_free(&tf);
    return n;
}

static void round_trip(void) {
    printf("prepare: folder walk + explicit file -> train.bin + val.bin -> same bytes\n");
    const char *src = test_path(dir, "src");
    test_mkdirs(test_path(src, "sub/deeper"));
    test_mkdirs(test_path(src, ".git"));
    test_mkdirs(test_path(src, "build-cpu"));
    test_mkdirs(test_path(src, "buildroot"));
    write_text(test_path(src, "b.txt"), "bravo: the second file\n");
    write_text(test_path(src, "a.md"), "# alpha\n\nfirst, after Zeta.py (strcmp order)");
    write_text(test_path(src, "Zeta.py"), "print('zeta')\n");
    write_text(test_path(src, "sub/c.c"), "int c = 3;\n");
    write_text(test_path(src, "sub/deeper/CMakeLists.txt"), "add_library(x x.c)\n");
    write_text(test_path(src, "sub/deeper/utf8.md"), "caf\xc3\xa9 \xe2\x86\x92 \xff bytes\n");
    write_text(test_path(src, "sub/.hidden.txt"), "HIDDEN FILE\n");
    write_text(test_path(src, ".git/config.txt"), "HIDDEN FOLDER\n");
    write_text(test_path(src, "build-cpu/gen.c"), "BUILD FOLDER\n");
    write_text(test_path(src, "buildroot/gen.c"), "BUILD FOLDER 2\n");
    write_text(test_path(src, "data.bin"), "NOT TEXT\n");
    // One byte over the size limit: skipped. (A sparse file: cheap to make.)
    const char *big = test_path(src, "big.txt");
    FILE *f = fopen(big, "wb");
    if (!f || fseek(f, (long)DATA_PREPARE_MAX_FILE_BYTES, SEEK_SET) != 0 || fputc('x', f) == EOF) {
        fprintf(stderr, "test setup: cannot write %s\n", big);
        exit(2);
    }
    fclose(f);
    write_text(test_path(src, "exact.txt"), ""); // empty files still add their '\n'
    unlink(test_path(src, "link.txt"));
    if (symlink("b.txt", test_path(src, "link.txt")) != 0) printf("  (no symlink support)\n");
    unlink(test_path(src, "sub/loop"));
    if (symlink("..", test_path(src, "sub/loop")) != 0) printf("  (no symlink support)\n");
    const char *extra = test_path(dir, "explicit.dat"); // explicit: taken whatever its name
    write_text(extra, "explicit source, any extension");

    const char *expected = "print('zeta')\n\n"                                // Zeta.py
                           "# alpha\n\nfirst, after Zeta.py (strcmp order)\n" // a.md
                           "bravo: the second file\n\n"                       // b.txt
                           "\n"                                               // exact.txt (empty)
                           "bravo: the second file\n\n"                       // link.txt -> b.txt
                           "int c = 3;\n\n"                                   // sub/c.c
                           "add_library(x x.c)\n\n"                  // sub/deeper/CMakeLists.txt
                           "caf\xc3\xa9 \xe2\x86\x92 \xff bytes\n\n" // sub/deeper/utf8.md
                           "explicit source, any extension\n";       // explicit.dat
    size_t n = strlen(expected);

    const char *out = test_path(dir, "out/nested/deeper");
    const char *sources[] = {src, extra};
    uint64_t nt = 0, nv = 0;
    double vf = 0.1;
    moe_status s = data_prepare_text(sources, 2, out, vf, &nt, &nv);
    if (s != MOE_OK) printf("  %s\n", moe_last_error());
    check_true("prepare ok (out dir created)", s == MOE_OK);
    printf("  %zu bytes of text -> train %llu, val %llu\n", n, (unsigned long long)nt,
           (unsigned long long)nv);
    check_true("val = floor(val_fraction * bytes)", nv == (uint64_t)floor(vf * (double)n));
    check_true("train + val = all bytes", nt + nv == n);

    unsigned char *got = malloc(2 * n + 16);
    long a = read_bytes(test_path(out, "train.bin"), got, 2 * n);
    long b = a < 0 ? -1 : read_bytes(test_path(out, "val.bin"), got + a, 2 * n - (size_t)a);
    check_true("token counts match what prepare reported", a == (long)nt && b == (long)nv);
    check_true("train.bin + val.bin == the source text, byte for byte",
               a >= 0 && b >= 0 && (size_t)(a + b) == n && memcmp(got, expected, n) == 0);
    if (a >= 0 && b >= 0 && !((size_t)(a + b) == n && memcmp(got, expected, n) == 0)) {
        got[a + b] = 0;
        printf("  got:\n%s\n", (char *)got);
    }
    free(got);

    // Deterministic: a second run writes identical files.
    const char *out2 = test_path(dir, "out2");
    uint64_t nt2 = 0, nv2 = 0;
    s = data_prepare_text(sources, 2, out2, vf, &nt2, &nv2);
    check_true("second run: same counts", s == MOE_OK && nt2 == nt && nv2 == nv);
}

static void refusals(void) {
    printf("prepare refuses\n");
    const char *out = test_path(dir, "out_bad");
    const char *good = test_path(dir, "good.txt");
    write_text(good, "enough text for both splits, surely\n");
    const char *one[] = {good};
    check_refused("no sources", data_prepare_text(one, 0, out, 0.1, NULL, NULL), NULL,
                  "no text sources");
    const char *missing = test_path(dir, "no_such_file.txt");
    const char *two[] = {good, missing};
    check_refused("missing source", data_prepare_text(two, 2, out, 0.1, NULL, NULL), missing,
                  "does not exist");
    const char *empty = test_path(dir, "empty_dir");
    test_mkdirs(empty);
    const char *e[] = {empty};
    check_refused("folder without text", data_prepare_text(e, 1, out, 0.1, NULL, NULL), empty,
                  "no text found");
    const char *skipped = test_path(dir, "only_skipped");
    test_mkdirs(test_path(skipped, "build"));
    write_text(test_path(skipped, "build/a.c"), "int a;\n");
    write_text(test_path(skipped, ".a.c"), "int a;\n");
    write_text(test_path(skipped, "a.o"), "int a;\n");
    const char *sk[] = {skipped};
    check_refused("only skipped files", data_prepare_text(sk, 1, out, 0.1, NULL, NULL), skipped,
                  "no text found");
    double bad_vf[] = {0.0, -0.1, 0.51, 1.0, NAN};
    for (int i = 0; i < 5; i++) {
        char what[64];
        snprintf(what, sizeof what, "val_fraction %g", bad_vf[i]);
        check_refused(what, data_prepare_text(one, 1, out, bad_vf[i], NULL, NULL), NULL,
                      "not in (0, 0.5]");
    }
    const char *tiny = test_path(dir, "tiny.txt");
    write_text(tiny, "abc"); // 4 bytes with the '\n': val 1 at 0.25
    const char *t[] = {tiny};
    check_refused("too few tokens", data_prepare_text(t, 1, out, 0.25, NULL, NULL), tiny,
                  "too few tokens");
    check_true("  0.5 of it is enough", data_prepare_text(t, 1, out, 0.5, NULL, NULL) == MOE_OK);
    const char *file_as_dir = test_path(good, "sub");
    check_refused("output under a file", data_prepare_text(one, 1, file_as_dir, 0.1, NULL, NULL),
                  good, "cannot create folder");
}

int main(int argc, char **argv) {
    dir = test_scratch_dir(argc, argv);
    tokenizer();
    text_names();
    round_trip();
    refusals();
    return test_result();
}
