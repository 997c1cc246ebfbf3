// One error path for the whole project.
// Library functions return a moe_status and leave a message (what, where, why)
// that moe_last_error() returns; programs turn a failure into moe_fatal().
#ifndef MOE_STATUS_H
#define MOE_STATUS_H

typedef enum {
    MOE_OK = 0,
    MOE_EINVAL,   // an argument or a config value is out of its contract
    MOE_ENOMEM,   // an allocation failed
    MOE_EIO,      // a file could not be read or written, or is malformed
    MOE_ENUMERIC, // a non-finite value where a finite one is required
} moe_status;

// Records a message for the calling thread and returns `code`, so that
// `return moe_error(MOE_EINVAL, "top_k=%d exceeds n_experts=%d", k, E);` reads well.
moe_status moe_error(moe_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Prefixes the current message with "<context>: " (e.g. the layer or file) and returns code.
moe_status moe_error_context(moe_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

// The message of the last failed call on this thread ("" if none).
const char *moe_last_error(void);

// Short name of a status code ("invalid argument", ...).
const char *moe_status_name(moe_status code);

// Prints "moe: error: <message>" to stderr and exits with status 1.
_Noreturn void moe_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// How moe_fatal ends the process: exit (the default), or under expert parallelism the
// exchange's abort (MPI_Abort: every rank ends, not just this one), with messages prefixed
// "rank R: ". NULL restores exit.
void moe_set_fatal_exit(void (*exit_fn)(int code), int rank);

#endif
