// Every CUDA kernel against its CPU twin (the same table entry of the "cpu" backend) on the
// same random inputs: sizes that are not multiples of any block size, ties, experts without
// tokens, dropped assignments. The CUDA outputs are poisoned (NaN bytes) before each call, so an
// element the kernel fails to write fails the comparison. fp32: relative error <= 1e-5 (norm
// of the difference over the norm of the CPU's result); integer outputs exactly; TF32 GEMMs
// <= 2e-3. Exit 77 (ctest: skipped) when there is no CUDA device.
// $MOE_TWIN_DEVICE names another backend in place of "cuda" (cpu-strict: the harness itself
// checked on a machine without a GPU; the CUDA-only knobs are then left alone).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_backend.h"
#include "layers/backend.h"
#include "layers/bf16.h"
#include "layers/model.h"
#include "tests/test_util.h"

static moe_backend *C, *G; // the CPU and the CUDA backend
static int is_cuda;        // G is "cuda" (its knobs exist)

static void set_expert_gemm(cuda_expert_gemm mode) {
    if (is_cuda) cuda_backend_set_expert_gemm(G, mode);
}
static void set_tf32(int on) {
    if (is_cuda) cuda_backend_set_tf32(G, on);
}
static test_rng rng;

// One buffer on both backends.
typedef struct {
    void *c, *g;
    size_t bytes;
} twin;

static twin make(size_t bytes) {
    twin t = {C->alloc(C, bytes), G->alloc(G, bytes), bytes};
    if (!t.c || !t.g) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return t;
}
static twin from_host(const void *host, size_t bytes) {
    twin t = make(bytes);
    C->copy_to_device(C, t.c, host, bytes);
    G->copy_to_device(G, t.g, host, bytes);
    return t;
}
static twin reals(size_t n, double scale) {
    real *h = malloc(n * sizeof(real));
    for (size_t i = 0; i < n; i++) h[i] = (real)(scale * rng_normal(&rng));
    twin t = from_host(h, n * sizeof(real));
    free(h);
    return t;
}
static twin ints(const int *h, size_t n) { return from_host(h, n * sizeof(int)); }
// The CUDA side filled with 0xFF bytes (NaN as floats, -1 as ints) before the kernel runs.
static void poison(twin t) {
    void *h = malloc(t.bytes);
    memset(h, 0xFF, t.bytes);
    G->copy_to_device(G, t.g, h, t.bytes);
    free(h);
}
static twin output(size_t bytes) {
    twin t = make(bytes);
    poison(t);
    return t;
}
static void drop(twin t) {
    C->free(C, t.c);
    G->free(G, t.g);
}
#define RC(t) ((real *)(t).c)
#define RG(t) ((real *)(t).g)
#define IC(t) ((int *)(t).c)
#define IG(t) ((int *)(t).g)

static void same_reals(const char *what, twin t, size_t n, double tol) {
    real *a = malloc(n * sizeof(real)), *b = malloc(n * sizeof(real));
    double *da = malloc(n * sizeof(double)), *db = malloc(n * sizeof(double));
    G->copy_to_host(G, a, t.g, n * sizeof(real));
    C->copy_to_host(C, b, t.c, n * sizeof(real));
    for (size_t i = 0; i < n; i++) da[i] = a[i], db[i] = b[i];
    check_rel(what, da, db, n, tol);
    free(a), free(b), free(da), free(db);
}
static void same_ints(const char *what, twin t, size_t n) {
    int *a = malloc(n * sizeof(int)), *b = malloc(n * sizeof(int));
    G->copy_to_host(G, a, t.g, n * sizeof(int));
    C->copy_to_host(C, b, t.c, n * sizeof(int));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += a[i] != b[i];
    char line[128];
    snprintf(line, sizeof line, "%s: %zu of %zu differ", what, bad, n);
    check_true(line, bad == 0);
    free(a), free(b);
}

#define TOL 1e-5

static void test_gemm(double tol, const char *tag) {
    printf("GEMMs (%s)\n", tag);
    const int m = 67, n = 45, kd = 131;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            twin a = reals((size_t)m * kd, 1), b = reals((size_t)kd * n, 1),
                 c = reals((size_t)m * n, 1);
            C->matmul(C, RC(c), RC(a), RC(b), m, n, kd, ta, tb, 0.5f);
            G->matmul(G, RG(c), RG(a), RG(b), m, n, kd, ta, tb, 0.5f);
            char what[64];
            snprintf(what, sizeof what, "matmul ta=%d tb=%d beta=0.5", ta, tb);
            same_reals(what, c, (size_t)m * n, tol);
            drop(a), drop(b), drop(c);
        }
    // experts with 0, 1, odd and many rows
    const int E = 6, n_out = 38, n_in = 29, offsets[] = {0, 0, 1, 18, 18, 57, 60};
    const int N = offsets[E];
    for (int mode = 0; mode < 2; mode++) {
        set_expert_gemm(mode ? CUDA_EXPERT_GEMM_GROUPED : CUDA_EXPERT_GEMM_LOOP);
        const char *name = mode ? "grouped" : "loop";
        twin w = reals((size_t)E * n_out * n_in, 1), x = reals((size_t)N * n_in, 1);
        twin y = output((size_t)N * n_out * sizeof(real));
        C->expert_matmul_forward(C, RC(y), RC(x), RC(w), offsets, E, n_out, n_in);
        G->expert_matmul_forward(G, RG(y), RG(x), RG(w), offsets, E, n_out, n_in);
        char what[64];
        snprintf(what, sizeof what, "expert forward (%s)", name);
        same_reals(what, y, (size_t)N * n_out, tol);
        twin dy = reals((size_t)N * n_out, 1), dx = reals((size_t)N * n_in, 1);
        for (int acc = 0; acc < 2; acc++) {
            if (!acc) poison(dx);
            C->expert_matmul_backward_input(C, RC(dx), RC(dy), RC(w), offsets, E, n_out, n_in, acc);
            G->expert_matmul_backward_input(G, RG(dx), RG(dy), RG(w), offsets, E, n_out, n_in, acc);
            snprintf(what, sizeof what, "expert backward input acc=%d (%s)", acc, name);
            same_reals(what, dx, (size_t)N * n_in, tol);
        }
        twin dw = reals((size_t)E * n_out * n_in, 1); // accumulates; expert 0 and 3 have no rows
        C->expert_matmul_backward_weight(C, RC(dw), RC(dy), RC(x), offsets, E, n_out, n_in);
        G->expert_matmul_backward_weight(G, RG(dw), RG(dy), RG(x), offsets, E, n_out, n_in);
        snprintf(what, sizeof what, "expert backward weight (%s)", name);
        same_reals(what, dw, (size_t)E * n_out * n_in, tol);
        drop(w), drop(x), drop(y), drop(dy), drop(dx), drop(dw);
    }
    set_expert_gemm(CUDA_EXPERT_GEMM_LOOP);
}

