// Causal GQA attention (layers/cpu/attention.c, flash-style: out + lse kept, scores
// recomputed in the backward) at lengths of several query blocks of 64 and one that is not a
// multiple of the block (150). Compiled twice: test_attention against moe_layers_f64
// (real = double) and test_attention_f32 against moe_layers (real = float).
//   - forward == a direct evaluation of the formula (o and lse, in double);
//   - forward and backward == the previous implementation, which kept the softmax matrix
//     [B, H, S, S] (ref_attention_*, below, unchanged): 1e-6 relative in fp32, 1e-12 in f64;
//   - f64 only: backward == central finite differences of the forward;
//   - one scratch slot (one thread) == the threaded kernels bit for bit; every dqkv entry
//     is written; a scratch sized for a longer S serves a shorter one.
#include "layers/cpu/cblas.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/backend.h"
#include "layers/bf16.h"
#include "test_util.h"
#include "layers/cpu/cpu_backend.h"
#include "layers/cpu/vec_math.h"
#include "test_backend.h"

#ifdef MOE_REAL_DOUBLE
#define cblas_gemm cblas_dgemm
#define TOL_REF 1e-12
#else
#define cblas_gemm cblas_sgemm
#define TOL_REF 1e-6
#endif

// ---- the previous implementation (S x S softmax kept), the reference ---------------------

static void ref_softmax_row(real *p, int last, int len) {
    real mx = p[0], sum = 0;
    for (int j = 1; j <= last; j++) mx = p[j] > mx ? p[j] : mx;
    for (int j = 0; j <= last; j++) {
        p[j] = real_exp(p[j] - mx);
        sum += p[j];
    }
    for (int j = 0; j <= last; j++) p[j] /= sum;
    for (int j = last + 1; j < len; j++) p[j] = 0;
}

// att [B,H,S,S] = softmax(q k^T hd^-1/2) (causal), out [T, H*hd] = att v
static void ref_attention_forward(real *out, real *att, const real *qkv, int B, int S, int H,
                                  int KV, int hd) {
    const int row = (H + 2 * KV) * hd, group = H / KV;
    const real scale = (real)(1.0 / sqrt((double)hd));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const real *q = qkv + (size_t)b * S * row + (size_t)h * hd;
            const real *k = qkv + (size_t)b * S * row + (size_t)(H + h / group) * hd;
            const real *v = k + (size_t)KV * hd;
            real *p = att + ((size_t)b * H + h) * S * S;
            cblas_gemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, S, hd, scale, q, row, k, row, 0,
                       p, S);
            for (int i = 0; i < S; i++) ref_softmax_row(p + (size_t)i * S, i, S);
            cblas_gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, hd, S, 1, p, S, v, row, 0,
                       out + (size_t)b * S * H * hd + (size_t)h * hd, H * hd);
        }
}

// dP = do v^T, dv = P^T do, dS = P * (dP - rowsum(dP * P)), dq = dS k / sqrt(hd),
// dk = dS^T q / sqrt(hd); datt [B,H,S,S] scratch
static void ref_attention_backward(real *dqkv, real *datt, const real *dout, const real *qkv,
                                   const real *att, int B, int S, int H, int KV, int hd) {
    const int row = (H + 2 * KV) * hd, group = H / KV;
    const real scale = (real)(1.0 / sqrt((double)hd));
    for (int b = 0; b < B; b++)
        for (int g = 0; g < KV; g++) {
            const size_t base = (size_t)b * S * row;
            const real *k = qkv + base + (size_t)(H + g) * hd, *v = k + (size_t)KV * hd;
            real *dk = dqkv + base + (size_t)(H + g) * hd, *dv = dk + (size_t)KV * hd;
            for (int t = 0; t < S; t++) {
                memset(dk + (size_t)t * row, 0, (size_t)hd * sizeof(real));
                memset(dv + (size_t)t * row, 0, (size_t)hd * sizeof(real));
            }
            for (int h = g * group; h < (g + 1) * group; h++) {
                const real *q = qkv + base + (size_t)h * hd;
                real *dq = dqkv + base + (size_t)h * hd;
                const real *p = att + ((size_t)b * H + h) * S * S;
                real *dp = datt + ((size_t)b * H + h) * S * S;
                const real *dO = dout + (size_t)b * S * H * hd + (size_t)h * hd;
                cblas_gemm(CblasRowMajor, CblasNoTrans, CblasTrans, S, S, hd, 1, dO, H * hd, v, row,
                           0, dp, S);
                cblas_gemm(CblasRowMajor, CblasTrans, CblasNoTrans, S, hd, S, 1, p, S, dO, H * hd,
                           1, dv, row);
                for (int i = 0; i < S; i++) {
                    const real *pi = p + (size_t)i * S;
                    real *dpi = dp + (size_t)i * S, dot = 0;
                    for (int j = 0; j <= i; j++) dot += pi[j] * dpi[j];
                    for (int j = 0; j <= i; j++) dpi[j] = pi[j] * (dpi[j] - dot) * scale;
                    for (int j = i + 1; j < S; j++) dpi[j] = 0;
                }
                cblas_gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, S, hd, S, 1, dp, S, k, row, 0,
                           dq, row);
                cblas_gemm(CblasRowMajor, CblasTrans, CblasNoTrans, S, hd, S, 1, dp, S, q, row, 1,
                           dk, row);
            }
        }
}

