// The MoE layer under expert parallelism (layers/moe.c dispatch/combine with layers/exchange.h)
// against the single-rank layer, under mpirun -np R. Each rank routes its own tokens; the
// EP layer holds E/ep of the experts. Per rank, outputs, input gradients and router
// gradients equal the single-rank layer's on the same tokens with all E experts; a local
// expert's weight gradient equals the single-rank gradients summed over the EP group's ranks.
// Dropless and with capacity (both drop policies, drops happening), EP over all ranks and
// over halves of them; both exchanges (dedup and rows). The largest relative difference seen
// is printed. The bytes each rank sends each peer equal what the routing says they must be:
// per kept slot 4 rows (rows), per (token, peer holding one of its kept slots) 4 rows and 2
// weight vectors of k (dedup).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/exchange.h"
#include "layers/moe.h"
#include "ep_test.h"
#include "test_backend.h"
#include "test_util.h"

#define TOL 1e-6

static real *randn(uint64_t seed, size_t n, double scale) {
    test_rng r;
    rng_seed(&r, seed);
    real *x = malloc(n * sizeof(real));
    for (size_t i = 0; i < n; i++) x[i] = (real)(scale * rng_normal(&r));
    return x;
}

typedef struct {
    double worst;      // largest relative difference
    long dropped;      // assignments dropped on this rank
    long remote_bytes; // bytes this rank sent to the other ranks of its group
    double *ep;        // the EP layer's outputs, dx and gradients (the caller frees)
    size_t ep_n;
} outcome;

// One layer forward + backward on this rank's tokens; g receives the weight gradients.
static void run(moe_layer *L, moe_backend *be, const moe_config *cfg, int E_local, const real *hw,
                const real *hx, const real *hdout, int T, double **y, double **dx, double **g,
                long *dropped) {
    const size_t nx = (size_t)T * cfg->d_model, nw = moe_weights_count_local(cfg, E_local);
    real *w = ep_device(be, hw, nw), *gr = ep_device(be, NULL, nw), *x = ep_device(be, hx, nx);
    real *dout = ep_device(be, hdout, nx), *out = ep_device(be, NULL, nx),
         *dxd = ep_device(be, NULL, nx);
    moe_weights wv, gv;
    moe_weights_view_local(&wv, w, cfg, E_local);
    moe_weights_view_local(&gv, gr, cfg, E_local);
    moe_stats st;
    if (moe_layer_forward(L, out, x, &wv, T, 0, moe_pass_train(L->cfg.capacity_factor), &st) ||
        moe_layer_backward(L, dxd, &gv, dout, x, &wv, 1.0)) {
        fprintf(stderr, "layer: %s\n", moe_last_error());
        exit(1);
    }
    *dropped = st.dropped;
    *y = ep_host_doubles(be, out, nx), *dx = ep_host_doubles(be, dxd, nx),
    *g = ep_host_doubles(be, gr, nw);
    real *bufs[] = {w, gr, x, dout, out, dxd};
    for (int i = 0; i < 6; i++) be->free(be, bufs[i]);
}

