// What the tests of the exchange and of expert parallelism share: the world, tensors between
// host and backend memory, and the verdict over all ranks.
#ifndef MOE_EP_TEST_H
#define MOE_EP_TEST_H

#include <stdio.h>
#include <stdlib.h>

#include "layers/exchange.h"
#include "test_util.h"

// The world communicator (mpirun's ranks, else one), or exit 1 with the reason.
static inline moe_comm *ep_world(void) {
    moe_comm *world;
    if (moe_comm_world(&world)) {
        fprintf(stderr, "%s\n", moe_last_error());
        exit(1);
    }
    return world;
}

// n reals of backend memory, a copy of host (NULL: zeros).
static inline real *ep_device(moe_backend *be, const real *host, size_t n) {
    real *p = be->alloc(be, n * sizeof(real) + 1);
    if (!p) {
        fprintf(stderr, "out of backend memory\n");
        exit(1);
    }
    if (host) be->copy_to_device(be, p, host, n * sizeof(real));
    return p;
}

// n reals of backend memory as host doubles (malloc'ed).
static inline double *ep_host_doubles(moe_backend *be, const real *p, size_t n) {
    real *h = malloc(n * sizeof(real) + 1);
    double *o = malloc(n * sizeof(double) + 1);
    be->copy_to_host(be, h, p, n * sizeof(real));
    for (size_t i = 0; i < n; i++) o[i] = h[i];
    free(h);
    return o;
}

// The failures of every rank summed, printed by rank 0; destroys the world. The exit status.
static inline int ep_verdict(moe_comm *world) {
    long failures = test_failures();
    world->allreduce_sum_long(world, &failures, 1);
    if (world->rank == 0) printf("%ld failure(s) over %d rank(s)\n", failures, world->size);
    world->destroy(world);
    return failures != 0;
}

#endif
