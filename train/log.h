// Run logs: one JSON object per line (metrics.jsonl, expert_load.jsonl), written with
// cJSON, so NaN and Inf become null (DESIGN.md §5), and flushed per record so that a run in
// progress can be read. Every write is checked: the logs are the user's record of the run,
// so a failed write (a full disk) stops the run, naming the file and the OS error.
#ifndef MOE_TRAIN_LOG_H
#define MOE_TRAIN_LOG_H

#include <cjson/cJSON.h>
#include <stdio.h>

#include "layers/status.h"

// An open log and its path, for the messages.
typedef struct {
    FILE *f;
    char path[2048];
} moe_jsonl_file;

// Opens dir/name for appending (append=0 empties it first: a new run); every record goes to
// the file's end. MOE_EIO with the path on failure.
moe_status moe_jsonl_open(moe_jsonl_file *j, const char *dir, const char *name, int append);
// Keeps only the records of dir/name whose "step" is <= max_step (a missing file is fine);
// MOE_EIO naming the file when a read or write fails (the file is then left as it was).
moe_status moe_jsonl_keep_until(const char *dir, const char *name, long long max_step);
// Writes obj as one line, flushes, and frees obj. MOE_EIO "path: write failed: <why>".
moe_status moe_jsonl_write(moe_jsonl_file *j, cJSON *obj);
// Closes j (if open). MOE_EIO as moe_jsonl_write when the last data could not be written.
moe_status moe_jsonl_close(moe_jsonl_file *j);
// Flushes and closes f, a file written to `path`: MOE_EIO "path: write failed: <why>" when
// any write to it failed (fclose is the last chance to hear of a full disk).
moe_status moe_file_close_checked(FILE *f, const char *path);
// An array of ints as a cJSON array.
cJSON *moe_json_int_array(const long *values, int n);

#endif
