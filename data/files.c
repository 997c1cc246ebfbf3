// Files a user names, and whole small files (see files.h).
#define _POSIX_C_SOURCE 200809L // fsync, fileno

#include "data/files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/json_check.h"

// What st_mode is, for "not a regular file (...)".
static const char *file_kind(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a file";
}

// A cap in words: "16 MiB", "64 GiB" (whole units only), else the bytes.
static void cap_words(char *buf, size_t size, uint64_t n) {
    if (n >= (1ull << 30) && n % (1ull << 30) == 0)
        snprintf(buf, size, "%llu GiB", (unsigned long long)(n >> 30));
    else if (n >= (1ull << 20) && n % (1ull << 20) == 0)
        snprintf(buf, size, "%llu MiB", (unsigned long long)(n >> 20));
    else
        snprintf(buf, size, "%llu bytes", (unsigned long long)n);
}

static moe_status too_large(const char *path, const char *what, uint64_t n, uint64_t max) {
    char cap[32];
    cap_words(cap, sizeof cap, max);
    return moe_error(MOE_EIO, "%s: is %llu bytes, more than the %llu (%s) %s file may have", path,
                     (unsigned long long)n, (unsigned long long)max, cap, what);
}

moe_status moe_file_open_input(const char *path, const char *what, uint64_t max, FILE **out,
                               uint64_t *size) {
    *out = NULL;
    // O_NONBLOCK: opening a FIFO does not wait for a writer (it is refused below)
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        const int e = errno;
        moe_status st = moe_error(MOE_EIO, "%s: cannot read: %s", path, strerror(e));
        errno = e;
        return st;
    }
    struct stat sb;
    moe_status st = MOE_OK;
    if (fstat(fd, &sb) != 0)
        st = moe_error(MOE_EIO, "%s: cannot read: %s", path, strerror(errno));
    else if (S_ISDIR(sb.st_mode))
        st = moe_error(MOE_EIO, "%s: cannot read: %s", path, strerror(EISDIR));
    else if (!S_ISREG(sb.st_mode))
        st = moe_error(MOE_EIO, "%s: not a regular file (%s): %s must be a regular file", path,
                       file_kind(sb.st_mode), what);
    else if ((uint64_t)sb.st_size > max)
        st = too_large(path, what, (uint64_t)sb.st_size, max);
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0 ||
             !(*out = fdopen(fd, "rb")))
        st = moe_error(MOE_EIO, "%s: cannot read: %s", path, strerror(errno));
    if (st) {
        close(fd);
        errno = 0; // (not an open() failure)
        return st;
    }
    if (size) *size = (uint64_t)sb.st_size;
    return MOE_OK;
}

moe_status moe_file_read_input(const char *path, const char *what, size_t max, int text, char **out,
                               size_t *len) {
    *out = NULL;
    FILE *f;
    uint64_t size;
    moe_status st = moe_file_open_input(path, what, max, &f, &size);
    if (st) return st;
    size_t cap = (size_t)size + 2, n = 0; // room to see one byte more than fstat said
    char *s = malloc(cap);
    while (s) {
        n += fread(s + n, 1, cap - 1 - n, f);
        if (n > max || ferror(f) || feof(f) || n < cap - 1) break;
        cap = cap * 2 > max + 2 ? max + 2 : cap * 2; // it grew since fstat
        char *t = realloc(s, cap);
        if (!t) free(s);
        s = t;
    }
    if (!s) {
        fclose(f);
        return moe_error(MOE_ENOMEM, "%s: out of memory reading it", path);
    }
    const int bad = ferror(f);
    fclose(f);
    if (bad || n > max) {
        free(s);
        return bad ? moe_error(MOE_EIO, "%s: read error", path) : too_large(path, what, n, max);
    }
    s[n] = 0;
    const char *nul = text ? memchr(s, 0, n) : NULL;
    if (nul) {
        const size_t at = (size_t)(nul - s);
        free(s);
        return moe_error(MOE_EINVAL, "%s: contains a NUL byte at offset %zu: not %s file", path, at,
                         what);
    }
    *out = s;
    if (len) *len = n;
    return MOE_OK;
}

moe_status moe_file_read_all(const char *path, size_t max, char **out, size_t *len) {
    return moe_file_read_input(path, "a file", max, 0, out, len);
}

#define FILE_LINES_BLOCK ((size_t)1 << 16)