// ---- helpers ------------------------------------------------------------------------------

static double *to_double(const real *x, size_t n) {
    double *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = (double)x[i];
    return y;
}

static void check_rel_real(const char *what, const real *got, const real *want, size_t n,
                           double tol) {
    double *g = to_double(got, n), *w = to_double(want, n);
    check_rel(what, g, w, n, tol);
    free(g), free(w);
}

// The q, k or v part (part 0, 1, 2) of rows [T, (H + 2KV) hd], packed.
static real *qkv_part(const real *x, int T, int H, int KV, int hd, int part) {
    const int row = (H + 2 * KV) * hd,
              off = part == 0   ? 0
                    : part == 1 ? H * hd
                                : (H + KV) * hd,
              w = part == 0 ? H * hd : KV * hd;
    real *y = malloc((size_t)T * w * sizeof *y);
    for (int t = 0; t < T; t++)
        memcpy(y + (size_t)t * w, x + (size_t)t * row + off, (size_t)w * sizeof(real));
    return y;
}

// o and lse by the formula, in double: o_i = sum_{j <= i} softmax_j(q_i . k_j / sqrt(hd)) v_j
static void direct_forward(double *o, double *lse, const real *qkv, int B, int S, int H, int KV,
                           int hd) {
    const int row = (H + 2 * KV) * hd;
    double *s = malloc((size_t)S * sizeof *s);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                const real *q = qkv + ((size_t)b * S + i) * row + (size_t)h * hd;
                const int g = h / (H / KV);
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const real *k = qkv + ((size_t)b * S + j) * row + (size_t)(H + g) * hd;
                    s[j] = 0;
                    for (int c = 0; c < hd; c++) s[j] += (double)q[c] * k[c];
                    s[j] /= sqrt((double)hd);
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int j = 0; j <= i; j++) sum += (s[j] = exp(s[j] - mx));
                lse[((size_t)b * H + h) * S + i] = mx + log(sum);
                double *oi = o + ((size_t)b * S + i) * H * hd + (size_t)h * hd;
                for (int c = 0; c < hd; c++) {
                    oi[c] = 0;
                    for (int j = 0; j <= i; j++)
                        oi[c] += s[j] / sum *
                                 qkv[((size_t)b * S + j) * row + (size_t)(H + KV + g) * hd + c];
                }
            }
    free(s);
}

typedef moe_attention_shape shape; // B, S, H, KV, hd

