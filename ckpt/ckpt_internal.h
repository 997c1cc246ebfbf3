// Private to ckpt/ (never included from outside it): what the files of the checkpoint
// library share. folder.c: step folders, fsync, removal, `latest`; weights.c: tensors in and
// out of a folder (and the router bias); save.c: moe_checkpoint_save; state.c: trainer_state.json;
// verify.c: the integrity check; load.c: moe_checkpoint_load; export.c: moe_hf_export_from.
#ifndef MOE_CKPT_INTERNAL_H
#define MOE_CKPT_INTERNAL_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "ckpt/checkpoint.h"

// Not installed: what this header declares stays inside libmoe (hidden in libmoe.so).
#pragma GCC visibility push(hidden)

_Static_assert(sizeof(real) == sizeof(float), "checkpoints hold fp32 tensors");

// The prefixes of AdamW's moment shards (shards.h).
#define MOMENTS "optimizer-exp_avg"
#define MOMENTS_SQ "optimizer-exp_avg_sq"

// The selection bias (aux-loss-free balancing) lives in router_bias.safetensors, one [E]
// tensor per layer named like DeepSeek-V3's; transformers' Mixtral ignores the file.
#define BIAS_FILE "router_bias.safetensors"

// ---- folders (folder.c) --------------------------------------------------------------------

// "step_NNNNNNNN" (a checkpoint folder's name) -> N.
int ckpt_parse_step_name(const char *name, long long *step);
// 1 and *step when the last component of folder (trailing slashes allowed) is step_NNNNNNNN.
int ckpt_folder_step(const char *folder, long long *step);
moe_status ckpt_fsync_path(const char *path);
// Removes a folder of plain files (a checkpoint), then the folder.
void ckpt_remove_folder(const char *path);
// An empty folder at path, where a save or an export writes before its rename: the leftover
// of an interrupted one is removed; anything else there (a folder in it) is an error.
moe_status ckpt_fresh_folder(const char *path);

// ---- weights (weights.c) -------------------------------------------------------------------

// Copies the n tensors of tab into host (a buffer laid out like m->params), from
// folder/single_file when not NULL, else from the files the index names (model-*) under
// file_prefix instead of "model" (the moment shards of a save). host NULL: only checks that
// every tensor is there with its shape, reading the headers alone.
moe_status ckpt_load_tensors(real *host, const moe_model_tensor *tab, int n, const char *folder,
                             const char *single_file, const char *file_prefix);
// m's weights from folder (any HF folder: no verification), and its router bias from
// BIAS_FILE when m has one and the folder holds it.
moe_status ckpt_load_weights(moe_model *m, const char *folder);
// m's router bias into folder/BIAS_FILE.
moe_status ckpt_write_bias(const char *folder, const moe_model *m);

// ---- trainer_state.json (state.c) and the integrity check (verify.c) ------------------------

// folder/trainer_state.json, parsed into *json and validated into *cs.
moe_status ckpt_read_state(cJSON **json, moe_checkpoint_state *cs, const char *folder);
void ckpt_capacity_state_free(moe_capacity_state *c);
// moe_checkpoint_verify, also giving the validated state (trainer_state.json is read once; free
// cs->ts.capacity's needs when it succeeds).
moe_status ckpt_verify(moe_checkpoint_state *cs, const char *folder);

#pragma GCC visibility pop

#endif
