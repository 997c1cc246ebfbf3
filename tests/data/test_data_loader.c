// The loader: windows are shifted copies of the file, an epoch is a permutation of all
// windows, ranks split it disjointly into blocks of batch_size (one global step of w ranks
// = w consecutive world-1 batches), the order is a function of the seed, and a saved state
// resumes exactly (also across epochs and in a fresh loader) or, under another world, at
// the documented block.
// Usage: test_data_loader SCRATCH_DIR
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/loader.h"
#include "data/token_file.h"
#include "tests/data/data_test.h"

enum { SEQ = 8, NWIN = 37, COUNT = SEQ * NWIN + 1 + 3 }; // 3 tail tokens never used

static const char *dir;
static moe_token_file tf; // tokens[i] = (i * 7 + 3) mod VOCAB: a window's start is recoverable
enum { VOCAB = 1009 };    // prime > COUNT, so i -> tokens[i] is one-to-one on [0, COUNT)
static int64_t start_of[VOCAB];

// The window a row came from, after checking the row is a shifted copy of the file:
// inputs = tokens[s .. s+SEQ-1], targets = tokens[s+1 .. s+SEQ], s a multiple of SEQ.
// Returns -1 (and counts a failure) otherwise.
static int64_t window_of(const int *in, const int *tg) {
    if (in[0] < 0 || in[0] >= VOCAB || start_of[in[0]] < 0) return -1;
    int64_t s = start_of[in[0]];
    if (s % SEQ != 0 || s / SEQ >= NWIN) return -1;
    for (int t = 0; t < SEQ; t++)
        if (in[t] != (int)tf.tokens[s + t] || tg[t] != (int)tf.tokens[s + t + 1]) return -1;
    return s / SEQ;
}

// Draws `n_batches` batches and records the window of each row into ids (may be NULL).
// Returns 1 if every row was a valid shifted window.
static int draw(data_loader *L, int n_batches, int64_t *ids) {
    size_t n = (size_t)L->batch_size * SEQ;
    int *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
    int ok = 1;
    for (int i = 0; i < n_batches; i++) {
        data_loader_next(L, in, tg);
        for (int b = 0; b < L->batch_size; b++) {
            int64_t w = window_of(in + (size_t)b * SEQ, tg + (size_t)b * SEQ);
            ok &= w >= 0;
            if (ids) ids[(size_t)i * L->batch_size + b] = w;
        }
    }
    free(in);
    free(tg);
    return ok;
}

static int is_permutation(const int64_t *ids, int n, int n_values) {
    int *seen = calloc((size_t)n_values, sizeof *seen), ok = n == n_values;
    for (int i = 0; i < n && ok; i++) ok = ids[i] >= 0 && ids[i] < n_values && !seen[ids[i]]++;
    free(seen);
    return ok;
}

static void make_file(void) {
    uint32_t tok[COUNT];
    for (int i = 0; i < COUNT; i++) tok[i] = (uint32_t)((i * 7 + 3) % VOCAB);
    const char *path = test_path(dir, "loader.bin");
    if (moe_token_file_write(path, tok, COUNT, VOCAB) != MOE_OK ||
        moe_token_file_read(&tf, path) != MOE_OK) {
        fprintf(stderr, "test setup: %s\n", moe_last_error());
        exit(2);
    }
    for (int v = 0; v < VOCAB; v++) start_of[v] = -1;
    for (int i = 0; i < COUNT; i++) start_of[tok[i]] = i;
}

