// `moe stats` (stats_cli, train/stats/stats.h) on a run folder whose expert_load.jsonl is the
// input (no metrics.jsonl, no config.cfg: both are optional for the report). Twice: the
// text report, and the JSON one over a short window, whose code paths differ. The exit
// status must be 0 (report) or 1 (malformed input): 2 is a usage error, and our usage is fixed.
#include "fuzz.h"
#include "train/stats/stats.h"

static void run_stats(int argc, char **argv) {
    const int rc = stats_cli(argc, argv, fuzz_devnull(), fuzz_devnull());
    if (rc != 0 && rc != 1) fuzz_fail("moe stats %s: exit status %d", argv[0], rc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[FUZZ_PATH_MAX], path[FUZZ_PATH_MAX];
    fuzz_dir(dir, sizeof dir, "run");
    fuzz_write(path, sizeof path, dir, "expert_load.jsonl", data, size);
    char json[] = "--json", window[] = "--window", two[] = "2";
    char *report[] = {dir, NULL}, *json_report[] = {dir, json, window, two, NULL};
    run_stats(1, report);
    run_stats(4, json_report);
    return 0;
}
