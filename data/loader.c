// The data loader: seeded per-epoch permutations of fixed windows, sharded by rank.
#include "data/loader.h"

#include <stdlib.h>
#include <string.h>

#include "layers/rng.h"

// Uniform in [0, bound), bound >= 1, without modulo bias: reject the lowest
// 2^64 mod bound values so the rest are a whole number of copies of [0, bound).
static uint64_t uniform_below(uint64_t *s, uint64_t bound) {
    uint64_t threshold = (0 - bound) % bound; // = 2^64 mod bound
    for (;;) {
        uint64_t x = moe_splitmix64(s);
        if (x >= threshold) return x % bound;
    }
}

// perm = the permutation of epoch `epoch`: a function of (seed, epoch) only.
static void build_permutation(uint64_t *perm, uint64_t n, uint64_t seed, uint64_t epoch) {
    uint64_t s = moe_mix64(seed ^ moe_mix64(epoch + 0xD1B54A32D192ED03ull));
    for (uint64_t i = 0; i < n; i++) perm[i] = i;
    for (uint64_t i = n; i-- > 1;) { // Fisher-Yates
        uint64_t j = uniform_below(&s, i + 1);
        uint64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

void data_loader_free(data_loader *L) {
    if (!L) return;
    free(L->perm);
    memset(L, 0, sizeof *L);
}

moe_status data_loader_init(data_loader *L, const moe_token_file *tf, int batch_size, int seq_len,
                            uint64_t seed, int rank, int world) {
    if (!L) return moe_error(MOE_EINVAL, "data_loader_init: L is NULL");
    memset(L, 0, sizeof *L);
    if (!tf || (tf->count > 0 && !tf->tokens))
        return moe_error(MOE_EINVAL, "data_loader_init: no token file");
    if (batch_size < 1 || seq_len < 1)
        return moe_error(MOE_EINVAL,
                         "data loader for '%s': batch_size %d and seq_len %d must be >= 1",
                         tf->path, batch_size, seq_len);
    if (world < 1 || rank < 0 || rank >= world)
        return moe_error(MOE_EINVAL, "data loader for '%s': rank %d is not in a world of %d",
                         tf->path, rank, world);
    if (tf->count < (uint64_t)seq_len + 1)
        return moe_error(MOE_EINVAL,
                         "token file '%s': %llu tokens, fewer than one window of seq_len + 1 = "
                         "%llu tokens",
                         tf->path, (unsigned long long)tf->count, (unsigned long long)seq_len + 1);
    if (tf->vocab_size > 1u << 31)
        return moe_error(MOE_EINVAL,
                         "token file '%s': vocab_size %u does not fit the int token ids", tf->path,
                         tf->vocab_size);
    uint64_t n_windows = (tf->count - 1) / (uint64_t)seq_len;
    uint64_t block_windows = (uint64_t)world * (uint64_t)batch_size; // one block per rank
    if (world > 1 && n_windows < block_windows)
        return moe_error(MOE_EINVAL,
                         "token file '%s': %llu windows of seq_len %d, fewer than the %d ranks "
                         "x batch_size %d = %llu windows an epoch needs (one batch per rank)",
                         tf->path, (unsigned long long)n_windows, seq_len, world, batch_size,
                         (unsigned long long)block_windows);
    if (n_windows > SIZE_MAX / sizeof(uint64_t))
        return moe_error(MOE_ENOMEM, "token file '%s': %llu windows do not fit in memory", tf->path,
                         (unsigned long long)n_windows);
    uint64_t *perm = malloc((size_t)n_windows * sizeof *perm);
    if (!perm)
        return moe_error(MOE_ENOMEM, "token file '%s': cannot allocate the order of %llu windows",
                         tf->path, (unsigned long long)n_windows);
    L->tf = tf;
    L->batch_size = batch_size;
    L->seq_len = seq_len;
    L->rank = rank;
    L->world = world;
    L->n_windows = n_windows;
    // World 1 uses the whole epoch (batches straddle epochs); world > 1 whole blocks only.
    L->windows_per_rank = world == 1 ? n_windows : n_windows / block_windows * (uint64_t)batch_size;
    L->seed = seed;
    L->epoch = 0;
    L->taken = 0;
    L->perm = perm;
    build_permutation(L->perm, n_windows, seed, 0);
    return MOE_OK;
}

void data_loader_next(data_loader *L, int *inputs, int *targets) {
    const size_t T = (size_t)L->seq_len;
    for (int b = 0; b < L->batch_size; b++) {
        if (L->taken == L->windows_per_rank) { // this rank's share of the epoch is used up
            L->epoch++;
            L->taken = 0;
            build_permutation(L->perm, L->n_windows, L->seed, L->epoch);
        }
        // The rank's n-th block (n = taken / B) is global block n*world + rank; under world
        // 1 the entry is just `taken` (B need not divide the epoch there).
        uint64_t B = (uint64_t)L->batch_size;
        uint64_t block = L->taken / B * (uint64_t)L->world + (uint64_t)L->rank;
        uint64_t window = L->perm[block * B + L->taken % B];
        L->taken++;
        const uint32_t *src = L->tf->tokens + window * T;
        int *in = inputs + (size_t)b * T, *tg = targets + (size_t)b * T;
        for (size_t t = 0; t < T; t++) { // ids < vocab_size <= 2^31 (checked at init)
            in[t] = (int)src[t];
            tg[t] = (int)src[t + 1];
        }
    }
}

void data_loader_get_state(data_loader_state *state, const data_loader *L) {
    state->seed = L->seed;
    state->epoch = L->epoch;
    state->position = L->taken * (uint64_t)L->world;
    state->n_windows = L->n_windows;
    state->seq_len = (uint64_t)L->seq_len;
}

moe_status data_loader_set_state(data_loader *L, const data_loader_state *state) {
    if (!L || !L->perm || !state)
        return moe_error(MOE_EINVAL, "data_loader_set_state: loader not initialised or no state");
    const char *path = L->tf->path;
    if (state->n_windows != L->n_windows || state->seq_len != (uint64_t)L->seq_len)
        return moe_error(MOE_EINVAL,
                         "data loader for '%s': saved state is for %llu windows of seq_len %llu, "
                         "this loader has %llu windows of seq_len %d (different data or seq_len)",
                         path, (unsigned long long)state->n_windows,
                         (unsigned long long)state->seq_len, (unsigned long long)L->n_windows,
                         L->seq_len);
    if (state->position > L->n_windows)
        return moe_error(MOE_EINVAL,
                         "data loader for '%s': saved position %llu is beyond the %llu windows "
                         "of an epoch",
                         path, (unsigned long long)state->position,
                         (unsigned long long)L->n_windows);
    // World 1 continues at entry `position` exactly (its states are arbitrary entry counts).
    // World w > 1 rounds up to a multiple of w*B, skipping rather than repeating when the
    // world changed: the rank's next block is ceil(position / (w*B)) * w + rank.
    uint64_t taken = state->position;
    if (L->world > 1) {
        uint64_t B = (uint64_t)L->batch_size, stride = (uint64_t)L->world * B;
        taken = (state->position / stride + (state->position % stride != 0)) * B;
    }
    if (taken > L->windows_per_rank) taken = L->windows_per_rank; // epoch used up
    if (state->seed != L->seed || state->epoch != L->epoch)
        build_permutation(L->perm, L->n_windows, state->seed, state->epoch);
    L->seed = state->seed;
    L->epoch = state->epoch;
    L->taken = taken;
    return MOE_OK;
}
