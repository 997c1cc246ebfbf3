// The bf16 attention kernels (layers/cpu/attention.c, attention_forward_bf16 and
// attention_backward_bf16) on every bf16 GEMM path this machine has, at the shapes of
// test_attention.c, the default model's (S = 256, hd = 32) and heads of several 32-wide chunks
// (hd = 72, 128: the AMX blocks' loops over chunks of k):
//   - against a direct evaluation in double of the bf16 rule of layers/backend.h (q, k, v,
//     do, o widened from bf16; E = exp(S - m), P and dS rounded to bf16 where they enter a
//     product): 5e-5 relative (a rounding of E may flip where fp32 and double scores differ);
//   - the rule is what runs: the fp32 kernels on the same widened inputs (no rounding of E, P,
//     dS) are at least 10x farther from that reference;
//   - against the fp32 kernels: within bf16's tolerance (1e-2 relative, DESIGN.md §5b);
//   - one thread == two threads, bit for bit; every dqkv entry is written.
// test_attention_bf16_standin links tests/sbgemm_standin.c, so that the sbgemm path's calls
// (alpha, the row strides of q, k, v inside qkv rows) run too.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/backend.h"
#include "layers/bf16.h"
#include "layers/cpu/cpu_backend.h"
#include "test_backend.h"
#include "test_util.h"

typedef moe_attention_shape shape; // B, S, H, KV, hd

static double r16(double x) { return moe_bf16_to_f32(moe_f32_to_bf16((float)x)); }

// o [T, H*hd], lse [B, H, S] by the bf16 rule, in double, from x = widened qkv16.
static void ref_forward(double *o, double *lse, const real *x, shape sh) {
    const int S = sh.S, H = sh.H, KV = sh.KV, hd = sh.hd, row = (H + 2 * KV) * hd;
    double *e = malloc((size_t)S * sizeof *e);
    for (int b = 0; b < sh.B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                const int g = h / (H / KV);
                const real *q = x + ((size_t)b * S + i) * row + (size_t)h * hd;
                double m = -INFINITY, l = 0;
                for (int j = 0; j <= i; j++) {
                    const real *k = x + ((size_t)b * S + j) * row + (size_t)(H + g) * hd;
                    double s = 0;
                    for (int c = 0; c < hd; c++) s += (double)q[c] * k[c];
                    e[j] = s / sqrt((double)hd);
                    m = e[j] > m ? e[j] : m;
                }
                for (int j = 0; j <= i; j++) l += (e[j] = exp(e[j] - m));
                lse[((size_t)b * H + h) * S + i] = m + log(l);
                double *oi = o + ((size_t)b * S + i) * H * hd + (size_t)h * hd;
                for (int c = 0; c < hd; c++) {
                    double t = 0;
                    for (int j = 0; j <= i; j++)
                        t += r16(e[j]) *
                             x[((size_t)b * S + j) * row + (size_t)(H + KV + g) * hd + c];
                    oi[c] = t / l;
                }
            }
    free(e);
}

// dqkv [T, (H+2KV)*hd] by the bf16 rule, in double: x = widened qkv16, dO = widened dout16,
// o = widened out16, lse the reference's.
static void ref_backward(double *dqkv, const real *x, const real *dO, const real *o,
                         const double *lse, shape sh) {
    const int S = sh.S, H = sh.H, KV = sh.KV, hd = sh.hd, row = (H + 2 * KV) * hd;
    const double scale = 1.0 / sqrt((double)hd);
    memset(dqkv, 0, (size_t)sh.B * S * row * sizeof *dqkv);
    for (int b = 0; b < sh.B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                const int g = h / (H / KV);
                const size_t qi = ((size_t)b * S + i) * row + (size_t)h * hd,
                             oi = ((size_t)b * S + i) * H * hd + (size_t)h * hd;
                double D = 0;
                for (int c = 0; c < hd; c++) D += (double)dO[oi + c] * o[oi + c];
                for (int j = 0; j <= i; j++) {
                    const size_t kj = ((size_t)b * S + j) * row + (size_t)(H + g) * hd,
                                 vj = kj + (size_t)KV * hd;
                    double s = 0, dp = 0;
                    for (int c = 0; c < hd; c++) {
                        s += (double)x[qi + c] * x[kj + c];
                        dp += (double)dO[oi + c] * x[vj + c];
                    }
                    const double p = exp(s * scale - lse[((size_t)b * H + h) * S + i]);
                    const double ds = r16(p * (dp - D) * scale), p16 = r16(p);
                    for (int c = 0; c < hd; c++) {
                        dqkv[qi + c] += ds * x[kj + c];
                        dqkv[kj + c] += ds * x[qi + c];
                        dqkv[vj + c] += p16 * dO[oi + c];
                    }
                }
            }
}

