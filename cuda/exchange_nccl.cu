// The NCCL exchange (layers/exchange.h) for the cuda backend: a communicator over a host one
// (MPI), whose operations on backend memory run on the device with NCCL and whose host-memory
// operations are the host communicator's. Expert parallelism's rows never leave the device.
//
// - alltoallv_rows: NCCL has no variable-count all-to-all; the counts are already on the host
//   (the layer exchanged them), so it is one group of ncclSend/ncclRecv per peer with rows
//   (zero-row peers skipped), on the backend's stream.
// - alltoallv_rows_start / _wait (the overlap): the same group on a side stream ordered by
//   events, so the backend's stream computes while the rows travel.
// - allreduce_sum_real: ncclAllReduce (sum, fp32) in place on the backend's stream.
// - reduce_scatter_sum_real, allgather_real (parallel.shard_optimizer): pieces of unequal
//   counts, so a group of ncclReduce / ncclBroadcast per piece (NCCL's ReduceScatter and
//   AllGather take one count for all).
// - The unique id is made by rank 0 and broadcast over the host communicator; split splits the
//   host communicator and the NCCL one (ncclCommSplit) alike.
// - Each call waits for its stream (the layer reads the results' sizes on the host next, and
//   wait_s then measures the exchange), so the interface stays synchronous as on MPI.
// NCCL refuses two ranks on one GPU: one GPU per rank (the cuda backend picks the device from
// MOE_CUDA_DEVICE, else the node-local rank modulo the devices).
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda/cuda_kernels.cuh"
extern "C" {
#include "layers/exchange.h"
}

typedef struct {
    moe_comm *host; // the host communicator (owned)
    ncclComm_t nccl;
    moe_backend *be; // the cuda backend whose stream and memory the operations use
    // the overlap's (alltoallv_rows_start): transfers run on their own stream, ordered after
    // the backend's work so far by `ready`; a wait orders the backend's stream after `done`
    cudaStream_t side; // created at the first start
    cudaEvent_t ready, done[MOE_EXCHANGE_SLOTS];
    int in_flight[MOE_EXCHANGE_SLOTS];
} nccl_state;

static nccl_state *nccl_of(moe_comm *c) { return (nccl_state *)c->state; }

