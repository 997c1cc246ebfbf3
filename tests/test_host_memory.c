// cpu_host_alloc (layers/cpu/host_memory.c): every buffer zeroed and writable end to end; those
// of 2 MiB or more 2 MiB-aligned, advised for transparent huge pages where the kernel has them
// (the "hg" flag of the mapping holding the buffer, /proc/self/smaps), not with
// MOE_HUGE_PAGES=0, and resident only as far as written (the memory plan counts on it). Under
// AddressSanitizer the buffers are calloc's: only the first is checked.
#define _POSIX_C_SOURCE 200809L // setenv
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "layers/cpu/cpu_backend.h"
#include "test_util.h"

enum { MIB = 1 << 20 };

static double resident_mib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, rss = 0;
    if (!f || fscanf(f, "%ld %ld", &size, &rss) != 2) {
        perror("/proc/self/statm");
        exit(2);
    }
    fclose(f);
    return (double)rss * (double)sysconf(_SC_PAGESIZE) / MIB;
}

// 1: the mapping holding p has VmFlags "hg" (MADV_HUGEPAGE); 0: it has not; -1: not found.
static int advised_huge(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int inside = 0, found = -1;
    const uintptr_t a = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = a >= lo && a < hi;
            continue;
        }
        if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            found = strstr(line, " hg") != NULL;
            break;
        }
    }
    fclose(f);
    return found;
}

static int kernel_has_thp(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return 0;
    char mode[128] = "";
    const int ok = fgets(mode, sizeof mode, f) != NULL;
    fclose(f);
    return ok && strstr(mode, "[never]") == NULL;
}

// A buffer of `bytes`: zero everywhere, then written end to end; returns it (to free).
static unsigned char *zeroed(size_t bytes) {
    unsigned char *p = cpu_host_alloc(bytes);
    char what[96];
    snprintf(what, sizeof what, "%zu bytes: allocated", bytes);
    check_true(what, p != NULL);
    if (!p) exit(1);
    size_t nonzero = 0;
    for (size_t i = 0; i < bytes; i++) nonzero += p[i] != 0;
    snprintf(what, sizeof what, "%zu bytes: all zero", bytes);
    check_true(what, nonzero == 0);
    memset(p, 0xa5, bytes);
    return p;
}

// 64 MiB allocated: resident only once written.
static void lazy(void) {
    const double r0 = resident_mib();
    unsigned char *p = cpu_host_alloc(64 * MIB);
    const double r1 = resident_mib();
    for (size_t i = 0; i < 64 * MIB; i += 4096) p[i] = 1;
    const double r2 = resident_mib();
    printf("resident: %.1f MiB, allocated %.1f, written %.1f\n", r0, r1, r2);
    check_true("64 MiB allocated: under 4 MiB more resident", r1 - r0 < 4);
    check_true("64 MiB written: 60 MiB or more resident", r2 - r0 >= 60);
    cpu_host_free(p);
}

int main(void) {
    const size_t sizes[] = {0, 1, 4096, 2 * MIB - 1, 2 * MIB, 5 * MIB + 3, 33 * MIB};
    const int asan = CPU_ASAN;
    if (asan) printf("(AddressSanitizer: calloc's buffers, only zeroing checked)\n");
    if (!asan) lazy();
    const int thp = kernel_has_thp() && !asan;
    for (int round = 0; round < 2; round++) // the second round reuses what the first freed
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            unsigned char *p = zeroed(sizes[s]);
            char what[96];
            if (sizes[s] >= 2 * MIB && !asan) {
                snprintf(what, sizeof what, "%zu bytes: 2 MiB-aligned", sizes[s]);
                check_true(what, (uintptr_t)p % (2 * MIB) == 0);
                if (thp) {
                    snprintf(what, sizeof what, "%zu bytes: advised for huge pages", sizes[s]);
                    check_true(what, advised_huge(p) == 1);
                }
            }
            cpu_host_free(p);
        }
    if (!thp && !asan)
        printf("(no transparent huge pages in this kernel: the advice is not checked)\n");
    setenv("MOE_HUGE_PAGES", "0", 1);
    unsigned char *p = zeroed(9 * MIB);
    if (!asan) check_true("MOE_HUGE_PAGES=0: not advised", advised_huge(p) == 0);
    cpu_host_free(p);
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
