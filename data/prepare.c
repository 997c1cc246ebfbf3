// The byte tokenizer and corpus preparation: text files and folders -> train.bin, val.bin.
#define _POSIX_C_SOURCE 200809L // opendir, lstat, mkdir, strdup

#include "data/prepare.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/files.h"
#include "data/token_file.h"

// ---- byte tokenizer ----------------------------------------------------------------

void moe_byte_tokenize(int *tokens, const char *text, size_t n) {
    for (size_t i = 0; i < n; i++) tokens[i] = (unsigned char)text[i];
}

moe_status moe_byte_detokenize(char *text, const int *tokens, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= DATA_BYTE_VOCAB_SIZE)
            return moe_error(MOE_EINVAL,
                             "moe_byte_detokenize: token %zu has id %d, outside [0, %d)", i,
                             tokens[i], DATA_BYTE_VOCAB_SIZE);
        text[i] = (char)(unsigned char)tokens[i];
    }
    return MOE_OK;
}

// ---- which files are text ----------------------------------------------------------

int moe_prepare_is_text_name(const char *name) {
    static const char *const names[] = {"Makefile", "README", "LICENSE"};
    static const char *const exts[] = {".c",    ".h",    ".cc",  ".cpp",  ".hpp", ".cu",    ".cuh",
                                       ".py",   ".md",   ".txt", ".rst",  ".cfg", ".conf",  ".ini",
                                       ".toml", ".yaml", ".yml", ".json", ".sh",  ".cmake", ".in"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(name, names[i]) == 0) return 1;
    const char *dot = strrchr(name, '.');
    if (!dot || dot == name) return 0; // no extension, or a dot-file like ".txt"
    for (size_t i = 0; i < sizeof exts / sizeof *exts; i++)
        if (strcmp(dot, exts[i]) == 0) return 1;
    return 0;
}

// ---- the corpus: a growing byte buffer ---------------------------------------------

typedef struct {
    unsigned char *bytes;
    size_t n, cap;
    int n_files;
} corpus;

static moe_status corpus_reserve(corpus *c, size_t extra) {
    if (c->n + extra <= c->cap) return MOE_OK;
    size_t cap = c->cap ? c->cap : (size_t)1 << 16;
    while (cap < c->n + extra) cap *= 2;
    unsigned char *p = realloc(c->bytes, cap);
    if (!p) return moe_error(MOE_ENOMEM, "prepare: cannot grow the corpus to %zu bytes", cap);
    c->bytes = p;
    c->cap = cap;
    return MOE_OK;
}

