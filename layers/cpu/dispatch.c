// Dispatch: per-expert counts (of the micro-batch, and per sequence), the capacity/drop
// decision, the grouping of kept assignments by expert (permute index), and the row movements
// around the experts.
//
// An "assignment" is a slot s = t*k + j: token t's j-th choice, expert topk_idx[s].
#include <string.h>

#include "layers/bf16.h"
#include "layers/cpu/cpu_kernels.h"

void cpu_moe_dispatch_counts(moe_backend *be, int *counts, const int *topk_idx, int T, int k,
                             int E) {
    CPU_KERNEL(be);
    memset(counts, 0, (size_t)E * sizeof(int));
    for (size_t s = 0; s < (size_t)T * k; s++) counts[topk_idx[s]]++;
}

void cpu_moe_seq_counts(moe_backend *be, int *seq_counts, const int *topk_idx, int T, int k, int E,
                        int seq_len) {
    CPU_KERNEL(be);
    const int B = T / seq_len;
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * E))
    for (int b = 0; b < B; b++) {
        int *c = seq_counts + (size_t)b * E;
        for (int e = 0; e < E; e++) c[e] = 0;
        for (size_t s = (size_t)b * seq_len * k; s < (size_t)(b + 1) * seq_len * k; s++)
            c[topk_idx[s]]++;
    }
}

// Stable bottom-up merge sort of slots by weight, largest first: on equal weights
// the slot that came first (the earlier token) stays first.
static void sort_slots_by_weight(int *slots, int *tmp, int n, const real *weights) {
    int *src = slots, *dst = tmp;
    for (int width = 1; width < n; width *= 2) {
        for (int lo = 0; lo < n; lo += 2 * width) {
            int mid = lo + width < n ? lo + width : n;
            int hi = lo + 2 * width < n ? lo + 2 * width : n;
            int a = lo, b = mid, o = lo;
            while (a < mid && b < hi)
                dst[o++] = weights[src[b]] > weights[src[a]] ? src[b++] : src[a++];
            while (a < mid) dst[o++] = src[a++];
            while (b < hi) dst[o++] = src[b++];
        }
        int *swap = src;
        src = dst;
        dst = swap;
    }
    if (src != slots) memcpy(slots, src, (size_t)n * sizeof(int));
}

void cpu_moe_capacity_keep(moe_backend *be, int *keep, int *scratch, const int *topk_idx,
                           const real *weights, const int *counts, int T, int k, int E,
                           int capacity, moe_drop_policy policy) {
    CPU_KERNEL(be);
    const int n_slots = T * k;
    for (int s = 0; s < n_slots; s++) keep[s] = 1;
    if (capacity <= 0) return;
#pragma omp parallel for schedule(dynamic, 1) if (cpu_parallel_worth((size_t)T * k * E))
    for (int e = 0; e < E; e++) {
        if (counts[e] <= capacity) continue;
        int base = 0; // expert e's slots go to scratch[base .. base+counts[e])
        for (int i = 0; i < e; i++) base += counts[i];
        int *slots = scratch + base, *tmp = scratch + n_slots + base;
        int n = 0;
        for (int s = 0; s < n_slots; s++)
            if (topk_idx[s] == e) slots[n++] = s; // token order
        if (policy == MOE_DROP_PROBS) sort_slots_by_weight(slots, tmp, n, weights);
        for (int i = capacity; i < n; i++) keep[slots[i]] = 0;
    }
}

void cpu_moe_permute_index(moe_backend *be, int *offsets, int *assign_row, int *row_token,
                           const int *topk_idx, const int *keep, int T, int k, int E) {
    CPU_KERNEL(be);
    const int n_slots = T * k;
    memset(offsets, 0, (size_t)(E + 1) * sizeof(int));
    for (int s = 0; s < n_slots; s++)
        if (keep[s]) offsets[topk_idx[s] + 1]++;
    for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
#pragma omp parallel for schedule(dynamic, 1) if (cpu_parallel_worth((size_t)T * k * E))
    for (int e = 0; e < E; e++) {
        int row = offsets[e];
        for (int s = 0; s < n_slots; s++) {
            if (topk_idx[s] != e) continue;
            if (keep[s]) {
                assign_row[s] = row;
                row_token[row++] = s / k;
            } else {
                assign_row[s] = -1;
            }
        }
    }
}

void cpu_moe_permute(moe_backend *be, real *xp, const real *x, const int *row_token, int N, int d) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)N * d))
    for (int r = 0; r < N; r++)
        memcpy(xp + (size_t)r * d, x + (size_t)row_token[r] * d, (size_t)d * sizeof(real));
}