// The MoE layer's kernels in the order of a forward and a backward, on shared inputs.
static void check_dispatch_bf16(twin x, twin rtok, twin y, twin dout, twin w, twin arow, int T,
                                int N, int k, int d);


// router_topk on both backends, the same arguments (bias NULL: no bias).
static void router_topk_twins(twin s, twin p, twin lse, twin idx, twin w, twin z, const twin *bias,
                              moe_router_shape shape, moe_router_hparams hp) {
    C->router_topk(C, RC(s), RC(p), RC(lse), IC(idx), RC(w), RC(z), bias ? RC(*bias) : NULL, shape,
                   hp);
    G->router_topk(G, RG(s), RG(p), RG(lse), IG(idx), RG(w), RG(z), bias ? RG(*bias) : NULL, shape,
                   hp);
}

static void test_router_dispatch(moe_scoring scoring, int with_bias, int capacity,
                                 moe_drop_policy policy) {
    printf("router + dispatch (%s%s, capacity %d, %s)\n",
           scoring == MOE_SCORE_SOFTMAX ? "softmax" : "sigmoid", with_bias ? ", bias" : "",
           capacity, policy == MOE_DROP_PROBS ? "probs" : "position");
    const int T = 203, E = 9, k = 3, d = 37, seq_len = 29; // T = 7 sequences
    // logits with ties: a few values per row, expert 4 never chosen (very low)
    real *zh = malloc((size_t)T * E * sizeof(real));
    for (int i = 0; i < T * E; i++)
        zh[i] = (i % E == 4) ? -30.0f : (real)((int)(rng_uniform(&rng) * 5) - 2) * 0.5f;
    twin z = from_host(zh, (size_t)T * E * sizeof(real));
    free(zh);
    twin bias = reals((size_t)E, 0.01);
    twin s = output((size_t)T * E * sizeof(real)), p = output((size_t)T * E * sizeof(real));
    twin lse = output((size_t)T * sizeof(real)), idx = output((size_t)T * k * sizeof(int));
    twin w = output((size_t)T * k * sizeof(real));
    const moe_router_shape shape = {.T = T, .E = E, .k = k, .seq_len = seq_len};
    const moe_router_hparams hp = {.scoring = scoring,
                                   .norm_topk_prob = 1,
                                   .route_scale = 1.5f,
                                   .aux_coef = 0.01f,
                                   .seq_aux_coef = 0.003f,
                                   .z_coef = 0.001f};
    router_topk_twins(s, p, lse, idx, w, z, with_bias ? &bias : NULL, shape, hp);
    same_ints("router_topk idx (ties: lower index)", idx, (size_t)T * k);
    same_reals("router_topk scores", s, (size_t)T * E, TOL);
    same_reals("router_topk probs", p, (size_t)T * E, TOL);
    same_reals("router_topk lse", lse, (size_t)T, TOL);
    same_reals("router_topk weights", w, (size_t)T * k, TOL);
    { // group-limited routing (DeepSeek-V3): 3 groups of 3 experts, the best 2 kept
        moe_router_hparams hg = hp;
        hg.n_group = 3, hg.topk_group = 2;
        twin gi = output((size_t)T * k * sizeof(int)), gw = output((size_t)T * k * sizeof(real));
        router_topk_twins(s, p, lse, gi, gw, z, with_bias ? &bias : NULL, shape, hg);
        same_ints("router_topk idx, group-limited", gi, (size_t)T * k);
        same_reals("router_topk weights, group-limited", gw, (size_t)T * k, TOL);
        drop(gi), drop(gw);
    }
    // from here both sides continue from the CPU's choices, so that decisions are compared on
    // identical inputs (the weights may differ in the last bit)
    {
        int *h = malloc((size_t)T * k * sizeof(int));
        real *hw = malloc((size_t)T * k * sizeof(real));
        C->copy_to_host(C, h, idx.c, (size_t)T * k * sizeof(int));
        C->copy_to_host(C, hw, w.c, (size_t)T * k * sizeof(real));
        G->copy_to_device(G, idx.g, h, (size_t)T * k * sizeof(int));
        G->copy_to_device(G, w.g, hw, (size_t)T * k * sizeof(real));
        free(h), free(hw);
    }
    twin counts = output((size_t)E * sizeof(int)),
         sc = output((size_t)T / seq_len * E * sizeof(int));
    C->moe_dispatch_counts(C, IC(counts), IC(idx), T, k, E);
    G->moe_dispatch_counts(G, IG(counts), IG(idx), T, k, E);
    same_ints("dispatch_counts", counts, (size_t)E);
    C->moe_seq_counts(C, IC(sc), IC(idx), T, k, E, seq_len);
    G->moe_seq_counts(G, IG(sc), IG(idx), T, k, E, seq_len);
    same_ints("seq_counts", sc, (size_t)T / seq_len * E);

    twin keep = output((size_t)T * k * sizeof(int)),
         scratch = make((size_t)2 * T * k * sizeof(int));
    C->moe_capacity_keep(C, IC(keep), IC(scratch), IC(idx), RC(w), IC(counts), T, k, E, capacity,
                         policy);
    G->moe_capacity_keep(G, IG(keep), IG(scratch), IG(idx), RG(w), IG(counts), T, k, E, capacity,
                         policy);
    same_ints("capacity_keep", keep, (size_t)T * k);
    twin offsets = output((size_t)(E + 1) * sizeof(int)),
         arow = output((size_t)T * k * sizeof(int));
    twin rtok = make((size_t)T * k * sizeof(int));
    C->moe_permute_index(C, IC(offsets), IC(arow), IC(rtok), IC(idx), IC(keep), T, k, E);
    G->moe_permute_index(G, IG(offsets), IG(arow), IG(rtok), IG(idx), IG(keep), T, k, E);
    same_ints("permute_index offsets", offsets, (size_t)E + 1);
    same_ints("permute_index assign_row", arow, (size_t)T * k);
    int off[64];
    C->copy_to_host(C, off, offsets.c, (size_t)(E + 1) * sizeof(int));
    const int N = off[E];
    same_ints("permute_index row_token", rtok, (size_t)N);

    twin x = reals((size_t)T * d, 1), xp = output((size_t)(N + 1) * d * sizeof(real));
    C->moe_permute(C, RC(xp), RC(x), IC(rtok), N, d);
    G->moe_permute(G, RG(xp), RG(x), IG(rtok), N, d);
    same_reals("permute", xp, (size_t)N * d, 0);
    twin y = reals((size_t)(N + 1) * d, 1), out = output((size_t)T * d * sizeof(real));
    C->moe_combine_forward(C, RC(out), RC(y), RC(w), IC(arow), T, k, d);
    G->moe_combine_forward(G, RG(out), RG(y), RG(w), IG(arow), T, k, d);
    same_reals("combine forward", out, (size_t)T * d, TOL);
    twin dout = reals((size_t)T * d, 1), dy = output((size_t)(N + 1) * d * sizeof(real));
    twin dw = output((size_t)T * k * sizeof(real));
    C->moe_combine_backward(C, RC(dy), RC(dw), RC(dout), RC(y), RC(w), IC(arow), T, k, d);
    G->moe_combine_backward(G, RG(dy), RG(dw), RG(dout), RG(y), RG(w), IG(arow), T, k, d);
    same_reals("combine backward dy", dy, (size_t)N * d, TOL);
    same_reals("combine backward dweights", dw, (size_t)T * k, TOL);
    check_dispatch_bf16(x, rtok, y, dout, w, arow, T, N, k, d);
    twin dx = reals((size_t)T * d, 1);
    C->moe_unpermute_add(C, RC(dx), RC(dy), IC(arow), T, k, d);
    G->moe_unpermute_add(G, RG(dx), RG(dy), IG(arow), T, k, d);
    same_reals("unpermute_add", dx, (size_t)T * d, TOL);

    twin losses = output(MOE_LOSS_SLOTS * sizeof(real));
    C->router_losses(C, RC(losses), RC(p), RC(z), RC(lse), IC(counts), IC(sc), shape, hp);
    G->router_losses(G, RG(losses), RG(p), RG(z), RG(lse), IG(counts), IG(sc), shape, hp);
    same_reals("router_losses (every slot)", losses, MOE_LOSS_SLOTS, TOL);
    twin dz = output((size_t)T * E * sizeof(real));
    C->router_backward(C, RC(dz), RC(dw), RC(s), RC(p), RC(z), RC(lse), IC(idx), RC(w), IC(counts),
                       IC(sc), shape, hp, 0.5f);
    G->router_backward(G, RG(dz), RG(dw), RG(s), RG(p), RG(z), RG(lse), IG(idx), RG(w), IG(counts),
                       IG(sc), shape, hp, 0.5f);
    same_reals("router_backward", dz, (size_t)T * E, TOL);

    // expert-parallel reorder: blocks of rows, not in order
    const moe_row_chunk chunks[] = {{0, 7, 5}, {5, 0, 7}, {12, 12, 0}, {12, 12, 3}};
    twin cdst = output((size_t)15 * d * sizeof(real));
    C->moe_copy_chunks(C, RC(cdst), RC(x), chunks, 4, d);
    G->moe_copy_chunks(G, RG(cdst), RG(x), chunks, 4, d);
    same_reals("copy_chunks", cdst, (size_t)15 * d, 0);
    twin all[] = {z,    bias, s,  p, lse, idx,  w,  counts, sc, keep,   scratch, offsets, arow,
                  rtok, x,    xp, y, out, dout, dy, dw,     dx, losses, dz,      cdst};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
}