// Everything but the finite differences, on one shape.
static void check_shape(moe_backend *be, shape sh, uint64_t seed) {
    const int B = sh.B, S = sh.S, H = sh.H, KV = sh.KV, hd = sh.hd, T = B * S,
              row = (H + 2 * KV) * hd;
    const size_t nq = (size_t)T * row, no = (size_t)T * H * hd, nl = (size_t)B * H * S,
                 na = (size_t)B * H * S * S;
    printf("B=%d S=%d H=%d KV=%d hd=%d (%s)\n", B, S, H, KV, hd, be->name);
    real *qkv = malloc(nq * sizeof *qkv), *dout = malloc(no * sizeof *dout);
    real *out = malloc(no * sizeof *out), *lse = malloc(nl * sizeof *lse);
    real *dqkv = malloc(nq * sizeof *dqkv), *out1 = malloc(no * sizeof *out1),
         *lse1 = malloc(nl * sizeof *lse1), *dqkv1 = malloc(nq * sizeof *dqkv1);
    real *rout = malloc(no * sizeof *rout), *att = malloc(na * sizeof *att),
         *datt = malloc(na * sizeof *datt), *rdqkv = malloc(nq * sizeof *rdqkv);
    test_rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < nq; i++) qkv[i] = (real)(1.5 * rng_normal(&r)); // peaked rows too
    for (size_t i = 0; i < no; i++) dout[i] = (real)rng_normal(&r);

    // threaded, with the scratch the backend asks for (2 threads)
    cpu_backend_set_threads(be, 2);
    const size_t n_scratch = be->attention_scratch_size(be, S, hd);
    real *scratch = malloc(n_scratch * sizeof *scratch);
    be->attention_forward(be, out, lse, qkv, sh, scratch, n_scratch);
    for (size_t i = 0; i < nq; i++) dqkv[i] = -1; // the backward must overwrite every entry
    be->attention_backward(be, dqkv, dout, qkv, out, lse, sh, scratch, n_scratch);

    // the formula
    double *want_o = malloc(no * sizeof *want_o), *want_l = malloc(nl * sizeof *want_l);
    direct_forward(want_o, want_l, qkv, B, S, H, KV, hd);
    double *got_o = to_double(out, no), *got_l = to_double(lse, nl);
    check_rel("forward out == direct evaluation", got_o, want_o, no, TOL_REF);
    check_rel("forward lse == direct evaluation", got_l, want_l, nl, TOL_REF);
    free(got_o), free(got_l), free(want_o), free(want_l);

    // the previous implementation (S x S kept)
    ref_attention_forward(rout, att, qkv, B, S, H, KV, hd);
    for (size_t i = 0; i < nq; i++) rdqkv[i] = -1;
    ref_attention_backward(rdqkv, datt, dout, qkv, att, B, S, H, KV, hd);
    check_rel_real("forward out == S x S implementation", out, rout, no, TOL_REF);
    for (int part = 0; part < 3; part++) {
        static const char *what[3] = {"backward dq == S x S implementation",
                                      "backward dk == S x S implementation",
                                      "backward dv == S x S implementation"};
        real *g = qkv_part(dqkv, T, H, KV, hd, part), *w = qkv_part(rdqkv, T, H, KV, hd, part);
        check_rel_real(what[part], g, w, (size_t)T * (part ? KV : H) * hd, TOL_REF);
        free(g), free(w);
    }
    int written = 1;
    for (size_t i = 0; i < nq; i++) written &= dqkv[i] != -1;
    check_true("backward writes every dqkv entry", written);

    // one slot of scratch: the kernels run on one thread and give the same bits
    cpu_backend_set_threads(be, 1);
    const size_t n_one = be->attention_scratch_size(be, S, hd);
    cpu_backend_set_threads(be, 2);
    be->attention_forward(be, out1, lse1, qkv, sh, scratch, n_one);
    be->attention_backward(be, dqkv1, dout, qkv, out1, lse1, sh, scratch, n_one);
    check_true("one scratch slot (1 thread) == 2 threads, bit for bit",
               !memcmp(out, out1, no * sizeof *out) && !memcmp(lse, lse1, nl * sizeof *lse) &&
                   !memcmp(dqkv, dqkv1, nq * sizeof *dqkv));
    // a scratch sized for sequences of 2S (as the model sizes it for max_seq) serves S
    const size_t n_long = be->attention_scratch_size(be, 2 * S, hd);
    real *scratch_long = malloc(n_long * sizeof *scratch_long);
    be->attention_forward(be, out1, lse1, qkv, sh, scratch_long, n_long);
    be->attention_backward(be, dqkv1, dout, qkv, out1, lse1, sh, scratch_long, n_long);
    check_true("scratch for 2S used at S == scratch for S, bit for bit",
               !memcmp(out, out1, no * sizeof *out) && !memcmp(lse, lse1, nl * sizeof *lse) &&
                   !memcmp(dqkv, dqkv1, nq * sizeof *dqkv));
    // per thread an affine function of S (the bf16 slot's emulated GEMM operands add S hd + 64 hd;
    // the fp32 slot's rows are padded by up to 31 floats): at 2S under 3x, where S^2 gives 4x
    check_true("scratch is threads x O(S), not O(B H S^2)",
               n_scratch == 2 * n_one && n_long >= n_scratch && n_long < 3 * n_scratch);
    free(scratch_long), free(scratch);
    free(qkv), free(dout), free(out), free(lse), free(dqkv), free(out1), free(lse1), free(dqkv1);
    free(rout), free(att), free(datt), free(rdqkv);
}

