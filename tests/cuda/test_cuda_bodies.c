// The CUDA kernels' per-element and per-row bodies (cuda/bodies.h), compiled as C and composed
// here the way the kernels compose them, against the CPU twins on random inputs: odd sizes,
// ties, experts without tokens, dropped assignments. No GPU needed: this runs in every CI.
// What it proves: the GPU's decomposition (capacity by rank instead of a merge sort, combine
// per output element, attention by key tiles with an online softmax, ...) computes the CPU's
// contract. What it cannot: the kernels' indexing and launch shapes (tests/cuda/test_cuda_twin.c
// on a GPU).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/bodies.h"
#include "layers/cpu/cpu_kernels.h"
#include "tests/test_util.h"

static moe_backend *cpu;
static test_rng rng;

static real *rand_reals(size_t n, double scale) {
    real *x = malloc(n * sizeof(real));
    for (size_t i = 0; i < n; i++) x[i] = (real)(scale * rng_normal(&rng));
    return x;
}
static double *to_double(const real *x, size_t n) {
    double *d = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}
static void check_reals(const char *what, const real *got, const real *want, size_t n, double tol) {
    double *g = to_double(got, n), *w = to_double(want, n);
    check_rel(what, g, w, n, tol);
    free(g);
    free(w);
}

// Random routing of T tokens to k distinct of E experts; expert `empty` gets none. Weights are
// drawn from a few values, so ties are common.
static void random_routing(int *idx, real *w, int T, int k, int E, int empty) {
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            int e, dup;
            do {
                e = (int)(rng_uniform(&rng) * E);
                dup = e == empty;
                for (int i = 0; i < j; i++) dup |= idx[t * k + i] == e;
            } while (dup);
            idx[t * k + j] = e;
            w[t * k + j] = (real)(1 + (int)(rng_uniform(&rng) * 4)) / 8;
        }
}

// k_capacity: per expert over its capacity, its slots in token order, then each one's rank.
static void gpu_capacity(int *keep, const int *idx, const real *w, int T, int k, int E, int C,
                         moe_drop_policy policy) {
    const int n = T * k;
    int *list = malloc((size_t)n * sizeof(int));
    for (int s = 0; s < n; s++) keep[s] = 1;
    for (int e = 0; e < E; e++) {
        int c = 0;
        for (int s = 0; s < n; s++)
            if (idx[s] == e) list[c++] = s;
        if (c <= C) continue;
        for (int pos = 0; pos < c; pos++)
            if (moe_hd_keep_rank(list[pos], pos, list, c, w, policy) >= C) keep[list[pos]] = 0;
    }
    free(list);
}

static void test_capacity(void) {
    printf("capacity: rank per slot == the CPU's sort (both policies, ties, an empty expert)\n");
    const int shapes[][3] = {{37, 3, 7}, {101, 2, 5}, {64, 4, 9}, {1, 1, 3}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        const int T = shapes[sh][0], k = shapes[sh][1], E = shapes[sh][2], n = T * k;
        int *idx = malloc((size_t)n * sizeof(int)), *counts = calloc((size_t)E, sizeof(int));
        int *keep_cpu = malloc((size_t)n * sizeof(int)),
            *keep_gpu = malloc((size_t)n * sizeof(int));
        int *scratch = malloc((size_t)2 * n * sizeof(int));
        real *w = malloc((size_t)n * sizeof(real));
        random_routing(idx, w, T, k, E, E / 2);
        for (int s = 0; s < n; s++) counts[idx[s]]++;
        for (int policy = 0; policy < 2; policy++)
            for (int C = 1; C <= T; C += 1 + T / 5) {
                cpu_moe_capacity_keep(cpu, keep_cpu, scratch, idx, w, counts, T, k, E, C,
                                      (moe_drop_policy)policy);
                gpu_capacity(keep_gpu, idx, w, T, k, E, C, (moe_drop_policy)policy);
                int same = !memcmp(keep_cpu, keep_gpu, (size_t)n * sizeof(int)), dropped = 0;
                for (int s = 0; s < n; s++) dropped += !keep_cpu[s];
                char what[96];
                snprintf(what, sizeof what, "T=%d k=%d E=%d C=%d %s: %d dropped", T, k, E, C,
                         policy ? "position" : "probs", dropped);
                check_true(what, same);
            }
        free(idx), free(counts), free(keep_cpu), free(keep_gpu), free(scratch), free(w);
    }
}

