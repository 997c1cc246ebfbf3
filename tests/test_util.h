// Helpers shared by the C tests: the MOEFIX1 fixture reader (written by
// scripts/make_fixtures.py), comparisons with a relative-error bound, a seeded RNG.
#ifndef MOE_TEST_UTIL_H
#define MOE_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char name[64];
    int dtype; // 0 f32, 1 i32, 2 f64
    int ndim;
    int64_t dims[8];
    size_t count;
    double *data; // every dtype converted to double
} fixture_tensor;

typedef struct {
    char path[512];
    int n;
    fixture_tensor *t;
} fixture;

// Reads a fixture; exits with a message naming the file on any malformation.
void fixture_load(fixture *fx, const char *path);
void fixture_free(fixture *fx);
// Tensor by name; exits with a message if absent or if its element count differs
// from `expect_count` (pass 0 to skip the count check).
const fixture_tensor *fixture_get(const fixture *fx, const char *name, size_t expect_count);
// Tensor by name, or NULL if the fixture has none (optional tensors).
const fixture_tensor *fixture_find(const fixture *fx, const char *name);
int fixture_int(const fixture *fx, const char *name);
double fixture_double(const fixture *fx, const char *name);

// A whole file as a NUL-terminated string (malloc'ed), or NULL if it cannot be read.
char *test_read_file(const char *path);

// ||a - b||_2 / ||b||_2 (0 when both are 0).
double rel_err(const double *a, const double *b, size_t n);

// Counts a failed check; test programs return test_failures() != 0.
void check_rel(const char *what, const double *got, const double *want, size_t n, double tol);
void check_true(const char *what, int cond);
int test_failures(void);

// Deterministic RNG (xorshift64*), uniform in [0,1) and standard normal.
typedef struct {
    uint64_t s;
} test_rng;
void rng_seed(test_rng *r, uint64_t seed);
double rng_uniform(test_rng *r);
double rng_normal(test_rng *r);

#endif
