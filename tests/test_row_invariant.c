// Row-invariant CPU kernels (moe_backend_options.row_invariant, `moe serve --deterministic`):
// a sequence's logits are the same bits whether it runs alone, as `moe generate` runs it
// (moe_model_infer_slot: prefill chunks of 5 and 3 tokens, then one row per decode step), or
// batched with other sequences' rows through moe_model_decode_batch (its prefill and decode
// rows at other row offsets, among rows of three other sequences, in batches of other sizes),
// in fp32 and in bf16. The same comparison on the plain backend is printed, not asserted: a
// BLAS may or may not give a row other bits for another row count on this machine.
#define _POSIX_C_SOURCE 200809L // setenv, unsetenv
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/backend.h"
#include "layers/model.h"
#include "test_util.h"

enum { PREFILL1 = 5, PREFILL2 = 3, STEPS = 10, LEN = PREFILL1 + PREFILL2 + STEPS };
enum { SEQS = 4, A = 2, MAX_POS = 32, MAX_CHUNK = 16 }; // A: the followed sequence's slot

// One row of a decode batch.
typedef struct {
    int slot, pos;
} batch_row;

static int token_of(int slot, int pos, int V) { return (slot * 131 + pos * 17 + 5) % V; }

// The model's logits [rows, V] to host reals.
static real *logits_of(const moe_model *m, int rows, int V) {
    real *h = malloc((size_t)rows * V * sizeof(real));
    m->be->copy_to_host(m->be, h, m->logits, (size_t)rows * V * sizeof(real));
    return h;
}

static int create(moe_model *m, moe_backend *be, const moe_model_config *cfg, const real *params) {
    if (moe_model_create_inference_batch(m, be, cfg, MAX_POS, MAX_CHUNK, SEQS, NULL)) {
        fprintf(stderr, "%s\n", moe_last_error());
        return 1;
    }
    be->copy_to_device(be, m->params, params, m->n_params * sizeof(real));
    moe_model_refresh_bf16(m); // decode_batch alone never refreshes the bf16 copy
    return 0;
}

// (a) A alone, as `moe generate`: logits [LEN, V] of each position.
static int run_alone(moe_backend *be, const moe_model_config *cfg, const real *params,
                     real *logits) {
    const int V = cfg->vocab_size;
    moe_model m;
    if (create(&m, be, cfg, params)) return 1;
    int tokens[LEN];
    for (int p = 0; p < LEN; p++) tokens[p] = token_of(A, p, V);
    for (int p = 0; p < LEN;) {
        const int n = p == 0 ? PREFILL1 : p == PREFILL1 ? PREFILL2 : 1;
        if (moe_model_infer_slot(&m, A, tokens + p, n, p)) {
            fprintf(stderr, "%s\n", moe_last_error());
            return 1;
        }
        real *h = logits_of(&m, n, V);
        memcpy(logits + (size_t)p * V, h, (size_t)n * V * sizeof(real));
        free(h);
        p += n;
    }
    moe_model_destroy(&m);
    return 0;
}

// (b) A among the others: batches in which A contributes its prefill rows (PREFILL1 then
// PREFILL2, as in (a): 2 + 3, then 3) and then one row each, the others 0-3 rows each, all
// interleaved at random (each sequence's rows in position order). Logits [LEN, V] of A's rows.
static int run_batched(moe_backend *be, const moe_model_config *cfg, const real *params,
                       real *logits, int *offsets_seen) {
    const int V = cfg->vocab_size;
    moe_model m;
    if (create(&m, be, cfg, params)) return 1;
    test_rng r;
    rng_seed(&r, 5);
    int next[SEQS] = {0}, batches = 0;
    while (next[A] < LEN) {
        int want[SEQS];
        for (int s = 0; s < SEQS; s++) {
            want[s] = s == A ? 0 : (int)(rng_uniform(&r) * 4); // 0-3 rows of the others
            if (next[s] + want[s] > MAX_POS) want[s] = MAX_POS - next[s];
        }
        want[A] = next[A] == 0 ? 2 : next[A] == 2 ? 3 : next[A] == PREFILL1 ? PREFILL2 : 1;
        batch_row rows[MAX_CHUNK];
        int n = 0, left = 0;
        for (int s = 0; s < SEQS; s++) left += want[s];
        while (left > 0) { // a random sequence with rows left gives its next one
            int pick = (int)(rng_uniform(&r) * left), s = 0;
            while (pick >= want[s]) pick -= want[s++];
            rows[n++] = (batch_row){s, next[s]++};
            want[s]--, left--;
        }
        int tokens[MAX_CHUNK], slots[MAX_CHUNK], pos[MAX_CHUNK];
        for (int i = 0; i < n; i++)
            tokens[i] = token_of(rows[i].slot, rows[i].pos, V), slots[i] = rows[i].slot,
            pos[i] = rows[i].pos;
        if (moe_model_decode_batch(&m, tokens, n, slots, pos)) {
            fprintf(stderr, "%s\n", moe_last_error());
            return 1;
        }
        real *h = logits_of(&m, n, V);
        for (int i = 0; i < n; i++)
            if (rows[i].slot == A) {
                memcpy(logits + (size_t)rows[i].pos * V, h + (size_t)i * V, V * sizeof(real));
                offsets_seen[i] = 1;
            }
        free(h);
        batches++;
    }
    moe_model_destroy(&m);
    return batches < 3;
}