// On each backend, the bf16 weights an update wrote beside params are to_bf16(params) bit for
// bit (each side against its own params: the twins' params agree only within TOL).
static void check_written_bf16(const char *what, twin p16, twin params, size_t n) {
    const size_t bytes = n * sizeof(moe_bf16);
    twin ref = output(bytes);
    C->to_bf16(C, (moe_bf16 *)ref.c, RC(params), n);
    G->to_bf16(G, (moe_bf16 *)ref.g, RG(params), n);
    moe_bf16 *a = malloc(bytes), *b = malloc(bytes);
    int same = 1;
    for (int side = 0; side < 2; side++) {
        moe_backend *be = side ? G : C;
        be->copy_to_host(be, a, side ? p16.g : p16.c, bytes);
        be->copy_to_host(be, b, side ? ref.g : ref.c, bytes);
        same &= !memcmp(a, b, bytes);
    }
    check_true(what, same);
    free(a), free(b);
    drop(ref);
}

static void test_elementwise(void) {
    printf("elementwise, SwiGLU, noise, optimizer, reductions\n");
    const size_t n = 100003;
    twin a = reals(n, 1), b = reals(n, 1), o = output(n * sizeof(real));
    C->add(C, RC(o), RC(a), RC(b), n);
    G->add(G, RG(o), RG(a), RG(b), n);
    same_reals("add", o, n, 0);
    for (int acc = 0; acc < 2; acc++) {
        C->mul(C, RC(o), RC(a), RC(b), n, acc);
        G->mul(G, RG(o), RG(a), RG(b), n, acc);
        same_reals(acc ? "mul +=" : "mul", o, n, TOL);
    }
    poison(o);
    C->uniform_noise(C, RC(o), n, 0x1234567890abcdefull, 0.99f, 1.01f);
    G->uniform_noise(G, RG(o), n, 0x1234567890abcdefull, 0.99f, 1.01f);
    same_reals("uniform_noise (the same numbers)", o, n, 0);
    const int N = 77, ff = 45;
    twin h13 = reals((size_t)N * 2 * ff, 2), act = output((size_t)N * ff * sizeof(real));
    C->swiglu_forward(C, RC(act), RC(h13), N, ff);
    G->swiglu_forward(G, RG(act), RG(h13), N, ff);
    same_reals("swiglu forward", act, (size_t)N * ff, TOL);
    twin dh = output((size_t)N * 2 * ff * sizeof(real));
    C->swiglu_backward(C, RC(dh), RC(act), RC(h13), N, ff);
    G->swiglu_backward(G, RG(dh), RG(act), RG(h13), N, ff);
    same_reals("swiglu backward", dh, (size_t)N * 2 * ff, TOL);
    double sc = 0, sg = 0;
    C->sum_squares(C, &sc, RC(a), n);
    G->sum_squares(G, &sg, RG(a), n);
    check_rel("sum_squares", &sg, &sc, 1, 1e-12);
    C->sum(C, &sc, RC(a), n);
    G->sum(G, &sg, RG(a), n);
    check_rel("sum", &sg, &sc, 1, 1e-10);
    twin pm = reals(n, 1), m = reals(n, 0.1), v = reals(n, 0.1), g = reals(n, 1);
    C->mul(C, RC(v), RC(v), RC(v), n, 0); // v >= 0
    G->mul(G, RG(v), RG(v), RG(v), n, 0);
    twin p16 = output(n * sizeof(moe_bf16));
    // lr, beta1, beta2, eps, weight_decay, bc1, bc2, grad_scale
    const moe_adamw_hparams hp = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.19f, 0.0975f, 0.7f};
    C->adamw_update(C, RC(pm), (moe_bf16 *)p16.c, RC(m), RC(v), RC(g), n, hp);
    G->adamw_update(G, RG(pm), (moe_bf16 *)p16.g, RG(m), RG(v), RG(g), n, hp);
    same_reals("adamw params", pm, n, TOL);
    same_reals("adamw m", m, n, TOL);
    same_reals("adamw v", v, n, TOL);
    check_written_bf16("adamw params16 == to_bf16(params)", p16, pm, n);
    C->sgd_update(C, RC(pm), (moe_bf16 *)p16.c, RC(g), n, 0.1f, 0.5f);
    G->sgd_update(G, RG(pm), (moe_bf16 *)p16.g, RG(g), n, 0.1f, 0.5f);
    same_reals("sgd", pm, n, TOL);
    check_written_bf16("sgd params16 == to_bf16(params)", p16, pm, n);
    twin all[] = {a, b, o, h13, act, dh, pm, m, v, g, p16};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
}