static void test_combine(void) {
    printf("combine and unpermute: one output element per thread, j in order\n");
    const int T = 29, k = 3, d = 13, N = T * k;
    int *rows = malloc((size_t)N * sizeof(int));
    for (int s = 0; s < N; s++)
        rows[s] = rng_uniform(&rng) < 0.2 ? -1 : (int)(rng_uniform(&rng) * N);
    real *y = rand_reals((size_t)N * d, 1), *w = rand_reals((size_t)N, 1);
    real *out_cpu = rand_reals((size_t)T * d, 1), *out_gpu = malloc((size_t)T * d * sizeof(real));
    cpu_moe_combine_forward(cpu, out_cpu, y, w, rows, T, k, d);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < d; i++)
            out_gpu[t * d + i] = moe_hd_combine_elem(y, w + t * k, rows + t * k, k, d, i);
    check_reals("combine forward", out_gpu, out_cpu, (size_t)T * d, 1e-6);
    real *dx_cpu = rand_reals((size_t)T * d, 1), *dx_gpu = malloc((size_t)T * d * sizeof(real));
    memcpy(dx_gpu, dx_cpu, (size_t)T * d * sizeof(real));
    cpu_moe_unpermute_add(cpu, dx_cpu, y, rows, T, k, d);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < d; i++)
            dx_gpu[t * d + i] = moe_hd_unpermute_elem(dx_gpu[t * d + i], y, rows + t * k, k, d, i);
    check_reals("unpermute add", dx_gpu, dx_cpu, (size_t)T * d, 1e-6);
    free(rows), free(y), free(w), free(out_cpu), free(out_gpu), free(dx_cpu), free(dx_gpu);
}

static void test_elementwise(void) {
    printf("SwiGLU, RoPE, AdamW elements\n");
    const int N = 7, ff = 19;
    real *h13 = rand_reals((size_t)N * 2 * ff, 2), *dact = rand_reals((size_t)N * ff, 1);
    real *a_cpu = malloc((size_t)N * ff * sizeof(real)),
         *a_gpu = malloc((size_t)N * ff * sizeof(real));
    real *d_cpu = malloc((size_t)N * 2 * ff * sizeof(real)),
         *d_gpu = malloc((size_t)N * 2 * ff * sizeof(real));
    cpu_swiglu_forward(cpu, a_cpu, h13, N, ff);
    cpu_swiglu_backward(cpu, d_cpu, dact, h13, N, ff);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < ff; c++) {
            const real *h = h13 + (size_t)r * 2 * ff;
            real *dh = d_gpu + (size_t)r * 2 * ff;
            a_gpu[r * ff + c] = moe_hd_swiglu(h[c], h[ff + c]);
            moe_hd_swiglu_backward(&dh[c], &dh[ff + c], dact[r * ff + c], h[c], h[ff + c]);
        }
    check_reals("swiglu forward", a_gpu, a_cpu, (size_t)N * ff, 1e-6);
    check_reals("swiglu backward", d_gpu, d_cpu, (size_t)N * 2 * ff, 1e-6);

    const int T = 5, S = 3, pos0 = 2, n_heads = 4, n_rot = 3, hd = 6, half = hd / 2, maxp = 8;
    real *x = rand_reals((size_t)T * n_heads * hd, 1), *cs = rand_reals((size_t)maxp * half, 1),
         *sn = rand_reals((size_t)maxp * half, 1);
    real *o_cpu = malloc((size_t)T * n_heads * hd * sizeof(real)),
         *o_gpu = malloc((size_t)T * n_heads * hd * sizeof(real));
    for (int inverse = 0; inverse < 2; inverse++) {
        const moe_rope_args ra = {.T = T,
                                  .S = S,
                                  .pos0 = pos0,
                                  .n_rot = n_rot,
                                  .n_heads = n_heads,
                                  .hd = hd,
                                  .inverse = inverse};
        cpu_rope(cpu, o_cpu, x, cs, sn, ra);
        memcpy(o_gpu, x, (size_t)T * n_heads * hd * sizeof(real)); // unrotated heads copied
        for (int t = 0; t < T; t++)
            for (int h = 0; h < n_rot; h++)
                for (int i = 0; i < half; i++) {
                    const size_t at = ((size_t)t * n_heads + h) * hd, pos = pos0 + t % S;
                    moe_hd_rope_pair(&o_gpu[at + i], &o_gpu[at + i + half], x[at + i],
                                     x[at + i + half], cs[pos * half + i],
                                     (inverse ? -1 : 1) * sn[pos * half + i]);
                }
        check_reals(inverse ? "rope inverse" : "rope", o_gpu, o_cpu, (size_t)T * n_heads * hd,
                    1e-6);
    }

    const size_t n = 33;
    real *p1 = rand_reals(n, 1), *m1 = rand_reals(n, 0.1), *v1 = rand_reals(n, 0.1),
         *g = rand_reals(n, 1);
    for (size_t i = 0; i < n; i++) v1[i] = v1[i] * v1[i];
    real *p2 = malloc(n * sizeof(real)), *m2 = malloc(n * sizeof(real)),
         *v2 = malloc(n * sizeof(real));
    memcpy(p2, p1, n * sizeof(real)), memcpy(m2, m1, n * sizeof(real)),
        memcpy(v2, v1, n * sizeof(real));
    // lr, beta1, beta2, eps, weight_decay, bc1, bc2, grad_scale
    const moe_adamw_hparams hp = {1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.19f, 0.0975f, 0.5f};
    cpu_adamw_update(cpu, p1, NULL, m1, v1, g, n, hp);
    for (size_t i = 0; i < n; i++) moe_hd_adamw(&p2[i], &m2[i], &v2[i], g[i], hp);
    check_reals("adamw params", p2, p1, n, 1e-6);
    check_reals("adamw m", m2, m1, n, 1e-6);
    check_reals("adamw v", v2, v1, n, 1e-6);
    free(h13), free(dact), free(a_cpu), free(a_gpu), free(d_cpu), free(d_gpu);
    free(x), free(cs), free(sn), free(o_cpu), free(o_gpu);
    free(p1), free(m1), free(v1), free(g), free(p2), free(m2), free(v2);
}

