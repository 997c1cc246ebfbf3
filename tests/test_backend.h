// The backend the C tests run on: $MOE_TEST_DEVICE (ctest's *_strict variants set
// "cpu-strict", where any host access to backend memory faults; the *_cuda ones "cuda"), else
// "cpu". Created once,
// on first use, and kept for the life of the test program.
#ifndef MOE_TEST_BACKEND_H
#define MOE_TEST_BACKEND_H

#include <stdio.h>
#include <stdlib.h>

#include "layers/backend.h"

static inline moe_backend *test_backend(void) {
    static moe_backend *be;
    if (!be) {
        const char *name = getenv("MOE_TEST_DEVICE");
        if (moe_backend_create(&be, name && *name ? name : "cpu", NULL)) {
            fprintf(stderr, "test backend: %s\n", moe_last_error());
            // the GPU variants of the tests (MOE_TEST_SKIP_UNAVAILABLE=1): skipped (ctest's
            // SKIP_RETURN_CODE 77) on a machine without the device, failed elsewhere
            const char *skip = getenv("MOE_TEST_SKIP_UNAVAILABLE");
            exit(skip && *skip == '1' ? 77 : 1);
        }
    }
    return be;
}

#endif
