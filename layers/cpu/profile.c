// MOE_PROFILE=1: a time table of the CPU kernels, printed on stderr when the process exits.
//
// Every kernel opens with CPU_KERNEL(be), which also opens a profile scope here: with the
// variable unset that is one test of a flag; with it set, two clock reads per call and a sum
// per kernel (the outermost kernel scope only, so nothing is counted twice). The table sorts
// the kernels by time and splits them into the expert and dense GEMMs (cpu_*matmul*),
// attention (its small GEMMs and its softmax together) and the rest, against the wall time
// from the first kernel's start to the last one's end; what is not in any kernel is the host's
// orchestration (the layers, the optimizer's loop over regions, logging, data).
// MOE_PROFILE_FROM=N narrows the table to training steps N .. the last (layers/profile.h).
#define _POSIX_C_SOURCE 200809L // clock_gettime
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "layers/cpu/cpu_kernels.h"
#include "layers/profile.h"

#define PROFILE_SLOTS 96

typedef struct {
    const char *name; // the kernel's function name
    long calls;
    double seconds;
} profile_slot;
static int cpu_profile_on = -1; // -1: MOE_PROFILE not read yet
static profile_slot slots[PROFILE_SLOTS];
static int n_slots, depth;
static double first_start = -1, last_end;
static int64_t window_from, window_to; // MOE_PROFILE_FROM's steps (0: the whole process)
static int paused, window_open;        // paused: before the window and after its last step

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int by_time(const void *a, const void *b) {
    const double x = ((const profile_slot *)a)->seconds, y = ((const profile_slot *)b)->seconds;
    return (x < y) - (x > y);
}

static void print_table(void) {
    if (window_from && !window_to) {
        fprintf(stderr,
                "\nMOE_PROFILE: no table: the run ended before step %lld (MOE_PROFILE_FROM)\n",
                (long long)window_from);
        return;
    }
    if (!n_slots) return;
    qsort(slots, (size_t)n_slots, sizeof slots[0], by_time);
    double all = 0, gemm = 0, attn = 0;
    for (int i = 0; i < n_slots; i++) {
        all += slots[i].seconds;
        if (strstr(slots[i].name, "matmul")) gemm += slots[i].seconds;
        if (strstr(slots[i].name, "attention")) attn += slots[i].seconds;
    }
    const double wall = last_end - first_start;
    char window[80] = "";
    if (window_to)
        snprintf(window, sizeof window, " of steps %lld..%lld (%lld steps)", (long long)window_from,
                 (long long)window_to, (long long)(window_to - window_from + 1));
    fprintf(stderr, "\nMOE_PROFILE: CPU kernels%s, %.3f s from the first kernel to the last\n",
            window, wall);
    fprintf(stderr, "%-34s %9s %10s %7s\n", "kernel", "calls", "seconds", "% wall");
    for (int i = 0; i < n_slots; i++)
        fprintf(stderr, "%-34s %9ld %10.4f %6.1f%%\n", slots[i].name, slots[i].calls,
                slots[i].seconds, 100 * slots[i].seconds / wall);
    fprintf(stderr,
            "GEMM kernels (cpu_*matmul*) %.3f s = %.1f%%; attention %.3f s = %.1f%%; other "
            "kernels %.3f s = %.1f%%; outside kernels (host) %.3f s = %.1f%%\n",
            gemm, 100 * gemm / wall, attn, 100 * attn / wall, all - gemm - attn,
            100 * (all - gemm - attn) / wall, wall - all, 100 * (wall - all) / wall);
    fprintf(stderr, "outside the GEMM kernels: %.1f%% of the wall time\n",
            100 * (wall - gemm) / wall);
}

static int profile_enabled(void) {
    if (cpu_profile_on < 0) {
        const char *e = getenv("MOE_PROFILE");
        cpu_profile_on = e && *e && strcmp(e, "0");
        const char *from = getenv("MOE_PROFILE_FROM");
        if (cpu_profile_on && from && *from) {
            char *end;
            window_from = strtoll(from, &end, 10);
            if (*end || window_from < 1)
                moe_fatal("MOE_PROFILE_FROM=%s: expected a step number >= 1", from);
            paused = 1; // until that step begins
        }
        if (cpu_profile_on) atexit(print_table);
    }
    return cpu_profile_on;
}

cpu_profile_scope cpu_profile_begin(const char *name, int *slot) {
    cpu_profile_scope s = {NULL, 0, 0};
    if (!profile_enabled() || paused) return s;
    s.depth_taken = 1;
    if (depth++) return s; // nested: the outer kernel counts it
    if (*slot < 0) {
        if (n_slots == PROFILE_SLOTS) return s;
        *slot = n_slots;
        slots[n_slots++].name = name;
    }
    s.slot = slot;
    s.t0 = now();
    if (first_start < 0) first_start = s.t0;
    return s;
}

void cpu_profile_end(cpu_profile_scope *s) {
    if (!s->depth_taken) return;
    depth--;
    if (!s->slot) return;
    last_end = now();
    slots[*s->slot].calls++;
    slots[*s->slot].seconds += last_end - s->t0;
}

// The window opens at the first step from N on (a resumed run may start past N), once.
void moe_profile_step_begin(int64_t step) {
    if (!profile_enabled() || !window_from || window_open || step < window_from) return;
    for (int i = 0; i < n_slots; i++) slots[i].calls = 0, slots[i].seconds = 0;
    first_start = -1, paused = 0, window_open = 1, window_from = step;
}

void moe_profile_step_end(int64_t step, int last) {
    if (!profile_enabled() || !window_open) return;
    window_to = step, paused = last;
}
