// The bf16 kernels of the backend (layers/backend.h, DESIGN.md §5b) against references
// computed here in double:
//   - to_bf16 / from_bf16 on hand-picked bit patterns: ties to even, NaN, Inf, overflow,
//     subnormals, signed zero; widening is exact;
//   - matmul_bf16 and the three grouped expert GEMMs on odd sizes, every transpose, beta 0/1,
//     an expert with no rows, random data of the model's scale (weights N(0, 0.02),
//     activations N(0, 1)): (a) against fp32 math on the UNROUNDED operands within 1e-2
//     relative (the bf16 contract), and (b) elementwise against a double GEMM of the
//     bf16-ROUNDED operands within 1e-5 * sum_k |a_ik b_kj| (what fp32 accumulation in any
//     summation order guarantees), which fails if an operand is rounded twice, an
//     accumulation runs in bf16 or a transpose is wrong.
//   - the fused bf16 SwiGLU kernels against the unfused kernels they replace, bit for bit;
//   - the grouped GEMMs' loop (cpu_expert_gemms) hands each GEMM to the library where the
//     library may thread it: outside any parallel region with fewer than four experts per
//     thread, each on one thread of a parallel region with more.
// Every CPU path runs: emulated always, native through OpenBLAS's cblas_sbgemm when the
// OpenBLAS loaded has it (test_gemm_bf16_standin: a stand-in sbgemm, tests/sbgemm_standin.c)
// and through oneDNN's dnnl_gemm_bf16bf16f32 when libdnnl is there and the CPU has bf16
// instructions.
// MOE_TEST_DEVICE=cpu-strict runs the same on strict memory.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlfcn.h>
#include <omp.h>

#include "layers/bf16.h"
#include "layers/cpu/cpu_backend.h"
#include "layers/cpu/cpu_kernels.h"
#include "test_backend.h"
#include "test_util.h"

static moe_backend *be;
static test_rng rng;

