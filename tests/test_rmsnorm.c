// RMSNorm's CPU kernels at sizes the model tests do not reach: T = 1000 tokens (several of the
// backward's 64-token blocks of the weight gradient, the last one partial), against a plain
// double-precision evaluation of the formulas written here; dweight and dinp accumulate into
// what they hold. And the same bits on 1 and 2 threads.
// Then the q/k norm (head_rmsnorm), the linear bias and the shared expert's sigmoid gate
// (DESIGN.md §2.1): forwards against the formulas in double, backwards against central finite
// differences (in double) of the loss sum(out * R) for a random R; the columns outside the
// segments poisoned (NaN bytes) and checked untouched; the backward in place (dinp = dout);
// dweight and dbias accumulating into 0.5; the same bits on 1 and 2 threads.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/cpu/cpu_backend.h"
#include "test_util.h"

#define T 1000 // T x D above the fork threshold (32768): 2 threads really split it
#define D 40

static double max_rel(const float *a, const double *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return sqrt(num / (den > 0 ? den : 1));
}

// out, rstd, dinp, dweight of the kernels on `threads` threads (dinp, dweight start at 0.5)
static void run(moe_backend *be, int threads, const float *x, const float *w, const float *g,
                float *out, float *rstd, float *dx, float *dw) {
    cpu_backend_set_threads(be, threads);
    for (int i = 0; i < T * D; i++) dx[i] = 0.5f;
    for (int i = 0; i < D; i++) dw[i] = 0.5f;
    be->rmsnorm_forward(be, out, rstd, x, w, T, D, 1e-5f);
    be->rmsnorm_backward(be, dx, dw, g, x, w, rstd, T, D);
}

static int check_rmsnorm(moe_backend *be) {
    static float x[T * D], w[D], g[T * D], out[T * D], rstd[T], dx[T * D], dw[D];
    static float out2[T * D], rstd2[T], dx2[T * D], dw2[D];
    static double rout[T * D], rdx[T * D], rdw[D];
    test_rng rng;
    rng_seed(&rng, 7);
    for (int i = 0; i < T * D; i++) x[i] = (float)rng_normal(&rng), g[i] = (float)rng_normal(&rng);
    for (int i = 0; i < D; i++) w[i] = (float)(1 + 0.3 * rng_normal(&rng));
    run(be, 1, x, w, g, out, rstd, dx, dw);
    run(be, 2, x, w, g, out2, rstd2, dx2, dw2);

    // reference: r = 1/sqrt(mean x^2 + eps), n = x r, out = n w,
    // dx = 0.5 + r (w g - n mean_i(w g n)), dw = 0.5 + sum_t g n
    for (int i = 0; i < D; i++) rdw[i] = 0.5;
    for (int t = 0; t < T; t++) {
        double ss = 0, dot = 0;
        for (int i = 0; i < D; i++) ss += (double)x[t * D + i] * x[t * D + i];
        const double r = 1 / sqrt(ss / D + 1e-5);
        for (int i = 0; i < D; i++) dot += (double)w[i] * g[t * D + i] * x[t * D + i] * r;
        for (int i = 0; i < D; i++) {
            const double n = x[t * D + i] * r;
            rout[t * D + i] = n * w[i];
            rdx[t * D + i] = 0.5 + r * (w[i] * g[t * D + i] - n * dot / D);
            rdw[i] += g[t * D + i] * n;
        }
    }
    const double e_out = max_rel(out, rout, T * D), e_dx = max_rel(dx, rdx, T * D),
                 e_dw = max_rel(dw, rdw, D);
    const int same = !memcmp(out, out2, sizeof out) && !memcmp(rstd, rstd2, sizeof rstd) &&
                     !memcmp(dx, dx2, sizeof dx) && !memcmp(dw, dw2, sizeof dw);
    printf("T=%d d=%d: rel err out %.2e, dinp %.2e, dweight %.2e (bound 1e-5); 1 vs 2 threads: "
           "%s\n",
           T, D, e_out, e_dx, e_dw, same ? "same bits" : "DIFFERENT");
    return e_out < 1e-5 && e_dx < 1e-5 && e_dw < 1e-5 && same;
}
#undef T // the RMSNorm check's sizes; below, sizes are arguments
#undef D

// ---- q/k norm, bias, sigmoid gate --------------------------------------------------------

#define EPS 1e-5
#define FD_H 1e-5 // central differences of double-precision functions: error ~1e-10

