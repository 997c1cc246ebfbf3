// The replay program: runs LLVMFuzzerTestOneInput once on every file given, and on every
// file of every folder given (sorted by name, so runs are repeatable). It is what gcc builds
// and what ctest runs on the committed corpus; with libFuzzer the same target links
// libFuzzer's own main instead. An input that crashes aborts the run, naming the file first.
#define _POSIX_C_SOURCE 200809L // opendir, stat

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

// The whole file in a malloc'd buffer (*size bytes; never NULL on success).
static uint8_t *read_all(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            uint8_t *bigger = realloc(buf, cap *= 2);
            if (!bigger) free(buf);
            buf = bigger;
        }
    }
    const int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    *size = n;
    return buf;
}

static int run_file(const char *path) {
    size_t size;
    uint8_t *data = read_all(path, &size);
    if (!data) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        return 1;
    }
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, size);
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// Runs every regular file of dir; *count receives how many.
static int run_dir(const char *dir, int *count) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "replay: cannot open %s\n", dir);
        return 1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int bad = 0;
    for (struct dirent *e; !bad && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            char **more = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names);
            if (!more)
                bad = 1;
            else
                names = more;
        }
        if (!bad && !(names[n++] = strdup(e->d_name))) bad = 1, n--;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_name);
    for (size_t i = 0; i < n; i++) {
        char path[FUZZ_PATH_MAX];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (!bad && stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
            bad = run_file(path);
            ++*count;
        }
        free(names[i]);
    }
    free(names);
    return bad;
}

int main(int argc, char **argv) {
    int count = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') continue; // libFuzzer flags: meaningless here
        struct stat sb;
        if (stat(argv[i], &sb) == 0 && S_ISDIR(sb.st_mode)) {
            bad |= run_dir(argv[i], &count);
        } else {
            bad |= run_file(argv[i]);
            count++;
        }
    }
    // An empty corpus would pass while testing nothing.
    if (!count) fprintf(stderr, "replay: no inputs\n");
    fprintf(stderr, "replay: %d inputs, %s\n", count, bad || !count ? "FAILED" : "ok");
    return bad || !count;
}
