// Whole small files: read into memory, written and fsynced, parsed as a JSON object; and
// folders made on the way (mkdir -p). One home for what the checkpoint, log, preparation and
// tokenizer code need (config.c keeps its own reader: it
// also refuses non-regular files without blocking on them).
#ifndef MOE_DATA_FILES_H
#define MOE_DATA_FILES_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "layers/status.h"

// The whole file, NUL-terminated (malloc'd), of at most max bytes; *len its size (may be
// NULL). MOE_EIO naming the file when it cannot be read or is larger than max.
moe_status file_read_all(const char *path, size_t max, char **out, size_t *len);

// Writes n bytes to path (truncating), flushes and fsyncs; every step checked.
moe_status file_write_synced(const char *path, const void *data, size_t n);

// file_read_all of at most max bytes, parsed: MOE_EIO unless it is a JSON object.
moe_status file_read_json_object(const char *path, size_t max, cJSON **out);

// mkdir -p: creates every missing folder of path (mode 0777 less the umask). MOE_EIO
// "FOLDER: cannot create folder: why" naming the one that failed, or "PATH: exists and is
// not a folder".
moe_status file_make_dirs(const char *path);

#endif