static test_rng rng;
static real *randv(size_t n, double scale, double shift) {
    real *x = malloc(n * sizeof(real));
    for (size_t i = 0; i < n; i++) x[i] = (real)(shift + scale * rng_normal(&rng));
    return x;
}
static real *copyv(const real *x, size_t n) {
    real *y = malloc(n * sizeof(real));
    memcpy(y, x, n * sizeof(real));
    return y;
}
static real *poisoned(size_t n) { // NaN bytes, as the CUDA twin test's outputs
    real *x = malloc(n * sizeof(real));
    memset(x, 0xFF, n * sizeof(real));
    return x;
}
static int is_poison(real v) {
    real p;
    memset(&p, 0xFF, sizeof p);
    return !memcmp(&v, &p, sizeof v);
}
static void check_vs(const char *what, const real *got, const double *want, size_t n, double tol) {
    double *g = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) g[i] = got[i];
    check_rel(what, g, want, n, tol);
    free(g);
}
static void fill(real *x, size_t n, real v) {
    for (size_t i = 0; i < n; i++) x[i] = v;
}

// One segment's loss sum_i R_i x_i r w_i, r = 1 / sqrt(mean x^2 + eps), in double.
static double seg_loss(const double *x, const real *w, const real *R, int hd) {
    double ss = 0, l = 0;
    for (int i = 0; i < hd; i++) ss += x[i] * x[i];
    const double r = 1 / sqrt(ss / hd + EPS);
    for (int i = 0; i < hd; i++) l += R[i] * x[i] * r * w[i];
    return l;
}

// head_rmsnorm on T rows of `stride` reals, n_heads segments of hd starting at column `off`.
static void check_head(moe_backend *be, const char *name, int T, int stride, int off, int n_heads,
                       int hd) {
    printf("head_rmsnorm %s: T=%d stride=%d off=%d n_heads=%d hd=%d\n", name, T, stride, off,
           n_heads, hd);
    const size_t n = (size_t)T * stride, ns = (size_t)T * n_heads, nseg = ns * hd;
    real *x = randv(n, 1, 0), *w = randv((size_t)hd, 0.3, 1), *R = randv(n, 1, 0);
    for (int t = 0; t < T; t += 5) // rows of other scales
        for (int i = 0; i < stride; i++) x[(size_t)t * stride + i] *= t % 10 ? 1e-2f : 30;
    real *out = poisoned(n), *rstd = poisoned(ns), *dx = poisoned(n),
         *dw = malloc(hd * sizeof(real));
    double *rout = malloc(nseg * sizeof(double)), *rr = malloc(ns * sizeof(double));
    double *rdx = malloc(nseg * sizeof(double)), *rdw = malloc(hd * sizeof(double));
    real *gout = malloc(nseg * sizeof(real)), *gdx = malloc(nseg * sizeof(real));
    fill(dw, (size_t)hd, 0.5f);

    cpu_backend_set_threads(be, 1);
    be->head_rmsnorm_forward(be, out + off, rstd, x + off, w, T, stride, n_heads, hd, (real)EPS);
    be->head_rmsnorm_backward(be, dx + off, dw, R + off, x + off, w, rstd, T, stride, n_heads, hd);

    // references: the forward's formula; the backward by central differences of the loss
    for (int i = 0; i < hd; i++) rdw[i] = 0.5;
    size_t untouched = 0, untouched_dx = 0, cols = 0;
    for (size_t s = 0; s < ns; s++) {
        const size_t o = (s / n_heads) * stride + off + (s % n_heads) * hd;
        double xs[4096], ss = 0;
        for (int i = 0; i < hd; i++) xs[i] = x[o + i], ss += xs[i] * xs[i];
        rr[s] = 1 / sqrt(ss / hd + EPS);
        for (int i = 0; i < hd; i++) {
            rout[s * hd + i] = xs[i] * rr[s] * w[i];
            gout[s * hd + i] = out[o + i];
            gdx[s * hd + i] = dx[o + i];
            const double keep = xs[i];
            xs[i] = keep + FD_H;
            const double lp = seg_loss(xs, w, R + o, hd);
            xs[i] = keep - FD_H;
            const double lm = seg_loss(xs, w, R + o, hd);
            xs[i] = keep;
            rdx[s * hd + i] = (lp - lm) / (2 * FD_H);
            rdw[i] += R[o + i] * xs[i] * rr[s]; // the loss is linear in w: d/dw_i exactly
        }
    }
    for (int t = 0; t < T; t++) // the columns outside the segments
        for (int i = 0; i < stride; i++)
            if (i < off || i >= off + n_heads * hd) {
                cols++;
                untouched += is_poison(out[(size_t)t * stride + i]);
                untouched_dx += is_poison(dx[(size_t)t * stride + i]);
            }
    check_vs("forward out", gout, rout, nseg, 1e-6);
    check_vs("forward rstd", rstd, rr, ns, 1e-6);
    check_true("forward: columns outside the segments untouched", untouched == cols);
    check_vs("backward dinp vs finite differences", gdx, rdx, nseg, 1e-5);
    check_vs("backward dweight (+= 0.5) vs finite diff.", dw, rdw, (size_t)hd, 1e-5);
    check_true("backward: columns outside the segments untouched", untouched_dx == cols);

    // in place: dinp = dout, the same bits; the other columns keep dout's values
    real *buf = copyv(R, n), *dw2 = malloc(hd * sizeof(real));
    fill(dw2, (size_t)hd, 0.5f);
    be->head_rmsnorm_backward(be, buf + off, dw2, buf + off, x + off, w, rstd, T, stride, n_heads,
                              hd);
    int same = !memcmp(dw2, dw, hd * sizeof(real));
    for (size_t s = 0; s < ns; s++) {
        const size_t o = (s / n_heads) * stride + off + (s % n_heads) * hd;
        same &= !memcmp(buf + o, dx + o, hd * sizeof(real));
    }
    for (int t = 0; t < T; t++)
        for (int i = 0; i < stride; i++)
            if (i < off || i >= off + n_heads * hd)
                same &=
                    !memcmp(&buf[(size_t)t * stride + i], &R[(size_t)t * stride + i], sizeof(real));
    check_true("backward in place (dinp = dout): same bits", same);

    // 2 threads: the same bits (forks above 32768 elements)
    real *out2 = poisoned(n), *rstd2 = poisoned(ns), *dx2 = poisoned(n);
    fill(dw2, (size_t)hd, 0.5f);
    cpu_backend_set_threads(be, 2);
    be->head_rmsnorm_forward(be, out2 + off, rstd2, x + off, w, T, stride, n_heads, hd, (real)EPS);
    be->head_rmsnorm_backward(be, dx2 + off, dw2, R + off, x + off, w, rstd2, T, stride, n_heads,
                              hd);
    cpu_backend_set_threads(be, 1);
    check_true("1 vs 2 threads: same bits",
               !memcmp(out, out2, n * sizeof(real)) && !memcmp(rstd, rstd2, ns * sizeof(real)) &&
                   !memcmp(dx, dx2, n * sizeof(real)) && !memcmp(dw, dw2, hd * sizeof(real)));
    free(x), free(w), free(R), free(out), free(rstd), free(dx), free(dw), free(rout), free(rr);
    free(rdx), free(rdw), free(gout), free(gdx), free(buf), free(dw2), free(out2), free(rstd2);
    free(dx2);
}