static void test_dense(void) {
    printf("embedding, RMSNorm, RoPE, cross-entropy\n");
    const int T = 131, d = 301, V = 517;
    int tok[131];
    for (int t = 0; t < T; t++) tok[t] = t % 3 ? (int)(rng_uniform(&rng) * V) : 5; // repeats
    twin tokens = ints(tok, (size_t)T), embed = reals((size_t)V * d, 1);
    twin x = output((size_t)T * d * sizeof(real));
    C->embedding_forward(C, RC(x), IC(tokens), RC(embed), T, d);
    G->embedding_forward(G, RG(x), IG(tokens), RG(embed), T, d);
    same_reals("embedding forward", x, (size_t)T * d, 0);
    twin dout = reals((size_t)T * d, 1), dembed = reals((size_t)V * d, 1);
    C->embedding_backward(C, RC(dembed), RC(dout), IC(tokens), T, d);
    G->embedding_backward(G, RG(dembed), RG(dout), IG(tokens), T, d);
    same_reals("embedding backward (+=)", dembed, (size_t)V * d, TOL);
    twin w = reals((size_t)d, 1), y = output((size_t)T * d * sizeof(real));
    twin rstd = output((size_t)T * sizeof(real));
    C->rmsnorm_forward(C, RC(y), RC(rstd), RC(x), RC(w), T, d, 1e-5f);
    G->rmsnorm_forward(G, RG(y), RG(rstd), RG(x), RG(w), T, d, 1e-5f);
    same_reals("rmsnorm out", y, (size_t)T * d, TOL);
    same_reals("rmsnorm rstd", rstd, (size_t)T, TOL);
    twin dx = reals((size_t)T * d, 1), dw = reals((size_t)d, 1);
    C->rmsnorm_backward(C, RC(dx), RC(dw), RC(dout), RC(x), RC(w), RC(rstd), T, d);
    G->rmsnorm_backward(G, RG(dx), RG(dw), RG(dout), RG(x), RG(w), RG(rstd), T, d);
    same_reals("rmsnorm dinp (+=)", dx, (size_t)T * d, TOL);
    same_reals("rmsnorm dweight (+=)", dw, (size_t)d, TOL);

    const int Tr = 23, S = 7, n_heads = 5, n_rot = 3, hd = 10, maxp = 16;
    twin q = reals((size_t)Tr * n_heads * hd, 1), cs = reals((size_t)maxp * hd / 2, 1),
         sn = reals((size_t)maxp * hd / 2, 1);
    twin r = output((size_t)Tr * n_heads * hd * sizeof(real));
    moe_rope_args ra = {
        .T = Tr, .S = S, .pos0 = 3, .n_rot = n_rot, .n_heads = n_heads, .hd = hd, .inverse = 0};
    for (int inverse = 0; inverse < 2; inverse++) {
        ra.inverse = inverse;
        C->rope(C, RC(r), RC(q), RC(cs), RC(sn), ra);
        G->rope(G, RG(r), RG(q), RG(cs), RG(sn), ra);
        same_reals(inverse ? "rope inverse" : "rope", r, (size_t)Tr * n_heads * hd, TOL);
    }
    ra.pos0 = 0, ra.inverse = 0;
    C->rope(C, RC(q), RC(q), RC(cs), RC(sn), ra); // in place
    G->rope(G, RG(q), RG(q), RG(cs), RG(sn), ra);
    same_reals("rope in place", q, (size_t)Tr * n_heads * hd, TOL);

    twin logits = reals((size_t)T * V, 3), ce = output((size_t)T * sizeof(real));
    C->cross_entropy_forward(C, RC(ce), RC(logits), IC(tokens), T, V);
    G->cross_entropy_forward(G, RG(ce), RG(logits), IG(tokens), T, V);
    same_reals("cross_entropy forward", ce, (size_t)T, TOL);
    twin dl = output((size_t)T * V * sizeof(real));
    C->cross_entropy_backward(C, RC(dl), RC(logits), IC(tokens), T, V, 0.25f);
    G->cross_entropy_backward(G, RG(dl), RG(logits), IG(tokens), T, V, 0.25f);
    same_reals("cross_entropy backward", dl, (size_t)T * V, TOL);
    twin all[] = {tokens, embed, x, dout, dembed, w, y, rstd, dx, dw, q, cs, sn, r, logits, ce, dl};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
}

// Both sides filled with 0xFF bytes (NaN): the columns a kernel must not write.
static void poison_both(twin t) {
    void *h = malloc(t.bytes);
    memset(h, 0xFF, t.bytes);
    C->copy_to_device(C, t.c, h, t.bytes);
    G->copy_to_device(G, t.g, h, t.bytes);
    free(h);
}
// Rows of `stride` reals: columns [off, off + width) compared as same_reals does, and on both
// sides every other column still the poison (0xFF bytes) it held.
static void same_segments(const char *what, twin t, int T, int stride, int off, int width,
                          double tol) {
    const size_t n = (size_t)T * stride, nw = (size_t)T * width;
    real *a = malloc(n * sizeof(real)), *b = malloc(n * sizeof(real)), p;
    double *da = malloc(nw * sizeof(double)), *db = malloc(nw * sizeof(double));
    memset(&p, 0xFF, sizeof p);
    G->copy_to_host(G, a, t.g, n * sizeof(real));
    C->copy_to_host(C, b, t.c, n * sizeof(real));
    size_t k = 0, written = 0;
    for (int r = 0; r < T; r++)
        for (int i = 0; i < stride; i++) {
            const size_t j = (size_t)r * stride + i;
            if (i >= off && i < off + width)
                da[k] = a[j], db[k++] = b[j];
            else
                written += memcmp(&a[j], &p, sizeof p) != 0 || memcmp(&b[j], &p, sizeof p) != 0;
        }
    check_rel(what, da, db, nw, tol);
    char line[128];
    snprintf(line, sizeof line, "%s: other columns untouched (%zu written)", what, written);
    check_true(line, written == 0);
    free(a), free(b), free(da), free(db);
}

