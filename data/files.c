// Whole small files (see files.h).
#define _POSIX_C_SOURCE 200809L // fsync, fileno

#include "data/files.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

moe_status file_read_all(const char *path, size_t max, char **out, size_t *len) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return moe_error(MOE_EIO, "%s: cannot read: %s", path, strerror(errno));
    char *s = NULL;
    size_t n = 0, cap = 0, r = 1;
    while (r > 0 && n <= max) { // read until EOF or past max, doubling the buffer
        if (n + 1 >= cap) {
            char *t = realloc(s, cap ? 2 * cap : 4096);
            if (!t) {
                free(s), fclose(f);
                return moe_error(MOE_ENOMEM, "%s: out of memory reading it", path);
            }
            s = t, cap = cap ? 2 * cap : 4096;
        }
        r = fread(s + n, 1, cap - n - 1, f);
        n += r;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad || n > max) {
        free(s);
        return bad ? moe_error(MOE_EIO, "%s: read error", path)
                   : moe_error(MOE_EIO, "%s: larger than %zu bytes", path, max);
    }
    s[n] = 0;
    *out = s;
    if (len) *len = n;
    return MOE_OK;
}

moe_status file_write_synced(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return moe_error(MOE_EIO, "%s: cannot write: %s", path, strerror(errno));
    int ok = fwrite(data, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0) ok = 0;
    return ok ? MOE_OK : moe_error(MOE_EIO, "%s: write failed: %s", path, strerror(errno));
}

moe_status file_read_json_object(const char *path, size_t max, cJSON **out) {
    char *text;
    *out = NULL;
    moe_status st = file_read_all(path, max, &text, NULL);
    if (st) return st;
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return moe_error(MOE_EIO, "%s: not a JSON object (parse error)", path);
    }
    *out = j;
    return MOE_OK;
}

moe_status file_make_dirs(const char *path) {
    size_t len = strlen(path);
    char *p = malloc(len + 1);
    if (!p) return moe_error(MOE_ENOMEM, "%s: out of memory", path);
    memcpy(p, path, len + 1);
    for (size_t i = 1; i <= len; i++) { // each prefix that ends a component, then the whole
        if (p[i] != '/' && p[i] != '\0') continue;
        const char saved = p[i];
        p[i] = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            moe_status st = moe_error(MOE_EIO, "%s: cannot create folder: %s", p, strerror(errno));
            free(p);
            return st;
        }
        p[i] = saved;
    }
    free(p);
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return moe_error(MOE_EIO, "%s: exists and is not a folder", path);
    return MOE_OK;
}
