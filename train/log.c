#define _POSIX_C_SOURCE 200809L // getline

#include "train/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

moe_status make_dirs(const char *path) {
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return moe_error(MOE_EINVAL, "%s: path too long", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return moe_error(MOE_EIO, "%s: cannot create directory: %s", buf, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    return MOE_OK;
}

moe_status jsonl_open(FILE **f, const char *dir, const char *name, int append) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    *f = fopen(path, append ? "a" : "w");
    if (!*f) return moe_error(MOE_EIO, "%s: cannot open for writing: %s", path, strerror(errno));
    return MOE_OK;
}

void jsonl_write(FILE *f, cJSON *obj) {
    char *s = cJSON_PrintUnformatted(obj);
    if (s) {
        fputs(s, f);
        fputc('\n', f);
        fflush(f);
        free(s);
    }
    cJSON_Delete(obj);
}

cJSON *json_int_array(const long *values, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)values[i]));
    return a;
}

moe_status jsonl_keep_until(const char *dir, const char *name, long long max_step) {
    char path[2048], tmp[2100];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *in = fopen(path, "r");
    if (!in) return MOE_OK;
    FILE *out = fopen(tmp, "w");
    if (!out) {
        fclose(in);
        return moe_error(MOE_EIO, "%s: cannot write: %s", tmp, strerror(errno));
    }
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, in) > 0) {
        cJSON *rec = cJSON_Parse(line);
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(rec, "step");
        if (cJSON_IsNumber(step) && step->valuedouble <= (double)max_step) fputs(line, out);
        cJSON_Delete(rec);
    }
    free(line);
    fclose(in);
    if (fclose(out) != 0 || rename(tmp, path) != 0)
        return moe_error(MOE_EIO, "%s: cannot rewrite: %s", path, strerror(errno));
    return MOE_OK;
}