static float bits_f(uint32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

// ---- conversions ------------------------------------------------------------------------

static void test_conversions(void) {
    static const struct {
        uint32_t in;
        uint16_t want;
        const char *what;
    } cases[] = {
        {0x3F800000u, 0x3F80, "1.0 exact"},
        {0x3F808000u, 0x3F80, "1 + 2^-8: tie, even stays down"},
        {0x3F818000u, 0x3F82, "1 + 3*2^-8: tie, odd rounds up"},
        {0x3F808001u, 0x3F81, "just above a tie rounds up"},
        {0x3F807FFFu, 0x3F80, "just below a tie rounds down"},
        {0xBF818000u, 0xBF82, "negative tie to even"},
        {0x7F800000u, 0x7F80, "+Inf"},
        {0xFF800000u, 0xFF80, "-Inf"},
        {0x7F7FFFFFu, 0x7F80, "FLT_MAX overflows to +Inf"},
        {0x7F7F7FFFu, 0x7F7F, "largest value that stays finite"},
        {0x7FC00000u, 0x7FC0, "quiet NaN"},
        {0x7F800001u, 0x7FC0, "signalling NaN with a low payload: stays NaN, quiet"},
        {0xFFFFFFFFu, 0xFFFF, "negative NaN keeps its sign"},
        {0x00000000u, 0x0000, "+0"},
        {0x80000000u, 0x8000, "-0"},
        {0x00010000u, 0x0001, "smallest bf16 subnormal exact"},
        {0x00008000u, 0x0000, "subnormal tie to even (down to 0)"},
        {0x00018000u, 0x0002, "subnormal tie to even (up)"},
        {0x00008001u, 0x0001, "subnormal above a tie"},
        {0x007FFFFFu, 0x0080, "largest fp32 subnormal rounds to the smallest normal"},
        {0x80008001u, 0x8001, "negative subnormal"},
    };
    const int n = (int)(sizeof cases / sizeof cases[0]);
    float in[32];
    uint16_t out[32];
    float back[32];
    for (int i = 0; i < n; i++) in[i] = bits_f(cases[i].in);
    float *d_in = be->alloc(be, sizeof in);
    moe_bf16 *d_out = be->alloc(be, sizeof out);
    float *d_back = be->alloc(be, sizeof back);
    be->copy_to_device(be, d_in, in, sizeof in);
    be->to_bf16(be, d_out, d_in, (size_t)n);
    be->from_bf16(be, d_back, d_out, (size_t)n);
    be->copy_to_host(be, out, d_out, sizeof out);
    be->copy_to_host(be, back, d_back, sizeof back);
    for (int i = 0; i < n; i++) {
        char what[160];
        snprintf(what, sizeof what, "to_bf16(0x%08X) = 0x%04X, want 0x%04X: %s", cases[i].in,
                 out[i], cases[i].want, cases[i].what);
        check_true(what, out[i] == cases[i].want);
        uint32_t b;
        memcpy(&b, &back[i], 4);
        snprintf(what, sizeof what, "from_bf16(0x%04X) widens exactly", out[i]);
        check_true(what, b == (uint32_t)out[i] << 16);
    }
    be->free(be, d_in), be->free(be, d_out), be->free(be, d_back);
    // the host helper is the same function the kernels use: spot-check it on random values
    // against a rounding written differently (nearest of the two neighbours, ties to even)
    for (int i = 0; i < 100000; i++) {
        const float x = (float)(rng_normal(&rng) * pow(2.0, (int)(rng_uniform(&rng) * 60) - 30));
        uint32_t b;
        memcpy(&b, &x, 4);
        const uint32_t lo = b & 0xFFFF0000u, hi = lo + 0x10000u;
        const double dlo = fabs((double)bits_f(lo) - x), dhi = fabs((double)bits_f(hi) - x);
        const uint32_t want = dlo < dhi ? lo : dhi < dlo ? hi : ((lo >> 16) & 1) ? hi : lo;
        if (moe_f32_to_bf16(x) != (uint16_t)(want >> 16)) {
            check_true("random value rounds to the nearest bf16, ties to even", 0);
            break;
        }
    }
}

// ---- GEMMs ---------------------------------------------------------------------------

typedef struct {
    float *f;    // [n] the fp32 values (host)
    uint16_t *h; // [n] their bf16 (host, rounded here with the shared helper)
    moe_bf16 *d; // [n] device copy of h
    size_t n;
} operand;

static operand make_operand(size_t n, double scale) {
    operand o = {malloc(n * 4 + 4), malloc(n * 2 + 2), be->alloc(be, n * 2 + 2), n};
    for (size_t i = 0; i < n; i++) {
        o.f[i] = (float)(scale * rng_normal(&rng));
        o.h[i] = moe_f32_to_bf16(o.f[i]);
    }
    be->copy_to_device(be, o.d, o.h, n * 2);
    return o;
}
static void free_operand(operand *o) { free(o->f), free(o->h), be->free(be, o->d); }
static double rnd(const operand *o, size_t i) { return moe_bf16_to_f32(o->h[i]); }

// Compares got [n] (host) with the references: want_f the GEMM of the unrounded fp32 values
// (double), want_r of the rounded ones, mag the sums of |products|.
static void compare(const char *what, const float *got, const double *want_f, const double *want_r,
                    const double *mag, size_t n) {
    double *g = malloc(n * sizeof *g);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        g[i] = got[i];
        if (!(fabs(got[i] - want_r[i]) <= 1e-5 * mag[i] + 1e-30)) bad++;
    }
    char w[200];
    snprintf(w, sizeof w, "%s: vs fp32 math on unrounded operands", what);
    check_rel(w, g, want_f, n, 1e-2);
    snprintf(w, sizeof w, "%s: every element within fp32 accumulation of the bf16 GEMM (%d bad)",
             what, bad);
    check_true(w, bad == 0);
    free(g);
}

static void test_matmul(int m, int n, int kd, int ta, int tb, float beta) {
    operand a = make_operand((size_t)m * kd, 1.0), b = make_operand((size_t)kd * n, 0.02);
    const size_t mn = (size_t)m * n;
    float *c0 = malloc(mn * 4), *c = malloc(mn * 4);
    double *wf = malloc(mn * 8), *wr = malloc(mn * 8), *mag = malloc(mn * 8);
    for (size_t i = 0; i < mn; i++) c0[i] = (float)rng_normal(&rng);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double sf = 0, sr = 0, sm = 0;
            for (int p = 0; p < kd; p++) {
                const size_t ia = ta ? (size_t)p * m + i : (size_t)i * kd + p;
                const size_t ib = tb ? (size_t)j * kd + p : (size_t)p * n + j;
                sf += (double)a.f[ia] * b.f[ib];
                sr += rnd(&a, ia) * rnd(&b, ib);
                sm += fabs(rnd(&a, ia) * rnd(&b, ib));
            }
            const size_t o = (size_t)i * n + j;
            wf[o] = sf + beta * c0[o], wr[o] = sr + beta * c0[o];
            mag[o] = sm + fabs(beta * c0[o]);
        }
    float *dc = be->alloc(be, mn * 4);
    be->copy_to_device(be, dc, c0, mn * 4);
    be->matmul_bf16(be, dc, a.d, b.d, m, n, kd, ta, tb, beta);
    be->copy_to_host(be, c, dc, mn * 4);
    char what[120];
    snprintf(what, sizeof what, "matmul_bf16 %dx%dx%d trans %d%d beta %g", m, n, kd, ta, tb,
             (double)beta);
    compare(what, c, wf, wr, mag, mn);
    be->free(be, dc);
    free(c0), free(c), free(wf), free(wr), free(mag);
    free_operand(&a), free_operand(&b);
}