// The q/k norm on T rows of `stride` reals: n_heads segments of hd from column off.
static void test_head_rmsnorm(int T, int stride, int off, int n_heads, int hd) {
    printf("head_rmsnorm T=%d stride=%d off=%d n_heads=%d hd=%d\n", T, stride, off, n_heads, hd);
    const size_t n = (size_t)T * stride, ns = (size_t)T * n_heads;
    const int width = n_heads * hd;
    twin x = reals(n, 1), w = reals((size_t)hd, 1), dout = reals(n, 1);
    twin y = make(n * sizeof(real)), rstd = output(ns * sizeof(real));
    poison_both(y);
    C->head_rmsnorm_forward(C, RC(y) + off, RC(rstd), RC(x) + off, RC(w), T, stride, n_heads, hd,
                            1e-5f);
    G->head_rmsnorm_forward(G, RG(y) + off, RG(rstd), RG(x) + off, RG(w), T, stride, n_heads, hd,
                            1e-5f);
    same_segments("head_rmsnorm out", y, T, stride, off, width, TOL);
    same_reals("head_rmsnorm rstd", rstd, ns, TOL);
    twin dx = make(n * sizeof(real)), dw = reals((size_t)hd, 1);
    poison_both(dx);
    C->head_rmsnorm_backward(C, RC(dx) + off, RC(dw), RC(dout) + off, RC(x) + off, RC(w), RC(rstd),
                             T, stride, n_heads, hd);
    G->head_rmsnorm_backward(G, RG(dx) + off, RG(dw), RG(dout) + off, RG(x) + off, RG(w), RG(rstd),
                             T, stride, n_heads, hd);
    same_segments("head_rmsnorm dinp", dx, T, stride, off, width, TOL);
    same_reals("head_rmsnorm dweight (+=)", dw, (size_t)hd, TOL);
    // in place (dinp = dout), into a nonzero dweight again; the other columns keep dout
    C->head_rmsnorm_backward(C, RC(dout) + off, RC(dw), RC(dout) + off, RC(x) + off, RC(w),
                             RC(rstd), T, stride, n_heads, hd);
    G->head_rmsnorm_backward(G, RG(dout) + off, RG(dw), RG(dout) + off, RG(x) + off, RG(w),
                             RG(rstd), T, stride, n_heads, hd);
    same_reals("head_rmsnorm dinp in place (whole rows)", dout, n, TOL);
    same_reals("head_rmsnorm dweight (+=, twice)", dw, (size_t)hd, TOL);
    twin all[] = {x, w, dout, y, rstd, dx, dw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
}

// The linear bias and the shared expert's sigmoid gate on [T, n].
static void test_bias_gate(int T, int n) {
    printf("bias, sigmoid gate T=%d n=%d\n", T, n);
    const size_t tn = (size_t)T * n;
    twin out = reals(tn, 1), b = reals((size_t)n, 1), dout = reals(tn, 1), db = reals((size_t)n, 1);
    C->bias_add(C, RC(out), RC(b), T, n);
    G->bias_add(G, RG(out), RG(b), T, n);
    same_reals("bias_add (+=)", out, tn, 0);
    C->bias_backward(C, RC(db), RC(dout), T, n);
    G->bias_backward(G, RG(db), RG(dout), T, n);
    same_reals("bias_backward (+=)", db, (size_t)n, TOL);
    twin z = reals((size_t)T, 3), y = reals(tn, 1);
    C->sigmoid_gate_forward(C, RC(out), RC(z), RC(y), T, n);
    G->sigmoid_gate_forward(G, RG(out), RG(z), RG(y), T, n);
    same_reals("sigmoid_gate_forward (+=)", out, tn, TOL);
    twin dy = output(tn * sizeof(real)), dz = output((size_t)T * sizeof(real));
    C->sigmoid_gate_backward(C, RC(dy), RC(dz), RC(dout), RC(z), RC(y), T, n);
    G->sigmoid_gate_backward(G, RG(dy), RG(dz), RG(dout), RG(z), RG(y), T, n);
    same_reals("sigmoid_gate_backward dy", dy, tn, TOL);
    same_reals("sigmoid_gate_backward dz", dz, (size_t)T, TOL);
    twin all[] = {out, b, dout, db, z, y, dy, dz};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
}

static void test_attention(int B, int S, int H, int KV, int hd) {
    printf("attention B=%d S=%d H=%d KV=%d hd=%d\n", B, S, H, KV, hd);
    const int row = (H + 2 * KV) * hd;
    const size_t nq = (size_t)B * S * row, no = (size_t)B * S * H * hd;
    twin qkv = reals(nq, 1), out = output(no * sizeof(real));
    twin lse = output((size_t)B * H * S * sizeof(real));
    const size_t csz = C->attention_scratch_size(C, S, hd),
                 gsz = G->attention_scratch_size(G, S, hd);
    twin cscr = make(csz * sizeof(real)), gscr = make(gsz * sizeof(real));
    const moe_attention_shape sh = {.B = B, .S = S, .H = H, .KV = KV, .hd = hd};
    C->attention_forward(C, RC(out), RC(lse), RC(qkv), sh, RC(cscr), csz);
    G->attention_forward(G, RG(out), RG(lse), RG(qkv), sh, RG(gscr), gsz);
    same_reals("attention forward out", out, no, TOL);
    same_reals("attention forward lse", lse, (size_t)B * H * S, TOL);
    twin dout = reals(no, 1), dqkv = output(nq * sizeof(real));
    C->attention_backward(C, RC(dqkv), RC(dout), RC(qkv), RC(out), RC(lse), sh, RC(cscr), csz);
    G->attention_backward(G, RG(dqkv), RG(dout), RG(qkv), RG(out), RG(lse), sh, RG(gscr), gsz);
    same_reals("attention backward dqkv", dqkv, nq, TOL);

    // inference: the first sequence's rows appended to a cache in two chunks, then attended
    const int max_pos = S + 3, kv = KV * hd, n1 = S / 3, n2 = S - n1;
    twin kc = output((size_t)max_pos * kv * sizeof(real)),
         vc = output((size_t)max_pos * kv * sizeof(real));
    twin o2 = output((size_t)n2 * H * hd * sizeof(real));
    twin scr = make((size_t)H * n2 * S * sizeof(real));
    C->kv_cache_append(C, RC(kc), RC(vc), RC(qkv), n1, 0, H, KV, hd);
    G->kv_cache_append(G, RG(kc), RG(vc), RG(qkv), n1, 0, H, KV, hd);
    C->kv_cache_append(C, RC(kc), RC(vc), RC(qkv) + (size_t)n1 * row, n2, n1, H, KV, hd);
    G->kv_cache_append(G, RG(kc), RG(vc), RG(qkv) + (size_t)n1 * row, n2, n1, H, KV, hd);
    same_reals("kv_cache_append k", kc, (size_t)S * kv, 0);
    same_reals("kv_cache_append v", vc, (size_t)S * kv, 0);
    C->attention_cached_forward(C, RC(o2), RC(scr), RC(qkv) + (size_t)n1 * row, RC(kc), RC(vc), n2,
                                n1, H, KV, hd);
    G->attention_cached_forward(G, RG(o2), RG(scr), RG(qkv) + (size_t)n1 * row, RG(kc), RG(vc), n2,
                                n1, H, KV, hd);
    same_reals("attention_cached_forward", o2, (size_t)n2 * H * hd, TOL);
    twin all[] = {qkv, out, lse, cscr, gscr, dout, dqkv, kc, vc, o2, scr};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
}

// bf16 (DESIGN.md §5b): the conversions bit for bit (ties, NaN, Inf, overflow, subnormals),
// and the bf16 GEMMs on the same bf16 operands, which differ from the CPU's only in the order
// of their fp32 sums; the expert GEMMs with 0, 1, odd and many rows, in both expert-GEMM modes
// (bf16 always runs the loop: grouped has no bf16-in/fp32-out mode).
static twin halves(twin from, size_t n) { // the bf16 values of fp32 twins (rounded on the host)
    real *x = malloc(n * sizeof(real));
    moe_bf16 *h = malloc(n * sizeof(moe_bf16));
    C->copy_to_host(C, x, from.c, n * sizeof(real));
    for (size_t i = 0; i < n; i++) h[i] = moe_f32_to_bf16((float)x[i]);
    twin t = from_host(h, n * sizeof(moe_bf16));
    free(h), free(x);
    return t;
}
#define HC(t) ((moe_bf16 *)(t).c)
#define HG(t) ((moe_bf16 *)(t).g)

static void test_bf16_conversions(void) {
    const size_t n = 4099;
    real *h = malloc(n * sizeof(real));
    const uint32_t special[] = {0x7FC00001u, 0xFF800001u, 0x7F800000u, 0xFF800000u,
                                0x7F7FFFFFu, 0x00000001u, 0x807FFFFFu, 0x3F808000u,
                                0x3F818000u, 0x00000000u, 0x80000000u, 0x3F80FFFFu};
    for (size_t i = 0; i < n; i++) h[i] = (real)(rng_normal(&rng) * 3);
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) memcpy(&h[i], &special[i], 4);
    twin x = from_host(h, n * sizeof(real)), y = output(n * sizeof(moe_bf16));
    C->to_bf16(C, HC(y), RC(x), n);
    G->to_bf16(G, HG(y), RG(x), n);
    moe_bf16 *a = malloc(n * sizeof(moe_bf16)), *b = malloc(n * sizeof(moe_bf16));
    G->copy_to_host(G, a, y.g, n * sizeof(moe_bf16));
    C->copy_to_host(C, b, y.c, n * sizeof(moe_bf16));
    check_true("to_bf16: the same bits (NaN, Inf, overflow, subnormals, ties)",
               !memcmp(a, b, n * sizeof(moe_bf16)));
    twin back = output(n * sizeof(real));
    C->from_bf16(C, RC(back), HC(y), n);
    G->from_bf16(G, RG(back), HG(y), n);
    real *fa = malloc(n * sizeof(real)), *fb = malloc(n * sizeof(real));
    G->copy_to_host(G, fa, back.g, n * sizeof(real));
    C->copy_to_host(C, fb, back.c, n * sizeof(real));
    check_true("from_bf16: the same bits", !memcmp(fa, fb, n * sizeof(real)));
    drop(x), drop(y), drop(back);
    free(h), free(a), free(b), free(fa), free(fb);
}

