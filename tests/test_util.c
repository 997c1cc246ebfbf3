#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

static _Noreturn void fixture_die(const char *path, const char *why) {
    fprintf(stderr, "fixture %s: %s\n", path, why);
    exit(1);
}

static void read_exact(FILE *f, void *buf, size_t n, const char *path, const char *what) {
    if (fread(buf, 1, n, f) != n) {
        char msg[256];
        snprintf(msg, sizeof msg, "truncated while reading %s", what);
        fixture_die(path, msg);
    }
}

void fixture_load(fixture *fx, const char *path) {
    memset(fx, 0, sizeof *fx);
    snprintf(fx->path, sizeof fx->path, "%s", path);
    FILE *f = fopen(path, "rb");
    if (!f) fixture_die(path, "cannot open (run scripts/make_fixtures.py?)");
    char magic[8];
    read_exact(f, magic, 8, path, "magic");
    if (memcmp(magic, "MOEFIX1", 8) != 0) fixture_die(path, "bad magic, expected MOEFIX1");
    uint32_t n;
    read_exact(f, &n, 4, path, "tensor count");
    if (n > 4096) fixture_die(path, "implausible tensor count");
    fx->n = (int)n;
    fx->t = calloc(n, sizeof *fx->t);
    for (uint32_t i = 0; i < n; i++) {
        fixture_tensor *t = &fx->t[i];
        uint32_t len, dtype, ndim;
        read_exact(f, &len, 4, path, "name length");
        if (len == 0 || len >= sizeof t->name) fixture_die(path, "bad tensor name length");
        read_exact(f, t->name, len, path, "name");
        read_exact(f, &dtype, 4, path, "dtype");
        read_exact(f, &ndim, 4, path, "ndim");
        if (dtype > 2) fixture_die(path, "unknown dtype");
        if (ndim > 8) fixture_die(path, "too many dimensions");
        t->dtype = (int)dtype;
        t->ndim = (int)ndim;
        t->count = 1;
        for (uint32_t j = 0; j < ndim; j++) {
            read_exact(f, &t->dims[j], 8, path, "dims");
            if (t->dims[j] < 0 || t->dims[j] > (1 << 28)) fixture_die(path, "bad dimension");
            t->count *= (size_t)t->dims[j];
        }
        size_t esz = dtype == 2 ? 8 : 4;
        void *raw = malloc(t->count * esz + 1);
        read_exact(f, raw, t->count * esz, path, t->name);
        t->data = malloc(t->count * sizeof(double) + 1);
        for (size_t j = 0; j < t->count; j++) {
            if (dtype == 0)
                t->data[j] = ((float *)raw)[j];
            else if (dtype == 1)
                t->data[j] = ((int32_t *)raw)[j];
            else
                t->data[j] = ((double *)raw)[j];
        }
        free(raw);
    }
    fclose(f);
}

void fixture_free(fixture *fx) {
    for (int i = 0; i < fx->n; i++) free(fx->t[i].data);
    free(fx->t);
    memset(fx, 0, sizeof *fx);
}

const fixture_tensor *fixture_get(const fixture *fx, const char *name, size_t expect_count) {
    for (int i = 0; i < fx->n; i++) {
        if (strcmp(fx->t[i].name, name) != 0) continue;
        if (expect_count && fx->t[i].count != expect_count) {
            char msg[256];
            snprintf(msg, sizeof msg, "tensor %s has %zu elements, expected %zu", name,
                     fx->t[i].count, expect_count);
            fixture_die(fx->path, msg);
        }
        return &fx->t[i];
    }
    char msg[256];
    snprintf(msg, sizeof msg, "tensor %s missing", name);
    fixture_die(fx->path, msg);
}

const fixture_tensor *fixture_find(const fixture *fx, const char *name) {
    for (int i = 0; i < fx->n; i++)
        if (!strcmp(fx->t[i].name, name)) return &fx->t[i];
    return NULL;
}

int fixture_int(const fixture *fx, const char *name) {
    return (int)fixture_get(fx, name, 1)->data[0];
}

double fixture_double(const fixture *fx, const char *name) {
    return fixture_get(fx, name, 1)->data[0];
}

char *test_read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s) s[fread(s, 1, (size_t)n, f)] = 0;
    fclose(f);
    return s;
}

double rel_err(const double *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}

void check_rel(const char *what, const double *got, const double *want, size_t n, double tol) {
    double e = rel_err(got, want, n);
    int ok = e <= tol; // NaN fails
    printf("  %-40s rel_err %.3e (tol %.0e) %s\n", what, e, tol, ok ? "ok" : "FAIL");
    if (!ok) failures++;
}

void check_true(const char *what, int cond) {
    printf("  %-40s %s\n", what, cond ? "ok" : "FAIL");
    if (!cond) failures++;
}

int test_failures(void) { return failures; }

void rng_seed(test_rng *r, uint64_t seed) { r->s = seed * 0x9E3779B97F4A7C15ull + 1; }

double rng_uniform(test_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (double)((r->s * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
}

double rng_normal(test_rng *r) {
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}
