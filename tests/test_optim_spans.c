// The optimizer over spans (optim/optimizer.h, the sharded optimizer's per-rank piece): a
// parameter buffer cut into spans, each updated by its own optimizer, equals one optimizer
// over all of it bit for bit (AdamW with decay on some regions and not others, regions cut
// by the spans, bf16 copies), for several steps; parameters outside an optimizer's spans
// never change; its moments count only its spans.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optimizer.h"
#include "test_backend.h"
#include "test_util.h"

enum { N = 1000, STEPS = 3 };

static void fill(real *x, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = (real)((double)(seed >> 8 & 0xffff) / 32768.0 - 1.0);
    }
}

int main(void) {
    moe_backend *be = test_backend();
    const optim_config cfg = {OPTIM_ADAMW, 0.9, 0.95, 1e-8, 0.1};
    // regions of both decay flags, each cut by the pieces below
    const optim_region regions[4] = {{0, 300, 1}, {300, 50, 0}, {350, 400, 1}, {750, 250, 0}};
    // three "ranks": the dense [0, 700) in pieces, the "experts" [700, 1000) with each piece
    const optim_span pieces[3][2] = {
        {{0, 233}, {700, 300}}, {{233, 233}, {700, 300}}, {{466, 234}, {700, 300}}};
    real *host = malloc(3 * N * sizeof(real)), *grads = host + N, *ref = host + 2 * N;
    fill(host, N, 1);
    real *p_all = be->alloc(be, N * sizeof(real)), *g = be->alloc(be, N * sizeof(real));
    real *p_part[3];
    moe_optimizer all, part[3];
    int bad = moe_optimizer_create(&all, be, &cfg, N, regions, 4) != MOE_OK;
    be->copy_to_device(be, p_all, host, N * sizeof(real));
    for (int r = 0; r < 3; r++) {
        p_part[r] = be->alloc(be, N * sizeof(real));
        be->copy_to_device(be, p_part[r], host, N * sizeof(real));
        bad |=
            moe_optimizer_create_spans(&part[r], be, &cfg, N, regions, 4, pieces[r], 2) != MOE_OK;
        bad |= part[r].n != pieces[r][0].count + 300;
    }
    check_true("create: spans accepted, moments of the spans only", !bad);
    for (int s = 0; s < STEPS; s++) {
        fill(grads, N, 100 + (unsigned)s);
        be->copy_to_device(be, g, grads, N * sizeof(real));
        moe_optimizer_step(&all, p_all, NULL, g, 1e-2, 0.5);
        for (int r = 0; r < 3; r++) moe_optimizer_step(&part[r], p_part[r], NULL, g, 1e-2, 0.5);
    }
    be->copy_to_host(be, ref, p_all, N * sizeof(real));
    int same = 1, outside = 1;
    for (int r = 0; r < 3; r++) {
        be->copy_to_host(be, grads, p_part[r], N * sizeof(real)); // (grads: scratch now)
        for (size_t i = 0; i < N; i++) {
            const size_t lo = pieces[r][0].offset, hi = lo + pieces[r][0].count;
            if ((i >= lo && i < hi) || i >= 700)
                same &= memcmp(&grads[i], &ref[i], sizeof(real)) == 0;
            else
                outside &= grads[i] == host[i];
        }
    }
    check_true("each span's parameters equal the whole optimizer's, bit for bit", same);
    check_true("parameters outside the spans never change", outside);
    const optim_span overlap[2] = {{0, 100}, {50, 100}};
    moe_optimizer o;
    check_true("overlapping spans are refused",
               moe_optimizer_create_spans(&o, be, &cfg, N, regions, 4, overlap, 2) == MOE_EINVAL);
    moe_optimizer_destroy(&all);
    for (int r = 0; r < 3; r++) moe_optimizer_destroy(&part[r]), be->free(be, p_part[r]);
    be->free(be, p_all), be->free(be, g);
    free(host);
    printf("%s\n", test_failures() ? "FAILED" : "all passed");
    return test_failures() != 0;
}