// k_attention_forward for one query row: keys in tiles of `tile`, the online softmax.
static void gpu_attention_row(real *o, real *lse, const real *q, const real *k, const real *v,
                              int stride, int n_keys, int hd, int tile, real scale) {
    real m = -INFINITY, l = 0, acc[64] = {0}, p[64];
    for (int j0 = 0; j0 < n_keys; j0 += tile) {
        const int n = n_keys - j0 < tile ? n_keys - j0 : tile;
        real s[64], tmax = -INFINITY;
        for (int jj = 0; jj < n; jj++) {
            real dot = 0;
            for (int c = 0; c < hd; c++) dot += q[c] * k[(size_t)(j0 + jj) * stride + c];
            s[jj] = scale * dot;
            tmax = s[jj] > tmax ? s[jj] : tmax;
        }
        real alpha, tsum = 0;
        const real mn = moe_hd_online_max(m, tmax, &alpha);
        for (int jj = 0; jj < n; jj++) tsum += p[jj] = real_exp(s[jj] - mn);
        l = l * alpha + tsum;
        m = mn;
        for (int c = 0; c < hd; c++) {
            real t = 0;
            for (int jj = 0; jj < n; jj++) t += p[jj] * v[(size_t)(j0 + jj) * stride + c];
            acc[c] = acc[c] * alpha + t;
        }
    }
    for (int c = 0; c < hd; c++) o[c] = acc[c] / l;
    *lse = m + real_log(l);
}