// bf16 values of both sides widened and compared (relative, as same_reals): the two exps may
// differ in their last fp32 bit, which can move a bf16 rounding by one bf16 ulp (2^-8).
static void same_halves(const char *what, twin t, size_t n, double tol) {
    moe_bf16 *a = malloc(n * sizeof(moe_bf16)), *b = malloc(n * sizeof(moe_bf16));
    double *da = malloc(n * sizeof(double)), *db = malloc(n * sizeof(double));
    G->copy_to_host(G, a, t.g, n * sizeof(moe_bf16));
    C->copy_to_host(C, b, t.c, n * sizeof(moe_bf16));
    for (size_t i = 0; i < n; i++) da[i] = moe_bf16_to_f32(a[i]), db[i] = moe_bf16_to_f32(b[i]);
    check_rel(what, da, db, n, tol);
    free(a), free(b), free(da), free(db);
}

// The bf16 layer's dispatch twins: a rounding of the fp32 kernels' rows (the same bits), and
// combine backward's dweights as the fp32 kernel's.
static void check_dispatch_bf16(twin x, twin rtok, twin y, twin dout, twin w, twin arow, int T,
                                int N, int k, int d) {
    twin xe16 = output((size_t)(N + 1) * d * sizeof(moe_bf16));
    twin dy16 = output((size_t)(N + 1) * d * sizeof(moe_bf16));
    twin dw = output((size_t)T * k * sizeof(real));
    C->moe_permute_bf16(C, HC(xe16), RC(x), IC(rtok), N, d);
    G->moe_permute_bf16(G, HG(xe16), RG(x), IG(rtok), N, d);
    same_halves("permute_bf16", xe16, (size_t)N * d, 0);
    C->moe_combine_backward_bf16(C, HC(dy16), RC(dw), RC(dout), RC(y), RC(w), IC(arow), T, k, d);
    G->moe_combine_backward_bf16(G, HG(dy16), RG(dw), RG(dout), RG(y), RG(w), IG(arow), T, k, d);
    same_halves("combine_backward_bf16 dy16", dy16, (size_t)N * d, 0);
    same_reals("combine_backward_bf16 dweights", dw, (size_t)T * k, TOL);
    drop(xe16), drop(dy16), drop(dw);
}

static void test_swiglu_bf16(void) {
    const int N = 45, ff = 37;
    const size_t nh = (size_t)N * 2 * ff, na = (size_t)N * ff;
    twin h13 = reals(nh, 2), dact = reals(na, 1);
    twin act16 = output(na * sizeof(moe_bf16)), h16 = output(nh * sizeof(moe_bf16));
    twin dh16 = output(nh * sizeof(moe_bf16));
    C->swiglu_forward_bf16(C, HC(act16), HC(h16), RC(h13), N, ff);
    G->swiglu_forward_bf16(G, HG(act16), HG(h16), RG(h13), N, ff);
    same_halves("swiglu_forward_bf16 act16", act16, na, 1e-2);
    same_halves("swiglu_forward_bf16 h13_16", h16, nh, 0); // a rounding only: the same bits
    C->swiglu_backward_bf16(C, HC(dh16), RC(dact), HC(h16), N, ff);
    G->swiglu_backward_bf16(G, HG(dh16), RG(dact), HG(h16), N, ff);
    same_halves("swiglu_backward_bf16", dh16, nh, 1e-2);
    drop(h13), drop(dact), drop(act16), drop(h16), drop(dh16);
}

