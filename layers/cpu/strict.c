// Strict mode of the CPU backend ("cpu-strict", tests only): device memory the host cannot
// touch, so the CPU proves what a GPU would require. Every allocation is its own anonymous
// mapping of whole pages, PROT_NONE while no kernel runs; a kernel scope (CPU_KERNEL, the
// typed copies, zero) makes every allocation readable and writable until it returns. A host
// dereference of backend memory outside a kernel is a SIGSEGV, which the handler below
// reports with the address and the allocation it falls in, then dies of.
//
// Cost: two mprotect calls per live allocation per kernel call; fine for tests, far too slow
// for training.
#define _DEFAULT_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "layers/cpu/cpu_backend.h"

// The strict backends whose regions the signal handler searches: a test's own backend and,
// side by side with it, the trainer's (test_checkpoint runs moe_trainer_run under cpu-strict).
#define STRICT_LIVE_MAX 8
static cpu_state *volatile strict_live[STRICT_LIVE_MAX];

static size_t page_round(size_t bytes) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (bytes ? bytes + page - 1 : page) / page * page;
}

static void protect_all(cpu_state *s, int prot) {
    for (int i = 0; i < s->n_regions; i++)
        if (mprotect(s->regions[i].base, s->regions[i].len, prot) != 0) {
            perror("cpu-strict: mprotect");
            abort();
        }
}

// The region of a live strict backend that holds address a, or NULL.
static const cpu_region *region_of(uintptr_t a) {
    for (int j = 0; j < STRICT_LIVE_MAX; j++) {
        const cpu_state *s = strict_live[j];
        for (int i = 0; s && i < s->n_regions; i++) {
            const uintptr_t b = (uintptr_t)s->regions[i].base;
            if (a >= b && a < b + s->regions[i].len) return &s->regions[i];
        }
    }
    return NULL;
}

// What SIGSEGV did before the first strict backend: the default action, or a sanitizer's
// handler (ASan installs one at start-up).
static struct sigaction previous_segv;
static int handler_installed;

// Async-signal-safe: write(2) of a fixed buffer, then the previous handler: restored, and the
// faulting access runs again when this returns, now into it (the default action: death by
// SIGSEGV; ASan: its report with the stack of the access). A SIGSEGV sent by kill or raise
// (no faulting access to run again) is raised again instead.
static void on_segv(int sig, siginfo_t *info, void *ctx) {
    (void)ctx;
    const uintptr_t a = (uintptr_t)info->si_addr;
    const cpu_region *r = info->si_code > 0 ? region_of(a) : NULL;
    if (r) {
        char msg[160];
        int n = snprintf(msg, sizeof msg,
                         "cpu-strict: the host touched backend memory outside a kernel: "
                         "address %p, byte %zu of an allocation of %zu\n",
                         info->si_addr, (size_t)(a - (uintptr_t)r->base), r->len);
        if (n > 0 && write(2, msg, (size_t)n) < 0) n = 0;
    }
    sigaction(sig, &previous_segv, NULL);
    if (info->si_code <= 0) raise(sig);
}

static void install_handler(cpu_state *s) {
    for (int j = 0; j < STRICT_LIVE_MAX; j++)
        if (!strict_live[j] || strict_live[j] == s) {
            strict_live[j] = s;
            break;
        }
    if (handler_installed) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &previous_segv) == 0) handler_installed = 1;
}

void *cpu_strict_alloc(moe_backend *be, size_t bytes) {
    cpu_state *s = be->state;
    if (s->n_regions == s->cap_regions) {
        const int cap = s->cap_regions ? 2 * s->cap_regions : 64;
        cpu_region *r = realloc(s->regions, (size_t)cap * sizeof *r);
        if (!r) return NULL;
        s->regions = r, s->cap_regions = cap;
    }
    const size_t len = page_round(bytes);
    void *p = mmap(NULL, len, s->depth > 0 ? PROT_READ | PROT_WRITE : PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); // zero-filled
    if (p == MAP_FAILED) return NULL;
    if (s->n_regions == 0) install_handler(s);
    s->regions[s->n_regions++] = (cpu_region){p, len};
    return p;
}

void cpu_strict_free(moe_backend *be, void *ptr) {
    cpu_state *s = be->state;
    for (int i = 0; i < s->n_regions; i++)
        if (s->regions[i].base == ptr) {
            munmap(ptr, s->regions[i].len);
            s->regions[i] = s->regions[--s->n_regions];
            return;
        }
    fprintf(stderr, "cpu-strict: free of %p, which this backend did not allocate\n", ptr);
    abort();
}

void cpu_strict_release(moe_backend *be) {
    cpu_state *s = be->state;
    for (int i = 0; i < s->n_regions; i++) munmap(s->regions[i].base, s->regions[i].len);
    free(s->regions);
    s->regions = NULL, s->n_regions = s->cap_regions = 0;
    for (int j = 0; j < STRICT_LIVE_MAX; j++)
        if (strict_live[j] == s) strict_live[j] = NULL;
}

void cpu_strict_open(moe_backend *be) {
    cpu_state *s = be->state;
    if (s->strict && s->depth++ == 0) protect_all(s, PROT_READ | PROT_WRITE);
}

void cpu_strict_close(moe_backend **scope) {
    cpu_state *s = (*scope)->state;
    if (s->strict && --s->depth == 0) protect_all(s, PROT_NONE);
}