static void test_attention(void) {
    printf("attention forward: key tiles with an online softmax == the CPU's row softmax\n");
    const int B = 2, S = 45, H = 4, KV = 2, hd = 10, row = (H + 2 * KV) * hd, tile = 7;
    real *qkv = rand_reals((size_t)B * S * row, 1);
    real *out_cpu = malloc((size_t)B * S * H * hd * sizeof(real)),
         *out_gpu = malloc((size_t)B * S * H * hd * sizeof(real));
    real *lse_cpu = malloc((size_t)B * H * S * sizeof(real)),
         *lse_gpu = malloc((size_t)B * H * S * sizeof(real));
    const size_t ss = cpu_attention_scratch_size(cpu, S, hd);
    real *scratch = malloc(ss * sizeof(real));
    const moe_attention_shape sh = {.B = B, .S = S, .H = H, .KV = KV, .hd = hd};
    cpu_attention_forward(cpu, out_cpu, lse_cpu, qkv, sh, scratch, ss);
    const real scale = (real)(1.0 / sqrt((double)hd));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                const real *base = qkv + (size_t)b * S * row;
                gpu_attention_row(
                    out_gpu + ((size_t)b * S + i) * H * hd + (size_t)h * hd,
                    lse_gpu + ((size_t)b * H + h) * S + i, base + (size_t)i * row + (size_t)h * hd,
                    base + (size_t)(H + h / (H / KV)) * hd,
                    base + (size_t)(H + KV + h / (H / KV)) * hd, row, i + 1, hd, tile, scale);
            }
    check_reals("attention out", out_gpu, out_cpu, (size_t)B * S * H * hd, 1e-5);
    check_reals("attention lse", lse_gpu, lse_cpu, (size_t)B * H * S, 1e-5);

    printf("attention backward: D, dq per query row, dk and dv per key row (the group's heads)\n");
    real *dout = rand_reals((size_t)B * S * H * hd, 1);
    real *dqkv_cpu = malloc((size_t)B * S * row * sizeof(real)),
         *dqkv_gpu = malloc((size_t)B * S * row * sizeof(real));
    real *D = malloc((size_t)B * H * S * sizeof(real));
    cpu_attention_backward(cpu, dqkv_cpu, dout, qkv, out_cpu, lse_cpu, sh, scratch, ss);
    for (int b = 0; b < B; b++) // k_attention_D
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                const size_t at = ((size_t)b * S + i) * H * hd + (size_t)h * hd;
                D[((size_t)b * H + h) * S + i] = moe_hd_dot(dout + at, out_cpu + at, hd);
            }
    for (int b = 0; b < B; b++) {
        const real *base = qkv + (size_t)b * S * row;
        real *dbase = dqkv_gpu + (size_t)b * S * row;
        for (int h = 0; h < H; h++) // k_attention_dq
            for (int i = 0; i < S; i++) {
                const int g = h / (H / KV);
                const real *q = base + (size_t)i * row + (size_t)h * hd;
                const real *dO = dout + ((size_t)b * S + i) * H * hd + (size_t)h * hd;
                const size_t li = ((size_t)b * H + h) * S + i;
                real acc[64] = {0}, p;
                for (int j = 0; j <= i; j++) {
                    const real *k = base + (size_t)j * row + (size_t)(H + g) * hd;
                    const real ds = moe_hd_attn_ds(&p, q, k, k + (size_t)KV * hd, dO, hd, scale,
                                                   lse_cpu[li], D[li]);
                    for (int c = 0; c < hd; c++) acc[c] += ds * k[c];
                }
                memcpy(dbase + (size_t)i * row + (size_t)h * hd, acc, (size_t)hd * sizeof(real));
            }
        for (int g = 0; g < KV; g++) // k_attention_dkv
            for (int j = 0; j < S; j++) {
                const real *k = base + (size_t)j * row + (size_t)(H + g) * hd,
                           *v = k + (size_t)KV * hd;
                real dk[64] = {0}, dv[64] = {0}, p;
                for (int h = g * (H / KV); h < (g + 1) * (H / KV); h++)
                    for (int i = j; i < S; i++) {
                        const real *q = base + (size_t)i * row + (size_t)h * hd;
                        const real *dO = dout + ((size_t)b * S + i) * H * hd + (size_t)h * hd;
                        const size_t li = ((size_t)b * H + h) * S + i;
                        const real ds =
                            moe_hd_attn_ds(&p, q, k, v, dO, hd, scale, lse_cpu[li], D[li]);
                        for (int c = 0; c < hd; c++) dv[c] += p * dO[c], dk[c] += ds * q[c];
                    }
                memcpy(dbase + (size_t)j * row + (size_t)(H + g) * hd, dk,
                       (size_t)hd * sizeof(real));
                memcpy(dbase + (size_t)j * row + (size_t)(H + KV + g) * hd, dv,
                       (size_t)hd * sizeof(real));
            }
    }
    check_reals("attention backward dqkv", dqkv_gpu, dqkv_cpu, (size_t)B * S * row, 1e-5);
    free(dout), free(dqkv_cpu), free(dqkv_gpu), free(D);
    free(qkv), free(out_cpu), free(out_gpu), free(lse_cpu), free(lse_gpu), free(scratch);
}

// A table entry a backend leaves NULL is refused by name, not called.
static void test_missing_entry(void) {
    printf("MOE_BACKEND_REQUIRE: a missing kernel is an error naming it and the backend\n");
    moe_backend partial = *cpu;
    partial.swiglu_backward = NULL;
    check_true("present entry: MOE_OK", MOE_BACKEND_REQUIRE(&partial, swiglu_forward) == MOE_OK);
    const moe_status st = MOE_BACKEND_REQUIRE(&partial, swiglu_backward);
    printf("  %s\n", moe_last_error());
    check_true("missing entry: MOE_EINVAL naming it and the backend",
               st == MOE_EINVAL &&
                   strstr(moe_last_error(), "swiglu_backward is not supported by backend cpu"));
}

int main(void) {
    rng_seed(&rng, 13);
    if (moe_backend_create(&cpu, "cpu", NULL)) {
        fprintf(stderr, "%s\n", moe_last_error());
        return 1;
    }
    test_capacity();
    test_combine();
    test_elementwise();
    test_attention();
    test_missing_entry();
    moe_backend_destroy(cpu);
    printf(test_failures() ? "FAILED: %d\n" : "all passed\n", test_failures());
    return test_failures() != 0;
}
