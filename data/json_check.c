// Duplicate keys in parsed JSON (see json_check.h).
#include "data/json_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/files.h"

#define WHERE_MAX 256 // the dotted path of an object in messages (a longer one is cut)

static int by_key(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// The keys of one object are distinct: its key pointers sorted, neighbours compared.
static moe_status keys_unique(const cJSON *obj, const char *path, const char *where) {
    size_t n = 0;
    for (const cJSON *c = obj->child; c; c = c->next) n++;
    if (n < 2) return MOE_OK;
    const char **keys = malloc(n * sizeof *keys);
    if (!keys) return moe_error(MOE_ENOMEM, "%s: out of memory checking its keys", path);
    size_t i = 0;
    for (const cJSON *c = obj->child; c; c = c->next) keys[i++] = c->string ? c->string : "";
    qsort(keys, n, sizeof *keys, by_key);
    moe_status st = MOE_OK;
    for (i = 1; i < n && !st; i++)
        if (!strcmp(keys[i - 1], keys[i]))
            st = moe_error(MOE_EIO, "%s: key \"%.200s\" appears twice in %s", path, keys[i],
                           where[0] ? where : "the top level");
    free(keys);
    return st;
}

// Appends the step to child (member `key` of an object: ".key", "key" at the top; element
// `index` of an array: "[index]") to where[0, len); the new length, cut at WHERE_MAX - 1.
static size_t where_push(char *where, size_t len, const cJSON *child, int index) {
    const size_t room = WHERE_MAX - len;
    const int k = child->string ? snprintf(where + len, room, "%s%s", len ? "." : "", child->string)
                                : snprintf(where + len, room, "[%d]", index);
    const size_t end = len + (k > 0 ? (size_t)k : 0);
    return end < WHERE_MAX ? end : WHERE_MAX - 1;
}

// Checks the object or array v (at where, depth levels down) and every object or array in it.
static moe_status walk(const cJSON *v, const char *path, char *where, size_t len, int depth) {
    if (depth > MOE_JSON_CHECK_MAX_DEPTH)
        return moe_error(MOE_EIO, "%s: nested deeper than %d levels (at %s)", path,
                         MOE_JSON_CHECK_MAX_DEPTH, where);
    moe_status st = cJSON_IsObject(v) ? keys_unique(v, path, where) : MOE_OK;
    int index = 0;
    for (const cJSON *c = v->child; c && !st; c = c->next, index++) {
        if (!cJSON_IsObject(c) && !cJSON_IsArray(c)) continue;
        st = walk(c, path, where, where_push(where, len, c, index), depth + 1);
        where[len] = '\0';
    }
    return st;
}

moe_status moe_json_refuse_duplicates(const cJSON *root, const char *path) {
    char where[WHERE_MAX] = "";
    if (!cJSON_IsObject(root) && !cJSON_IsArray(root)) return MOE_OK;
    return walk(root, path, where, 0, 1);
}