// bias_add and bias_backward on [T, n]: L = sum R (x + b)
static void check_bias(moe_backend *be, int T, int n) {
    printf("bias: T=%d n=%d\n", T, n);
    const size_t tn = (size_t)T * n;
    real *x = randv(tn, 1, 0), *b = randv((size_t)n, 1, 0), *R = randv(tn, 1, 0);
    real *out = copyv(x, tn), *db = malloc(n * sizeof(real));
    double *rout = malloc(tn * sizeof(double)), *rdb = malloc(n * sizeof(double));
    double *bd = malloc(n * sizeof(double));
    fill(db, (size_t)n, 0.5f);
    cpu_backend_set_threads(be, 1);
    be->bias_add(be, out, b, T, n);
    be->bias_backward(be, db, R, T, n);
    for (size_t j = 0; j < tn; j++) rout[j] = (double)x[j] + b[j % n];
    for (int i = 0; i < n; i++) bd[i] = b[i];
    for (int i = 0; i < n; i++) { // central differences of L in b_i
        double l[2];
        for (int side = 0; side < 2; side++) {
            bd[i] = b[i] + (side ? -FD_H : FD_H);
            l[side] = 0;
            for (size_t j = 0; j < tn; j++) l[side] += R[j] * ((double)x[j] + bd[j % n]);
        }
        bd[i] = b[i];
        rdb[i] = 0.5 + (l[0] - l[1]) / (2 * FD_H);
    }
    check_vs("bias_add", out, rout, tn, 1e-6);
    check_vs("bias_backward (+= 0.5) vs finite diff.", db, rdb, (size_t)n, 1e-5);
    real *out2 = copyv(x, tn), *db2 = malloc(n * sizeof(real));
    fill(db2, (size_t)n, 0.5f);
    cpu_backend_set_threads(be, 2);
    be->bias_add(be, out2, b, T, n);
    be->bias_backward(be, db2, R, T, n);
    cpu_backend_set_threads(be, 1);
    check_true("1 vs 2 threads: same bits",
               !memcmp(out, out2, tn * sizeof(real)) && !memcmp(db, db2, n * sizeof(real)));
    free(x), free(b), free(R), free(out), free(db), free(rout), free(rdb), free(bd), free(out2);
    free(db2);
}

