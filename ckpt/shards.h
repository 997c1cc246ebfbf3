// Which safetensors file of a checkpoint holds each tensor, and which process writes it.
//
// A folder's weights are model-00001-of-0000N.safetensors ... plus
// model.safetensors.index.json (HF's sharded layout); AdamW's moments are the same files
// under the prefixes optimizer-exp_avg and optimizer-exp_avg_sq (optimizer-exp_avg-00001-of-
// 0000N.safetensors holds the first moment of the tensors of model-00001-of-0000N).
//
// Under expert parallelism the files are written by W = E / E_local processes: writer w holds
// the experts of slots w*E_local .. (w+1)*E_local - 1 (world rank w, the trainer's first EP
// group; global experts placement[slot] under an expert placement) and writes their files; writer 0 also writes the dense tensors. Files are numbered writer by writer;
// within a writer, tensors go in HF order and a new file starts when the next tensor would
// take the file past max_bytes (a tensor bigger than that gets a file of its own). Every rank
// computes the same plan from the whole model's table, so the index (written by writer 0)
// names files that other processes write.
#ifndef MOE_CKPT_SHARDS_H
#define MOE_CKPT_SHARDS_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "layers/model.h"
#include "ckpt/safetensors.h"

typedef struct {
    moe_model_tensor *tab; // the whole model's table (every expert), HF order
    int n;                 // its tensors
    int *file;             // [n] the 0-based file of each tensor
    int *writer;           // [n_files] the writer of each file
    int n_files;
    int n_writers;      // W
    int max_per_writer; // the most files one writer writes
    uint64_t total;     // bytes of all tensors in the plan's dtype (the index's total_size)
} moe_shard_plan;

// The plan for a model of cfg written by processes holding E_local experts each (E_local =
// E: one writer) under the expert placement placement [E] (model.h; NULL: the identity),
// tensors in dtype. MOE_EINVAL when E_local does not divide E; MOE_ENOMEM.
moe_status moe_shard_plan_make(moe_shard_plan *p, const moe_model_config *cfg, int E_local,
                               const int *placement, moe_st_dtype dtype, uint64_t max_bytes);
void moe_shard_plan_free(moe_shard_plan *p);

// "PREFIX-0000F-of-0000N.safetensors" for file f (0-based) of the plan.
void moe_shard_file_name(char *out, size_t n, const moe_shard_plan *p, const char *prefix, int f);

// Writes the files of writer w under prefix ("model", "optimizer-exp_avg", ...) into folder:
// the tensors of m's table (m holds writer w's experts; its table is the plan's filtered to
// them, in the same order), their data from host (a buffer laid out like m->params), in
// dtype. Appends each file's name to files (a cJSON array) when not NULL.
moe_status moe_shard_write(const char *folder, const moe_shard_plan *p, int w, const moe_model *m,
                           const real *host, const char *prefix, moe_st_dtype dtype, cJSON *files);

// Writes folder/model.safetensors.index.json: {"metadata": {"total_size"}, "weight_map"}.
moe_status moe_shard_write_index(const char *folder, const moe_shard_plan *p);

#endif