static double *widen_d(const real *x, size_t n) {
    double *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = (double)x[i];
    return y;
}

static double rel(const real *got, const double *want, size_t n) {
    double *g = widen_d(got, n);
    const double e = rel_err(g, want, n);
    free(g);
    return e;
}

static void check_shape(moe_backend *be, shape sh, uint64_t seed, const char *path) {
    const int S = sh.S, H = sh.H, KV = sh.KV, hd = sh.hd, T = sh.B * S, row = (H + 2 * KV) * hd;
    const size_t nq = (size_t)T * row, no = (size_t)T * H * hd, nl = (size_t)sh.B * H * S;
    printf("B=%d S=%d H=%d KV=%d hd=%d (%s)\n", sh.B, S, H, KV, hd, path);
    moe_bf16 *qkv16 = malloc(nq * sizeof *qkv16), *dout16 = malloc(no * sizeof *dout16),
             *out16 = malloc(no * sizeof *out16);
    // the widened bf16 values (what the kernels read), for the references and the fp32 kernels
    real *x = malloc(nq * sizeof *x), *dOw = malloc(no * sizeof *dOw),
         *ow = malloc(no * sizeof *ow);
    real *out = malloc(no * sizeof *out), *lse = malloc(nl * sizeof *lse),
         *dqkv = malloc(nq * sizeof *dqkv), *out1 = malloc(no * sizeof *out1),
         *lse1 = malloc(nl * sizeof *lse1), *dqkv1 = malloc(nq * sizeof *dqkv1);
    double *ro = malloc(no * sizeof *ro), *rlse = malloc(nl * sizeof *rlse),
           *rdqkv = malloc(nq * sizeof *rdqkv);
    test_rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < nq; i++) { // peaked rows too; the values the kernels read
        qkv16[i] = moe_f32_to_bf16((float)(1.5 * rng_normal(&r)));
        x[i] = moe_bf16_to_f32(qkv16[i]);
    }
    for (size_t i = 0; i < no; i++) {
        dout16[i] = moe_f32_to_bf16((float)rng_normal(&r));
        dOw[i] = moe_bf16_to_f32(dout16[i]);
    }

    cpu_backend_set_threads(be, 2);
    const size_t ns = be->attention_scratch_size(be, S, hd);
    real *scratch = malloc(ns * sizeof *scratch);
    be->attention_forward_bf16(be, out, lse, qkv16, sh, scratch, ns);
    for (size_t i = 0; i < no; i++) ow[i] = moe_bf16_to_f32(out16[i] = moe_f32_to_bf16(out[i]));
    for (size_t i = 0; i < nq; i++) dqkv[i] = NAN; // every entry must be written
    be->attention_backward_bf16(be, dqkv, dout16, qkv16, out16, lse, sh, scratch, ns);
    int written = 1;
    for (size_t i = 0; i < nq; i++) written &= !isnan(dqkv[i]);
    check_true("backward writes every dqkv entry", written);

    ref_forward(ro, rlse, x, sh);
    ref_backward(rdqkv, x, dOw, ow, rlse, sh);
    const double e_out = rel(out, ro, no), e_lse = rel(lse, rlse, nl), e_d = rel(dqkv, rdqkv, nq);
    printf("  the bf16 rule (double): rel_err out %.2e, lse %.2e, dqkv %.2e\n", e_out, e_lse, e_d);
    check_true("forward, backward == the bf16 rule within 5e-5",
               e_out <= 5e-5 && e_lse <= 5e-5 && e_d <= 5e-5);

    // the fp32 kernels on the same widened values: no rounding of E, P, dS
    be->attention_forward(be, out1, lse1, x, sh, scratch, ns);
    be->attention_backward(be, dqkv1, dOw, x, ow, lse1, sh, scratch, ns);
    const double f_out = rel(out1, ro, no), f_d = rel(dqkv1, rdqkv, nq);
    printf("  fp32 kernels from the same reference: out %.2e dqkv %.2e\n", f_out, f_d);
    check_true("the rounding rule runs: fp32 is >= 10x farther (out, dqkv)",
               f_out >= 10 * e_out && f_d >= 10 * e_d);
    double *w1 = widen_d(out1, no), *w2 = widen_d(dqkv1, nq), *g1 = widen_d(out, no),
           *g2 = widen_d(dqkv, nq);
    check_rel("forward out == fp32 kernels (bf16 tol)", g1, w1, no, 1e-2);
    check_rel("backward dqkv == fp32 kernels (bf16 tol)", g2, w2, nq, 1e-2);

    // one thread: the same bits
    cpu_backend_set_threads(be, 1);
    be->attention_forward_bf16(be, out1, lse1, qkv16, sh, scratch, ns);
    be->attention_backward_bf16(be, dqkv1, dout16, qkv16, out16, lse1, sh, scratch, ns);
    check_true("1 thread == 2 threads, bit for bit", !memcmp(out, out1, no * sizeof *out) &&
                                                         !memcmp(lse, lse1, nl * sizeof *lse) &&
                                                         !memcmp(dqkv, dqkv1, nq * sizeof *dqkv));
    cpu_backend_set_threads(be, 2);
    free(w1), free(w2), free(g1), free(g2), free(scratch);
    free(qkv16), free(dout16), free(out16), free(x), free(dOw), free(ow);
    free(out), free(lse), free(dqkv), free(out1), free(lse1), free(dqkv1), free(ro), free(rlse),
        free(rdqkv);
}

