// The MPI exchange (layers/exchange.h), for Open MPI launched by mpirun. Host buffers go to
// MPI directly; backend memory too when it is host memory (be->host_memory), else it is
// staged through host buffers with the typed copies. Each call adds its time to c->wait_s:
// a rank that waits long in the exchanges is waiting for a slower (hotter) peer.
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "layers/exchange.h"

// One nonblocking rows exchange in flight (alltoallv_rows_start): its request, its row type,
// and for backend memory that is not host memory the host staging and where the rows land.
typedef struct {
    MPI_Request req;
    MPI_Datatype row;
    int active;
    void *hs, *hr; // host staging of send and recv (kept for the next transfer in this slot)
    size_t hs_bytes, hr_bytes;
    void *recv; // backend memory the staged rows go to at the wait
    const int *recv_rows, *recv_at;
    size_t row_bytes;
} mpi_slot;

typedef struct {
    MPI_Comm comm;
    int owns_mpi;   // the world: finalises MPI when destroyed
    void *stage[2]; // host staging for backend memory that is not host memory
    size_t stage_bytes[2];
    mpi_slot slot[MOE_EXCHANGE_SLOTS];
} mpi_state;

static MPI_Comm comm_of(moe_comm *c) { return ((mpi_state *)c->state)->comm; }

