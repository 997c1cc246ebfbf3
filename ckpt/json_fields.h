// Checked fields of a parsed JSON object: the readers of config.json (hf_config.c) and of
// trainer_state.json (state.c) refuse a field of the wrong type or range by name; and the
// one writer of the JSON files of a checkpoint.
#ifndef MOE_CKPT_JSON_FIELDS_H
#define MOE_CKPT_JSON_FIELDS_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "layers/status.h"

// The field of obj that `key` names: its last dotted part ("optimizer.t": obj is the
// optimizer object; the whole key names the field in messages).
const cJSON *ckpt_json_field(const cJSON *obj, const char *key);

// The integer field `key` of j, in [lo, hi]; `code` is the status of a bad or missing one,
// whose message names path and key.
moe_status ckpt_json_integer(const cJSON *j, const char *path, const char *key, int64_t lo,
                             int64_t hi, moe_status code, int64_t *out);

// Writes obj, formatted, to path and fsyncs it (MOE_EIO naming path; MOE_ENOMEM).
moe_status ckpt_json_write(const char *path, const cJSON *obj);

#endif
