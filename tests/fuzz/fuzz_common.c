// Scratch files for the fuzz targets (fuzz.h).
#define _POSIX_C_SOURCE 200809L // mkdtemp, opendir, lstat

#include "fuzz.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char scratch[FUZZ_PATH_MAX];
static FILE *devnull;

_Noreturn void fuzz_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

// Removes path and, for a folder, what it holds (our scratch folders are two levels deep).
static void remove_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return;
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char sub[FUZZ_PATH_MAX];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            remove_tree(sub);
        }
        if (d) closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

static void at_exit(void) {
    if (scratch[0]) remove_tree(scratch);
    if (devnull) fclose(devnull);
}

// The pid in the name lets scripts/fuzz.sh remove folders left by a process that crashed.
static const char *scratch_dir(void) {
    if (scratch[0]) return scratch;
    struct stat sb;
    const char *base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
    char tmpl[FUZZ_PATH_MAX];
    snprintf(tmpl, sizeof tmpl, "%s/moe-fuzz-%ld-XXXXXX", base, (long)getpid());
    if (!mkdtemp(tmpl)) fuzz_fail("cannot create a scratch folder under %s", base);
    snprintf(scratch, sizeof scratch, "%s", tmpl);
    atexit(at_exit);
    return scratch;
}

void fuzz_dir(char *dir, size_t n, const char *sub) {
    snprintf(dir, n, "%s/%s", scratch_dir(), sub);
    if (mkdir(dir, 0700) != 0) {
        struct stat sb;
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) fuzz_fail("cannot create %s", dir);
    }
}

void fuzz_write(char *path, size_t n, const char *dir, const char *name, const uint8_t *data,
                size_t size) {
    snprintf(path, n, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) fuzz_fail("cannot create %s", path);
    const size_t put = size ? fwrite(data, 1, size, f) : 0;
    if (fclose(f) != 0 || put != size) fuzz_fail("cannot write %s", path);
}

void fuzz_clear(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) fuzz_fail("cannot list %s", dir);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char path[FUZZ_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        remove_tree(path);
    }
    closedir(d);
}

FILE *fuzz_devnull(void) {
    if (!devnull && !(devnull = fopen("/dev/null", "w"))) fuzz_fail("cannot open /dev/null");
    return devnull;
}