static outcome check_case(moe_comm *world, moe_comm *ep, moe_backend *be, moe_config cfg, int T) {
    const int E = cfg.n_experts, d = cfg.d_model, ff = cfg.d_ff, El = E / ep->size;
    const size_t nx = (size_t)T * d, nw = moe_weights_count(&cfg);
    real *hw = randn(11, nw, 0.3); // the same global weights on every rank
    real *hx = randn(100 + (uint64_t)world->rank, nx, 1);
    real *hdout = randn(200 + (uint64_t)world->rank, nx, 1);
    outcome o = {0, 0, 0, NULL, 0};

    // the single-rank layer, all E experts, this rank's tokens
    moe_layer ref;
    if (moe_layer_init(&ref, be, &cfg, T)) exit(1);
    double *y0, *dx0, *g0;
    long drop0;
    run(&ref, be, &cfg, E, hw, hx, hdout, T, &y0, &dx0, &g0, &drop0);
    // the bytes the routing implies, per peer j: from the reference's top-k and keep. Units
    // to j: kept slots at j's experts (rows), tokens with one there (dedup); each unit sends
    // 2 rows out (x and dout, dedup also its weights) and j sends as much back (the outputs
    // and dx, dedup also dweights): so to j go our units' and j's units' worth of bytes.
    const int k = cfg.top_k, R = ep->size;
    int *topk = malloc(2 * (size_t)T * k * sizeof(int)), *keep = topk + (size_t)T * k;
    be->copy_to_host(be, topk, ref.topk_idx, (size_t)T * k * sizeof(int));
    be->copy_to_host(be, keep, ref.keep, (size_t)T * k * sizeof(int));
    int *units = calloc(2 * (size_t)R, sizeof(int)), *units_in = units + R;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < R; j++) {
            int slots = 0;
            for (int s = 0; s < k; s++) slots += keep[t * k + s] && topk[t * k + s] / El == j;
            units[j] += cfg.exchange == MOE_EXCHANGE_ROWS ? slots : slots > 0;
        }
    ep->alltoall_int(ep, units_in, units, 1);
    const long unit =
        (cfg.exchange == MOE_EXCHANGE_ROWS ? 2L * d : 2L * d + k) * (long)sizeof(real);
    long *want_bytes = calloc((size_t)R, sizeof(long));
    for (int j = 0; j < R; j++) want_bytes[j] = (units[j] + units_in[j]) * unit;
    free(units);
    moe_layer_free(&ref);

    // the EP layer: gate whole, experts [first, first + El)
    moe_layer L;
    moe_layer_shape shape = {.max_tokens = T, .ep = ep};
    if (moe_layer_create(&L, be, &cfg, &shape)) {
        fprintf(stderr, "%s\n", moe_last_error());
        exit(1);
    }
    const size_t ng = (size_t)E * d, per = 3 * (size_t)ff * d, w13 = 2 * (size_t)ff * d;
    const size_t nwl = moe_weights_count_local(&cfg, El);
    real *hwl = malloc(nwl * sizeof(real));
    moe_weights full, local;
    moe_weights_view(&full, hw, &cfg);
    moe_weights_view_local(&local, hwl, &cfg, El);
    memcpy(local.gate, full.gate, ng * sizeof(real));
    memcpy(local.w13, full.w13 + (size_t)L.expert0 * w13, El * w13 * sizeof(real));
    memcpy(local.w2, full.w2 + (size_t)L.expert0 * (per - w13), El * (per - w13) * sizeof(real));
    double *y1, *dx1, *g1;
    run(&L, be, &cfg, El, hwl, hx, hdout, T, &y1, &dx1, &g1, &o.dropped);
    check_true("the EP layer's drops equal the single-rank layer's (capacity per rank)",
               o.dropped == drop0);
    int bytes_ok = 1;
    for (int j = 0; j < R && L.sent_bytes; j++) bytes_ok &= L.sent_bytes[j] == want_bytes[j];
    check_true("bytes sent to each peer == what the routing implies", bytes_ok);
    for (int j = 0; j < R && L.sent_bytes; j++)
        o.remote_bytes += j == ep->rank ? 0 : L.sent_bytes[j];
    free(topk), free(want_bytes);
    moe_layer_free(&L);

    // expert gradients of the reference, summed over the EP group, sliced to the local experts
    ep->allreduce_sum_double(ep, g0 + ng, nw - ng);
    double *want = malloc(nwl * sizeof(double));
    memcpy(want, g0, ng * sizeof(double));
    const int first = ep->rank * El;
    memcpy(want + ng, g0 + ng + (size_t)first * w13, El * w13 * sizeof(double));
    memcpy(want + ng + El * w13, g0 + ng + (size_t)E * w13 + (size_t)first * (per - w13),
           El * (per - w13) * sizeof(double));
    const double errs[4] = {rel_err(y1, y0, nx), rel_err(dx1, dx0, nx), rel_err(g1, want, ng),
                            rel_err(g1 + ng, want + ng, nwl - ng)};
    for (int i = 0; i < 4; i++) o.worst = fmax(o.worst, errs[i]);
    check_true("EP == single rank: outputs, dx, dgate, expert grads (within 1e-6)", o.worst <= TOL);
    o.ep_n = 2 * nx + nwl;
    o.ep = malloc(o.ep_n * sizeof(double));
    memcpy(o.ep, y1, nx * sizeof(double));
    memcpy(o.ep + nx, dx1, nx * sizeof(double));
    memcpy(o.ep + 2 * nx, g1, nwl * sizeof(double));
    free(y0), free(dx0), free(g0), free(y1), free(dx1), free(g1), free(want);
    free(hw), free(hx), free(hdout), free(hwl);
    return o;
}

