// Run logs: one JSON object per line (metrics.jsonl, expert_load.jsonl), written with
// cJSON, so NaN and Inf become null (DESIGN.md §5), and flushed per record so that a run in
// progress can be read.
#ifndef MOE_TRAIN_LOG_H
#define MOE_TRAIN_LOG_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "layers/status.h"

// Opens dir/name for writing (append=0 truncates); MOE_EIO with the path on failure.
moe_status jsonl_open(FILE **f, const char *dir, const char *name, int append);
// Keeps only the records of dir/name whose "step" is <= max_step (a missing file is fine).
moe_status jsonl_keep_until(const char *dir, const char *name, long long max_step);
// Writes obj as one line and frees it.
void jsonl_write(FILE *f, cJSON *obj);
// An array of ints as a cJSON array.
cJSON *json_int_array(const long *values, int n);

// mkdir -p
moe_status make_dirs(const char *path);

#endif