moe_status moe_file_lines_open(moe_file_lines *r, const char *path, const char *what,
                               uint64_t max_file, size_t max_line) {
    memset(r, 0, sizeof *r);
    r->path = path;
    r->max_line = max_line;
    moe_status st = moe_file_open_input(path, what, max_file, &r->f, NULL);
    if (st) return st;
    if (!(r->block = malloc(FILE_LINES_BLOCK)) || !(r->line = malloc(r->cap = 256))) {
        moe_file_lines_close(r);
        return moe_error(MOE_ENOMEM, "%s: out of memory", path);
    }
    return MOE_OK;
}

// Appends n bytes to the line, within max_line.
static int line_append(moe_file_lines *r, const char *p, size_t n, moe_status *st) {
    if (r->len + n > r->max_line) {
        *st = moe_error(MOE_EIO, "%s:%ld: line longer than %zu bytes", r->path, r->lineno,
                        r->max_line);
        return -1;
    }
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap;
        while (cap < r->len + n + 1) cap *= 2;
        char *t = realloc(r->line, cap);
        if (!t) {
            *st = moe_error(MOE_ENOMEM, "%s:%ld: out of memory", r->path, r->lineno);
            return -1;
        }
        r->line = t, r->cap = cap;
    }
    memcpy(r->line + r->len, p, n);
    r->len += n;
    return 0;
}

int moe_file_lines_next(moe_file_lines *r, moe_status *st) {
    *st = MOE_OK;
    r->len = 0;
    r->has_newline = 0;
    r->lineno++;
    for (;;) {
        if (r->pos == r->end) {
            r->pos = 0;
            r->end = fread(r->block, 1, FILE_LINES_BLOCK, r->f);
            if (r->end == 0) {
                if (ferror(r->f)) {
                    *st = moe_error(MOE_EIO, "%s: read error", r->path);
                    return -1;
                }
                if (r->len == 0) return 0; // the end
                break;                     // a last line without its newline
            }
        }
        const char *p = r->block + r->pos, *nl = memchr(p, '\n', r->end - r->pos);
        const size_t n = nl ? (size_t)(nl - p) : r->end - r->pos;
        if (line_append(r, p, n, st)) return -1;
        r->pos += n + (nl != NULL);
        if (nl) {
            r->has_newline = 1;
            break;
        }
    }
    r->line[r->len] = 0;
    const char *nul = memchr(r->line, 0, r->len);
    if (nul) {
        *st = moe_error(MOE_EIO, "%s:%ld: NUL byte at column %zu", r->path, r->lineno,
                        (size_t)(nul - r->line) + 1);
        return -1;
    }
    return 1;
}

void moe_file_lines_close(moe_file_lines *r) {
    if (r->f) fclose(r->f);
    free(r->line), free(r->block);
    memset(r, 0, sizeof *r);
}

moe_status moe_file_write_synced(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return moe_error(MOE_EIO, "%s: cannot write: %s", path, strerror(errno));
    int ok = fwrite(data, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0) ok = 0;
    return ok ? MOE_OK : moe_error(MOE_EIO, "%s: write failed: %s", path, strerror(errno));
}

moe_status moe_file_read_json_object(const char *path, size_t max, cJSON **out) {
    char *text;
    *out = NULL;
    moe_status st = moe_file_read_input(path, "a JSON", max, 1, &text, NULL);
    if (st) return st;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return moe_error(MOE_EIO, "%s: not a JSON object (parse error)", path);
    }
    if ((st = moe_json_refuse_duplicates(j, path))) { // cJSON takes the first, Python the last
        cJSON_Delete(j);
        return st;
    }
    *out = j;
    return MOE_OK;
}

moe_status moe_file_make_dirs(const char *path) {
    size_t len = strlen(path);
    char *p = malloc(len + 1);
    if (!p) return moe_error(MOE_ENOMEM, "%s: out of memory", path);
    memcpy(p, path, len + 1);
    for (size_t i = 1; i <= len; i++) { // each prefix that ends a component, then the whole
        if (p[i] != '/' && p[i] != '\0') continue;
        const char saved = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            moe_status st = moe_error(MOE_EIO, "%s: cannot create folder: %s", p, strerror(errno));
            free(p);
            return st;
        }
        p[i] = saved;
    }
    free(p);
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return moe_error(MOE_EIO, "%s: exists and is not a folder", path);
    return MOE_OK;
}