// The three grouped GEMMs over experts with these row counts (one of them empty).
static void test_experts(const int *rows, int E, int n_out, int n_in) {
    int offsets[16] = {0};
    for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + rows[e];
    const int N = offsets[E];
    operand x = make_operand((size_t)N * n_in, 1.0),
            w = make_operand((size_t)E * n_out * n_in, 0.02),
            dy = make_operand((size_t)N * n_out, 0.1);
    const size_t ny = (size_t)N * n_out, nx = (size_t)N * n_in, nw = (size_t)E * n_out * n_in;
    size_t nmax = ny > nx ? ny : nx;
    nmax = nmax > nw ? nmax : nw;
    float *init = malloc(nmax * 4), *got = malloc(nmax * 4), *dbuf = be->alloc(be, nmax * 4);
    double *wf = malloc(nmax * 8), *wr = malloc(nmax * 8), *mag = malloc(nmax * 8);
    for (size_t i = 0; i < nmax; i++) init[i] = (float)(0.1 * rng_normal(&rng));
    char what[120];
    // forward: y[r] = x[r] w_e^T
    for (int e = 0; e < E; e++)
        for (int r = offsets[e]; r < offsets[e + 1]; r++)
            for (int o = 0; o < n_out; o++) {
                double sf = 0, sr = 0, sm = 0;
                for (int i = 0; i < n_in; i++) {
                    const size_t ix = (size_t)r * n_in + i, iw = ((size_t)e * n_out + o) * n_in + i;
                    sf += (double)x.f[ix] * w.f[iw], sr += rnd(&x, ix) * rnd(&w, iw);
                    sm += fabs(rnd(&x, ix) * rnd(&w, iw));
                }
                const size_t k = (size_t)r * n_out + o;
                wf[k] = sf, wr[k] = sr, mag[k] = sm;
            }
    be->copy_to_device(be, dbuf, init, ny * 4); // overwritten, not accumulated
    be->expert_matmul_forward_bf16(be, dbuf, x.d, w.d, offsets, E, n_out, n_in);
    be->copy_to_host(be, got, dbuf, ny * 4);
    snprintf(what, sizeof what, "expert_matmul_forward_bf16 E=%d %dx%d", E, n_out, n_in);
    compare(what, got, wf, wr, mag, ny);
    // backward input: dx[r] (+)= dy[r] w_e, both modes
    for (int acc = 0; acc < 2; acc++) {
        for (int e = 0; e < E; e++)
            for (int r = offsets[e]; r < offsets[e + 1]; r++)
                for (int i = 0; i < n_in; i++) {
                    const size_t k = (size_t)r * n_in + i;
                    double sf = acc ? init[k] : 0, sr = sf, sm = fabs(sf);
                    for (int o = 0; o < n_out; o++) {
                        const size_t id = (size_t)r * n_out + o,
                                     iw = ((size_t)e * n_out + o) * n_in + i;
                        sf += (double)dy.f[id] * w.f[iw], sr += rnd(&dy, id) * rnd(&w, iw);
                        sm += fabs(rnd(&dy, id) * rnd(&w, iw));
                    }
                    wf[k] = sf, wr[k] = sr, mag[k] = sm;
                }
        be->copy_to_device(be, dbuf, init, nx * 4);
        be->expert_matmul_backward_input_bf16(be, dbuf, dy.d, w.d, offsets, E, n_out, n_in, acc);
        be->copy_to_host(be, got, dbuf, nx * 4);
        snprintf(what, sizeof what, "expert_matmul_backward_input_bf16 accumulate=%d", acc);
        compare(what, got, wf, wr, mag, nx);
    }
    // backward weight: dw_e += dy_e^T x_e (an expert without rows keeps its gradient)
    for (int e = 0; e < E; e++)
        for (int o = 0; o < n_out; o++)
            for (int i = 0; i < n_in; i++) {
                const size_t k = ((size_t)e * n_out + o) * n_in + i;
                double sf = init[k], sr = sf, sm = fabs(sf);
                for (int r = offsets[e]; r < offsets[e + 1]; r++) {
                    const size_t id = (size_t)r * n_out + o, ix = (size_t)r * n_in + i;
                    sf += (double)dy.f[id] * x.f[ix], sr += rnd(&dy, id) * rnd(&x, ix);
                    sm += fabs(rnd(&dy, id) * rnd(&x, ix));
                }
                wf[k] = sf, wr[k] = sr, mag[k] = sm;
            }
    be->copy_to_device(be, dbuf, init, nw * 4);
    be->expert_matmul_backward_weight_bf16(be, dbuf, dy.d, x.d, offsets, E, n_out, n_in);
    be->copy_to_host(be, got, dbuf, nw * 4);
    compare("expert_matmul_backward_weight_bf16 (+=)", got, wf, wr, mag, nw);
    be->free(be, dbuf);
    free(init), free(got), free(wf), free(wr), free(mag);
    free_operand(&x), free_operand(&w), free_operand(&dy);
}

