// The one-rank exchange: every collective is a copy or nothing (layers/exchange.h).
#include <stdlib.h>
#include <string.h>

#include "layers/exchange.h"

static void single_alltoall_int(moe_comm *c, int *recv, const int *send, int n) {
    (void)c;
    memmove(recv, send, (size_t)n * sizeof(int));
}

static void single_alltoallv_rows(moe_comm *c, moe_backend *be, void *recv, const int *recv_rows,
                                  const void *send, const int *send_rows, size_t row_bytes) {
    (void)c, (void)recv_rows;
    if (send_rows[0] > 0 && recv != send)
        be->copy_on_device(be, recv, send, (size_t)send_rows[0] * row_bytes);
}

// One rank: the rows are copied at once, so there is nothing to wait for.
static void single_alltoallv_rows_start(moe_comm *c, moe_backend *be, int slot, void *recv,
                                        const int *recv_rows, const int *recv_at, const void *send,
                                        const int *send_rows, const int *send_at,
                                        size_t row_bytes) {
    (void)c, (void)slot, (void)recv_rows;
    char *to = (char *)recv + (size_t)recv_at[0] * row_bytes;
    const char *from = (const char *)send + (size_t)send_at[0] * row_bytes;
    if (send_rows[0] > 0 && to != from)
        be->copy_on_device(be, to, from, (size_t)send_rows[0] * row_bytes);
}
static void single_alltoallv_rows_wait(moe_comm *c, moe_backend *be, int slot) {
    (void)c, (void)be, (void)slot;
}

static void single_alltoallv_host(moe_comm *c, void *recv, const int *recv_n, const void *send,
                                  const int *send_n, size_t item_bytes) {
    (void)c, (void)recv_n;
    if (send_n[0] > 0 && recv != send) memmove(recv, send, (size_t)send_n[0] * item_bytes);
}

static void single_allreduce_real(moe_comm *c, moe_backend *be, real *x, size_t n) {
    (void)c, (void)be, (void)x, (void)n;
}
// One rank: its piece is all of x, already the sum and already gathered.
static void single_reduce_scatter_real(moe_comm *c, moe_backend *be, real *x,
                                       const size_t *counts) {
    (void)c, (void)be, (void)x, (void)counts;
}
static void single_allgather_real(moe_comm *c, moe_backend *be, real *x, const size_t *counts) {
    (void)c, (void)be, (void)x, (void)counts;
}
static void single_allreduce_double(moe_comm *c, double *x, size_t n) { (void)c, (void)x, (void)n; }
static void single_allreduce_long(moe_comm *c, long *x, size_t n) { (void)c, (void)x, (void)n; }
static void single_allgather(moe_comm *c, void *recv, const void *send, size_t bytes) {
    (void)c;
    memmove(recv, send, bytes);
}
static void single_broadcast(moe_comm *c, void *buf, size_t bytes, int root) {
    (void)c, (void)buf, (void)bytes, (void)root;
}
static void single_barrier(moe_comm *c) { (void)c; }
static void single_abort(moe_comm *c, int code) {
    (void)c;
    exit(code);
}
static moe_status single_split(moe_comm *c, int color, int key, moe_comm **out) {
    (void)c, (void)color, (void)key;
    return moe_comm_single(out);
}
static void single_destroy(moe_comm *c) { free(c); }

moe_status moe_comm_single(moe_comm **out) {
    moe_comm *c = calloc(1, sizeof *c);
    *out = c;
    if (!c) return moe_error(MOE_ENOMEM, "exchange: out of memory");
    *c = (moe_comm){
        .name = "single",
        .rank = 0,
        .size = 1,
        .alltoall_int = single_alltoall_int,
        .alltoallv_rows = single_alltoallv_rows,
        .alltoallv_rows_start = single_alltoallv_rows_start,
        .alltoallv_rows_wait = single_alltoallv_rows_wait,
        .alltoallv_host = single_alltoallv_host,
        .allreduce_sum_real = single_allreduce_real,
        .reduce_scatter_sum_real = single_reduce_scatter_real,
        .allgather_real = single_allgather_real,
        .allreduce_sum_double = single_allreduce_double,
        .allreduce_sum_long = single_allreduce_long,
        .allgather = single_allgather,
        .broadcast = single_broadcast,
        .barrier = single_barrier,
        .abort = single_abort,
        .split = single_split,
        .destroy = single_destroy,
    };
    return MOE_OK;
}

// The first of the variables that holds an integer >= lo, else fallback.
static int launch_var(const char *const *vars, int n_vars, int lo, int fallback) {
    for (int i = 0; i < n_vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) {
            int n = atoi(v);
            if (n >= lo) return n;
        }
    }
    return fallback;
}

int moe_launch_size(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
    return launch_var(vars, 3, 1, 1);
}

int moe_launch_rank(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    return launch_var(vars, 3, 0, 0);
}

int moe_launch_local_size(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"};
    return launch_var(vars, 2, 1, 1);
}
