// The training data loader: random windows of a token file, sharded by rank, resumable.
//
// Windows. The tokens are cut into n_windows = (count - 1) / seq_len non-overlapping
// windows; window i is tokens [i*seq_len, i*seq_len + seq_len] (seq_len + 1 tokens: the
// inputs are its first seq_len tokens, the targets its last seq_len, i.e. the inputs
// shifted by one). The tail that does not fill a window is never used.
//
// Order. Epoch e visits the windows in a pseudo-random permutation perm_e that depends
// only on (seed, e): Fisher-Yates driven by splitmix64 seeded with a hash of (seed, e).
// Rank r of world w takes the entries perm_e[j] with j % w == r, in order of j, so ranks
// see disjoint windows; each rank takes n_windows / w windows per epoch (the remainder
// n_windows % w is dropped so every rank has the same count), then epoch e + 1 begins.
// A batch is batch_size consecutive windows of the rank's sequence and may straddle two
// epochs.
//
// State. (seed, epoch, position) determines everything that follows, where position is
// the number of entries of perm_epoch consumed by all ranks together (= windows taken by
// each rank in this epoch * world; the same number on every rank of a synchronous run).
// Restoring a state under the same world continues exactly; under another world w' the
// rank continues at entry ceil(position / w') * w' + r of the same permutation, so at most
// w' - 1 windows of the epoch are skipped and none is seen twice.
#ifndef MOE_DATA_LOADER_H
#define MOE_DATA_LOADER_H

#include <stdint.h>

#include "data/token_file.h"
#include "layers/status.h"

// The resumable state: plain integers, for trainer_state.json. Note: a JSON number read as
// a double is exact only below 2^53; write `seed` as a string if it may be larger.
typedef struct {
    uint64_t seed;      // the data-order seed
    uint64_t epoch;     // current epoch, from 0
    uint64_t position;  // entries of this epoch's permutation consumed by all ranks together
    uint64_t n_windows; // windows in the token file (checked on restore: same data)
    uint64_t seq_len;   // window length (checked on restore: same windows)
} data_loader_state;

typedef struct {
    const token_file *tf;      // not owned; must outlive the loader
    int batch_size, seq_len;   // windows per batch, tokens per window (+1 for the target)
    int rank, world;           // this rank's share of each epoch
    uint64_t n_windows;        // (count - 1) / seq_len
    uint64_t windows_per_rank; // per epoch: n_windows / world
    uint64_t seed, epoch;
    uint64_t taken;            // windows this rank took in the current epoch, <= windows_per_rank
    uint64_t *perm;            // [n_windows] permutation of the current epoch (a cache)
} data_loader;

// Refusals (MOE_EINVAL, the message names the file where it matters): batch_size or
// seq_len < 1; world < 1 or rank outside [0, world); fewer tokens than one window
// (count < seq_len + 1); world > n_windows; vocab_size > 2^31 (token ids are int).
// On failure *L is left empty (data_loader_free is safe).
moe_status data_loader_init(data_loader *L, const token_file *tf, int batch_size, int seq_len,
                            uint64_t seed, int rank, int world);

// Fills inputs and targets, each [batch_size * seq_len] row-major, one window per row:
// targets[b*seq_len + t] is the token after inputs[b*seq_len + t].
void data_loader_next(data_loader *L, int *inputs, int *targets);

// The state to save after a batch.
void data_loader_get_state(data_loader_state *state, const data_loader *L);

// Continues from a saved state (its seed replaces the one given to init). Refuses, with
// MOE_EINVAL and L unchanged, a state made for another window count or seq_len, or a
// position beyond n_windows.
moe_status data_loader_set_state(data_loader *L, const data_loader_state *state);

void data_loader_free(data_loader *L);

#endif