// The bf16 layer's dispatch: the rows gathered and rounded in one pass, so that the fp32 copy
// of the expert rows (k times the layer's input) is never written and read back.
void cpu_moe_permute_bf16(moe_backend *be, moe_bf16 *xe16, const real *x, const int *row_token,
                          int N, int d) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)N * d))
    for (int r = 0; r < N; r++) {
        const real *src = x + (size_t)row_token[r] * d;
        moe_bf16 *dst = xe16 + (size_t)r * d;
        for (int i = 0; i < d; i++) dst[i] = moe_f32_to_bf16((float)src[i]);
    }
}

void cpu_moe_copy_chunks(moe_backend *be, real *dst, const real *src, const moe_row_chunk *chunks,
                         int n_chunks, int d) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(dynamic, 1) if (n_chunks > 1 && \
                                                  cpu_parallel_worth((size_t)n_chunks * d * 64))
    for (int c = 0; c < n_chunks; c++)
        if (chunks[c].rows > 0)
            memcpy(dst + (size_t)chunks[c].dst * d, src + (size_t)chunks[c].src * d,
                   (size_t)chunks[c].rows * d * sizeof(real));
}

void cpu_moe_combine_forward(moe_backend *be, real *out, const real *y, const real *weights,
                             const int *assign_row, int T, int k, int d) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * k * d))
    for (int t = 0; t < T; t++) {
        real *o = out + (size_t)t * d;
        for (int i = 0; i < d; i++) o[i] = 0;
        for (int j = 0; j < k; j++) {
            int r = assign_row[(size_t)t * k + j];
            if (r < 0) continue;
            real w = weights[(size_t)t * k + j];
            const real *yr = y + (size_t)r * d;
            for (int i = 0; i < d; i++) o[i] += w * yr[i];
        }
    }
}

// Both combine backwards: dy[r,:] = w dout[t,:] (fp32, or rounded into dy16 when dy16 is not
// NULL), dweights = dout[t,:] . y[r,:] as a simd reduction: lane-wise partial sums (a fixed
// order, so still deterministic); a strict left-to-right sum would be one dependent add per
// element.
static void combine_backward(real *dy, moe_bf16 *dy16, real *dweights, const real *dout,
                             const real *y, const real *weights, const int *assign_row, int T,
                             int k, int d) {
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * k * d))
    for (int t = 0; t < T; t++) {
        const real *g = dout + (size_t)t * d;
        for (int j = 0; j < k; j++) {
            size_t s = (size_t)t * k + j;
            int r = assign_row[s];
            if (r < 0) {
                dweights[s] = 0;
                continue;
            }
            const real *yr = y + (size_t)r * d, w = weights[s];
            if (dy16) {
                moe_bf16 *dyr16 = dy16 + (size_t)r * d;
                for (int i = 0; i < d; i++) dyr16[i] = moe_f32_to_bf16((float)(w * g[i]));
            } else {
                real *dyr = dy + (size_t)r * d;
                for (int i = 0; i < d; i++) dyr[i] = w * g[i];
            }
            real dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int i = 0; i < d; i++) dot += g[i] * yr[i];
            dweights[s] = dot;
        }
    }
}

void cpu_moe_combine_backward(moe_backend *be, real *dy, real *dweights, const real *dout,
                              const real *y, const real *weights, const int *assign_row, int T,
                              int k, int d) {
    CPU_KERNEL(be);
    combine_backward(dy, NULL, dweights, dout, y, weights, assign_row, T, k, d);
}

// The bf16 layer's combine backward: the expert rows' gradient rounded as it is written (its
// two GEMMs read bf16), without the fp32 copy the rounding would read back.
void cpu_moe_combine_backward_bf16(moe_backend *be, moe_bf16 *dy16, real *dweights,
                                   const real *dout, const real *y, const real *weights,
                                   const int *assign_row, int T, int k, int d) {
    CPU_KERNEL(be);
    combine_backward(NULL, dy16, dweights, dout, y, weights, assign_row, T, k, d);
}

void cpu_moe_unpermute_add(moe_backend *be, real *dx, const real *dxp, const int *assign_row, int T,
                           int k, int d) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * k * d))
    for (int t = 0; t < T; t++) {
        real *o = dx + (size_t)t * d;
        for (int j = 0; j < k; j++) {
            int r = assign_row[(size_t)t * k + j];
            if (r < 0) continue;
            const real *g = dxp + (size_t)r * d;
            for (int i = 0; i < d; i++) o[i] += g[i];
        }
    }
}
