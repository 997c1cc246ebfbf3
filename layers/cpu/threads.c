// How many threads the CPU backend uses. OpenMP on its own starts one thread per core it may
// run on, but a container is often allowed less CPU time than it sees cores (a cgroup CPU
// quota: 64 cores visible, 2 CPUs' worth of time). Threads beyond the quota only wait on
// each other at every parallel region, so the automatic choice is capped by the quota.
#include <stdio.h>
#include <stdlib.h>

#include <omp.h>

#include "layers/cpu/cpu_backend.h"

// The first integer of a file; 0 when it cannot be read.
static int read_first_integer(const char *path, long long *value) {
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return 0;
    const int ok = fscanf(f, "%lld", value) == 1;
    fclose(f);
    return ok;
}

int moe_cpu_quota_cores(const char *cpu_max_path, const char *cfs_quota_path,
                        const char *cfs_period_path) {
    long long quota = -1, period = 0;
    FILE *f = cpu_max_path ? fopen(cpu_max_path, "r") : NULL;
    if (f) { // cgroup v2: "QUOTA PERIOD" or "max PERIOD"
        char word[32];
        if (fscanf(f, "%31s %lld", word, &period) == 2 && word[0] != 'm') {
            char *end;
            quota = strtoll(word, &end, 10);
            if (*end) quota = -1;
        }
        fclose(f);
    } else if (!read_first_integer(cfs_quota_path, &quota) || // cgroup v1; quota -1 = none
               !read_first_integer(cfs_period_path, &period)) {
        return 0;
    }
    if (quota <= 0 || period <= 0) return 0;
    const long long cores = (quota + period - 1) / period; // 1.5 CPUs of time -> 2 threads
    return cores > 4096 ? 4096 : (int)cores;
}

int moe_cpu_threads(int requested) {
    if (requested > 0) {
        omp_set_num_threads(requested);
        moe_blas_set_threads(requested);
        return requested;
    }
    const char *env = getenv("OMP_NUM_THREADS");
    if (env && *env) { // the user's choice stands
        moe_blas_set_threads(omp_get_max_threads());
        return omp_get_max_threads();
    }
    int n = omp_get_num_procs();
    const int quota =
        moe_cpu_quota_cores("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
                            "/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    if (quota > 0 && quota < n) n = quota;
    if (n < 1) n = 1;
    omp_set_num_threads(n);
    moe_blas_set_threads(n);
    return n;
}
