// moe_cpu_quota_cores reads cgroup CPU quotas (v2 cpu.max, v1 cfs files) from files written
// here; moe_cpu_threads honours an explicit request.
#include <stdio.h>
#include <stdlib.h>

#include <omp.h>

#include "layers/cpu/cpu_backend.h"
#include "test_util.h"

static const char *spit(const char *name, const char *text) {
    FILE *f = fopen(name, "w");
    if (!f) {
        perror(name);
        exit(2);
    }
    fputs(text, f);
    fclose(f);
    return name;
}

static void v2(const char *text, int want) {
    char what[96];
    snprintf(what, sizeof what, "cpu.max \"%s\" -> %d", text, want);
    check_true(what, moe_cpu_quota_cores(spit("cpu.max", text), NULL, NULL) == want);
}

int main(void) {
    v2("200000 100000\n", 2);
    v2("150000 100000\n", 2); // 1.5 CPUs of time: 2 threads
    v2("50000 100000\n", 1);
    v2("max 100000\n", 0); // no quota
    v2("garbage\n", 0);
    v2("12x 100000\n", 0);
    v2("", 0);
    check_true("no files: 0",
               moe_cpu_quota_cores("no/such/cpu.max", "no/such/q", "no/such/p") == 0);
    spit("cfs_quota_us", "300000\n");
    spit("cfs_period_us", "100000\n");
    check_true("v1 300000/100000 -> 3",
               moe_cpu_quota_cores("no/such/cpu.max", "cfs_quota_us", "cfs_period_us") == 3);
    spit("cfs_quota_us", "-1\n");
    check_true("v1 quota -1 -> 0",
               moe_cpu_quota_cores("no/such/cpu.max", "cfs_quota_us", "cfs_period_us") == 0);
    remove("cpu.max"), remove("cfs_quota_us"), remove("cfs_period_us");
    check_true("an explicit request is applied",
               moe_cpu_threads(3) == 3 && omp_get_max_threads() == 3);
    printf("%d failure(s)\n", test_failures());
    return test_failures() != 0;
}
