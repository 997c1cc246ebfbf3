#define _POSIX_C_SOURCE 200809L // getline

#include "train/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// Always opened for appending (O_APPEND): every record goes to the file's end as it is then,
// so a log that someone truncates while the run writes (clearing it, logrotate's
// copytruncate) starts again at the next record, instead of the old offset that "w" keeps
// (which leaves a hole of NUL bytes before it). A new run empties the file once, here.
moe_status moe_jsonl_open(moe_jsonl_file *j, const char *dir, const char *name, int append) {
    snprintf(j->path, sizeof j->path, "%s/%s", dir, name);
    j->f = fopen(j->path, "a");
    if (!j->f)
        return moe_error(MOE_EIO, "%s: cannot open for writing: %s", j->path, strerror(errno));
    struct stat sb;
    if (!append && fstat(fileno(j->f), &sb) == 0 && S_ISREG(sb.st_mode) &&
        ftruncate(fileno(j->f), 0) != 0) { // (not /dev/null, the other ranks' log)
        const int e = errno;
        fclose(j->f);
        j->f = NULL;
        return moe_error(MOE_EIO, "%s: cannot empty it for a new run: %s", j->path, strerror(e));
    }
    return MOE_OK;
}

// errno of the failed call (EIO when the C library did not say).
static moe_status write_failed(const char *path, int err) {
    return moe_error(MOE_EIO, "%s: write failed: %s", path, strerror(err ? err : EIO));
}

moe_status moe_jsonl_write(moe_jsonl_file *j, cJSON *obj) {
    char *s = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    if (!s) return moe_error(MOE_ENOMEM, "%s: out of memory formatting a record", j->path);
    errno = 0;
    // fflush per record: a full disk shows here, not at the end of the run
    const int ok = fputs(s, j->f) >= 0 && fputc('\n', j->f) != EOF && fflush(j->f) == 0;
    const int err = errno;
    free(s);
    return ok ? MOE_OK : write_failed(j->path, err);
}

moe_status moe_file_close_checked(FILE *f, const char *path) {
    errno = 0;
    int failed = fflush(f) != 0 || ferror(f);
    int err = errno;
    if (fclose(f) != 0 && !failed) failed = 1, err = errno;
    return failed ? write_failed(path, err) : MOE_OK;
}

moe_status moe_jsonl_close(moe_jsonl_file *j) {
    if (!j->f) return MOE_OK;
    FILE *f = j->f;
    j->f = NULL;
    return moe_file_close_checked(f, j->path);
}

cJSON *moe_json_int_array(const long *values, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)values[i]));
    return a;
}

moe_status moe_jsonl_keep_until(const char *dir, const char *name, long long max_step) {
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
    int write_ok = 1, err = 0;
    while (write_ok && getline(&line, &cap, in) > 0) {
        cJSON *rec = cJSON_Parse(line);
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(rec, "step");
        if (cJSON_IsNumber(step) && step->valuedouble <= (double)max_step) {
            errno = 0;
            write_ok = fputs(line, out) >= 0;
            err = errno;
        }
        cJSON_Delete(rec);
    }
    free(line);
    const int read_ok = !ferror(in);
    fclose(in);
    // the original stays until the copy is complete: a failure loses no record
    moe_status st = MOE_OK;
    if (!read_ok) {
        fclose(out);
        st = moe_error(MOE_EIO, "%s: read failed", path);
    } else if (!write_ok) {
        fclose(out);
        st = write_failed(tmp, err);
    } else if ((st = moe_file_close_checked(out, tmp)) == MOE_OK && rename(tmp, path) != 0) {
        st = moe_error(MOE_EIO, "%s: cannot rewrite: %s", path, strerror(errno));
    }
    if (st) remove(tmp);
    return st;
}
