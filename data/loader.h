// The training data loader: random windows of a token file, sharded by rank, resumable.
//
// Windows. The tokens are cut into n_windows = (count - 1) / seq_len non-overlapping
// windows; window i is tokens [i*seq_len, i*seq_len + seq_len] (seq_len + 1 tokens: the
// inputs are its first seq_len tokens, the targets its last seq_len, i.e. the inputs
// shifted by one). The tail that does not fill a window is never used.
//
// Order. Epoch e visits the windows in a pseudo-random permutation perm_e that depends
// only on (seed, e): Fisher-Yates driven by splitmix64 seeded with a hash of (seed, e).
//
// World 1. The rank takes perm_e[0], perm_e[1], ... perm_e[n_windows - 1], then epoch
// e + 1 begins; a batch is batch_size (B) consecutive windows of that sequence and may
// straddle two epochs.
//
// World w > 1 (blocks, for expert parallelism). perm_e is cut into blocks of B consecutive
// entries, block k = entries k*B .. k*B + B - 1. Rank r takes the blocks k with k % w == r,
// in order of k: its n-th batch of the epoch is block n*w + r. Each epoch uses
// floor(n_windows / (w*B)) * w*B entries (every rank gets the same number of whole blocks;
// the other entries of the epoch are dropped), then epoch e + 1 begins; a batch never
// straddles two epochs. Ranks see disjoint windows, and one global step (batch n of every
// rank, in rank order) is exactly the w consecutive batches n*w .. n*w + w - 1 that a
// world-1 loader with the same seed and B produces in epoch 0, where no world-1 batch has
// straddled yet: R ranks x 1 micro-batch see what 1 rank x R micro-batches of gradient
// accumulation sees, micro-batch m = rank m's batch. (In later epochs world 1's batches
// are shifted by the epochs' n_windows % B straddle, and world w drops entries world 1
// uses, so the two sequences are no longer batch-aligned.) Init refuses an epoch with
// fewer than w*B windows (not one block per rank).
//
// State. (seed, epoch, position) determines everything that follows, where position is
// the number of entries of perm_epoch consumed by all ranks together: under world 1 the
// windows taken in this epoch (any count, since batches straddle epochs), under world
// w > 1 n*w*B after n batches per rank in this epoch (the same on every rank of a
// synchronous run). Restoring a state under the same world and B continues exactly. A
// restore under world w' continues the same epoch of the same permutation:
//   - w' = 1: at entry position exactly, whatever world produced the state (nothing is
//     skipped; for a position that is a multiple of B this is block position / B);
//   - w' > 1: rank r at global block ceil(position / (w'*B)) * w' + r, the first block
//     boundary at or after position that is a multiple of w'*B; if that is beyond the
//     blocks this epoch has for w' ranks, the epoch is used up and the next batch is
//     block r of epoch + 1.
// So within an epoch no window is seen twice and at most w'*B - 1 windows are skipped
// (besides the entries world w' drops at the end of every epoch). B may differ between
// the saving and the restoring run; the rule above uses the restoring run's B.
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
    const moe_token_file *tf;  // not owned; must outlive the loader
    int batch_size, seq_len;   // windows per batch, tokens per window (+1 for the target)
    int rank, world;           // this rank's share of each epoch
    uint64_t n_windows;        // (count - 1) / seq_len
    uint64_t windows_per_rank; // per epoch: n_windows under world 1, else
                               // floor(n_windows / (world*batch_size)) * batch_size
    uint64_t seed, epoch;
    uint64_t taken; // windows this rank took in the current epoch, <= windows_per_rank
    uint64_t *perm; // [n_windows] permutation of the current epoch (a cache)
} data_loader;

// Refusals (MOE_EINVAL, the message names the file where it matters): batch_size or
// seq_len < 1; world < 1 or rank outside [0, world); fewer tokens than one window
// (count < seq_len + 1); world > 1 and n_windows < world * batch_size (not one block per
// rank); vocab_size > 2^31 (token ids are int).
// On failure *L is left empty (data_loader_free is safe).
moe_status data_loader_init(data_loader *L, const moe_token_file *tf, int batch_size, int seq_len,
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