// A row's result against the row count: the first 16 rows of a 200-row matmul_bf16 and a
// 16-row one of the same operands, bit for bit. Required of the reference path (the parity
// tests of expert parallelism rely on it); printed for the others (a BLAS may differ).
static void test_row_count(const char *path, int required) {
    const int m = 200, few = 16, n = 48, kd = 40;
    operand a = make_operand((size_t)m * kd, 1.0), b = make_operand((size_t)kd * n, 0.05);
    float *c = be->alloc(be, (size_t)m * n * 4), *c16 = be->alloc(be, (size_t)few * n * 4);
    float *h = malloc((size_t)m * n * 4), *h16 = malloc((size_t)few * n * 4);
    be->matmul_bf16(be, c, a.d, b.d, m, n, kd, 0, 1, 0);
    be->matmul_bf16(be, c16, a.d, b.d, few, n, kd, 0, 1, 0);
    be->copy_to_host(be, h, c, (size_t)m * n * 4);
    be->copy_to_host(be, h16, c16, (size_t)few * n * 4);
    int differ = 0;
    for (int i = 0; i < few * n; i++) differ += memcmp(&h[i], &h16[i], 4) != 0;
    char what[160];
    snprintf(what, sizeof what,
             "%s: rows 0-15 of a 200-row GEMM == a 16-row GEMM's (%d of %d "
             "differ)",
             path, differ, few * n);
    if (required)
        check_true(what, differ == 0);
    else
        printf("  info  %s\n", what);
    be->free(be, c), be->free(be, c16), free(h), free(h16);
    free_operand(&a), free_operand(&b);
}

static void test_gemms(const char *path) {
    printf("-- %s path\n", path);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            test_matmul(37, 53, 129, ta, tb, 0);
            test_matmul(17, 9, 301, ta, tb, 1);
        }
    test_matmul(1, 65, 64, 0, 1, 0); // a decode step's shape
    test_matmul(3, 40, 70, 0, 1, 1); // decode rows, beta 1, a partial chunk of k
    // AMX: whole 32-row blocks read in place (kd 96) and spread over the threads; a few rows
    // against transposed weights (c^T computed) with beta 1
    test_matmul(160, 100, 96, 0, 1, 0);
    test_matmul(160, 100, 96, 1, 0, 1);
    test_matmul(8, 300, 64, 1, 1, 1);
    test_matmul(40, 300, 2048, 0, 1, 0); // op(b) packed in two panels of columns
    test_matmul(40, 330, 256, 0, 1, 1);  // c^T for 40 rows against long weights
    const int rows[5] = {13, 0, 29, 1, 40};
    test_experts(rows, 5, 46, 33);
    const int many[12] = {3, 5, 0, 7, 2, 9, 1, 4, 6, 8, 2, 3}; // >= 4 experts per thread
    test_experts(many, 12, 24, 17);
}

// ---- the fused SwiGLU kernels --------------------------------------------------------------
// swiglu_forward_bf16 and swiglu_backward_bf16 against the kernels they fuse, on this backend:
// the same bits as swiglu_forward + to_bf16 (act, h13), and from_bf16 + swiglu_backward +
// to_bf16 (dh13); h13 of N(0, 2) so that silu's curved part and its tails are both hit.
static void *upload(const void *h, size_t bytes) {
    void *d = be->alloc(be, bytes);
    be->copy_to_device(be, d, h, bytes);
    return d;
}

static int same_bits(const void *d_a, const void *d_b, size_t bytes) {
    unsigned char *a = malloc(bytes), *b = malloc(bytes);
    be->copy_to_host(be, a, d_a, bytes);
    be->copy_to_host(be, b, d_b, bytes);
    const int same = !memcmp(a, b, bytes);
    free(a), free(b);
    return same;
}

