// The CPU backend's memory: zeroed host buffers, the large ones on 2 MiB pages.
//
// Why: a training step sweeps tens of MiB (parameters, gradients, AdamW's moments, the
// activations) in patterns a 4 KiB-page TLB cannot hold: one expert's rows of a [N, 2 d_ff]
// fp32 matrix are 3 KiB apart, so a GEMM's 32-row block of C touches 24 pages. Linux backs
// anonymous memory with transparent huge pages only where asked (madvise mode, the default of
// most distributions), and malloc does not ask. Asking for every buffer of at least 2 MiB:
// shakespeare.cfg's step, 2 threads of a Xeon with AMX, bf16 85-90 -> 73-76 ms, fp32
// 183-189 -> 169-176 ms (docs/measurements/2026-12-06-huge-pages-xeon.md).
//
// A large buffer is its own anonymous mapping, 2 MiB-aligned, advised before anything touches
// it. Its pages are the kernel's zero-filled ones on first touch, so memory is taken as far as
// the buffer is written, as with calloc (the memory plan counts on it: expert buffers sized
// for the worst routing are written as far as the routing reaches). Only whole 2 MiB pages
// are advised; the tail stays on small pages. The kernel may still refuse (fragmented memory,
// THP "never"): then the pages are small and nothing else changes. MOE_HUGE_PAGES=0 in the
// environment turns the advice off (to measure what it gives). Under AddressSanitizer buffers
// are plain calloc, whose redzones catch a kernel writing past a buffer's end.
#define _DEFAULT_SOURCE // madvise, MADV_HUGEPAGE, MAP_ANONYMOUS
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "layers/cpu/cpu_kernels.h"

#if defined(MADV_HUGEPAGE) && !CPU_ASAN

enum { HUGE_PAGE = 2 << 20 };

// The large buffers' mappings, for cpu_host_free (tens of buffers: a list suffices).
typedef struct {
    void *p;
    size_t len;
} mapping;
static mapping *maps;
static size_t n_maps, cap_maps;
static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;

static int huge_pages_wanted(void) {
    const char *e = getenv("MOE_HUGE_PAGES");
    return !(e && strcmp(e, "0") == 0);
}

static int remember(void *p, size_t len) {
    pthread_mutex_lock(&maps_lock);
    if (n_maps == cap_maps) {
        const size_t cap = cap_maps ? 2 * cap_maps : 64;
        mapping *m = realloc(maps, cap * sizeof *m);
        if (!m) {
            pthread_mutex_unlock(&maps_lock);
            return 0;
        }
        maps = m, cap_maps = cap;
    }
    maps[n_maps++] = (mapping){p, len};
    pthread_mutex_unlock(&maps_lock);
    return 1;
}

// The length of p's mapping, forgotten; 0 when p is not one.
static size_t forget(void *p) {
    size_t len = 0;
    pthread_mutex_lock(&maps_lock);
    for (size_t i = 0; i < n_maps; i++)
        if (maps[i].p == p) {
            len = maps[i].len;
            maps[i] = maps[--n_maps];
            break;
        }
    pthread_mutex_unlock(&maps_lock);
    return len;
}

// bytes rounded up to pages, at a 2 MiB boundary: map 2 MiB more, unmap both ends' excess.
static void *map_aligned(size_t bytes) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (bytes + page - 1) / page * page,
                 span = len + HUGE_PAGE;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (raw + span > p + len) munmap(p + len, (size_t)(raw + span - (p + len)));
    (void)madvise(p, len / HUGE_PAGE * HUGE_PAGE, MADV_HUGEPAGE);
    if (!remember(p, len)) {
        munmap(p, len);
        return NULL;
    }
    return p;
}

void *cpu_host_alloc(size_t bytes) {
    if (bytes >= HUGE_PAGE && huge_pages_wanted()) return map_aligned(bytes);
    return calloc(1, bytes ? bytes : 1);
}

void cpu_host_free(void *p) {
    const size_t len = p ? forget(p) : 0;
    if (len)
        munmap(p, len);
    else
        free(p);
}

#else // no transparent huge pages to ask for, or AddressSanitizer's allocator

void *cpu_host_alloc(size_t bytes) { return calloc(1, bytes ? bytes : 1); }
void cpu_host_free(void *p) { free(p); }

#endif