int main(void) {
    moe_comm *world = ep_world();
    moe_backend *be = test_backend();
    const int R = world->size, T = 48;
    struct {
        const char *name;
        double cf;
        moe_drop_policy policy;
    } modes[] = {{"dropless", 0, MOE_DROP_PROBS},
                 {"capacity 1.0, probs", 1.0, MOE_DROP_PROBS},
                 {"capacity 1.0, position", 1.0, MOE_DROP_POSITION}};
    int ep_sizes[2] = {R, R / 2}, n_ep = R >= 4 ? 2 : 1;
    for (int s = 0; s < n_ep; s++) {
        moe_comm *ep; // groups of ep_size consecutive ranks
        if (world->split(world, world->rank / ep_sizes[s], world->rank, &ep)) return 1;
        for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
            moe_config cfg = moe_config_default(16, 24, 8, 2);
            cfg.capacity_factor = modes[m].cf;
            cfg.drop_policy = modes[m].policy;
            cfg.exchange = MOE_EXCHANGE_ROWS;
            outcome rows = check_case(world, ep, be, cfg, T);
            // the overlap (rows in chunks of local experts, pipelined with the experts): the
            // same GEMMs on the same rows, so the same bits as one exchange
            cfg.overlap_chunks = cfg.n_experts / ep->size;
            outcome chunked = check_case(world, ep, be, cfg, T);
            int same = chunked.ep_n == rows.ep_n &&
                       memcmp(chunked.ep, rows.ep, rows.ep_n * sizeof(double)) == 0;
            check_true("overlap_chunks = E_local: outputs, dx and gradients bit for bit", same);
            free(chunked.ep), free(rows.ep);
            cfg.overlap_chunks = 1;
            cfg.exchange = MOE_EXCHANGE_DEDUP;
            outcome o = check_case(world, ep, be, cfg, T);
            // dedup in chunks: packets out with their first expert's chunk, back with their
            // last's; the same sums of the same products
            for (int C = 2; C <= cfg.n_experts / ep->size; C *= 2) {
                cfg.overlap_chunks = C;
                chunked = check_case(world, ep, be, cfg, T);
                same = chunked.ep_n == o.ep_n &&
                       memcmp(chunked.ep, o.ep, o.ep_n * sizeof(double)) == 0;
                check_true(
                    "dedup, overlap_chunks 2..E_local: outputs, dx and gradients bit for bit",
                    same);
                free(chunked.ep);
            }
            cfg.overlap_chunks = 1;
            free(o.ep);
            o.worst = fmax(o.worst, rows.worst);
            long bytes[2] = {rows.remote_bytes, o.remote_bytes};
            world->allreduce_sum_long(world, bytes, 2);
            if (ep->size > 1) check_true("dedup sends fewer bytes than rows", bytes[1] < bytes[0]);
            double worst = o.worst;
            long dropped = o.dropped;
            double *all = malloc((size_t)R * sizeof(double));
            world->allgather(world, all, &worst, sizeof worst);
            world->allreduce_sum_long(world, &dropped, 1);
            for (int j = 0; j < R; j++) worst = fmax(worst, all[j]);
            free(all);
            if (cfg.capacity_factor > 0) check_true("drops happen in capacity mode", dropped > 0);
            if (world->rank == 0)
                printf("R=%d ep=%d %-24s largest relative difference %.2e, %ld dropped, bytes "
                       "between ranks: rows %ld, dedup %ld (%.1f%% less)\n",
                       R, ep->size, modes[m].name, worst, dropped, bytes[0], bytes[1],
                       100.0 * (1 - (double)bytes[1] / (double)bytes[0]));
        }
        ep->destroy(ep);
    }
    return ep_verdict(world);
}