static void epochs(void) {
    printf("one rank: shifted windows, each epoch a permutation of all %d windows\n", NWIN);
    data_loader L;
    check_true("init", data_loader_init(&L, &tf, 4, SEQ, 1234, 0, 1) == MOE_OK);
    check_true("n_windows = (count-1)/seq_len", L.n_windows == NWIN && L.windows_per_rank == NWIN);
    // 37 batches of 4 = 148 windows = exactly 4 epochs; batches straddle epoch boundaries.
    int64_t ids[4 * NWIN];
    check_true("every row is a shifted copy of the file", draw(&L, NWIN, ids));
    int perms = 1, identity = 1, differ = 1;
    for (int e = 0; e < 4; e++) perms &= is_permutation(ids + e * NWIN, NWIN, NWIN);
    for (int i = 0; i < NWIN; i++) identity &= ids[i] == i;
    for (int e = 1; e < 4; e++) differ &= memcmp(ids, ids + e * NWIN, NWIN * sizeof *ids) != 0;
    check_true("each epoch visits every window exactly once", perms);
    check_true("the order is shuffled (not 0,1,2,...)", !identity);
    check_true("each epoch has a new order", differ);
    data_loader_state st;
    data_loader_get_state(&st, &L);
    printf("  after 4 epochs: epoch %llu position %llu\n", (unsigned long long)st.epoch,
           (unsigned long long)st.position);
    check_true("state: epoch 3 used up (the next batch starts epoch 4)",
               st.epoch == 3 && st.position == NWIN && st.seed == 1234 && st.n_windows == NWIN &&
                   st.seq_len == SEQ);
    data_loader_free(&L);
}

// Fisher-Yates must give every ordering with the same probability: with 3 windows over
// 600 epochs each of the 6 orderings should appear ~100 times (a biased shuffle such as
// Sattolo's, or a modulo-biased draw, misses orderings or skews them far outside 60..140).
static void uniform_orderings(void) {
    printf("the shuffle is uniform over orderings (3 windows, 600 epochs)\n");
    uint32_t t4[4] = {0, 1, 2, 3};
    const char *path = test_path(dir, "three.bin");
    moe_token_file tf4;
    if (moe_token_file_write(path, t4, 4, 4) != MOE_OK ||
        moe_token_file_read(&tf4, path) != MOE_OK) {
        fprintf(stderr, "test setup: %s\n", moe_last_error());
        exit(2);
    }
    data_loader L;
    data_loader_init(&L, &tf4, 3, 1, 2024, 0, 1); // a batch = one epoch of 3 windows
    int in[3], tg[3], hist[6] = {0}, ok = 1;
    for (int e = 0; e < 600; e++) {
        data_loader_next(&L, in, tg);
        ok &= in[0] != in[1] && in[1] != in[2] && in[0] != in[2];
        // index of the ordering: first element * 2 + (whether the other two are ascending)
        hist[in[0] * 2 + (in[1] < in[2] ? 0 : 1)]++;
    }
    printf("  ordering counts: %d %d %d %d %d %d\n", hist[0], hist[1], hist[2], hist[3], hist[4],
           hist[5]);
    int uniform = 1;
    for (int i = 0; i < 6; i++) uniform &= hist[i] >= 60 && hist[i] <= 140;
    check_true("each epoch is a permutation", ok);
    check_true("all 6 orderings appear 60..140 times", uniform);
    data_loader_free(&L);
    moe_token_file_free(&tf4);
}

static void seeds(void) {
    printf("seeds\n");
    data_loader a, b, c;
    data_loader_init(&a, &tf, 3, SEQ, 42, 0, 1);
    data_loader_init(&b, &tf, 3, SEQ, 42, 0, 1);
    data_loader_init(&c, &tf, 3, SEQ, 43, 0, 1);
    int64_t ia[60], ib[60], ic[60];
    draw(&a, 20, ia);
    draw(&b, 20, ib);
    draw(&c, 20, ic);
    check_true("same seed -> same sequence", memcmp(ia, ib, sizeof ia) == 0);
    check_true("different seed -> different sequence", memcmp(ia, ic, sizeof ia) != 0);
    data_loader_free(&a);
    data_loader_free(&b);
    data_loader_free(&c);
}

// The epoch orders of `seed`, from a world-1 loader with batch 1: perm[0 .. NWIN-1] is
// epoch 0, perm[NWIN .. 2*NWIN-1] epoch 1.
static void epoch_orders(uint64_t seed, int64_t perm[2 * NWIN]) {
    data_loader one;
    data_loader_init(&one, &tf, 1, SEQ, seed, 0, 1);
    draw(&one, 2 * NWIN, perm);
    data_loader_free(&one);
}

// 1 if got[0 .. B-1] is block `block` (entries block*B .. block*B + B - 1) of the order.
static int is_block(const int64_t *got, const int64_t *order, int block, int B) {
    for (int i = 0; i < B; i++)
        if (got[i] != order[block * B + i]) return 0;
    return 1;
}

static int cmp_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

