// The numbers of moe stats, a leaf that the rest of train/ may use too: numpy's percentile,
// the capacity a set of per-expert counts needs, and capacity factors <-> capacities exactly
// as the MoE layer computes them (layers/moe.h moe_capacity).
#ifndef MOE_TRAIN_STATS_QUANTILE_H
#define MOE_TRAIN_STATS_QUANTILE_H

#include <stddef.h>

// numpy.percentile(a, p) with its default method ('linear'), a sorted ascending, n >= 1,
// p in [0, 100]; evaluated in the same order as numpy so that results agree to the last bit.
double stats_percentile_sorted(const double *sorted, size_t n, double p);

// The smallest capacity C >= 1 per group (micro-batch) such that the assignments dropped,
// sum over groups and experts of max(0, c_e - C), are at most max_drop * (all assignments).
// counts is [rows][E]; each row stands for groups_per_row equal groups with c_e =
// counts[r][e] / groups_per_row (1 when each row is one micro-batch's own counts, n when a
// record only has the sum of n micro-batches). Exact integer test.
long stats_needed_capacity(const long *counts, int rows, int E, int groups_per_row,
                           double max_drop);

// C = moe_capacity (layers/moe.h): ceil((T*k/E) * cf) in double in that order, clamped to T;
// 0 when cf <= 0 (dropless). T is a micro-batch's tokens, batch_size * seq_len, at most
// MOE_CONFIG_MAX_TOKENS (an int).
long stats_capacity_of(double cf, long T, int k, int E);

// The capacity factor C*E/(T*k), nudged by an ulp where needed so that
// stats_capacity_of(cf, T, k, E) == C exactly.
double stats_capacity_factor(long C, long T, int k, int E);

#endif