// The bf16 attention (backend.h's rule) on the same bf16 q, k, v, do, o. Both round E, P and
// dS where they enter a product, but the GPU's E is exp(s - running max) of its key tile
// (rescaled later) where the CPU's uses the row's max, and the two exps differ in the last
// fp32 bit: bf16-level agreement (2e-3, a fifth of the bf16 tolerance), not fp32's.
static void test_attention_bf16(int B, int S, int H, int KV, int hd, double tol, double tol_lse) {
    printf("attention bf16 B=%d S=%d H=%d KV=%d hd=%d\n", B, S, H, KV, hd);
    const size_t nq = (size_t)B * S * (H + 2 * KV) * hd, no = (size_t)B * S * H * hd;
    twin q32 = reals(nq, 1), qkv = halves(q32, nq), out = output(no * sizeof(real));
    twin lse = output((size_t)B * H * S * sizeof(real));
    const size_t csz = C->attention_scratch_size(C, S, hd),
                 gsz = G->attention_scratch_size(G, S, hd);
    twin cscr = make(csz * sizeof(real)), gscr = make(gsz * sizeof(real));
    const moe_attention_shape sh = {.B = B, .S = S, .H = H, .KV = KV, .hd = hd};
    C->attention_forward_bf16(C, RC(out), RC(lse), HC(qkv), sh, RC(cscr), csz);
    G->attention_forward_bf16(G, RG(out), RG(lse), HG(qkv), sh, RG(gscr), gsz);
    same_reals("attention_forward_bf16 out", out, no, tol);
    same_reals("attention_forward_bf16 lse", lse, (size_t)B * H * S, tol_lse);
    twin d32 = reals(no, 1), dout = halves(d32, no), out16 = halves(out, no);
    twin dqkv = output(nq * sizeof(real));
    C->attention_backward_bf16(C, RC(dqkv), HC(dout), HC(qkv), HC(out16), RC(lse), sh, RC(cscr),
                               csz);
    G->attention_backward_bf16(G, RG(dqkv), HG(dout), HG(qkv), HG(out16), RG(lse), sh, RG(gscr),
                               gsz);
    same_reals("attention_backward_bf16 dqkv", dqkv, nq, tol);
    twin all[] = {q32, qkv, out, lse, cscr, gscr, d32, dout, out16, dqkv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) drop(all[i]);
}

// model.attention = "cudnn": cuDNN's fused attention as the bf16 attention entries, against the
// CPU's bf16 twin (backend.h's rule). cuDNN writes o and dq, dk, dv in bf16 (widened into the
// fp32 contract): one rounding more than the twin's, 2^-9 relative on an element, and its own
// summation order: bounded at 8e-3 of the largest element; lse is cuDNN's fp32 statistics.
// Skipped, with the reason, where the backend cannot start cuDNN (a build without MOE_CUDNN, no
// libcudnn.so.9), a failure instead with MOE_TEST_REQUIRE_CUDNN=1 (scripts/gpu_check.sh);
// MOE_TEST_CUDNN=0 leaves it out (the memcheck run: cuDNN is NVIDIA's to check).
static void test_cudnn_attention(void) {
    const char *req = getenv("MOE_TEST_REQUIRE_CUDNN"), *on = getenv("MOE_TEST_CUDNN");
    if (!is_cuda || (on && !atoi(on))) return;
    moe_backend *plain = G, *dnn = NULL;
    const moe_backend_options opt = {.attention_cudnn = 1};
    if (moe_backend_create(&dnn, "cuda", &opt)) {
        const int required = req && atoi(req) > 0;
        printf("cudnn attention: %s: %s\n", required ? "FAIL" : "skipped", moe_last_error());
        if (required) check_true("cuDNN attention starts (MOE_TEST_REQUIRE_CUDNN)", 0);
        return;
    }
    G = dnn;
    printf("cudnn attention: %s\n", G->describe(G));
    test_attention_bf16(2, 45, 4, 2, 16, 8e-3, 1e-4);
    test_attention_bf16(1, 300, 6, 3, 24, 8e-3, 1e-4);
    test_attention_bf16(2, 256, 4, 1, 64, 8e-3, 1e-4);   // gpu-1b's head_dim, GQA 4:1
    test_attention_bf16(1, 1024, 2, 2, 128, 8e-3, 1e-4); // a long sequence, head_dim 128
    G = plain;
    moe_backend_destroy(dnn);
}

static void test_bf16(void) {
    printf("bf16\n");
    test_bf16_conversions();
    test_swiglu_bf16();
    test_attention_bf16(2, 45, 4, 2, 16, 2e-3, TOL);
    test_attention_bf16(1, 300, 6, 3, 24, 2e-3, TOL); // key tiles beyond one block of 128
    const int m = 67, nn = 45, kd = 131;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            twin a32 = reals((size_t)m * kd, 1), b32 = reals((size_t)kd * nn, 1);
            twin a16 = halves(a32, (size_t)m * kd), b16 = halves(b32, (size_t)kd * nn);
            twin c = reals((size_t)m * nn, 1);
            C->matmul_bf16(C, RC(c), HC(a16), HC(b16), m, nn, kd, ta, tb, 0.5f);
            G->matmul_bf16(G, RG(c), HG(a16), HG(b16), m, nn, kd, ta, tb, 0.5f);
            char what[64];
            snprintf(what, sizeof what, "matmul_bf16 ta=%d tb=%d beta=0.5", ta, tb);
            same_reals(what, c, (size_t)m * nn, TOL);
            drop(a32), drop(b32), drop(a16), drop(b16), drop(c);
        }
    const int E = 6, n_out = 38, n_in = 29, offsets[] = {0, 0, 1, 18, 18, 57, 60};
    const int N = offsets[E];
    for (int mode = 0; mode < 2; mode++) {
        set_expert_gemm(mode ? CUDA_EXPERT_GEMM_GROUPED : CUDA_EXPERT_GEMM_LOOP);
        const char *name = mode ? "grouped" : "loop";
        twin w32 = reals((size_t)E * n_out * n_in, 1), x32 = reals((size_t)N * n_in, 1);
        twin dy32 = reals((size_t)N * n_out, 1);
        twin w = halves(w32, (size_t)E * n_out * n_in), xx = halves(x32, (size_t)N * n_in);
        twin dy = halves(dy32, (size_t)N * n_out);
        twin out = output((size_t)N * n_out * sizeof(real));
        C->expert_matmul_forward_bf16(C, RC(out), HC(xx), HC(w), offsets, E, n_out, n_in);
        G->expert_matmul_forward_bf16(G, RG(out), HG(xx), HG(w), offsets, E, n_out, n_in);
        char what[80];
        snprintf(what, sizeof what, "expert forward bf16 (%s)", name);
        same_reals(what, out, (size_t)N * n_out, TOL);
        twin dx = reals((size_t)N * n_in, 1);
        for (int acc = 0; acc < 2; acc++) {
            if (!acc) poison(dx);
            C->expert_matmul_backward_input_bf16(C, RC(dx), HC(dy), HC(w), offsets, E, n_out, n_in,
                                                 acc);
            G->expert_matmul_backward_input_bf16(G, RG(dx), HG(dy), HG(w), offsets, E, n_out, n_in,
                                                 acc);
            snprintf(what, sizeof what, "expert backward input bf16 acc=%d (%s)", acc, name);
            same_reals(what, dx, (size_t)N * n_in, TOL);
        }
        twin dw = reals((size_t)E * n_out * n_in, 1);
        C->expert_matmul_backward_weight_bf16(C, RC(dw), HC(dy), HC(xx), offsets, E, n_out, n_in);
        G->expert_matmul_backward_weight_bf16(G, RG(dw), HG(dy), HG(xx), offsets, E, n_out, n_in);
        snprintf(what, sizeof what, "expert backward weight bf16 (%s)", name);
        same_reals(what, dw, (size_t)E * n_out * n_in, TOL);
        twin bufs[] = {w32, x32, dy32, w, xx, dy, out, dx, dw};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) drop(bufs[i]);
    }
    set_expert_gemm(CUDA_EXPERT_GEMM_LOOP);
}

