// The loader: windows are shifted copies of the file, an epoch is a permutation of all
// windows, ranks split it disjointly, the order is a function of the seed, and a saved
// state resumes exactly (also across epochs and in a fresh loader).
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
static token_file tf; // tokens[i] = (i * 7 + 3) mod VOCAB: a window's start is recoverable
enum { VOCAB = 1009 }; // prime > COUNT, so i -> tokens[i] is one-to-one on [0, COUNT)
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
    if (token_file_write(path, tok, COUNT, VOCAB) != MOE_OK ||
        token_file_read(&tf, path) != MOE_OK) {
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
    check_true("n_windows = (count-1)/seq_len",
               L.n_windows == NWIN && L.windows_per_rank == NWIN);
    // 37 batches of 4 = 148 windows = exactly 4 epochs; batches straddle epoch boundaries.
    int64_t ids[4 * NWIN];
    check_true("every row is a shifted copy of the file", draw(&L, NWIN, ids));
    int perms = 1, identity = 1, differ = 1;
    for (int e = 0; e < 4; e++) perms &= is_permutation(ids + e * NWIN, NWIN, NWIN);
    for (int i = 0; i < NWIN; i++) identity &= ids[i] == i;
    for (int e = 1; e < 4; e++)
        differ &= memcmp(ids, ids + e * NWIN, NWIN * sizeof *ids) != 0;
    check_true("each epoch visits every window exactly once", perms);
    check_true("the order is shuffled (not 0,1,2,...)", !identity);
    check_true("each epoch has a new order", differ);
    data_loader_state st;
    data_loader_get_state(&st, &L);
    printf("  after 4 epochs: epoch %llu position %llu\n", (unsigned long long)st.epoch,
           (unsigned long long)st.position);
    check_true("state: epoch 3 used up (the next batch starts epoch 4)",
               st.epoch == 3 && st.position == NWIN && st.seed == 1234 &&
                   st.n_windows == NWIN && st.seq_len == SEQ);
    data_loader_free(&L);
}