// World w, batch B: rank r's n-th batch of an epoch is block n*w + r of the epoch order;
// the ranks are disjoint; one global step (batch n of each rank, in rank order) is the w
// consecutive batches a world-1 loader with the same seed and B gives; the epoch keeps
// floor(NWIN / (w*B)) whole blocks per rank and drops the rest; epoch 1 starts at block r.
static void ranks(int w, int B) {
    enum { MAXW = 4, MAXB = 5 };
    const uint64_t seed = 7;
    int nblk = NWIN / (w * B), used = nblk * w * B; // blocks per rank, entries kept
    printf("%d ranks, batch %d: blocks r, r+%d, ... of one epoch order (%d per rank, %d of %d "
           "windows kept)\n",
           w, B, w, nblk, used, NWIN);
    int64_t order[2 * NWIN];
    epoch_orders(seed, order);
    data_loader one, r[MAXW];
    data_loader_init(&one, &tf, B, SEQ, seed, 0, 1);
    int ok = 1;
    for (int k = 0; k < w; k++) ok &= data_loader_init(&r[k], &tf, B, SEQ, seed, k, w) == MOE_OK;
    check_true("  init ok", ok);
    check_true("  windows per rank = floor(37 / (w*B)) * B",
               r[0].windows_per_rank == (uint64_t)(nblk * B));
    // rank k's batches of epoch 0: ids[k][n*B .. n*B + B - 1]; world 1: single[.]
    int64_t ids[MAXW][NWIN], single[NWIN * MAXW], step[MAXW * MAXB], ref[MAXW * MAXB];
    int valid = 1, blocks = 1, same_step = 1, same_multiset = 1;
    valid &= draw(&one, nblk * w, single);
    for (int k = 0; k < w; k++) valid &= draw(&r[k], nblk, ids[k]);
    check_true("  every row is a shifted window", valid);
    for (int k = 0; k < w; k++)
        for (int n = 0; n < nblk; n++) blocks &= is_block(ids[k] + n * B, order, n * w + k, B);
    check_true("  rank r's n-th batch is block n*w + r of the epoch order", blocks);
    for (int n = 0; n < nblk; n++) { // global step n: batch n of ranks 0 .. w-1
        for (int k = 0; k < w; k++) memcpy(step + k * B, ids[k] + n * B, B * sizeof *step);
        memcpy(ref, single + n * w * B, (size_t)(w * B) * sizeof *ref); // world-1 batches
        same_step &= memcmp(step, ref, (size_t)(w * B) * sizeof *ref) == 0;
        qsort(step, (size_t)(w * B), sizeof *step, cmp_i64);
        qsort(ref, (size_t)(w * B), sizeof *ref, cmp_i64);
        same_multiset &= memcmp(step, ref, (size_t)(w * B) * sizeof *ref) == 0;
    }
    check_true("  global step n (rank order) = world-1 batches n*w .. n*w+w-1, same seed",
               same_step);
    check_true("  ... and the same multiset of windows", same_multiset);
    int seen[NWIN] = {0}, disjoint = 1, covered = 0, dropped_unseen = 1;
    for (int k = 0; k < w; k++)
        for (int i = 0; i < nblk * B; i++) disjoint &= !seen[ids[k][i]]++;
    for (int i = 0; i < NWIN; i++) covered += seen[i];
    for (int j = used; j < NWIN; j++) dropped_unseen &= !seen[order[j]];
    check_true("  ranks see disjoint windows", disjoint);
    check_true("  union = the first floor(37/(w*B))*w*B entries; the rest dropped",
               covered == used && dropped_unseen);
    // Every rank is at the end of epoch 0 with the same state; the next batch is block r of
    // epoch 1.
    data_loader_state st[MAXW];
    int same_state = 1, next_epoch = 1;
    for (int k = 0; k < w; k++) {
        data_loader_get_state(&st[k], &r[k]);
        same_state &= st[k].epoch == 0 && st[k].position == (uint64_t)used;
    }
    check_true("  end of epoch 0: every rank at position n*w*B", same_state);
    for (int k = 0; k < w; k++) {
        int64_t got[MAXB];
        draw(&r[k], 1, got);
        next_epoch &= is_block(got, order + NWIN, k, B);
        data_loader_get_state(&st[k], &r[k]);
        next_epoch &= st[k].epoch == 1 && st[k].position == (uint64_t)(w * B);
    }
    check_true("  then epoch 1 on every rank: block r, position w*B", next_epoch);
    data_loader_free(&one);
    for (int k = 0; k < w; k++) data_loader_free(&r[k]);
}