// expert_swiglu_forward_bf16 against expert_matmul_forward_bf16 + swiglu_forward_bf16 on this
// backend's path, bit for bit, and expert_swiglu_backward_bf16 against
// expert_matmul_backward_input_bf16 + swiglu_backward_bf16: experts of 0, 3 (few rows), 17
// (c^T), 33, 40 and 100 rows (partial 32-row blocks) from row 5 on (offsets[0] != 0), ff a
// multiple of 16 (fused on AMX) and not (unfused), 9 experts (run in parallel on 2 threads) and
// two experts of 300 and 260 rows (each GEMM spread over the threads).
static void check_expert_swiglu(const int *rows, int E, int ff, int d) {
    int offsets[16] = {5};
    for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + rows[e];
    const int N = offsets[E], r0 = offsets[0];
    operand x = make_operand((size_t)N * d, 1.0), w = make_operand((size_t)E * 2 * ff * d, 0.1);
    operand dy = make_operand((size_t)N * d, 1.0), w2 = make_operand((size_t)E * d * ff, 0.1);
    const size_t nh = (size_t)N * 2 * ff, na = (size_t)N * ff;
    real *h13 = be->alloc(be, nh * sizeof(real)), *dact = be->alloc(be, na * sizeof(real));
    moe_bf16 *act[2], *k[2], *dh[2];
    unsigned char *zeros = calloc(nh * sizeof(real), 1), *nans = malloc(nh * sizeof(real));
    memset(nans, 0xff, nh * sizeof(real));
    for (int v = 0; v < 2; v++)
        act[v] = upload(zeros, na * 2), k[v] = upload(zeros, nh * 2), dh[v] = upload(zeros, nh * 2);
    be->expert_matmul_forward_bf16(be, h13, x.d, w.d, offsets, E, 2 * ff, d);
    be->swiglu_forward_bf16(be, act[0] + (size_t)r0 * ff, k[0] + (size_t)r0 * 2 * ff,
                            h13 + (size_t)r0 * 2 * ff, N - r0, ff);
    be->copy_to_device(be, h13, nans, nh * sizeof(real)); // NaN: the fused kernel must not read it
    be->expert_swiglu_forward_bf16(be, act[1], k[1], h13, x.d, w.d, offsets, E, ff, d);
    char what[160];
    snprintf(what, sizeof what,
             "expert_swiglu_forward_bf16 == expert GEMM + swiglu_forward_bf16 (E=%d ff=%d d=%d): "
             "act, h13_16",
             E, ff, d);
    check_true(what, same_bits(act[0], act[1], na * 2) && same_bits(k[0], k[1], nh * 2));
    be->expert_matmul_backward_input_bf16(be, dact, dy.d, w2.d, offsets, E, d, ff, 0);
    be->swiglu_backward_bf16(be, dh[0] + (size_t)r0 * 2 * ff, dact + (size_t)r0 * ff,
                             k[0] + (size_t)r0 * 2 * ff, N - r0, ff);
    be->copy_to_device(be, dact, nans, na * sizeof(real));
    be->expert_swiglu_backward_bf16(be, dh[1], dact, dy.d, w2.d, k[0], offsets, E, ff, d);
    snprintf(what, sizeof what,
             "expert_swiglu_backward_bf16 == expert input-gradient GEMM + swiglu_backward_bf16 "
             "(E=%d ff=%d d=%d)",
             E, ff, d);
    check_true(what, same_bits(dh[0], dh[1], nh * 2));
    for (int v = 0; v < 2; v++) be->free(be, act[v]), be->free(be, k[v]), be->free(be, dh[v]);
    be->free(be, h13), be->free(be, dact);
    free(zeros), free(nans);
    free_operand(&x), free_operand(&w), free_operand(&dy), free_operand(&w2);
}

