// Small helpers shared by the data/ tests: scratch folders, raw files, refusal checks.
// Checks go through tests/test_util.h (check_true, test_failures).
#ifndef MOE_TESTS_DATA_TEST_H
#define MOE_TESTS_DATA_TEST_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "layers/status.h"
#include "tests/test_util.h"

// mkdir -p for a scratch folder; exits on failure (a broken test setup, not a result).
static inline void test_mkdirs(const char *dir) {
    char p[1024];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0') continue;
        char saved = *s;
        *s = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "test setup: cannot create %s\n", p);
            exit(2);
        }
        if (!(*s = saved)) break;
    }
}

// The scratch folder of a data test's main (its one argument, created); usage: exit 2.
static inline const char *test_scratch_dir(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
        exit(2);
    }
    test_mkdirs(argv[1]);
    return argv[1];
}

// A data test's last line ("all passed" or "FAILED") and its exit status.
static inline int test_result(void) {
    printf("%s\n", test_failures() ? "FAILED" : "all passed");
    return test_failures() != 0;
}

// "<dir>/<name>", kept until the program exits (freed then, so ASan sees no leak).
static char *test_paths_[1024];
static int test_n_paths_;
static inline void test_free_paths_(void) {
    for (int i = 0; i < test_n_paths_; i++) free(test_paths_[i]);
}
static inline const char *test_path(const char *dir, const char *name) {
    if (test_n_paths_ == 0) atexit(test_free_paths_);
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (!p || test_n_paths_ == (int)(sizeof test_paths_ / sizeof *test_paths_)) {
        fprintf(stderr, "test setup: too many paths\n");
        exit(2);
    }
    snprintf(p, n, "%s/%s", dir, name);
    return test_paths_[test_n_paths_++] = p;
}

static inline void test_write_file(const char *path, const void *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(bytes, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "test setup: cannot write %s\n", path);
        exit(2);
    }
}

// A refusal is correct when the code is MOE_EIO or MOE_EINVAL and the message names the
// file (`name`) and contains `keyword` (what is wrong). Prints the message.
static inline void check_refused(const char *what, moe_status s, const char *name,
                                 const char *keyword) {
    const char *msg = moe_last_error();
    printf("  [%s] %s -> %s: %s\n", what, s == MOE_OK ? "ACCEPTED" : "refused", moe_status_name(s),
           msg);
    char label[256];
    snprintf(label, sizeof label, "%s: refused, names file, says '%s'", what,
             keyword ? keyword : "...");
    check_true(label, (s == MOE_EIO || s == MOE_EINVAL) && (!name || strstr(msg, name)) &&
                          (!keyword || strstr(msg, keyword)));
}

#endif