// Appends the whole file and one '\n'. Reads to EOF rather than trusting the size.
static moe_status corpus_add_file(corpus *c, const char *path) {
    FILE *f; // a regular file (a FIFO would block, /dev/zero never end: data/files.h)
    if (moe_file_open_input(path, "a text source", UINT64_MAX, &f, NULL))
        return errno ? moe_error(MOE_EIO, "prepare: cannot open '%s': %s", path, strerror(errno))
                     : moe_error_context(MOE_EIO, "prepare");
    moe_status s = MOE_OK;
    for (;;) {
        if ((s = corpus_reserve(c, (size_t)1 << 16)) != MOE_OK) break;
        size_t got = fread(c->bytes + c->n, 1, c->cap - c->n, f);
        c->n += got;
        if (got == 0) {
            if (ferror(f)) s = moe_error(MOE_EIO, "prepare: read error in '%s'", path);
            break;
        }
    }
    fclose(f);
    if (s != MOE_OK) return s;
    if ((s = corpus_reserve(c, 1)) != MOE_OK) return s;
    c->bytes[c->n++] = '\n';
    c->n_files++;
    return MOE_OK;
}

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t k = a;
    if (a > 0 && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// Walks `dir` recursively in sorted order (see data_prepare_text for the rules).
static moe_status corpus_add_dir(corpus *c, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return moe_error(MOE_EIO, "prepare: cannot open folder '%s': %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    moe_status s = MOE_OK;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.') continue; // hidden, and "." / ".."
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **p = realloc(names, cap * sizeof *names);
            if (!p) {
                s = moe_error(MOE_ENOMEM, "prepare: out of memory listing '%s'", dir);
                break;
            }
            names = p;
        }
        if (!(names[n] = strdup(e->d_name))) {
            s = moe_error(MOE_ENOMEM, "prepare: out of memory listing '%s'", dir);
            break;
        }
        n++;
    }
    closedir(d);
    if (s == MOE_OK && n > 1) // (names is NULL when n == 0)
        qsort(names, n, sizeof *names, cmp_names);

    for (size_t i = 0; i < n && s == MOE_OK; i++) {
        char *path = join_path(dir, names[i]);
        if (!path) {
            s = moe_error(MOE_ENOMEM, "prepare: out of memory in '%s'", dir);
            break;
        }
        struct stat st;
        if (lstat(path, &st) != 0) {
            s = moe_error(MOE_EIO, "prepare: cannot stat '%s': %s", path, strerror(errno));
        } else if (S_ISDIR(st.st_mode)) {
            if (strncmp(names[i], "build", 5) != 0) s = corpus_add_dir(c, path);
        } else {
            // A symbolic link counts when it points to a regular file (never to a folder).
            int regular = S_ISREG(st.st_mode) ||
                          (S_ISLNK(st.st_mode) && stat(path, &st) == 0 && S_ISREG(st.st_mode));
            if (regular && moe_prepare_is_text_name(names[i]) &&
                (uint64_t)st.st_size <= DATA_PREPARE_MAX_FILE_BYTES)
                s = corpus_add_file(c, path);
        }
        free(path);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return s;
}

// Writes bytes [0, n) as a vocab-256 token file.
static moe_status write_bytes(const char *dir, const char *name, const unsigned char *bytes,
                              size_t n) {
    char *path = join_path(dir, name);
    uint32_t *tokens = malloc(n ? n * sizeof *tokens : 1);
    if (!path || !tokens) {
        free(path);
        free(tokens);
        return moe_error(MOE_ENOMEM, "prepare: cannot allocate %zu tokens for '%s'", n, name);
    }
    for (size_t i = 0; i < n; i++) tokens[i] = bytes[i]; // the byte tokenizer
    moe_status s = moe_token_file_write(path, tokens, n, DATA_BYTE_VOCAB_SIZE);
    free(tokens);
    free(path);
    return s;
}

moe_status data_prepare_text(const char *const *sources, int n_sources, const char *out_dir,
                             double val_fraction, uint64_t *n_train, uint64_t *n_val) {
    if (n_train) *n_train = 0;
    if (n_val) *n_val = 0;
    if (!sources || n_sources < 1) return moe_error(MOE_EINVAL, "prepare: no text sources given");
    if (!out_dir || !*out_dir) return moe_error(MOE_EINVAL, "prepare: no output folder given");
    if (!(val_fraction > 0 && val_fraction <= 0.5)) // also refuses NaN
        return moe_error(MOE_EINVAL, "prepare: val_fraction %g is not in (0, 0.5]", val_fraction);
    // Check every source before reading any, so a typo fails fast.
    for (int i = 0; i < n_sources; i++) {
        struct stat st;
        if (!sources[i] || stat(sources[i], &st) != 0)
            return moe_error(MOE_EIO, "prepare: source '%s' does not exist",
                             sources[i] ? sources[i] : "(null)");
        if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
            return moe_error(MOE_EINVAL, "prepare: source '%s' is neither a file nor a folder",
                             sources[i]);
    }

    corpus c = {0};
    moe_status s = MOE_OK;
    for (int i = 0; i < n_sources && s == MOE_OK; i++) {
        struct stat st;
        if (stat(sources[i], &st) != 0)
            s = moe_error(MOE_EIO, "prepare: source '%s' disappeared: %s", sources[i],
                          strerror(errno));
        else if (S_ISDIR(st.st_mode))
            s = corpus_add_dir(&c, sources[i]);
        else
            s = corpus_add_file(&c, sources[i]);
    }
    if (s == MOE_OK && c.n_files == 0)
        s = moe_error(MOE_EINVAL, "prepare: no text found in %d source(s) (first: '%s')", n_sources,
                      sources[0]);

    size_t nv = (size_t)((double)c.n * val_fraction), nt = c.n - nv;
    if (s == MOE_OK && (nv < 2 || nt < 2))
        s = moe_error(MOE_EINVAL,
                      "prepare: too few tokens: %zu bytes of text in '%s'%s give %zu train and "
                      "%zu validation tokens at val_fraction %g; each split needs at least 2",
                      c.n, sources[0], n_sources > 1 ? " and the other sources" : "", nt, nv,
                      val_fraction);
    if (s == MOE_OK && (s = moe_file_make_dirs(out_dir))) moe_error_context(s, "prepare");
    if (s == MOE_OK) s = write_bytes(out_dir, "train.bin", c.bytes, nt);
    if (s == MOE_OK) s = write_bytes(out_dir, "val.bin", c.bytes + nt, nv);
    free(c.bytes);
    if (s == MOE_OK) {
        if (n_train) *n_train = nt;
        if (n_val) *n_val = nv;
    }
    return s;
}