// The fp32 twins, expert_swiglu_forward and expert_swiglu_backward, against the two kernels
// each names, bit for bit (act and h13; dh13), on the same rows.
static void check_expert_swiglu32(const int *rows, int E, int ff, int d) {
    int offsets[16] = {5};
    for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + rows[e];
    const int N = offsets[E], r0 = offsets[0];
    const size_t nx = (size_t)N * d, nw = (size_t)E * 2 * ff * d, nh = (size_t)N * 2 * ff,
                 na = (size_t)N * ff;
    const size_t nr = 2 * nx > nw ? 2 * nx : nw; // x and dy, then w13 and w2, from hx
    real *hx = malloc(nr * sizeof(real));
    for (size_t i = 0; i < nr; i++) hx[i] = (real)rng_normal(&rng);
    real *x = upload(hx, nx * sizeof(real)), *dy = upload(hx + nx, nx * sizeof(real));
    for (size_t i = 0; i < nw; i++) hx[i] *= (real)0.1;
    real *w13 = upload(hx, nw * sizeof(real)), *w2 = upload(hx + nw / 2, nw / 2 * sizeof(real));
    unsigned char *zeros = calloc(nh * sizeof(real), 1);
    real *h[2], *act[2], *dh[2], *dact = be->alloc(be, na * sizeof(real));
    for (int v = 0; v < 2; v++)
        h[v] = upload(zeros, nh * sizeof(real)), act[v] = upload(zeros, na * sizeof(real)),
        dh[v] = upload(zeros, nh * sizeof(real));
    be->expert_matmul_forward(be, h[0], x, w13, offsets, E, 2 * ff, d);
    be->swiglu_forward(be, act[0] + (size_t)r0 * ff, h[0] + (size_t)r0 * 2 * ff, N - r0, ff);
    be->expert_swiglu_forward(be, act[1], h[1], x, w13, offsets, E, ff, d);
    char what[160];
    snprintf(what, sizeof what,
             "expert_swiglu_forward == expert GEMM + swiglu_forward (E=%d ff=%d d=%d): act, h13", E,
             ff, d);
    check_true(what, same_bits(act[0], act[1], na * sizeof(real)) &&
                         same_bits(h[0], h[1], nh * sizeof(real)));
    be->expert_matmul_backward_input(be, dact, dy, w2, offsets, E, d, ff, 0);
    be->swiglu_backward(be, dh[0] + (size_t)r0 * 2 * ff, dact + (size_t)r0 * ff,
                        h[0] + (size_t)r0 * 2 * ff, N - r0, ff);
    be->zero(be, dact, na * sizeof(real));
    be->expert_swiglu_backward(be, dh[1], dact, dy, w2, h[0], offsets, E, ff, d);
    snprintf(what, sizeof what,
             "expert_swiglu_backward == expert input-gradient GEMM + swiglu_backward (E=%d ff=%d "
             "d=%d)",
             E, ff, d);
    check_true(what, same_bits(dh[0], dh[1], nh * sizeof(real)));
    for (int v = 0; v < 2; v++) be->free(be, h[v]), be->free(be, act[v]), be->free(be, dh[v]);
    void *bufs[] = {dact, x, dy, w13, w2};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    free(hx), free(zeros);
}

// >= 4 experts per thread: in parallel, each GEMM (and its SwiGLU) on one thread
static const int swiglu_rows[6] = {40, 0, 3, 17, 100, 33}, swiglu_big[2] = {300, 260},
                 swiglu_many[9] = {33, 40, 64, 35, 50, 1, 70, 36, 45},
                 swiglu_wide[9] = {200, 130, 5, 300, 129, 0, 140, 260, 17};

// The row sets above, against ff a multiple of 16 (fused on AMX) and not (40: unfused).
static void expert_swiglu_cases(void (*check)(const int *rows, int E, int ff, int d)) {
    check(swiglu_rows, 6, 48, 64);
    check(swiglu_many, 9, 32, 64);
    check(swiglu_wide, 9, 48, 64);
    check(swiglu_rows, 6, 40, 96);
    check(swiglu_big, 2, 64, 192);
}

static void test_expert_swiglu(void) { expert_swiglu_cases(check_expert_swiglu); }

static void test_expert_swiglu32(void) {
    printf("-- fp32 experts' GEMM and SwiGLU in one call\n");
    expert_swiglu_cases(check_expert_swiglu32);
}

static void test_swiglu_bf16(void) {
    printf("-- fused SwiGLU (bf16)\n");
    const int N = 37, ff = 29;
    const size_t nh = (size_t)N * 2 * ff, na = (size_t)N * ff;
    real *h = malloc(nh * sizeof(real)), *g = malloc(na * sizeof(real));
    for (size_t i = 0; i < nh; i++) h[i] = (real)(2 * rng_normal(&rng));
    for (size_t i = 0; i < na; i++) g[i] = (real)rng_normal(&rng);
    real *d_h = upload(h, nh * sizeof(real)), *d_g = upload(g, na * sizeof(real));
    real *act = be->alloc(be, na * sizeof(real)), *wide = be->alloc(be, nh * sizeof(real));
    real *dh = be->alloc(be, nh * sizeof(real));
    moe_bf16 *act16 = be->alloc(be, na * 2), *ref_act16 = be->alloc(be, na * 2);
    moe_bf16 *h16 = be->alloc(be, nh * 2), *ref_h16 = be->alloc(be, nh * 2);
    moe_bf16 *dh16 = be->alloc(be, nh * 2), *ref_dh16 = be->alloc(be, nh * 2);
    be->swiglu_forward(be, act, d_h, N, ff); // the unfused path
    be->to_bf16(be, ref_act16, act, na);
    be->to_bf16(be, ref_h16, d_h, nh);
    be->from_bf16(be, wide, ref_h16, nh);
    be->swiglu_backward(be, dh, d_g, wide, N, ff);
    be->to_bf16(be, ref_dh16, dh, nh);
    be->swiglu_forward_bf16(be, act16, h16, d_h, N, ff);
    check_true("swiglu_forward_bf16: act16 = to_bf16(swiglu_forward(h13)), bit for bit",
               same_bits(act16, ref_act16, na * 2));
    check_true("swiglu_forward_bf16: h13_16 = to_bf16(h13), bit for bit",
               same_bits(h16, ref_h16, nh * 2));
    be->zero(be, act16, na * 2);
    be->swiglu_forward_bf16(be, act16, NULL, d_h, N, ff); // inference: no h13_16
    check_true("swiglu_forward_bf16 without h13_16: the same act16",
               same_bits(act16, ref_act16, na * 2));
    be->swiglu_backward_bf16(be, dh16, d_g, h16, N, ff);
    check_true("swiglu_backward_bf16 = to_bf16(swiglu_backward(dact, from_bf16(h13_16)))",
               same_bits(dh16, ref_dh16, nh * 2));
    void *bufs[] = {d_h, d_g, act, wide, dh, act16, ref_act16, h16, ref_h16, dh16, ref_dh16};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    free(h), free(g);
}