// The whole model, forward and backward, on both backends from the same weights: the loss
// parts and the logits within tol, every parameter's gradient (by its HF name) within 10 tol.
static void test_model(const char *what, moe_model_config cfg, int B, int S, double tol) {
    printf("model (%s): B=%d S=%d, forward + backward\n", what, B, S);
    moe_model mc, mg;
    if (moe_model_create(&mc, C, &cfg, B, S) || moe_model_create(&mg, G, &cfg, B, S)) {
        fprintf(stderr, "%s\n", moe_last_error());
        exit(1);
    }
    moe_model_init_weights(&mc, 11, 0.2);
    moe_model_init_weights(&mg, 11, 0.2); // host RNG: the same weights on both
    int *tok = malloc((size_t)B * S * sizeof(int)), *tgt = malloc((size_t)B * S * sizeof(int));
    for (int i = 0; i < B * S; i++)
        tok[i] = (int)(rng_uniform(&rng) * cfg.vocab_size), tgt[i] = (i * 7 + 3) % cfg.vocab_size;
    if (moe_model_forward(&mc, tok, tgt, B, S, moe_pass_train(mc.cfg.moe.capacity_factor)) ||
        moe_model_forward(&mg, tok, tgt, B, S, moe_pass_train(mg.cfg.moe.capacity_factor)) ||
        moe_model_backward(&mc, 0.5) || moe_model_backward(&mg, 0.5)) {
        fprintf(stderr, "%s\n", moe_last_error());
        exit(1);
    }
    const double lc[3] = {mc.ce, mc.aux, mc.z}, lg[3] = {mg.ce, mg.aux, mg.z};
    check_rel("loss parts (ce, aux, z)", lg, lc, 3, tol);
    const size_t nl = (size_t)B * S * cfg.vocab_size, np = mc.n_params;
    real *a = malloc((nl > np ? nl : np) * sizeof(real)),
         *b = malloc((nl > np ? nl : np) * sizeof(real));
    C->copy_to_host(C, a, mc.logits, nl * sizeof(real));
    G->copy_to_host(G, b, mg.logits, nl * sizeof(real));
    double *da = malloc((nl > np ? nl : np) * sizeof(double)),
           *db = malloc((nl > np ? nl : np) * sizeof(double));
    for (size_t i = 0; i < nl; i++) da[i] = a[i], db[i] = b[i];
    check_rel("logits", db, da, nl, tol);
    C->copy_to_host(C, a, mc.grads, np * sizeof(real));
    G->copy_to_host(G, b, mg.grads, np * sizeof(real));
    int worst = -1;
    double worst_err = 0;
    for (int t = 0; t < mc.n_tensors; t++) {
        const moe_model_tensor *x = &mc.tensors[t];
        const size_t n = (size_t)x->rows * (x->cols ? x->cols : 1);
        for (size_t i = 0; i < n; i++) da[i] = a[x->offset + i], db[i] = b[x->offset + i];
        const double e = rel_err(db, da, n);
        if (!(e <= worst_err)) worst_err = e, worst = t; // NaN is the worst
    }
    char line[160];
    snprintf(line, sizeof line, "every gradient <= %.0e (worst %.2e: %s)", 10 * tol, worst_err,
             worst >= 0 ? mc.tensors[worst].name : "-");
    check_true(line, worst_err <= 10 * tol);
    free(tok), free(tgt), free(a), free(b), free(da), free(db);
    moe_model_destroy(&mc);
    moe_model_destroy(&mg);
}

int main(void) {
    rng_seed(&rng, 2026);
    const char *name = getenv("MOE_TWIN_DEVICE");
    name = name && *name ? name : "cuda";
    is_cuda = !strcmp(name, "cuda");
    if (moe_backend_create(&G, name, NULL)) {
        printf("skipped: %s\n", moe_last_error());
        return 77;
    }
    if (moe_backend_create(&C, "cpu", NULL)) {
        fprintf(stderr, "%s\n", moe_last_error());
        return 1;
    }
    printf("%s\n", G->describe(G));
    test_gemm(TOL, "fp32");
    set_tf32(1);
    test_gemm(2e-3, "tf32");
    set_tf32(0);
    test_router_dispatch(MOE_SCORE_SOFTMAX, 0, 0, MOE_DROP_PROBS);
    test_router_dispatch(MOE_SCORE_SOFTMAX, 1, 50, MOE_DROP_PROBS);
    test_router_dispatch(MOE_SCORE_SIGMOID, 1, 41, MOE_DROP_POSITION);
    test_router_dispatch(MOE_SCORE_SIGMOID, 0, 1, MOE_DROP_PROBS);
    test_elementwise();
    test_dense();
    // a qkv row of H = 6 query and KV = 3 key/value heads of hd = 12: the q heads, the k heads,
    // the whole q projection (n_heads 1, hd 72)
    for (int T = 37; T <= 301; T += 264) {
        test_head_rmsnorm(T, (6 + 2 * 3) * 12, 0, 6, 12);
        test_head_rmsnorm(T, (6 + 2 * 3) * 12, 6 * 12, 3, 12);
        test_head_rmsnorm(T, (6 + 2 * 3) * 12, 0, 1, 72);
    }
    test_bias_gate(37, 45);
    test_bias_gate(203, 301); // rows beyond one block of 256 threads
    test_bf16();
    test_cudnn_attention();
    test_attention(2, 45, 4, 2, 16);
    test_attention(1, 300, 6, 3, 24);  // key tiles beyond one block of 128
    test_attention(2, 129, 2, 2, 130); // head_dim beyond one column per thread
    moe_model_config cfg = {.vocab_size = 61,
                            .d_model = 48,
                            .n_layers = 2,
                            .n_heads = 6,
                            .n_kv_heads = 2,
                            .max_seq_len = 40,
                            .rope_theta = 1e4,
                            .rms_norm_eps = 1e-5};
    cfg.moe = moe_config_default(48, 40, 6, 2);
    cfg.moe.capacity_factor = 1.25; // drops, probs policy
    cfg.moe.seq_aux_coef = 1e-3;
    test_model("GQA, capacity 1.25", cfg, 3, 37, TOL);
    cfg.tie_embeddings = 1, cfg.n_kv_heads = 6;
    cfg.moe = moe_config_default(48, 40, 8, 3);
    cfg.moe.scoring = MOE_SCORE_SIGMOID;
    test_model("tied, MHA, sigmoid, dropless", cfg, 2, 40, TOL);
    // bf16: activations rounded to bf16 on both sides; a last-bit fp32 difference can move a
    // value across a bf16 rounding boundary (2^-8 relative on that element), hence the bound
    cfg.dtype = MOE_DTYPE_BF16;
    test_model("bf16, tied, MHA, sigmoid, dropless", cfg, 2, 40, 1e-3);
    moe_backend_destroy(G);
    moe_backend_destroy(C);
    printf(test_failures() ? "FAILED: %d\n" : "all passed\n", test_failures());
    return test_failures() != 0;
}
