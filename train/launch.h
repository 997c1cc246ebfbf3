// The ranks of one mpirun launch agree on what they are about to do before they do any of it.
//
// mpirun starts R copies of `moe`, each with its own arguments (an MPMD launch can give each
// rank another command). Ranks that were told different things would deadlock in their first
// mismatched collective, or compute garbage from mismatched buffers: rank 0 resuming a finished
// run (nothing to do) while rank 1 overwrites it, `train` on one rank and `eval` on another.
// So the first collective of every command that runs on several ranks is this one: each rank
// describes its intent (the command, its resolved config, the checkpoint it resumes and that
// checkpoint's step, --overwrite, --dry-run, the files it reads), all ranks gather every
// description (one fixed-size allgather: the same call whatever the command), and a rank
// whose intent differs from rank 0's is refused on every rank, naming it and the field.
#ifndef MOE_TRAIN_LAUNCH_H
#define MOE_TRAIN_LAUNCH_H

#include <stdint.h>

#include "layers/exchange.h"
#include "config/config.h"

typedef struct {
    char command[16];               // "train", "eval"
    uint64_t config_hash;           // moe_launch_config_hash of the resolved config (0: none)
    char resume[MOE_PATH_MAX + 64]; // the checkpoint folder a train resumes from ("": none)
    int64_t resume_step;            // its trainer_state.json step (-1: unknown or none)
    int overwrite, dry_run;
    char inputs
        [3 * MOE_PATH_MAX]; // what else the command reads and how ("--ckpt X --data Y ..."), or ""
} moe_launch_intent;

// FNV-1a over the resolved config as config.cfg writes it (two ranks given the same file and
// --set have the same hash).
uint64_t moe_launch_config_hash(const moe_train_config *cfg);

// Every rank of w gathers every rank's intent; MOE_EINVAL on every rank when a rank's differs
// from rank 0's: "the ranks were told different things: rank 1 ... , rank 0 ...". Collective
// over w; MOE_OK at once when w has one rank.
moe_status moe_launch_agree(moe_comm *w, const moe_launch_intent *mine);

#endif