int main(int argc, char **argv) {
    // --require-native: a native path must run (test_attention_bf16_standin links one)
    const int require_native = argc > 1 && !strcmp(argv[1], "--require-native");
    moe_backend *be = test_backend();
    const shape shapes[] = {
        {2, 150, 4, 2, 8},  // GQA, 3 query blocks, the last one partial
        {1, 128, 4, 4, 16}, // MHA, 2 full blocks
        {3, 70, 6, 1, 8},   // MQA
        {2, 2, 2, 1, 4},    // two tokens
        {1, 256, 6, 2, 32}, // configs/shakespeare.cfg's heads
        {1, 100, 4, 2, 72}, // hd of several 32-wide chunks, the last one partial (AMX: kc 3)
        {1, 96, 2, 1, 128}, // Mixtral's and Qwen3's hd
    };
    int natives = 0;
    for (int path = CPU_BF16_EMULATED; path <= CPU_BF16_AMX; path++) {
        if (!cpu_backend_set_bf16_gemm(be, path)) {
            printf("-- %s: not run, its library is not here\n", cpu_bf16_path_name(path));
            continue;
        }
        natives += path == CPU_BF16_SBGEMM || path == CPU_BF16_ONEDNN || path == CPU_BF16_AMX;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            check_shape(be, shapes[i], 300 + i, cpu_bf16_path_name(path));
    }
    check_true("a native path ran (--require-native)", !require_native || natives > 0);
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