// Fisher-Yates must give every ordering with the same probability: with 3 windows over
// 600 epochs each of the 6 orderings should appear ~100 times (a biased shuffle such as
// Sattolo's, or a modulo-biased draw, misses orderings or skews them far outside 60..140).
static void uniform_orderings(void) {
    printf("the shuffle is uniform over orderings (3 windows, 600 epochs)\n");
    uint32_t t4[4] = {0, 1, 2, 3};
    const char *path = test_path(dir, "three.bin");
    token_file tf4;
    if (token_file_write(path, t4, 4, 4) != MOE_OK || token_file_read(&tf4, path) != MOE_OK) {
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
    token_file_free(&tf4);
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

static void ranks(void) {
    printf("two ranks: disjoint shares of the same epoch order\n");
    data_loader one, r0, r1;
    data_loader_init(&one, &tf, 1, SEQ, 7, 0, 1);
    data_loader_init(&r0, &tf, 2, SEQ, 7, 0, 2);
    data_loader_init(&r1, &tf, 2, SEQ, 7, 1, 2);
    check_true("windows per rank = 37 / 2 = 18", r0.windows_per_rank == 18);
    int64_t all[NWIN], s0[18], s1[18];
    draw(&one, NWIN, all);
    check_true("rank 0 rows are shifted windows", draw(&r0, 9, s0));
    check_true("rank 1 rows are shifted windows", draw(&r1, 9, s1));
    int strided = 1, seen[NWIN] = {0}, disjoint = 1, covered = 0;
    for (int p = 0; p < 18; p++) {
        strided &= s0[p] == all[2 * p] && s1[p] == all[2 * p + 1];
        disjoint &= !seen[s0[p]]++;
        disjoint &= !seen[s1[p]]++;
    }
    for (int i = 0; i < NWIN; i++) covered += seen[i];
    check_true("rank r takes entries j % 2 == r of the epoch order", strided);
    check_true("ranks see disjoint windows", disjoint);
    check_true("union = the epoch minus the 37 % 2 = 1 dropped window",
               covered == 36 && !seen[all[36]]);
    // Both ranks move to epoch 1 together, again disjoint.
    data_loader_state a, b;
    draw(&r0, 1, s0);
    draw(&r1, 1, s1);
    data_loader_get_state(&a, &r0);
    data_loader_get_state(&b, &r1);
    check_true("epoch 1 on both ranks, same state", a.epoch == 1 && b.epoch == 1 &&
                                                        a.position == 4 && b.position == 4);
    check_true("epoch 1: still disjoint", s0[0] != s1[0] && s0[1] != s1[1] && s0[0] != s1[1] &&
                                              s0[1] != s1[0]);
    data_loader_free(&one);
    data_loader_free(&r0);
    data_loader_free(&r1);
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

static void world_change(void) {
    printf("restore under another world size continues the same epoch order\n");
    data_loader one, r0, r1;
    data_loader_init(&one, &tf, 1, SEQ, 5, 0, 1);
    int64_t all[NWIN], w[2];
    draw(&one, NWIN, all);
    data_loader_init(&r0, &tf, 2, SEQ, 5, 0, 2);
    draw(&r0, 3, NULL); // 6 windows per rank: position 12
    data_loader_state st;
    data_loader_get_state(&st, &r0);
    check_true("position = windows taken * world", st.position == 12);
    data_loader_free(&one);
    data_loader_init(&one, &tf, 1, SEQ, 0, 0, 1); // seed 0: the state's seed 5 must win
    check_true("set_state ok", data_loader_set_state(&one, &st) == MOE_OK);
    draw(&one, 2, w);
    check_true("world 2 -> 1: continues at entry 12", w[0] == all[12] && w[1] == all[13]);
    // world 1 at position 13 -> world 2: round up to 14 (skip one, repeat none).
    data_loader_get_state(&st, &one);
    st.position = 13;
    data_loader_init(&r1, &tf, 1, SEQ, 0, 1, 2);
    check_true("set_state ok", data_loader_set_state(&r1, &st) == MOE_OK);
    draw(&r1, 1, w);
    check_true("world 1 -> 2: rank 1 continues at entry 15", w[0] == all[15]);
    data_loader_free(&one);
    data_loader_free(&r0);
    data_loader_free(&r1);
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
    check_refused("window longer than the file",
                  data_loader_init(&L, &tf, 1, COUNT, 1, 0, 1), path,
                  "300 tokens, fewer than one window of seq_len + 1 = 301 tokens");
    check_true("  seq_len = count - 1 is fine (one window)",
               data_loader_init(&L, &tf, 1, COUNT - 1, 1, 0, 1) == MOE_OK && L.n_windows == 1);
    data_loader_free(&L);

    // A tiny file: 8 tokens, seq_len 8 needs 9.
    uint32_t t8[8] = {1, 2, 3, 4, 5, 6, 7, 0};
    const char *small = test_path(dir, "small.bin");
    token_file tf8;
    if (token_file_write(small, t8, 8, 256) != MOE_OK || token_file_read(&tf8, small) != MOE_OK) {
        fprintf(stderr, "test setup: %s\n", moe_last_error());
        exit(2);
    }
    check_refused("fewer tokens than one window", data_loader_init(&L, &tf8, 2, 8, 1, 0, 1),
                  small, "8 tokens, fewer than one window of seq_len + 1 = 9 tokens");
    data_loader_free(&L); // safe after a failed init
    token_file_free(&tf8);

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
    if (argc != 2) {
        fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    test_mkdirs(dir);
    make_file();
    epochs();
    uniform_orderings();
    seeds();
    ranks();
    save_restore(0, 1, 4);
    save_restore(1, 2, 3);
    save_restore(0, 3, 1);
    world_change();
    refusals();
    token_file_free(&tf);
    printf("%s\n", test_failures() ? "FAILED" : "all passed");
    return test_failures() != 0;
}