// ---- the bf16 dispatch twins ---------------------------------------------------------------
// moe_permute_bf16 and moe_combine_backward_bf16 against the kernels they fuse, on this
// backend: the same bits as moe_permute + to_bf16, and moe_combine_backward + to_bf16 of dy
// (dweights equal); a quarter of the slots dropped, the kept ones on shuffled rows.
static void test_dispatch_bf16(void) {
    printf("-- fused dispatch and combine backward (bf16)\n");
    const int T = 23, k = 3, d = 41;
    int assign[T * k], row_token[T * k], perm[T * k], N = 0;
    for (int s = 0; s < T * k; s++) perm[s] = s;
    for (int i = T * k - 1; i > 0; i--) { // Fisher-Yates: the kept slots' rows in random order
        const int j = (int)(rng_uniform(&rng) * (i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int s = 0; s < T * k; s++) assign[s] = rng_uniform(&rng) < 0.25 ? -1 : N++;
    for (int s = 0, r = 0; s < T * k; s++) // rows 0..N-1 in the order perm visits slots
        if (assign[perm[s]] >= 0) assign[perm[s]] = r++;
    for (int s = 0; s < T * k; s++)
        if (assign[s] >= 0) row_token[assign[s]] = s / k;
    const size_t nx = (size_t)T * d, ny = (size_t)N * d, nw = (size_t)T * k;
    real *x = malloc(nx * sizeof(real)), *y = malloc(ny * sizeof(real)),
         *w = malloc(nw * sizeof(real));
    for (size_t i = 0; i < nx; i++) x[i] = (real)(3 * rng_normal(&rng));
    for (size_t i = 0; i < ny; i++) y[i] = (real)rng_normal(&rng);
    for (size_t i = 0; i < nw; i++) w[i] = (real)rng_uniform(&rng);
    real *d_x = upload(x, nx * sizeof(real)), *d_y = upload(y, ny * sizeof(real));
    real *d_w = upload(w, nw * sizeof(real));
    int *d_tok = upload(row_token, (size_t)N * sizeof(int)),
        *d_arow = upload(assign, sizeof assign);
    real *xp = be->alloc(be, ny * sizeof(real)), *dy = be->alloc(be, ny * sizeof(real));
    real *dw = be->alloc(be, nw * sizeof(real)), *dw16 = be->alloc(be, nw * sizeof(real));
    moe_bf16 *xe16 = be->alloc(be, ny * 2), *ref_xe16 = be->alloc(be, ny * 2);
    moe_bf16 *dy16 = be->alloc(be, ny * 2), *ref_dy16 = be->alloc(be, ny * 2);
    be->moe_permute(be, xp, d_x, d_tok, N, d); // the unfused path
    be->to_bf16(be, ref_xe16, xp, ny);
    be->moe_combine_backward(be, dy, dw, d_x, d_y, d_w, d_arow, T, k, d); // dout = x
    be->to_bf16(be, ref_dy16, dy, ny);
    be->moe_permute_bf16(be, xe16, d_x, d_tok, N, d);
    check_true("moe_permute_bf16 = to_bf16(moe_permute(x)), bit for bit",
               same_bits(xe16, ref_xe16, ny * 2));
    be->moe_combine_backward_bf16(be, dy16, dw16, d_x, d_y, d_w, d_arow, T, k, d);
    check_true("moe_combine_backward_bf16: dy16 = to_bf16(dy), bit for bit",
               same_bits(dy16, ref_dy16, ny * 2));
    check_true("moe_combine_backward_bf16: dweights as moe_combine_backward's, bit for bit",
               same_bits(dw16, dw, nw * sizeof(real)));
    void *bufs[] = {d_x, d_y, d_w, d_tok, d_arow, xp, dy, dw, dw16, xe16, ref_xe16, dy16, ref_dy16};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    free(x), free(y), free(w);
}

// The loop's calls, as the GEMM sees them: the parallel nesting level and the team's size.
typedef struct {
    int calls, max_level, max_team;
} seen_calls;
static void record_call(void *ctx, int trans_a, int trans_b, int m, int n, int kd, const void *a,
                        int lda, const void *b, int ldb, real beta, real *c, int ldc) {
    (void)trans_a, (void)trans_b, (void)m, (void)n, (void)kd, (void)a, (void)lda, (void)b;
    (void)ldb, (void)beta, (void)c, (void)ldc;
    seen_calls *s = ctx;
    const int level = omp_get_level(), team = omp_get_num_threads();
#pragma omp critical(record_call)
    {
        s->calls++;
        s->max_level = level > s->max_level ? level : s->max_level;
        s->max_team = team > s->max_team ? team : s->max_team;
    }
}

// With fewer than four experts per thread, the GEMMs must run outside any parallel region
// (level 0): inside an `omp parallel if (0)` region OpenBLAS and oneDNN run one thread, which
// made a 4-expert shakespeare step 1.4x (fp32) to 1.8x (bf16) slower on 2 threads.
static void test_expert_threading(void) {
    enum { THREADS = 2, EXPERTS_MAX = 4 * THREADS, ROWS = 3 };
    const int saved = omp_get_max_threads();
    omp_set_num_threads(THREADS);
    int offsets[EXPERTS_MAX + 1];
    float buf[ROWS * EXPERTS_MAX]; // every operand and output: 1 x 1 weights, ROWS rows each
    for (int E = 1; E <= EXPERTS_MAX; E += EXPERTS_MAX - 1) { // below, and at, 4 per thread
        for (int e = 0; e <= E; e++) offsets[e] = ROWS * e;
        for (int pass = CPU_EXPERT_FORWARD; pass <= CPU_EXPERT_BACKWARD_WEIGHT; pass++) {
            seen_calls s = {0, 0, 0};
            cpu_expert_gemms((cpu_expert_pass)pass, buf, buf, buf, sizeof(float), offsets, E, 1, 1,
                             0, record_call, &s);
            char what[120];
            snprintf(what, sizeof what,
                     "cpu_expert_gemms pass %d, %d experts on %d threads: "
                     "%d calls, level %d, team %d",
                     pass, E, THREADS, s.calls, s.max_level, s.max_team);
            check_true(what, s.calls == E && (E < 4 * THREADS ? s.max_level == 0 && s.max_team == 1
                                                              : s.max_level == 1));
        }
    }
    omp_set_num_threads(saved);
}

int main(int argc, char **argv) {
    // --require-native: the native path must run (test_gemm_bf16_standin links a stand-in)
    const int require_native = argc > 1 && !strcmp(argv[1], "--require-native");
    be = test_backend();
    rng_seed(&rng, 20261201);
    printf("backend: %s\n", be->describe(be));
    test_conversions();
    test_swiglu_bf16();
    test_expert_swiglu32();
    test_dispatch_bf16();
    if (strncmp(be->name, "cpu", 3) == 0) {
        test_expert_threading();
        // auto picks a native path wherever one can run: a CPU with bf16 instructions and
        // oneDNN installed (sanitizer builds leave oneDNN out, layers/cpu/gemm_bf16.c)
        const int picked = ((cpu_state *)be->state)->bf16_native;
        void *dnnl = dlopen("libdnnl.so.3", RTLD_NOW | RTLD_LOCAL);
        if (!dnnl) dnnl = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
        const int could =
            cpu_has_bf16_instructions() && dnnl && !CPU_NO_ONEDNN && !getenv("MOE_BF16_GEMM");
        printf("-- auto: %s (bf16 instructions %d, libdnnl %s)\n", cpu_bf16_path_name(picked),
               cpu_has_bf16_instructions(), dnnl ? "found" : "not found");
        check_true("auto: a native path where the CPU and an installed library allow one",
                   !could || picked != CPU_BF16_EMULATED);
        int natives = 0;
        for (int path = CPU_BF16_EMULATED; path <= CPU_BF16_AMX; path++) {
            if (cpu_backend_set_bf16_gemm(be, path)) {
                test_gemms(cpu_bf16_path_name(path));
                test_expert_swiglu();
                test_row_count(cpu_bf16_path_name(path), path == CPU_BF16_REFERENCE);
                natives +=
                    path == CPU_BF16_SBGEMM || path == CPU_BF16_ONEDNN || path == CPU_BF16_AMX;
            } else {
                printf("-- %s: not run, its library is not here\n", cpu_bf16_path_name(path));
            }
        }
        check_true("a native path ran (--require-native)", !require_native || natives > 0);
    } else {
        test_gemms(be->name);
        test_expert_swiglu();
    }
    printf("%s\n", test_failures() ? "FAILED" : "all passed");
    return test_failures() != 0;
}