// A host buffer of at least `bytes` for staging slot i (kept for the next call).
static void *stage(moe_comm *c, int i, size_t bytes) {
    mpi_state *s = c->state;
    if (s->stage_bytes[i] < bytes) {
        free(s->stage[i]);
        s->stage[i] = malloc(bytes ? bytes : 1);
        s->stage_bytes[i] = s->stage[i] ? bytes : 0;
        if (!s->stage[i]) {
            fprintf(stderr, "moe: error: rank %d: cannot allocate %zu bytes to stage an exchange\n",
                    c->rank, bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    return s->stage[i];
}

static void mpi_alltoall_int(moe_comm *c, int *recv, const int *send, int n) {
    const double t0 = MPI_Wtime();
    MPI_Alltoall(send, n, MPI_INT, recv, n, MPI_INT, comm_of(c));
    c->wait_s += MPI_Wtime() - t0;
}

// MPI_Alltoallv of host items (item_bytes each): send_n[i] to rank i, recv_n[i] from it.
static void alltoallv_items(moe_comm *c, void *recv, const int *recv_n, const void *send,
                            const int *send_n, size_t item_bytes) {
    const int R = c->size;
    int *sdisp = malloc(2 * (size_t)R * sizeof(int)), *rdisp = sdisp + R;
    for (int i = 0, ns = 0, nr = 0; i < R; i++) {
        sdisp[i] = ns, rdisp[i] = nr;
        ns += send_n[i], nr += recv_n[i];
    }
    MPI_Datatype item;
    MPI_Type_contiguous((int)item_bytes, MPI_BYTE, &item);
    MPI_Type_commit(&item);
    MPI_Alltoallv(send, send_n, sdisp, item, recv, recv_n, rdisp, item, comm_of(c));
    MPI_Type_free(&item);
    free(sdisp);
}

static void mpi_alltoallv_host(moe_comm *c, void *recv, const int *recv_n, const void *send,
                               const int *send_n, size_t item_bytes) {
    const double t0 = MPI_Wtime();
    alltoallv_items(c, recv, recv_n, send, send_n, item_bytes);
    c->wait_s += MPI_Wtime() - t0;
}

static void mpi_alltoallv_rows(moe_comm *c, moe_backend *be, void *recv, const int *recv_rows,
                               const void *send, const int *send_rows, size_t row_bytes) {
    const double t0 = MPI_Wtime();
    size_t n_send = 0, n_recv = 0;
    for (int i = 0; i < c->size; i++)
        n_send += (size_t)send_rows[i], n_recv += (size_t)recv_rows[i];
    const void *sbuf = send;
    void *rbuf = recv;
    if (!be->host_memory) {
        void *hs = stage(c, 0, n_send * row_bytes);
        be->copy_to_host(be, hs, send, n_send * row_bytes);
        sbuf = hs;
        rbuf = stage(c, 1, n_recv * row_bytes);
    }
    alltoallv_items(c, rbuf, recv_rows, sbuf, send_rows, row_bytes);
    if (!be->host_memory) be->copy_to_device(be, recv, rbuf, n_recv * row_bytes);
    c->wait_s += MPI_Wtime() - t0;
}

// ---- the nonblocking rows exchange (the overlap) ------------------------------------------

// The rows [at[i], at[i] + rows[i]) of every peer i: the extent of the buffer they span.
static size_t span_rows(const moe_comm *c, const int *rows, const int *at) {
    size_t n = 0;
    for (int i = 0; i < c->size; i++)
        if (rows[i] > 0 && (size_t)at[i] + (size_t)rows[i] > n) n = (size_t)at[i] + rows[i];
    return n;
}

// A host buffer of at least `bytes` in *buf (grown, kept for the next transfer).
static void *grow(moe_comm *c, void **buf, size_t *have, size_t bytes) {
    if (*have >= bytes) return *buf;
    free(*buf);
    *buf = malloc(bytes ? bytes : 1);
    *have = *buf ? bytes : 0;
    if (!*buf) {
        fprintf(stderr, "moe: error: rank %d: cannot allocate %zu bytes to stage an exchange\n",
                c->rank, bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return *buf;
}

// Copies each peer's block of rows between backend memory and its staging (same offsets).
static void stage_blocks(moe_comm *c, moe_backend *be, void *host, void *dev, const int *rows,
                         const int *at, size_t row_bytes, int to_host) {
    for (int i = 0; i < c->size; i++) {
        if (rows[i] <= 0) continue;
        const size_t off = (size_t)at[i] * row_bytes, n = (size_t)rows[i] * row_bytes;
        if (to_host)
            be->copy_to_host(be, (char *)host + off, (char *)dev + off, n);
        else
            be->copy_to_device(be, (char *)dev + off, (char *)host + off, n);
    }
}

static void mpi_alltoallv_rows_start(moe_comm *c, moe_backend *be, int slot, void *recv,
                                     const int *recv_rows, const int *recv_at, const void *send,
                                     const int *send_rows, const int *send_at, size_t row_bytes) {
    const double t0 = MPI_Wtime();
    if (slot < 0 || slot >= MOE_EXCHANGE_SLOTS || ((mpi_state *)c->state)->slot[slot].active)
        moe_fatal("exchange: rows slot %d is out of range or already in flight", slot);
    mpi_slot *q = &((mpi_state *)c->state)->slot[slot];
    const void *sbuf = send;
    void *rbuf = recv;
    if (!be->host_memory) {
        void *hs = grow(c, &q->hs, &q->hs_bytes, span_rows(c, send_rows, send_at) * row_bytes);
        stage_blocks(c, be, hs, (void *)send, send_rows, send_at, row_bytes, 1);
        sbuf = hs;
        rbuf = grow(c, &q->hr, &q->hr_bytes, span_rows(c, recv_rows, recv_at) * row_bytes);
    }
    q->recv = recv, q->recv_rows = recv_rows, q->recv_at = recv_at, q->row_bytes = row_bytes;
    MPI_Type_contiguous((int)row_bytes, MPI_BYTE, &q->row);
    MPI_Type_commit(&q->row);
    MPI_Ialltoallv(sbuf, send_rows, send_at, q->row, rbuf, recv_rows, recv_at, q->row, comm_of(c),
                   &q->req);
    q->active = 1;
    c->wait_s += MPI_Wtime() - t0;
}

static void mpi_alltoallv_rows_wait(moe_comm *c, moe_backend *be, int slot) {
    const double t0 = MPI_Wtime();
    if (slot < 0 || slot >= MOE_EXCHANGE_SLOTS || !((mpi_state *)c->state)->slot[slot].active)
        moe_fatal("exchange: rows slot %d is out of range or not in flight", slot);
    mpi_slot *q = &((mpi_state *)c->state)->slot[slot];
    MPI_Wait(&q->req, MPI_STATUS_IGNORE);
    MPI_Type_free(&q->row);
    if (!be->host_memory)
        stage_blocks(c, be, q->hr, q->recv, q->recv_rows, q->recv_at, q->row_bytes, 0);
    q->active = 0;
    c->wait_s += MPI_Wtime() - t0;
}

// MPI counts are ints: reduce in chunks of at most 2^30 elements.
static void allreduce_chunks(moe_comm *c, void *x, size_t n, size_t elem, MPI_Datatype t) {
    const double t0 = MPI_Wtime();
    const size_t chunk = (size_t)1 << 30;
    for (size_t at = 0; at < n; at += chunk) {
        const size_t m = n - at < chunk ? n - at : chunk;
        MPI_Allreduce(MPI_IN_PLACE, (char *)x + at * elem, (int)m, t, MPI_SUM, comm_of(c));
    }
    c->wait_s += MPI_Wtime() - t0;
}

// MPI's type of a real (float, or double in the f64 build).
static MPI_Datatype real_type(void) {
    return sizeof(real) == sizeof(double) ? MPI_DOUBLE : MPI_FLOAT;
}

static void mpi_allreduce_real(moe_comm *c, moe_backend *be, real *x, size_t n) {
    const MPI_Datatype t = real_type();
    if (be->host_memory) {
        allreduce_chunks(c, x, n, sizeof(real), t);
        return;
    }
    real *h = stage(c, 0, n * sizeof(real));
    be->copy_to_host(be, h, x, n * sizeof(real));
    allreduce_chunks(c, h, n, sizeof(real), t);
    be->copy_to_device(be, x, h, n * sizeof(real));
}

static void mpi_allreduce_double(moe_comm *c, double *x, size_t n) {
    allreduce_chunks(c, x, n, sizeof(double), MPI_DOUBLE);
}
static void mpi_allreduce_long(moe_comm *c, long *x, size_t n) {
    allreduce_chunks(c, x, n, sizeof(long), MPI_LONG);
}

// ---- the sharded optimizer's pair (ZeRO-1) -------------------------------------------
// x [n] in `size` consecutive pieces: piece i is x[displs[i], + counts[i]). MPI counts and
// displacements are ints: the collectives take them up to INT_MAX reals in all; past that,
// one root at a time in chunks of 2^30 (MPI_Reduce, MPI_Bcast), the same sums.

// The pieces of x [n] as both collectives need them: MPI's int counts and displacements (ic,
// ic + size; 0 unless all fit), size_t displacements, whether all fit MPI's ints, the total
// and this rank's piece [off, off + mine).
typedef struct {
    int *ic;
    size_t *displs, n, off, mine;
    int fits;
} piece_plan;

static piece_plan plan_pieces(const moe_comm *c, const size_t *counts) {
    piece_plan p = {.ic = malloc(2 * (size_t)c->size * sizeof(int)),
                    .displs = malloc((size_t)c->size * sizeof(size_t)),
                    .fits = 1};
    if (!p.ic || !p.displs) moe_fatal("exchange: out of memory");
    for (int i = 0; i < c->size; i++) {
        p.displs[i] = p.n;
        p.fits = p.fits && p.n <= INT_MAX && counts[i] <= INT_MAX;
        p.ic[i] = p.fits ? (int)counts[i] : 0, p.ic[c->size + i] = p.fits ? (int)p.n : 0;
        p.n += counts[i];
    }
    p.fits = p.fits && p.n <= INT_MAX;
    p.off = p.displs[c->rank], p.mine = counts[c->rank];
    return p;
}

static void free_pieces(piece_plan *p) { free(p->ic), free(p->displs); }

// The reduce-scatter over host memory h [n]: this rank's piece summed into h + displs[rank].
static void reduce_scatter_host(moe_comm *c, real *h, const size_t *counts, const int *icounts,
                                const size_t *displs, int fits) {
    const size_t chunk = (size_t)1 << 30, mine = counts[c->rank];
    if (fits) { // MPI puts the piece at the front of its receive buffer: staged, then placed
        real *out = stage(c, 1, mine * sizeof(real));
        MPI_Reduce_scatter(h, out, icounts, real_type(), MPI_SUM, comm_of(c));
        memcpy(h + displs[c->rank], out, mine * sizeof(real));
        return;
    }
    for (int r = 0; r < c->size; r++)
        for (size_t at = 0; at < counts[r]; at += chunk) {
            real *p = h + displs[r] + at;
            const int m = (int)(counts[r] - at < chunk ? counts[r] - at : chunk);
            MPI_Reduce(r == c->rank ? MPI_IN_PLACE : p, p, m, real_type(), MPI_SUM, r, comm_of(c));
        }
}

static void mpi_reduce_scatter_real(moe_comm *c, moe_backend *be, real *x, const size_t *counts) {
    const double t0 = MPI_Wtime();
    piece_plan p = plan_pieces(c, counts);
    real *h = x;
    if (!be->host_memory) {
        h = stage(c, 0, p.n * sizeof(real));
        be->copy_to_host(be, h, x, p.n * sizeof(real));
    }
    reduce_scatter_host(c, h, counts, p.ic, p.displs, p.fits);
    if (!be->host_memory) be->copy_to_device(be, x + p.off, h + p.off, p.mine * sizeof(real));
    free_pieces(&p);
    c->wait_s += MPI_Wtime() - t0;
}

static void mpi_allgather_real(moe_comm *c, moe_backend *be, real *x, const size_t *counts) {
    const double t0 = MPI_Wtime();
    const size_t chunk = (size_t)1 << 30;
    piece_plan p = plan_pieces(c, counts);
    real *h = x;
    if (!be->host_memory) { // only this rank's piece goes out; every piece comes back
        h = stage(c, 0, p.n * sizeof(real));
        be->copy_to_host(be, h + p.off, x + p.off, p.mine * sizeof(real));
    }
    if (p.fits)
        MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, h, p.ic, p.ic + c->size, real_type(),
                       comm_of(c));
    for (int r = 0; !p.fits && r < c->size; r++)
        for (size_t at = 0; at < counts[r]; at += chunk) {
            const int m = (int)(counts[r] - at < chunk ? counts[r] - at : chunk);
            MPI_Bcast(h + p.displs[r] + at, m, real_type(), r, comm_of(c));
        }
    if (!be->host_memory) be->copy_to_device(be, x, h, p.n * sizeof(real));
    free_pieces(&p);
    c->wait_s += MPI_Wtime() - t0;
}

static void mpi_allgather(moe_comm *c, void *recv, const void *send, size_t bytes) {
    const double t0 = MPI_Wtime();
    MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, comm_of(c));
    c->wait_s += MPI_Wtime() - t0;
}

static void mpi_broadcast(moe_comm *c, void *buf, size_t bytes, int root) {
    const double t0 = MPI_Wtime();
    MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, comm_of(c));
    c->wait_s += MPI_Wtime() - t0;
}

static void mpi_barrier(moe_comm *c) {
    const double t0 = MPI_Wtime();
    MPI_Barrier(comm_of(c));
    c->wait_s += MPI_Wtime() - t0;
}

static void mpi_abort(moe_comm *c, int code) {
    (void)c;
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    exit(code); // not reached
}

static void abort_world(int code) {
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
}

// The world of this process (moe_comm_world), and how many of its holders have not destroyed it
// yet: the last destroy finalises MPI.
static moe_comm *the_world;
static int world_holders;

static void mpi_destroy(moe_comm *c) {
    mpi_state *s = c->state;
    if (c == the_world && --world_holders > 0) return;
    if (c == the_world) the_world = NULL;
    free(s->stage[0]), free(s->stage[1]);
    for (int i = 0; i < MOE_EXCHANGE_SLOTS; i++) free(s->slot[i].hs), free(s->slot[i].hr);
    if (s->owns_mpi) {
        moe_set_fatal_exit(NULL, -1);
        MPI_Comm_free(&s->comm);
        MPI_Finalize();
    } else {
        MPI_Comm_free(&s->comm);
    }
    free(s);
    free(c);
}

static moe_status mpi_split(moe_comm *c, int color, int key, moe_comm **out);

static moe_status wrap(MPI_Comm comm, int owns_mpi, moe_comm **out) {
    moe_comm *c = calloc(1, sizeof *c);
    mpi_state *s = calloc(1, sizeof *s);
    *out = c;
    if (!c || !s) {
        free(c), free(s);
        *out = NULL;
        return moe_error(MOE_ENOMEM, "exchange: out of memory");
    }
    s->comm = comm;
    s->owns_mpi = owns_mpi;
    *c = (moe_comm){
        .name = "mpi",
        .state = s,
        .alltoall_int = mpi_alltoall_int,
        .alltoallv_rows = mpi_alltoallv_rows,
        .alltoallv_rows_start = mpi_alltoallv_rows_start,
        .alltoallv_rows_wait = mpi_alltoallv_rows_wait,
        .alltoallv_host = mpi_alltoallv_host,
        .allreduce_sum_real = mpi_allreduce_real,
        .reduce_scatter_sum_real = mpi_reduce_scatter_real,
        .allgather_real = mpi_allgather_real,
        .allreduce_sum_double = mpi_allreduce_double,
        .allreduce_sum_long = mpi_allreduce_long,
        .allgather = mpi_allgather,
        .broadcast = mpi_broadcast,
        .barrier = mpi_barrier,
        .abort = mpi_abort,
        .split = mpi_split,
        .destroy = mpi_destroy,
    };
    MPI_Comm_rank(comm, &c->rank);
    MPI_Comm_size(comm, &c->size);
    return MOE_OK;
}

static moe_status mpi_split(moe_comm *c, int color, int key, moe_comm **out) {
    MPI_Comm sub;
    if (MPI_Comm_split(comm_of(c), color, key, &sub) != MPI_SUCCESS)
        return moe_error(MOE_EIO, "exchange: MPI_Comm_split failed on rank %d", c->rank);
    return wrap(sub, 0, out);
}

moe_status moe_comm_world(moe_comm **out) {
    *out = NULL;
    if (moe_launch_size() <= 1) return moe_comm_single(out); // not under mpirun (or -np 1)
    if (the_world) { // one world per process, shared by its holders
        world_holders++;
        *out = the_world;
        return MOE_OK;
    }
    int provided;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return moe_error(MOE_EIO, "exchange: MPI_Init failed");
    // errors abort the job (MPI's default): a failed rank must not leave the others waiting
    MPI_Comm world;
    MPI_Comm_dup(MPI_COMM_WORLD, &world);
    moe_status st = wrap(world, 1, out);
    if (!st) moe_set_fatal_exit(abort_world, (*out)->rank); // one rank's fatal error ends all
    if (!st) the_world = *out, world_holders = 1;
    return st;
}