#ifdef MOE_REAL_DOUBLE
// sum over (b, i, h, c) of out * w: the scalar whose gradient the backward computes with dout = w
static double weighted_out(moe_backend *be, shape sh, const real *qkv, const real *w, real *out,
                           real *lse, real *scratch, size_t n_scratch) {
    be->attention_forward(be, out, lse, qkv, sh, scratch, n_scratch);
    double s = 0;
    for (size_t i = 0; i < (size_t)sh.B * sh.S * sh.H * sh.hd; i++) s += out[i] * w[i];
    return s;
}

// The new backward against central differences of the forward on 400 entries of qkv.
static void check_finite_differences(moe_backend *be, shape sh) {
    const size_t nq = (size_t)sh.B * sh.S * (sh.H + 2 * sh.KV) * sh.hd,
                 no = (size_t)sh.B * sh.S * sh.H * sh.hd, nl = (size_t)sh.B * sh.H * sh.S;
    const size_t n_scratch = be->attention_scratch_size(be, sh.S, sh.hd);
    real *qkv = malloc(nq * sizeof *qkv), *dqkv = malloc(nq * sizeof *dqkv),
         *out = malloc(no * sizeof *out), *w = malloc(no * sizeof *w),
         *lse = malloc(nl * sizeof *lse), *scratch = malloc(n_scratch * sizeof *scratch);
    test_rng r;
    rng_seed(&r, 21);
    for (size_t i = 0; i < nq; i++) qkv[i] = rng_normal(&r);
    for (size_t i = 0; i < no; i++) w[i] = rng_normal(&r);
    be->attention_forward(be, out, lse, qkv, sh, scratch, n_scratch);
    be->attention_backward(be, dqkv, w, qkv, out, lse, sh, scratch, n_scratch);
    enum { N_CHECK = 400 };
    double got[N_CHECK], fd[N_CHECK];
    const double eps = 1e-5;
    for (int n = 0; n < N_CHECK; n++) {
        size_t i = (size_t)(rng_uniform(&r) * (double)nq);
        if (n < 3) i = (size_t)n * 97; // a few from the first rows
        const double x = qkv[i];
        qkv[i] = x + eps;
        const double up = weighted_out(be, sh, qkv, w, out, lse, scratch, n_scratch);
        qkv[i] = x - eps;
        const double down = weighted_out(be, sh, qkv, w, out, lse, scratch, n_scratch);
        qkv[i] = x;
        fd[n] = (up - down) / (2 * eps);
        got[n] = dqkv[i];
    }
    check_rel("backward dq, dk, dv == finite differences (400 entries)", got, fd, N_CHECK, 1e-7);
    free(qkv), free(dqkv), free(out), free(w), free(lse), free(scratch);
}
#endif

