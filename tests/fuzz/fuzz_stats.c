// `moe stats` (stats_cli, stats/stats.h) on a run folder whose expert_load.jsonl is the
// input, through every mode and both logs' reader (stats/records.h):
//   - without config.cfg (optional for the report): the text report, and the JSON one over a
//     short window, whose code paths differ;
//   - with a fixed config.cfg (4 experts, 2 layers, top-2: the corpus seeds' model), which
//     --capacity and --placement need: --capacity --json, --placement 2 --json, and one
//     refresh of --watch (whose metrics reader reads the input as metrics.jsonl).
// The exit status must be 0 (report) or 1 (malformed input): 2 is a usage error, and our usage
// is fixed.
#include <string.h>

#include "fuzz.h"
#include "stats/stats.h"

static const char config[] =
    "model = { vocab_size = 16; d_model = 8; n_layers = 2; n_heads = 2; n_kv_heads = 1;\n"
    "          d_ff = 4; n_experts = 4; top_k = 2; max_seq_len = 16; capacity_factor = 1.25; };\n"
    "train = { steps = 3; batch_size = 2; seq_len = 8; warmup_steps = 1; };\n";

static void run_stats(int argc, char **argv) {
    const int rc = stats_cli(argc, argv, fuzz_devnull(), fuzz_devnull());
    if (rc != 0 && rc != 1) fuzz_fail("moe stats %s %s: exit status %d", argv[0], argv[1], rc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[FUZZ_PATH_MAX], path[FUZZ_PATH_MAX];
    fuzz_dir(dir, sizeof dir, "run");
    fuzz_clear(dir);
    fuzz_write(path, sizeof path, dir, "expert_load.jsonl", data, size);
    char json[] = "--json", window[] = "--window", two[] = "2", capacity[] = "--capacity",
         placement[] = "--placement", watch[] = "--watch", count[] = "--count", one[] = "1";
    char *report[] = {dir, NULL}, *json_report[] = {dir, json, window, two, NULL};
    run_stats(1, report);
    run_stats(4, json_report);
    fuzz_write(path, sizeof path, dir, "config.cfg", (const uint8_t *)config, strlen(config));
    char *cap[] = {dir, capacity, json, NULL}, *place[] = {dir, placement, two, json, NULL};
    run_stats(3, cap);
    run_stats(4, place);
    fuzz_write(path, sizeof path, dir, "metrics.jsonl", data, size);
    char *refresh[] = {dir, watch, count, one, NULL};
    run_stats(4, refresh);
    return 0;
}