// sigmoid_gate_forward/backward on [T, d]: L = sum R (out0 + sigmoid(z) y)
static double gate_loss_row(const real *R, const real *out0, double z, const double *y, int d) {
    const double s = 1 / (1 + exp(-z));
    double l = 0;
    for (int i = 0; i < d; i++) l += R[i] * (out0[i] + s * y[i]);
    return l;
}
static void check_gate(moe_backend *be, int T, int d) {
    printf("sigmoid gate: T=%d d=%d\n", T, d);
    const size_t td = (size_t)T * d;
    real *out0 = randv(td, 1, 0), *y = randv(td, 1, 0), *z = randv((size_t)T, 3, 0);
    real *R = randv(td, 1, 0), *out = copyv(out0, td), *dy = poisoned(td), *dz = poisoned(T);
    double *rout = malloc(td * sizeof(double)), *rdy = malloc(td * sizeof(double));
    double *rdz = malloc(T * sizeof(double)), *yd = malloc(d * sizeof(double));
    cpu_backend_set_threads(be, 1);
    be->sigmoid_gate_forward(be, out, z, y, T, d);
    be->sigmoid_gate_backward(be, dy, dz, R, z, y, T, d);
    for (int t = 0; t < T; t++) {
        const size_t o = (size_t)t * d;
        const double s = 1 / (1 + exp(-(double)z[t]));
        for (int i = 0; i < d; i++) rout[o + i] = out0[o + i] + s * y[o + i], yd[i] = y[o + i];
        rdz[t] = (gate_loss_row(R + o, out0 + o, z[t] + FD_H, yd, d) -
                  gate_loss_row(R + o, out0 + o, z[t] - FD_H, yd, d)) /
                 (2 * FD_H);
        for (int i = 0; i < d; i++) {
            yd[i] = y[o + i] + FD_H;
            const double lp = gate_loss_row(R + o, out0 + o, z[t], yd, d);
            yd[i] = y[o + i] - FD_H;
            const double lm = gate_loss_row(R + o, out0 + o, z[t], yd, d);
            yd[i] = y[o + i];
            rdy[o + i] = (lp - lm) / (2 * FD_H);
        }
    }
    check_vs("sigmoid_gate_forward", out, rout, td, 1e-6);
    check_vs("sigmoid_gate_backward dy vs finite diff.", dy, rdy, td, 1e-5);
    check_vs("sigmoid_gate_backward dz vs finite diff.", dz, rdz, (size_t)T, 1e-5);
    real *out2 = copyv(out0, td), *dy2 = poisoned(td), *dz2 = poisoned(T);
    cpu_backend_set_threads(be, 2);
    be->sigmoid_gate_forward(be, out2, z, y, T, d);
    be->sigmoid_gate_backward(be, dy2, dz2, R, z, y, T, d);
    cpu_backend_set_threads(be, 1);
    check_true("1 vs 2 threads: same bits", !memcmp(out, out2, td * sizeof(real)) &&
                                                !memcmp(dy, dy2, td * sizeof(real)) &&
                                                !memcmp(dz, dz2, T * sizeof(real)));
    free(out0), free(y), free(z), free(R), free(out), free(dy), free(dz), free(rout), free(rdy);
    free(rdz), free(yd), free(out2), free(dy2), free(dz2);
}

int main(void) {
    moe_backend *be;
    if (cpu_backend_create(&be, NULL, 0)) return 1;
    const int ok = check_rmsnorm(be);
    rng_seed(&rng, 11);
    // a qkv row of H = 6 query and KV = 3 key/value heads of hd = 12: stride (6 + 2*3) * 12;
    // T = 37 (the weight gradient's 64-segment chunks, the last partial) and 1000 (forks)
    for (int T = 37; T <= 1000; T += 963) {
        check_head(be, "q heads", T, 144, 0, 6, 12);
        check_head(be, "k heads", T, 144, 72, 3, 12);
        check_head(be, "whole q projection", T, 144, 0, 1, 72);
        check_bias(be, T, 45);
        check_gate(be, T, 45);
    }
    moe_backend_destroy(be);
    const int all = ok && test_failures() == 0;
    printf(all ? "all checks passed\n" : "FAILED\n");
    return !all;
}
