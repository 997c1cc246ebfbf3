// Duplicate keys in parsed JSON. cJSON keeps every member of an object, and its lookups find
// the first of a repeated key; Python's json (so transformers, safetensors' own reader) keeps
// the last. The same file would then describe two different things, so every JSON file a
// moe.c reads (data/files.h moe_file_read_json_object checks them all) is refused when any of
// its objects repeats a key.
#ifndef MOE_DATA_JSON_CHECK_H
#define MOE_DATA_JSON_CHECK_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "layers/status.h"

// The deepest nesting moe_json_refuse_duplicates walks (cJSON's own limit, CJSON_NESTING_LIMIT,
// is 1000 by default): deeper is refused, so the walk's recursion is bounded.
#define MOE_JSON_CHECK_MAX_DEPTH 1000

// MOE_OK when no object of root (root itself and every object nested in it, through arrays
// too) has a key twice; else MOE_EIO "PATH: key \"K\" appears twice in OBJECT", OBJECT being
// "the top level" or the dotted path of keys to it ("rope_parameters", "added_tokens[2]").
// O(n log n) in the keys of each object (they are sorted). Nesting deeper than
// MOE_JSON_CHECK_MAX_DEPTH is MOE_EIO too; MOE_ENOMEM when out of memory.
moe_status moe_json_refuse_duplicates(const cJSON *root, const char *path);

#endif