// The positions of A whose logits differ between (a) and (b) on a backend; -1 on error.
static int differing_positions(moe_backend *be, const moe_model_config *cfg, const real *params,
                               int *offsets_seen) {
    const size_t n = (size_t)LEN * cfg->vocab_size;
    real *alone = calloc(n, sizeof(real)), *batched = calloc(n, sizeof(real));
    int diff = -1;
    if (!run_alone(be, cfg, params, alone) &&
        !run_batched(be, cfg, params, batched, offsets_seen)) {
        diff = 0;
        for (int p = 0; p < LEN; p++)
            diff +=
                memcmp(alone + (size_t)p * cfg->vocab_size, batched + (size_t)p * cfg->vocab_size,
                       cfg->vocab_size * sizeof(real)) != 0;
    }
    free(alone), free(batched);
    return diff;
}

static int run_case(const char *title, moe_model_config cfg, moe_backend *ri, moe_backend *plain) {
    printf("%s\n", title);
    moe_model init;
    if (moe_model_create_inference(&init, plain, &cfg, MAX_POS, MAX_CHUNK)) {
        fprintf(stderr, "%s\n", moe_last_error());
        return 1;
    }
    moe_model_init_weights(&init, 7, 0.3);
    real *params = malloc(init.n_params * sizeof(real));
    plain->copy_to_host(plain, params, init.params, init.n_params * sizeof(real));
    moe_model_destroy(&init);

    int offsets[MAX_CHUNK] = {0}, plain_offsets[MAX_CHUNK] = {0}, spread = 0;
    const int d_ri = differing_positions(ri, &cfg, params, offsets);
    const int d_plain = differing_positions(plain, &cfg, params, plain_offsets);
    for (int i = 0; i < MAX_CHUNK; i++) spread += offsets[i];
    free(params);
    if (d_ri < 0 || d_plain < 0) return 1;
    printf("    A's rows sat at %d different row offsets of the batches\n", spread);
    check_true("A's rows at 3 or more row offsets", spread >= 3);
    printf("    row-invariant: %d of %d positions differ\n", d_ri, LEN);
    check_true("row-invariant: A batched == A alone, bit for bit, at every position", d_ri == 0);
    printf("    plain backend (not asserted): %d of %d positions differ%s\n", d_plain, LEN,
           d_plain ? "" : " (this BLAS gave these rows the same bits at every row count)");
    return 0;
}

int main(void) {
    moe_backend *ri, *plain;
    const moe_backend_options on = {.row_invariant = 1}, off = {0};
    unsetenv("MOE_ROW_INVARIANT"); // the plain backend must be plain
    if (moe_backend_create(&ri, "cpu", &on) || moe_backend_create(&plain, "cpu", &off)) {
        fprintf(stderr, "%s\n", moe_last_error());
        return 1;
    }
    printf("row-invariant backend: %s\n", ri->describe(ri));
    check_true("describe() says row-invariant", strstr(ri->describe(ri), "row-invariant") != NULL);
    check_true("the plain backend's describe() does not",
               strstr(plain->describe(plain), "row-invariant") == NULL);
    { // the environment variable turns it on too
        moe_backend *env;
        setenv("MOE_ROW_INVARIANT", "1", 1);
        if (moe_backend_create(&env, "cpu", &off)) return 1;
        unsetenv("MOE_ROW_INVARIANT");
        check_true("MOE_ROW_INVARIANT=1 makes a row-invariant backend",
                   strstr(env->describe(env), "row-invariant") != NULL);
        moe_backend_destroy(env);
    }

    moe_model_config cfg = {
        .vocab_size = 61,
        .d_model = 128,
        .n_layers = 2,
        .n_heads = 4,
        .n_kv_heads = 2,
        .max_seq_len = MAX_POS,
        .rope_theta = 1000.0,
        .rms_norm_eps = 1e-5,
    };
    cfg.moe = moe_config_default(128, 192, 8, 2);
    if (run_case("fp32", cfg, ri, plain)) return 1;
    cfg.dtype = MOE_DTYPE_BF16;
    if (run_case("bf16", cfg, ri, plain)) return 1;
    moe_backend_destroy(ri);
    moe_backend_destroy(plain);
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
