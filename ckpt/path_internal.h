// Private to ckpt/: paths inside checkpoint folders (the checkpoint files, hf_config.c). Every folder argument is
// checked against PATH_ARG_MAX on entry (check_path_arg), so the names appended with
// path_fmt always fit in a PATH_BUF.
#ifndef MOE_CKPT_PATH_INTERNAL_H
#define MOE_CKPT_PATH_INTERNAL_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "layers/status.h"

#define PATH_BUF 2048
#define SMALL_FILE_MAX ((size_t)64 << 20) // the largest JSON (an index) or `latest` file we read
#define PATH_ARG_MAX 1024 // longest folder argument; leaves room for the names appended

// snprintf for paths.
__attribute__((format(printf, 3, 4))) static inline void path_fmt(char *buf, size_t n,
                                                                  const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}

static inline moe_status check_path_arg(const char *path) {
    if (strlen(path) > PATH_ARG_MAX)
        return moe_error(MOE_EINVAL, "%.64s...: path longer than %d characters", path,
                         PATH_ARG_MAX);
    return MOE_OK;
}

#endif
