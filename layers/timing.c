// The clock of layers/timing.h.
#define _POSIX_C_SOURCE 200809L // clock_gettime
#include "layers/timing.h"

#include <time.h>

double moe_clock_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
