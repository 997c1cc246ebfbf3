// The exchange: collective operations between the ranks of a run, for expert parallelism
// (DESIGN.md §4). One interface, several implementations: "single" (one rank: copies, no
// MPI) and "mpi" (Open MPI; built with MOE_MPI). A later NCCL implementation fills the same
// table with device pointers, so the interface says which memory each buffer is in:
//   "rows" and the reduced gradients live in BACKEND memory (the backend passed along);
//   counts, flags and small vectors are HOST memory.
// The implementation stages backend memory through the host when the backend's memory is not
// host memory (be->host_memory == 0: cpu-strict, later cuda without CUDA-aware MPI).
//
// A communicator is a group of ranks: the world, its expert-parallel (EP) groups and its
// expert-data-parallel groups (the ranks holding the same experts). Every operation is
// collective over the communicator: each of its ranks makes the same call in the same order.
#ifndef MOE_EXCHANGE_H
#define MOE_EXCHANGE_H

#include <stddef.h>
#include <stdint.h>

#include "layers/backend.h"

typedef struct moe_comm moe_comm;

// Transfers one communicator may have in flight (alltoallv_rows_start's slots).
enum { MOE_EXCHANGE_SLOTS = 64 };

struct moe_comm {
    const char *name; // "single" or "mpi"
    int rank, size;   // this process's rank in the group, and the group's size
    void *state;      // the implementation's (MPI: the MPI_Comm)
    double wait_s;    // seconds spent inside the collectives of this communicator so far

    // recv[i*n .. i*n+n) = what rank i sent to this rank as its send[rank*n ..]. HOST ints,
    // send and recv [size * n].
    void (*alltoall_int)(moe_comm *c, int *recv, const int *send, int n);
    // Rows to every peer: send holds send_rows[0] rows for rank 0, then send_rows[1] for rank
    // 1, ...; recv receives recv_rows[i] rows from rank i, in rank order. Counts are HOST
    // [size] (zero allowed); rows are BACKEND memory of row_bytes each.
    void (*alltoallv_rows)(moe_comm *c, moe_backend *be, void *recv, const int *recv_rows,
                           const void *send, const int *send_rows, size_t row_bytes);
    // The nonblocking form, for the overlap of exchange and experts (parallel.overlap_chunks):
    // rows go from send + send_at[i] rows (send_rows[i] of them) to rank i, and arrive from
    // rank i at recv + recv_at[i] rows (recv_rows[i]); displacements and counts HOST [size].
    // It returns once the transfer is under way; the buffers, counts and displacements stay
    // untouched until alltoallv_rows_wait(c, be, slot) returns, after which recv holds the
    // rows for whatever the backend runs next. A slot in [0, MOE_EXCHANGE_SLOTS) names one
    // transfer in flight; several may be in flight at once, waited in any order.
    void (*alltoallv_rows_start)(moe_comm *c, moe_backend *be, int slot, void *recv,
                                 const int *recv_rows, const int *recv_at, const void *send,
                                 const int *send_rows, const int *send_at, size_t row_bytes);
    void (*alltoallv_rows_wait)(moe_comm *c, moe_backend *be, int slot);
    // The same for HOST memory: items of item_bytes, send_n[i] of them to rank i, recv_n[i]
    // from rank i (what a receiver needs to read its rows: the dedup exchange's slot lists).
    void (*alltoallv_host)(moe_comm *c, void *recv, const int *recv_n, const void *send,
                           const int *send_n, size_t item_bytes);
    // x = the sum of every rank's x, in place. BACKEND memory, n reals.
    void (*allreduce_sum_real)(moe_comm *c, moe_backend *be, real *x, size_t n);
    // The sharded optimizer's pair (ZeRO-1, train/zero.h). x [n] is BACKEND memory cut into
    // size consecutive pieces, piece i of counts[i] reals (HOST [size], sum n), starting at
    // the sum of the counts before it.
    // reduce_scatter_sum_real: this rank's piece of x becomes the sum of every rank's x over
    // that piece; the rest of x is left undefined.
    void (*reduce_scatter_sum_real)(moe_comm *c, moe_backend *be, real *x, const size_t *counts);
    // allgather_real: every rank's piece of x (its own) is copied into that piece on every
    // rank, in place.
    void (*allgather_real)(moe_comm *c, moe_backend *be, real *x, const size_t *counts);
    // The same for HOST doubles and longs.
    void (*allreduce_sum_double)(moe_comm *c, double *x, size_t n);
    void (*allreduce_sum_long)(moe_comm *c, long *x, size_t n);
    // recv[i*bytes ..] = rank i's send (bytes each). HOST.
    void (*allgather)(moe_comm *c, void *recv, const void *send, size_t bytes);
    // buf (bytes, HOST) becomes root's buf on every rank.
    void (*broadcast)(moe_comm *c, void *buf, size_t bytes, int root);
    void (*barrier)(moe_comm *c);
    // Ends every rank of the world with exit status `code` (never returns).
    void (*abort)(moe_comm *c, int code);
    // Splits c into groups of equal color, ordered by key (MPI_Comm_split): the new
    // communicator in *out. Collective over c.
    moe_status (*split)(moe_comm *c, int color, int key, moe_comm **out);
    void (*destroy)(moe_comm *c); // a communicator from split or moe_comm_world
};

// The world: "mpi" when this process was started by mpirun (and the build has MPI), else
// "single". MOE_EINVAL with the reason when mpirun started R > 1 ranks of a build without
// MPI. An MPI world is created once per process and shared: each call returns the same
// communicator, each call is matched by one destroy, and the last destroy finalises MPI (which
// cannot start again in that process).
moe_status moe_comm_world(moe_comm **out);

// The one-rank communicator (tests; what moe_comm_world gives outside mpirun).
moe_status moe_comm_single(moe_comm **out);

// The ranks an mpirun launch says this process has (OMPI_COMM_WORLD_SIZE, PMI_SIZE), or 1,
// and this process's rank in it (OMPI_COMM_WORLD_RANK, PMI_RANK), or 0: what a program may
// decide before the world exists (who deletes a run directory). moe_launch_local_size: the
// ranks on this node (OMPI_COMM_WORLD_LOCAL_SIZE), or 1.
int moe_launch_size(void);
int moe_launch_rank(void);
int moe_launch_local_size(void);

#endif