#ifdef MOE_VEC16
// vec_math.h's 16-lane twins, which attention.c's AVX-512 loops use, against the scalar
// functions bit for bit: vec_exp16 == vec_exp on a sweep of [-100, 100] in steps of 1/1024
// (the clamps at -87 and 88 inside), +-inf, NaN, -0 and denormals; vec_to_bf16_16 ==
// moe_f32_to_bf16 on every 65521st bit pattern (all classes: NaN, inf, denormals, ties);
// vec_to_bf16_16_normal the same on those patterns but the subnormals, and on every output
// of the exp sweep (what attention rounds with it).
static void check_vec16(void) {
    printf("16-lane exp and bf16 rounding == the scalar functions\n");
    float x[16];
    long bad_exp = 0, bad_bf16 = 0, n_exp = 0, n_bf16 = 0, bad_normal = 0, n_normal = 0;
    const float special[8] = {INFINITY, -INFINITY, NAN, -0.0f, 1e-40f, -1e-40f, -87.0f, 88.0f};
    for (long i = -102400 - 8; i <= 102400; i += 16) {
        for (int l = 0; l < 16; l++)
            x[l] = i + l < -102400 ? special[(i + l + 102400 + 8) % 8] : (float)(i + l) / 1024;
        float y[16];
        uint16_t e16[16];
        _mm512_storeu_ps(y, vec_exp16(_mm512_loadu_ps(x)));
        _mm256_storeu_si256((__m256i *)e16, vec_to_bf16_16_normal(_mm512_loadu_ps(y)));
        for (int l = 0; l < 16; l++, n_exp++, n_normal++) {
            const float want = vec_exp(x[l]);
            bad_exp += memcmp(&want, &y[l], sizeof want) != 0;
            bad_normal += e16[l] != moe_f32_to_bf16(y[l]);
        }
    }
    for (uint64_t b = 0; b < ((uint64_t)1 << 32); b += 16 * 65521) {
        for (int l = 0; l < 16; l++) {
            const uint32_t u = (uint32_t)(b + (uint64_t)l * 65521);
            memcpy(&x[l], &u, sizeof u);
        }
        uint16_t h[16], hn[16];
        _mm256_storeu_si256((__m256i *)h, vec_to_bf16_16(_mm512_loadu_ps(x)));
        _mm256_storeu_si256((__m256i *)hn, vec_to_bf16_16_normal(_mm512_loadu_ps(x)));
        for (int l = 0; l < 16; l++, n_bf16++) {
            bad_bf16 += h[l] != moe_f32_to_bf16(x[l]);
            if (fpclassify(x[l]) != FP_SUBNORMAL)
                n_normal++, bad_normal += hn[l] != moe_f32_to_bf16(x[l]);
        }
    }
    char what[120];
    snprintf(what, sizeof what, "vec_exp16 == vec_exp: %ld of %ld differ", bad_exp, n_exp);
    check_true(what, bad_exp == 0);
    snprintf(what, sizeof what, "vec_to_bf16_16 == moe_f32_to_bf16: %ld of %ld differ", bad_bf16,
             n_bf16);
    check_true(what, bad_bf16 == 0);
    snprintf(what, sizeof what,
             "vec_to_bf16_16_normal == moe_f32_to_bf16 away from subnormals: %ld of %ld differ",
             bad_normal, n_normal);
    check_true(what, bad_normal == 0);
}
#endif

int main(void) {
    moe_backend *be = test_backend();
#ifdef MOE_VEC16
    check_vec16();
#elif !defined(MOE_REAL_DOUBLE)
    printf("16-lane exp and bf16 rounding: not built here (no AVX-512 target)\n");
#endif
    const shape shapes[] = {
        {2, 150, 4, 2, 8},  // GQA, 3 query blocks, the last one partial
        {1, 128, 4, 4, 16}, // MHA, 2 full blocks
        {3, 70, 6, 1, 8},   // MQA: 6 query heads on one kv head
        {2, 2, 2, 1, 4},    // two tokens (row 0 attends to itself only: dq_0 = 0)
        {1, 203, 2, 1, 32}, // shakespeare's head size; a last block of 11 rows (tile tails)
        {1, 90, 2, 2, 72},  // a head of 32 + 32 + 8 columns (attention_gemm.c's masked tail)
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_shape(be, shapes[i], 100 + i);
#ifdef MOE_REAL_DOUBLE
    printf("finite differences, B=2 S=150 H=4 KV=2 hd=8\n");
    check_finite_differences(be, shapes[0]);
#endif
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
