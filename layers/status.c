#include "layers/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static _Thread_local char last_error[1024];

moe_status moe_error(moe_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

moe_status moe_error_context(moe_status code, const char *fmt, ...) {
    char prefix[256], old[sizeof last_error];
    snprintf(old, sizeof old, "%s", last_error);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    // a message longer than the buffer is cut, which is fine for a message
    if (snprintf(last_error, sizeof last_error, "%s: %s", prefix, old) < 0) last_error[0] = 0;
    return code;
}

const char *moe_last_error(void) { return last_error; }

const char *moe_status_name(moe_status code) {
    switch (code) {
    case MOE_OK: return "ok";
    case MOE_EINVAL: return "invalid argument";
    case MOE_ENOMEM: return "out of memory";
    case MOE_EIO: return "input/output error";
    case MOE_ENUMERIC: return "non-finite value";
    }
    return "unknown status";
}

static void (*fatal_exit)(int code) = exit;
static int fatal_rank = -1;

void moe_set_fatal_exit(void (*exit_fn)(int code), int rank) {
    fatal_exit = exit_fn ? exit_fn : exit;
    fatal_rank = exit_fn ? rank : -1;
}

void moe_fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (fatal_rank >= 0)
        fprintf(stderr, "moe: error: rank %d: ", fatal_rank);
    else
        fputs("moe: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stdout);
    fatal_exit(1);
    exit(1); // an exit hook returns only if it failed
}
