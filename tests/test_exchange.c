// The exchange (layers/exchange.h) in the manner of nccl-tests: every rank builds its data
// from (sender, receiver, index), exchanges counts that include zeros and a rank that sends
// nothing at all, checks every element it receives, and reports the bandwidth of the same
// runs; the host all-to-all-v of items likewise. With MOE_TEST_TRANSPORT=device, over the
// backend's own transport (NCCL: tests/cuda's exchange_nccl_*). Run alone (one rank) or under mpirun -np R.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "layers/exchange.h"
#include "layers/rng.h"
#include "ep_test.h"
#include "test_backend.h"
#include "test_util.h"

// The element j of a row i that rank `src` sends to rank `dst` (exact in float).
static real value(int src, int dst, int i, int j) {
    return (real)((src * 7 + dst * 3) % 64 + (double)((i * 5 + j) % 997) / 1024.0);
}

// Rows rank src sends to rank dst in round `round`: a function every rank can evaluate.
// Zero for (src + round) % 5 == 0 pairs, and rank R-1 sends nothing in round 1.
static int rows_of(int src, int dst, int R, int round, int max_rows) {
    if (round == 1 && src == R - 1) return 0;
    uint64_t h = moe_mix64((uint64_t)(src * 131 + dst * 17 + round * 7919 + 1));
    if ((src + dst + round) % 5 == 0) return 0;
    return (int)(h % (uint64_t)(max_rows + 1));
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

// The nonblocking form (the MoE layer's overlap): two transfers in flight at once (rounds 2
// and 3's counts), each peer's rows at a displacement in reverse peer order with a gap of one
// row before each block, the second waited first. Returns the wrong elements seen.
static int nonblocking_rows(moe_comm *world, moe_backend *be, int d, int max_rows) {
    const int R = world->size, me = world->rank;
    int *n = calloc(8 * (size_t)R, sizeof(int)), bad = 0;
    real *ds[2], *dr[2];
    size_t span_s[2], span_r[2];
    for (int x = 0; x < 2; x++) {
        int *sn = n + 4 * x * R, *sa = sn + R, *rn = sa + R, *ra = rn + R;
        span_s[x] = span_r[x] = 0;
        for (int j = R - 1; j >= 0; j--) { // peer R-1's block first
            sn[j] = rows_of(me, j, R, 2 + x, max_rows), rn[j] = rows_of(j, me, R, 2 + x, max_rows);
            sa[j] = (int)span_s[x] + 1, ra[j] = (int)span_r[x] + 1;
            span_s[x] += (size_t)sn[j] + 1, span_r[x] += (size_t)rn[j] + 1;
        }
        real *h = calloc(span_s[x] * d, sizeof(real));
        for (int j = 0; j < R; j++)
            for (int i = 0; i < sn[j]; i++)
                for (int k = 0; k < d; k++) h[((size_t)sa[j] + i) * d + k] = value(me, j, i, k);
        ds[x] = be->alloc(be, span_s[x] * d * sizeof(real));
        dr[x] = be->alloc(be, span_r[x] * d * sizeof(real));
        be->copy_to_device(be, ds[x], h, span_s[x] * d * sizeof(real));
        free(h);
        world->alltoallv_rows_start(world, be, 5 + x, dr[x], rn, ra, ds[x], sn, sa,
                                    d * sizeof(real));
    }
    for (int x = 1; x >= 0; x--) {
        world->alltoallv_rows_wait(world, be, 5 + x);
        const int *rn = n + 4 * x * R + 2 * R, *ra = rn + R;
        real *h = malloc(span_r[x] * d * sizeof(real));
        be->copy_to_host(be, h, dr[x], span_r[x] * d * sizeof(real));
        for (int j = 0; j < R; j++)
            for (int i = 0; i < rn[j]; i++)
                for (int k = 0; k < d; k++)
                    bad += h[((size_t)ra[j] + i) * d + k] != value(j, me, i, k);
        free(h);
        be->free(be, ds[x]), be->free(be, dr[x]);
    }
    free(n);
    return bad;
}

// argv[1] (optional): the most rows a rank sends a peer (default 200; scripts/bench_ep uses
// large ones for the all-to-all bandwidth).
int main(int argc, char **argv) {
    moe_comm *world = ep_world();
    moe_backend *be = test_backend();
    // MOE_TEST_TRANSPORT=device: the same checks through the backend's own transport (NCCL on
    // cuda), which owns the world from here on
    const char *transport = getenv("MOE_TEST_TRANSPORT");
    if (transport && !strcmp(transport, "device")) {
        moe_comm *dev;
        if (!be->device_comm || be->device_comm(be, world, &dev)) {
            fprintf(stderr, "%s\n", be->device_comm ? moe_last_error() : "no device transport");
            return 1;
        }
        world = dev;
    }
    const int R = world->size, me = world->rank, d = 64;
    const int max_rows = argc > 1 && atoi(argv[1]) > 0 ? atoi(argv[1]) : 200;
    if (me == 0) printf("exchange %s, %d rank(s), backend %s\n", world->name, R, be->name);

    // the per-peer counts, exchanged as the MoE layer does (alltoall of ints)
    int *send_n = malloc(2 * (size_t)R * sizeof(int)), *recv_n = send_n + R;
    double bytes_moved = 0, seconds = 0;
    int bad = 0, bad_host = 0;
    for (int round = 0; round < 5; round++) {
        for (int j = 0; j < R; j++) send_n[j] = rows_of(me, j, R, round, max_rows);
        world->alltoall_int(world, recv_n, send_n, 1);
        size_t ns = 0, nr = 0;
        for (int j = 0; j < R; j++) {
            bad += recv_n[j] != rows_of(j, me, R, round, max_rows); // counts arrive intact
            ns += (size_t)send_n[j], nr += (size_t)recv_n[j];
        }
        real *hs = malloc((ns + 1) * d * sizeof(real)), *hr = malloc((nr + 1) * d * sizeof(real));
        size_t at = 0;
        for (int j = 0; j < R; j++)
            for (int i = 0; i < send_n[j]; i++, at++)
                for (int k = 0; k < d; k++) hs[at * d + k] = value(me, j, i, k);
        real *ds = be->alloc(be, (ns + 1) * d * sizeof(real)),
             *dr = be->alloc(be, (nr + 1) * d * sizeof(real));
        be->copy_to_device(be, ds, hs, ns * d * sizeof(real));
        world->barrier(world);
        const double t0 = now();
        world->alltoallv_rows(world, be, dr, recv_n, ds, send_n, d * sizeof(real));
        if (round > 0) { // round 0 warms up (MPI's first contact between the ranks): not timed
            seconds += now() - t0;
            bytes_moved += (double)(ns + nr) * d * sizeof(real) / 2;
        }
        be->copy_to_host(be, hr, dr, nr * d * sizeof(real));
        at = 0;
        for (int j = 0; j < R; j++)
            for (int i = 0; i < recv_n[j]; i++, at++)
                for (int k = 0; k < d; k++) bad += hr[at * d + k] != value(j, me, i, k);
        be->free(be, ds), be->free(be, dr);
        free(hs), free(hr);
        // the same counts of host items of 3 ints (sender, receiver, index)
        int *is = malloc((ns + 1) * 3 * sizeof(int)), *ir = malloc((nr + 1) * 3 * sizeof(int));
        at = 0;
        for (int j = 0; j < R; j++)
            for (int i = 0; i < send_n[j]; i++, at++)
                is[3 * at] = me, is[3 * at + 1] = j, is[3 * at + 2] = i;
        world->alltoallv_host(world, ir, recv_n, is, send_n, 3 * sizeof(int));
        at = 0;
        for (int j = 0; j < R; j++)
            for (int i = 0; i < recv_n[j]; i++, at++)
                bad_host += ir[3 * at] != j || ir[3 * at + 1] != me || ir[3 * at + 2] != i;
        free(is), free(ir);
    }
    check_true("alltoall counts and alltoallv rows: every element from (sender, receiver, index)",
               bad == 0);
    check_true("alltoallv_host: every item from (sender, receiver, index)", bad_host == 0);
    check_true("alltoallv_rows_start/wait: two in flight, displacements, waited in reverse",
               nonblocking_rows(world, be, d, max_rows) == 0);

    // all-reduce of backend reals, host doubles and longs; allgather; broadcast
    const size_t n = 1000;
    real *hx = malloc(n * sizeof(real)), *dx = be->alloc(be, n * sizeof(real));
    for (size_t i = 0; i < n; i++) hx[i] = (real)(me + 1) * (real)(i % 13);
    be->copy_to_device(be, dx, hx, n * sizeof(real));
    world->allreduce_sum_real(world, be, dx, n);
    be->copy_to_host(be, hx, dx, n * sizeof(real));
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= hx[i] == (real)(R * (R + 1) / 2) * (real)(i % 13);
    check_true("allreduce_sum_real (backend memory) == R(R+1)/2 x", ok);
    // the sharded optimizer's pair on uneven pieces (piece r: 100 + 37 r reals, the last one
    // the rest; a count of 0 when R is large): rank r's piece is the sum, then every piece
    // everywhere
    size_t *counts = malloc((size_t)R * sizeof *counts), left = n, off = 0;
    for (int r = 0; r < R; r++) {
        counts[r] = r == R - 1 ? left : (100 + 37 * (size_t)r < left ? 100 + 37 * (size_t)r : left);
        left -= counts[r];
        if (r < me) off += counts[r];
    }
    for (size_t i = 0; i < n; i++) hx[i] = (real)(me + 1) * (real)(i % 13);
    be->copy_to_device(be, dx, hx, n * sizeof(real));
    world->reduce_scatter_sum_real(world, be, dx, counts);
    be->copy_to_host(be, hx, dx, n * sizeof(real));
    ok = 1;
    for (size_t i = off; i < off + counts[me]; i++)
        ok &= hx[i] == (real)(R * (R + 1) / 2) * (real)(i % 13);
    check_true("reduce_scatter_sum_real (uneven pieces): this rank's piece == R(R+1)/2 x", ok);
    for (size_t i = off; i < off + counts[me]; i++) hx[i] = (real)(i + 1000 * me);
    be->copy_to_device(be, dx + off, hx + off, counts[me] * sizeof(real));
    world->allgather_real(world, be, dx, counts);
    be->copy_to_host(be, hx, dx, n * sizeof(real));
    ok = 1;
    for (int r = 0, at = 0; r < R; at += (int)counts[r], r++)
        for (size_t i = (size_t)at; i < (size_t)at + counts[r]; i++)
            ok &= hx[i] == (real)(i + 1000 * r);
    check_true("allgather_real (uneven pieces): every rank's piece on every rank", ok);
    free(counts);
    double dv[2] = {me + 0.5, 1};
    long lv[2] = {me, 1};
    world->allreduce_sum_double(world, dv, 2);
    world->allreduce_sum_long(world, lv, 2);
    check_true("allreduce_sum_double", dv[0] == R * (R - 1) / 2.0 + 0.5 * R && dv[1] == R);
    check_true("allreduce_sum_long", lv[0] == (long)R * (R - 1) / 2 && lv[1] == R);
    int *all = malloc((size_t)R * sizeof(int)), mine = 100 + me;
    world->allgather(world, all, &mine, sizeof mine);
    ok = 1;
    for (int j = 0; j < R; j++) ok &= all[j] == 100 + j;
    check_true("allgather", ok);
    long token = me == R - 1 ? 4242 : -1;
    world->broadcast(world, &token, sizeof token, R - 1);
    check_true("broadcast from the last rank", token == 4242);

    // split: even and odd ranks
    moe_comm *half;
    if (world->split(world, me % 2, me, &half)) return 1;
    long one = 1;
    half->allreduce_sum_long(half, &one, 1);
    check_true("split: the group's size and this rank's place in it",
               half->size == (R + 1 - me % 2) / 2 && half->rank == me / 2 && one == half->size);
    half->destroy(half);

    if (me == 0)
        printf("alltoallv: %.2f MB per rank in %.3f ms: %.2f GB/s (algorithm bandwidth)\n",
               bytes_moved / 1e6, seconds * 1e3, seconds > 0 ? bytes_moved / seconds / 1e9 : 0);
    be->free(be, dx);
    free(hx), free(all), free(send_n);
    return ep_verdict(world);
}