static void nccl_fail(moe_comm *c, const char *what, ncclResult_t r) {
    fprintf(stderr, "moe: error: rank %d: %s: %s (NCCL %d.%d)\n", c->rank, what,
            ncclGetErrorString(r), NCCL_MAJOR, NCCL_MINOR);
    nccl_of(c)->host->abort(nccl_of(c)->host, 1);
}
#define NCCL_CHECK(c, call)                                                         \
    do {                                                                            \
        const ncclResult_t r_ = (call);                                             \
        if (r_ != ncclSuccess) nccl_fail((c), #call, r_); /* blocking comms only */ \
    } while (0)

// The host communicator's operations, their seconds counted as this one's.
#define HOST_CALL(c, call)               \
    do {                                 \
        moe_comm *h_ = nccl_of(c)->host; \
        const double w0_ = h_->wait_s;   \
        h_->call;                        \
        (c)->wait_s += h_->wait_s - w0_; \
    } while (0)

static void n_alltoall_int(moe_comm *c, int *recv, const int *send, int n) {
    HOST_CALL(c, alltoall_int(h_, recv, send, n));
}
static void n_alltoallv_host(moe_comm *c, void *recv, const int *recv_n, const void *send,
                             const int *send_n, size_t item_bytes) {
    HOST_CALL(c, alltoallv_host(h_, recv, recv_n, send, send_n, item_bytes));
}
static void n_allreduce_double(moe_comm *c, double *x, size_t n) {
    HOST_CALL(c, allreduce_sum_double(h_, x, n));
}
static void n_allreduce_long(moe_comm *c, long *x, size_t n) {
    HOST_CALL(c, allreduce_sum_long(h_, x, n));
}
static void n_allgather(moe_comm *c, void *recv, const void *send, size_t bytes) {
    HOST_CALL(c, allgather(h_, recv, send, bytes));
}
static void n_broadcast(moe_comm *c, void *buf, size_t bytes, int root) {
    HOST_CALL(c, broadcast(h_, buf, bytes, root));
}
static void n_barrier(moe_comm *c) { HOST_CALL(c, barrier(h_)); }
static void n_abort(moe_comm *c, int code) {
    ncclCommAbort(nccl_of(c)->nccl);
    nccl_of(c)->host->abort(nccl_of(c)->host, code);
    exit(code); // not reached: the host's abort ends the process
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// One group of ncclSend/ncclRecv per peer on `stream`: peer p's rows start at send_at[p] /
// recv_at[p] rows, or (NULL) right after the previous peer's.
static void post_rows(moe_comm *c, cudaStream_t stream, void *recv, const int *recv_rows,
                      const int *recv_at, const void *send, const int *send_rows,
                      const int *send_at, size_t row_bytes) {
    size_t at_send = 0, at_recv = 0;
    NCCL_CHECK(c, ncclGroupStart());
    for (int p = 0; p < c->size; p++) {
        if (send_at) at_send = (size_t)send_at[p] * row_bytes;
        if (recv_at) at_recv = (size_t)recv_at[p] * row_bytes;
        const size_t ns = (size_t)send_rows[p] * row_bytes, nr = (size_t)recv_rows[p] * row_bytes;
        if (ns)
            NCCL_CHECK(c, ncclSend((const char *)send + at_send, ns, ncclUint8, p, nccl_of(c)->nccl,
                                   stream));
        if (nr)
            NCCL_CHECK(
                c, ncclRecv((char *)recv + at_recv, nr, ncclUint8, p, nccl_of(c)->nccl, stream));
        at_send += ns, at_recv += nr;
    }
    NCCL_CHECK(c, ncclGroupEnd());
}

static void check_rows_backend(moe_comm *c, moe_backend *be) {
    if (be != nccl_of(c)->be)
        moe_fatal("nccl exchange: rows of backend %s on a communicator of backend %s", be->name,
                  nccl_of(c)->be->name);
}

static void n_alltoallv_rows(moe_comm *c, moe_backend *be, void *recv, const int *recv_rows,
                             const void *send, const int *send_rows, size_t row_bytes) {
    check_rows_backend(c, be);
    const double t0 = now_s();
    cudaStream_t stream = cuda_stream(be);
    post_rows(c, stream, recv, recv_rows, NULL, send, send_rows, NULL, row_bytes);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    c->wait_s += now_s() - t0;
}

// The overlap's form: the transfer on the side stream, after the backend's work so far; the
// host does not wait (wait_s counts only the posting), the backend's stream waits at the
// wait, so the experts' kernels queued between them run beside the transfer.
static void n_alltoallv_rows_start(moe_comm *c, moe_backend *be, int slot, void *recv,
                                   const int *recv_rows, const int *recv_at, const void *send,
                                   const int *send_rows, const int *send_at, size_t row_bytes) {
    nccl_state *s = nccl_of(c);
    check_rows_backend(c, be);
    if (slot < 0 || slot >= MOE_EXCHANGE_SLOTS || s->in_flight[slot])
        moe_fatal("nccl exchange: rows slot %d is out of range or already in flight", slot);
    const double t0 = now_s();
    if (!s->side) {
        CUDA_CHECK(cudaStreamCreateWithFlags(&s->side, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming));
    }
    if (!s->done[slot])
        CUDA_CHECK(cudaEventCreateWithFlags(&s->done[slot], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(s->ready, cuda_stream(be)));
    CUDA_CHECK(cudaStreamWaitEvent(s->side, s->ready, 0));
    post_rows(c, s->side, recv, recv_rows, recv_at, send, send_rows, send_at, row_bytes);
    CUDA_CHECK(cudaEventRecord(s->done[slot], s->side));
    s->in_flight[slot] = 1;
    c->wait_s += now_s() - t0;
}

static void n_alltoallv_rows_wait(moe_comm *c, moe_backend *be, int slot) {
    nccl_state *s = nccl_of(c);
    check_rows_backend(c, be);
    if (slot < 0 || slot >= MOE_EXCHANGE_SLOTS || !s->in_flight[slot])
        moe_fatal("nccl exchange: rows slot %d is out of range or not in flight", slot);
    CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(be), s->done[slot], 0));
    s->in_flight[slot] = 0;
}

static void n_allreduce_real(moe_comm *c, moe_backend *be, real *x, size_t n) {
    nccl_state *s = nccl_of(c);
    if (be != s->be)
        moe_fatal("nccl exchange: a reduction on backend %s through a communicator of backend %s",
                  be->name, s->be->name);
    if (!n) return;
    const double t0 = now_s();
    static_assert(sizeof(real) == sizeof(float), "the NCCL exchange reduces fp32");
    NCCL_CHECK(c, ncclAllReduce(x, x, n, ncclFloat32, ncclSum, s->nccl, cuda_stream(be)));
    CUDA_CHECK(cudaStreamSynchronize(cuda_stream(be)));
    c->wait_s += now_s() - t0;
}

// The sharded optimizer's pair on unequal pieces: ncclReduceScatter and ncclAllGather take
// equal counts, so each is one group of per-piece collectives: ncclReduce of piece r to rank r
// (in place), ncclBroadcast of piece r from rank r (in place). The same sums as a ring
// reduce-scatter's, in NCCL's fixed order for the communicator.
static void check_backend(moe_comm *c, moe_backend *be, const char *what) {
    if (be != nccl_of(c)->be)
        moe_fatal("nccl exchange: %s on backend %s through a communicator of backend %s", what,
                  be->name, nccl_of(c)->be->name);
}

// One group of per-piece collectives over x: piece r reduced to rank r (reduce) or broadcast
// from it (all-gather), in place.
static void per_piece(moe_comm *c, moe_backend *be, real *x, const size_t *counts, int reduce) {
    check_backend(c, be, reduce ? "a reduce-scatter" : "an all-gather");
    const double t0 = now_s();
    cudaStream_t stream = cuda_stream(be);
    size_t at = 0;
    NCCL_CHECK(c, ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        if (counts[r] && reduce)
            NCCL_CHECK(c, ncclReduce(x + at, x + at, counts[r], ncclFloat32, ncclSum, r,
                                     nccl_of(c)->nccl, stream));
        else if (counts[r])
            NCCL_CHECK(c, ncclBroadcast(x + at, x + at, counts[r], ncclFloat32, r, nccl_of(c)->nccl,
                                        stream));
        at += counts[r];
    }
    NCCL_CHECK(c, ncclGroupEnd());
    CUDA_CHECK(cudaStreamSynchronize(stream));
    c->wait_s += now_s() - t0;
}

static void n_reduce_scatter_real(moe_comm *c, moe_backend *be, real *x, const size_t *counts) {
    per_piece(c, be, x, counts, 1);
}

static void n_allgather_real(moe_comm *c, moe_backend *be, real *x, const size_t *counts) {
    per_piece(c, be, x, counts, 0);
}

static void n_destroy(moe_comm *c) {
    nccl_state *s = nccl_of(c);
    if (s->side) {
        cudaStreamSynchronize(s->side);
        for (int i = 0; i < MOE_EXCHANGE_SLOTS; i++)
            if (s->done[i]) cudaEventDestroy(s->done[i]);
        cudaEventDestroy(s->ready);
        cudaStreamDestroy(s->side);
    }
    ncclCommDestroy(s->nccl);
    s->host->destroy(s->host);
    free(s);
    free(c);
}

static moe_status wrap(moe_backend *be, moe_comm *host, ncclComm_t nccl, moe_comm **out);

static moe_status n_split(moe_comm *c, int color, int key, moe_comm **out) {
    nccl_state *s = nccl_of(c);
    moe_comm *host;
    moe_status st = s->host->split(s->host, color, key, &host);
    if (st) return st;
    ncclComm_t part;
    const ncclResult_t r = ncclCommSplit(s->nccl, color, key, &part, NULL);
    if (r != ncclSuccess) {
        host->destroy(host);
        return moe_error(MOE_EINVAL, "nccl: ncclCommSplit failed on rank %d: %s", c->rank,
                         ncclGetErrorString(r));
    }
    if ((st = wrap(s->be, host, part, out))) host->destroy(host);
    return st;
}

static moe_status wrap(moe_backend *be, moe_comm *host, ncclComm_t nccl, moe_comm **out) {
    moe_comm *c = (moe_comm *)calloc(1, sizeof *c);
    nccl_state *s = (nccl_state *)calloc(1, sizeof *s);
    if (!c || !s) { // the caller keeps host
        free(c), free(s);
        ncclCommDestroy(nccl);
        return moe_error(MOE_ENOMEM, "nccl: out of memory");
    }
    s->host = host, s->nccl = nccl, s->be = be;
    c->name = "nccl";
    c->rank = host->rank, c->size = host->size;
    c->state = s;
    c->alltoall_int = n_alltoall_int;
    c->alltoallv_rows = n_alltoallv_rows;
    c->alltoallv_rows_start = n_alltoallv_rows_start;
    c->alltoallv_rows_wait = n_alltoallv_rows_wait;
    c->alltoallv_host = n_alltoallv_host;
    c->allreduce_sum_real = n_allreduce_real;
    c->reduce_scatter_sum_real = n_reduce_scatter_real;
    c->allgather_real = n_allgather_real;
    c->allreduce_sum_double = n_allreduce_double;
    c->allreduce_sum_long = n_allreduce_long;
    c->allgather = n_allgather;
    c->broadcast = n_broadcast;
    c->barrier = n_barrier;
    c->abort = n_abort;
    c->split = n_split;
    c->destroy = n_destroy;
    *out = c;
    return MOE_OK;
}

// The backend's device_comm entry (layers/backend.h): rank 0's unique id over host, then
// ncclCommInitRank on the backend's device. Collective over host. On failure host is left to
// the caller.
moe_status cuda_device_comm(moe_backend *be, moe_comm *host, moe_comm **out) {
    *out = NULL;
    ncclUniqueId id;
    long ok = 1;
    if (host->rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) ok = 0;
    host->broadcast(host, &ok, sizeof ok, 0);
    if (!ok) return moe_error(MOE_EINVAL, "nccl: rank 0 could not make a unique id");
    host->broadcast(host, &id, sizeof id, 0);
    CUDA_CHECK(cudaSetDevice(cuda_state_of(be)->device));
    ncclComm_t nccl;
    const ncclResult_t r = ncclCommInitRank(&nccl, host->size, id, host->rank);
    long fine = r == ncclSuccess, all = fine;
    host->allreduce_sum_long(host, &all, 1);
    if (all != host->size) {
        if (fine) ncclCommDestroy(nccl);
        return moe_error(MOE_EINVAL,
                         "nccl: ncclCommInitRank failed on %ld of %d ranks (this one: %s; NCCL "
                         "needs one GPU per rank: this rank has device %d)",
                         host->size - all, host->size, fine ? "ok" : ncclGetErrorString(r),
                         cuda_state_of(be)->device);
    }
    return wrap(be, host, nccl, out);
}