static void save_restore(int rank, int world, int batch) {
    printf("save/restore (rank %d of %d, batch %d)\n", rank, world, batch);
    enum { N = 7, M = 12 };
    data_loader a, fresh;
    data_loader_init(&a, &tf, batch, SEQ, 99, rank, world);
    draw(&a, N, NULL);
    data_loader_state st;
    data_loader_get_state(&st, &a);
    int64_t want[M * 4], got[M * 4];
    draw(&a, M, want);
    data_loader_state end;
    data_loader_get_state(&end, &a);
    check_true("the M batches cross an epoch boundary", end.epoch > st.epoch);
    // A fresh loader with another seed: the state's seed wins.
    data_loader_init(&fresh, &tf, batch, SEQ, 12345, rank, world);
    draw(&fresh, 3, NULL);
    check_true("set_state ok", data_loader_set_state(&fresh, &st) == MOE_OK);
    draw(&fresh, M, got);
    check_true("the next M batches are identical",
               memcmp(want, got, (size_t)M * batch * sizeof *got) == 0);
    data_loader_state end2;
    data_loader_get_state(&end2, &fresh);
    check_true("and the states agree afterwards", memcmp(&end, &end2, sizeof end) == 0);
    data_loader_free(&a);
    data_loader_free(&fresh);
}

// A loader of world w, rank k, batch B (seed 0: the state's seed must win) restored from
// st; draws n batches into got and returns 1 if set_state accepted the state.
static int restored(data_loader *L, int k, int w, int B, const data_loader_state *st, int n,
                    int64_t *got) {
    data_loader_init(L, &tf, B, SEQ, 0, k, w);
    int ok = data_loader_set_state(L, st) == MOE_OK;
    draw(L, n, got);
    return ok;
}

// None of got[0 .. n-1] is one of order[0 .. before-1] (what was consumed before the save).
static int repeats_none(const int64_t *got, int n, const int64_t *order, int before) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < before; j++)
            if (got[i] == order[j]) return 0;
    return 1;
}

