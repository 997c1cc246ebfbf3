// Checkpoints are Hugging Face Mixtral folders (DESIGN.md §5):
//
//   RUN/ckpt/step_00000100/
//     config.json                              HF MixtralConfig
//     model-00001-of-0000N.safetensors ...     HF tensor names, fp32
//     model.safetensors.index.json             {"metadata": {"total_size"}, "weight_map"}
//     optimizer-exp_avg-00001-of-0000N.safetensors ...   AdamW moments of the tensors of
//     optimizer-exp_avg_sq-00001-of-0000N.safetensors ... model-00001-of-0000N (AdamW only;
//                                              older checkpoints: one optimizer-exp_avg.safetensors)
//     trainer_state.json                       step, schedule, loader/RNG state, skipped
//                                              steps, world layout, resolved config, CRC32s
//   RUN/ckpt/latest                            "step_00000100\n"
//
// A save writes step_N.tmp/, fsyncs every file and the folder, renames it to step_N/, fsyncs
// the parent, then replaces `latest` by write-temp-and-rename; only then are checkpoints
// beyond `keep` deleted. A crash at any moment leaves the previous checkpoint loadable.
//
// Under expert parallelism the save is collective (ckpt/shards.h): each process of the
// first EP group writes the shards of its experts (and their moments), rank 0 also the dense
// tensors, config.json, the index and, once every rank has reported its files' CRC32s,
// trainer_state.json; then it publishes. The folder is the one a single process writes (HF
// loads it unchanged; any world whose ep_size divides n_experts resumes from it: tensors are
// found by name). The run directory must be on a filesystem every rank sees.
#ifndef MOE_CHECKPOINT_H
#define MOE_CHECKPOINT_H

#include <stdint.h>

#include "data/loader.h"
#include "layers/model.h"
#include "optim/optimizer.h"
#include "ckpt/hf_config.h"
#include "ckpt/safetensors.h"
#include "config/config.h"

// Auto capacity's state (train/capacity.h): the factor in force and the needs of the
// window's steps so far. Saving: need is borrowed. Loading: malloc'd when present (free it).
typedef struct {
    int present;   // the run had model.capacity_factor = "auto"
    double factor; // > 0
    int64_t n;     // steps of the current window, < its length
    int L;         // layers (need is [n][L])
    double *need;  // >= 0, finite
} moe_capacity_state;

// Everything besides tensors that an exact resume needs.
typedef struct {
    int64_t step;              // updates done
    int64_t skipped;           // non-finite steps skipped in all
    int64_t consecutive_skips; // at the moment of the save
    data_loader_state loader;  // the data order (the loader's RNG)
    // the world that saved it (informational: a checkpoint holds every expert and resumes
    // under any world); 0 is read as 1
    int64_t world_size, ep_size;
    moe_capacity_state capacity;
} train_state;

#define CKPT_SHARD_BYTES ((uint64_t)1 << 30)

// trainer_state.json, read and validated field by field (type, range, consistency): a bad
// field is MOE_EIO naming the file and the field.
typedef struct {
    train_state ts;
    optim_kind optimizer; // the optimizer whose moments the folder holds
    int64_t optimizer_t;  // its update count (<= ts.step)
} moe_checkpoint_state;

// Reads folder/trainer_state.json into cs (validated as above).
moe_status moe_checkpoint_state_read(moe_checkpoint_state *cs, const char *folder);

// A moe.c checkpoint folder (one with trainer_state.json) is intact: every file it must
// hold (config.json, the index and every shard it names, the bias file when config.json
// has router_bias, the optimizer moments for AdamW) exists, every file of the folder has a
// CRC32 in trainer_state.json, and each matches. The required set comes from the index and
// the configs, so it cannot be emptied by editing trainer_state.json. MOE_EIO naming the
// file otherwise. A folder without trainer_state.json (an HF folder) is not checked here.
moe_status moe_checkpoint_verify(const char *folder);

// Saves into ckpt_root/step_%08lld (see above). opt may be NULL (no moment files). world
// NULL: one process; else collective over world (every rank calls it; the model of world rank
// r < E / E_local holds experts r*E_local.., as the trainer's first EP group does), and every
// rank returns the same status (a failing rank's message, "rank R: ..." on the others).
moe_status moe_checkpoint_save(const char *ckpt_root, const moe_model *m, const moe_optimizer *opt,
                               const train_state *ts, const moe_train_config *cfg, int keep,
                               uint64_t max_shard_bytes, moe_comm *world);

// Resolves `path`: a step folder, or a `latest` file naming one (relative to its folder).
moe_status moe_checkpoint_resolve(char *folder, size_t n, const char *path);

// The model of a checkpoint or HF folder (or `latest`): its config.json, read and checked
// (ckpt/hf_config.h). The config library's reader of train.init_from's model keys.
moe_status moe_checkpoint_model_config(const char *path, moe_model_config *out);

// Loads a checkpoint folder (or `latest`) into m (and opt and ts when not NULL), after
// moe_checkpoint_verify, moe_checkpoint_state_read, config.json against m's config, and opt's kind
// against the one that wrote the moments (MOE_EINVAL: no switching optimizers on resume).
moe_status moe_checkpoint_load(const char *path, moe_model *m, moe_optimizer *opt, train_state *ts);

// Before allocating a model of cfg for the folder: its safetensors headers (read without
// the data) hold at least as many values as cfg's parameters, so a config.json that
// describes a bigger model than its weights is refused before anything is allocated.
moe_status moe_hf_check_sizes(const char *folder, const moe_model_config *cfg);

// Loads every tensor of m by its HF name from folder (model.safetensors, or the shards of
// model.safetensors.index.json; F32, BF16 or F16 converted to fp32). A moe.c checkpoint
// (see moe_checkpoint_verify) is verified first; a tensor with a NaN or Inf is refused.
moe_status moe_hf_load_weights(moe_model *m, const char *folder);

// Writes m's weights as an inference-only HF folder (config.json, shards, index) in dtype,
// with what running it needs: the tokenizer files of src_folder (the checkpoint or HF folder
// the weights come from; a `latest` file names one) or, when it has none and the vocabulary
// is 256, the byte tokenizer's (data/tokenizer.h); generation_config.json (src_folder's own,
// else the tokenizer's bos/eos/pad ids, those it defines), and those ids in config.json.
// src_folder NULL: no source (the byte tokenizer's files for a vocabulary of 256).
moe_status moe_hf_export_from(const char *out_folder, const char *src_folder, const moe_model *m,
                              moe_st_dtype dtype, uint64_t max_shard_bytes);

// moe_hf_export_from without a source folder.
static inline moe_status moe_hf_export(const char *out_folder, const moe_model *m,
                                       moe_st_dtype dtype, uint64_t max_shard_bytes) {
    return moe_hf_export_from(out_folder, NULL, m, dtype, max_shard_bytes);
}

#endif
