// Causal GQA attention at a length of several query blocks (layers/cpu/attention.c works in
// blocks of 64 rows; the model tests use short sequences): the forward against a direct
// evaluation of the formula, the backward against central finite differences, in double.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "layers/backend.h"
#include "test_util.h"

enum { B = 2, S = 150, H = 4, KV = 2, HD = 8, ROW = (H + 2 * KV) * HD };

// sum over (b, i, h, c) of out * w: the scalar whose gradient the backward computes with dout = w
static double weighted_out(const moe_backend *be, const double *qkv, const double *w, double *out,
                           double *att) {
    be->attention_forward(out, att, qkv, B, S, H, KV, HD);
    double s = 0;
    for (size_t i = 0; i < (size_t)B * S * H * HD; i++) s += out[i] * w[i];
    return s;
}

int main(void) {
    const moe_backend *be = moe_backend_cpu();
    const size_t nq = (size_t)B * S * ROW, no = (size_t)B * S * H * HD, na = (size_t)B * H * S * S;
    double *qkv = malloc(nq * sizeof *qkv), *dqkv = malloc(nq * sizeof *dqkv);
    double *out = malloc(no * sizeof *out), *w = malloc(no * sizeof *w), *want = malloc(no * sizeof *want);
    double *att = malloc(na * sizeof *att), *datt = malloc(na * sizeof *datt);
    test_rng r;
    rng_seed(&r, 21);
    for (size_t i = 0; i < nq; i++) qkv[i] = rng_normal(&r);
    for (size_t i = 0; i < no; i++) w[i] = rng_normal(&r);

    // forward: o_i = sum_{j <= i} softmax_j(q_i . k_j / sqrt(hd)) v_j, kv head = h / (H / KV)
    be->attention_forward(out, att, qkv, B, S, H, KV, HD);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                const double *q = qkv + ((size_t)b * S + i) * ROW + h * HD;
                const int g = h / (H / KV);
                double s[S], mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const double *k = qkv + ((size_t)b * S + j) * ROW + (H + g) * HD;
                    s[j] = 0;
                    for (int c = 0; c < HD; c++) s[j] += q[c] * k[c];
                    s[j] /= sqrt((double)HD);
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int j = 0; j <= i; j++) sum += (s[j] = exp(s[j] - mx));
                double *o = want + ((size_t)b * S + i) * H * HD + h * HD;
                for (int c = 0; c < HD; c++) {
                    o[c] = 0;
                    for (int j = 0; j <= i; j++)
                        o[c] += s[j] / sum * qkv[((size_t)b * S + j) * ROW + (H + KV + g) * HD + c];
                }
            }
    check_rel("forward == direct evaluation (S = 150: 3 query blocks)", out, want, no, 1e-12);

    // backward with dout = w, against central differences of weighted_out on 400 entries
    for (size_t i = 0; i < nq; i++) dqkv[i] = -1; // the backward must overwrite every entry
    be->attention_backward(dqkv, datt, w, qkv, att, B, S, H, KV, HD);
    enum { N_CHECK = 400 };
    double got[N_CHECK], fd[N_CHECK];
    const double eps = 1e-5;
    for (int n = 0; n < N_CHECK; n++) {
        size_t i = (size_t)(rng_uniform(&r) * (double)nq);
        if (n < 3) i = (size_t)n * 97; // a few from the first rows
        const double x = qkv[i];
        qkv[i] = x + eps;
        const double up = weighted_out(be, qkv, w, out, att);
        qkv[i] = x - eps;
        const double down = weighted_out(be, qkv, w, out, att);
        qkv[i] = x;
        fd[n] = (up - down) / (2 * eps);
        got[n] = dqkv[i];
    }
    check_rel("backward dq, dk, dv == finite differences (400 entries)", got, fd, N_CHECK, 1e-7);
    free(qkv), free(dqkv), free(out), free(w), free(want), free(att), free(datt);
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