static void world_change(void) {
    printf("restore under another world size continues the same epoch order at a block\n");
    int64_t order[2 * NWIN], got[2 * NWIN];
    epoch_orders(5, order);
    data_loader a, b;
    data_loader_state st;

    // world 2, batch 3: 2 batches per rank = blocks 0..3 -> position 12.
    data_loader_init(&a, &tf, 3, SEQ, 5, 0, 2);
    draw(&a, 2, NULL);
    data_loader_get_state(&st, &a);
    data_loader_free(&a);
    check_true("world 2 batch 3: position = batches * world * B = 12", st.position == 12);
    // 2 -> 1, batch 3: block ceil(12/3) = 4, then straight on through the epoch.
    check_true("  2 -> 1: set_state ok", restored(&b, 0, 1, 3, &st, 8, got));
    int straight = 1;
    for (int i = 0; i < 24; i++) straight &= got[i] == order[12 + i];
    check_true("  2 -> 1 (batch 3): continues at block 4 = entries 12, 13, ... 35", straight);
    check_true("  2 -> 1: repeats none of entries 0..11", repeats_none(got, 24, order, 12));
    data_loader_free(&b);
    // 2 -> 1 with batch 5: position 12 is not a multiple of 5; world 1 takes entry 12 on.
    check_true("  2 -> 1: set_state ok", restored(&b, 0, 1, 5, &st, 1, got));
    check_true("  2 -> 1 (batch 5): world 1 continues at entry 12 exactly",
               is_block(got, order + 12, 0, 5));
    data_loader_free(&b);

    // world 1, batch 1: 13 windows -> position 13 (world-1 states are any entry count).
    data_loader_init(&a, &tf, 1, SEQ, 5, 0, 1);
    draw(&a, 13, NULL);
    data_loader_get_state(&st, &a);
    data_loader_free(&a);
    check_true("world 1: position 13", st.position == 13);
    // 1 -> 2, batch 3: ceil(13/6) = 3 -> rank r at block 6 + r (entries 18.., 21..): skips
    // entries 13..17 (5 = w*B - 1), repeats none.
    int ok = 1, none = 1;
    for (int k = 0; k < 2; k++) {
        ok &= restored(&b, k, 2, 3, &st, 2, got);
        ok &= is_block(got, order, 6 + k, 3) && is_block(got + 3, order, 8 + k, 3);
        none &= repeats_none(got, 6, order, 13);
        data_loader_state after;
        data_loader_get_state(&after, &b);
        ok &= after.epoch == 0 && after.position == 30;
        data_loader_free(&b);
    }
    check_true("  1 -> 2 (batch 3) from 13: rank r at blocks 6+r, 8+r; position 30 after", ok);
    check_true("  1 -> 2: repeats none of entries 0..12", none);
    // 1 -> 2 from position 12 (a multiple of w*B = 6): blocks 4 + r, nothing skipped.
    st.position = 12;
    ok = 1;
    for (int k = 0; k < 2; k++) {
        ok &= restored(&b, k, 2, 3, &st, 1, got) && is_block(got, order, 4 + k, 3);
        data_loader_free(&b);
    }
    check_true("  1 -> 2 (batch 3) from 12: rank r at block 4 + r", ok);
    // 1 -> 2 from position 36: ceil(36/6) = 6 = the 6 blocks per rank of an epoch: used
    // up, so the next batch is block r of epoch 1.
    st.position = 36;
    ok = 1;
    for (int k = 0; k < 2; k++) {
        ok &= restored(&b, k, 2, 3, &st, 1, got) && is_block(got, order + NWIN, k, 3);
        data_loader_free(&b);
    }
    check_true("  1 -> 2 (batch 3) from 36: epoch used up, block r of epoch 1", ok);

    // world 4, batch 3: one batch per rank = blocks 0..3 -> position 12.
    data_loader_init(&a, &tf, 3, SEQ, 5, 2, 4);
    draw(&a, 1, NULL);
    data_loader_get_state(&st, &a);
    data_loader_free(&a);
    check_true("world 4 batch 3: position 12", st.position == 12);
    // 4 -> 2, batch 3: ceil(12/6) = 2 -> rank r at block 4 + r, nothing skipped.
    ok = 1, none = 1;
    for (int k = 0; k < 2; k++) {
        ok &= restored(&b, k, 2, 3, &st, 2, got);
        ok &= is_block(got, order, 4 + k, 3) && is_block(got + 3, order, 6 + k, 3);
        none &= repeats_none(got, 6, order, 12);
        data_loader_free(&b);
    }
    check_true("  4 -> 2 (batch 3): rank r at blocks 4+r, 6+r (entries 12.. on, no skip)", ok);
    check_true("  4 -> 2: repeats none of entries 0..11", none);

    // world 2, batch 3, one batch per rank -> position 6; 2 -> 4: ceil(6/12) = 1 -> rank r
    // at block 4 + r, skipping entries 6..11 (6 <= w*B - 1 = 11).
    data_loader_init(&a, &tf, 3, SEQ, 5, 1, 2);
    draw(&a, 1, NULL);
    data_loader_get_state(&st, &a);
    data_loader_free(&a);
    ok = st.position == 6, none = 1;
    for (int k = 0; k < 4; k++) {
        ok &= restored(&b, k, 4, 3, &st, 1, got) && is_block(got, order, 4 + k, 3);
        none &= repeats_none(got, 3, order, 6);
        data_loader_free(&b);
    }
    check_true("  2 -> 4 (batch 3) from 6: rank r at block 4 + r", ok);
    check_true("  2 -> 4: repeats none of entries 0..5", none);
}

