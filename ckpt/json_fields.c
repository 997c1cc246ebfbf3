// Checked fields of parsed JSON objects (see json_fields.h).
#include "ckpt/json_fields.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/files.h"

// The field of obj that `key` names ("optimizer.t": obj is the optimizer object).
const cJSON *ckpt_json_field(const cJSON *obj, const char *key) {
    const char *dot = strrchr(key, '.');
    return cJSON_GetObjectItemCaseSensitive(obj, dot ? dot + 1 : key);
}

// The integer field `key` of j, in [lo, hi]; `code` is the status of a bad or missing one.
moe_status ckpt_json_integer(const cJSON *j, const char *path, const char *key, int64_t lo,
                             int64_t hi, moe_status code, int64_t *out) {
    const cJSON *v = ckpt_json_field(j, key);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble))
        return moe_error(code, "%s: \"%s\" is missing or not an integer", path, key);
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return moe_error(code, "%s: \"%s\" = %.15g is outside [%" PRId64 ", %" PRId64 "]", path,
                         key, v->valuedouble, lo, hi);
    *out = (int64_t)v->valuedouble;
    return MOE_OK;
}

moe_status ckpt_json_write(const char *path, const cJSON *obj) {
    char *text = cJSON_Print(obj);
    if (!text) return moe_error(MOE_ENOMEM, "%s: cannot format JSON", path);
    moe_status st = moe_file_write_synced(path, text, strlen(text));
    free(text);
    return st;
}
