// config.json of Hugging Face Mixtral folders (checkpoints, exports, HF downloads): written
// from a model_config, read back with every field checked for type and range (the limits
// of the training schema, config/config.h), and compared with a model's config.
#ifndef MOE_CKPT_HF_CONFIG_H
#define MOE_CKPT_HF_CONFIG_H

#include <cjson/cJSON.h>

#include "layers/model.h"
#include "layers/status.h"

// The MixtralConfig of c (what transformers reads), plus moe.c's own routing fields
// (norm_topk_prob, scoring_func, routed_scaling_factor, router_bias), which transformers
// ignores. The caller owns the object.
cJSON *moe_hf_config_json(const moe_model_config *c, const char *torch_dtype);

// Reads an HF Mixtral folder's config.json into a model config (MoE capacity settings at
// their defaults; inference never drops). A field moe.c does not understand is an error
// naming it (it may change the model).
moe_status moe_hf_config_read(moe_model_config *cfg, const char *folder);

// MOE_EINVAL naming every field of folder/config.json that disagrees with cfg.
moe_status moe_hf_config_check(const char *folder, const moe_model_config *cfg);

#endif