static void refusals(void) {
    printf("loader refusals\n");
    data_loader L;
    const char *path = tf.path;
    check_refused("batch_size 0", data_loader_init(&L, &tf, 0, SEQ, 1, 0, 1), path, "batch_size");
    check_refused("seq_len 0", data_loader_init(&L, &tf, 1, 0, 1, 0, 1), path, "seq_len");
    check_refused("rank = world", data_loader_init(&L, &tf, 1, SEQ, 1, 2, 2), path, "rank 2");
    check_refused("rank -1", data_loader_init(&L, &tf, 1, SEQ, 1, -1, 2), path, "rank -1");
    check_refused("world 0", data_loader_init(&L, &tf, 1, SEQ, 1, 0, 0), path, "world of 0");
    check_refused("world > n_windows", data_loader_init(&L, &tf, 1, SEQ, 1, 0, 38), path,
                  "37 windows of seq_len 8, fewer than the 38 ranks");
    check_true("  world = n_windows is fine",
               data_loader_init(&L, &tf, 1, SEQ, 1, 36, 37) == MOE_OK);
    data_loader_free(&L);
    check_refused("world * batch_size > n_windows", data_loader_init(&L, &tf, 3, SEQ, 1, 0, 13),
                  path, "37 windows of seq_len 8, fewer than the 13 ranks x batch_size 3 = 39");
    check_true("  world * batch_size = 36 <= 37 is fine",
               data_loader_init(&L, &tf, 3, SEQ, 1, 11, 12) == MOE_OK);
    data_loader_free(&L);
    check_true("  world 1 with batch_size > n_windows is fine (batches straddle epochs)",
               data_loader_init(&L, &tf, 40, SEQ, 1, 0, 1) == MOE_OK);
    data_loader_free(&L);
    check_refused("window longer than the file", data_loader_init(&L, &tf, 1, COUNT, 1, 0, 1), path,
                  "300 tokens, fewer than one window of seq_len + 1 = 301 tokens");
    check_true("  seq_len = count - 1 is fine (one window)",
               data_loader_init(&L, &tf, 1, COUNT - 1, 1, 0, 1) == MOE_OK && L.n_windows == 1);
    data_loader_free(&L);

    // A tiny file: 8 tokens, seq_len 8 needs 9.
    uint32_t t8[8] = {1, 2, 3, 4, 5, 6, 7, 0};
    const char *small = test_path(dir, "small.bin");
    moe_token_file tf8;
    if (moe_token_file_write(small, t8, 8, 256) != MOE_OK ||
        moe_token_file_read(&tf8, small) != MOE_OK) {
        fprintf(stderr, "test setup: %s\n", moe_last_error());
        exit(2);
    }
    check_refused("fewer tokens than one window", data_loader_init(&L, &tf8, 2, 8, 1, 0, 1), small,
                  "8 tokens, fewer than one window of seq_len + 1 = 9 tokens");
    data_loader_free(&L); // safe after a failed init
    moe_token_file_free(&tf8);

    printf("set_state refusals leave the loader unchanged\n");
    data_loader a, b;
    data_loader_init(&a, &tf, 2, SEQ, 3, 0, 1);
    data_loader_init(&b, &tf, 2, SEQ, 3, 0, 1);
    draw(&a, 5, NULL);
    draw(&b, 5, NULL);
    data_loader_state st, bad;
    data_loader_get_state(&st, &a);
    bad = st;
    bad.n_windows = 36;
    check_refused("other window count", data_loader_set_state(&a, &bad), path,
                  "saved state is for 36 windows");
    bad = st;
    bad.seq_len = 16;
    check_refused("other seq_len", data_loader_set_state(&a, &bad), path, "seq_len 16");
    bad = st;
    bad.position = NWIN + 1;
    bad.seed = 77;
    check_refused("position beyond the epoch", data_loader_set_state(&a, &bad), path,
                  "position 38 is beyond the 37 windows");
    int64_t ia[8], ib[8];
    draw(&a, 4, ia);
    draw(&b, 4, ib);
    check_true("loader unchanged by refused states", memcmp(ia, ib, sizeof ia) == 0);
    data_loader_free(&a);
    data_loader_free(&b);
}

int main(int argc, char **argv) {
    dir = test_scratch_dir(argc, argv);
    make_file();
    epochs();
    uniform_orderings();
    seeds();
    ranks(2, 1);
    ranks(2, 3);
    ranks(4, 1);
    ranks(4, 3);
    ranks(2, 5); // 3 blocks per rank, 7 windows dropped
    save_restore(0, 1, 4);
    save_restore(1, 2, 3);
    save_restore(0, 3, 1);
    save_restore(3, 4, 3);
    world_change();
    refusals();
    moe_token_file_free(&tf);
    return test_result();
}
