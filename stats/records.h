// The one validated reader of a run's logs (DESIGN.md §5.4), for every `moe stats` mode (the
// report, --capacity, --placement, --watch): each line of expert_load.jsonl or metrics.jsonl
// becomes a checked record, or an error naming the file, the line and the field.
//
// A log is a regular file (data/files.h: a FIFO or /dev/zero is refused, not read) of at most
// 64 GiB, each line at most 256 MiB without NUL bytes. Blank lines are skipped; a last line
// without its newline that does not parse is a write in progress: skipped, its number kept.
// expert_load.jsonl, per record:
//   step       an integer in [1, 2^53]; per layer strictly increasing (a repeated or
//              decreasing step is an error naming both)
//   layer      an integer in [0, n_layers) (config.cfg's model.n_layers), else [0, 65536)
//   counts     E non-negative integers <= 2^53 (E: config.cfg's n_experts, else the first
//              record's), the same E in every record
//   kept       null or E counts with kept[e] <= counts[e]
//   tokens, capacity      null or integers in [0, 2^53]
//   dropped    null or a number in [0, 2^53]
//   entropy, aux, z, seq_aux   null or numbers (finite)
//   exchange_s null or a time in [0, 1e7] seconds
//   ranks      an integer in [1, 65536], the same in every record
//   micro_counts  null or rows of E counts, one per micro-batch (train.grad_accum x ranks
//              of them when config.cfg is known), whose sum is "counts"
//   coactivation  null or E (E - 1) / 2 counts (the upper triangle of the pair counts)
// metrics.jsonl, per record:
//   step       as above, strictly increasing
//   loss, ce, aux, z, lr, grad_norm, tokens_per_s, val_loss: null or numbers (finite); lr,
//              grad_norm, tokens_per_s >= 0
//   step_s     null or a time in [0, 1e7] seconds
//   skipped    null or a boolean
//   time       (unless skipped) an object with a time in [0, 1e7] for every phase
//   capacity_factor   null or a number in [0, 1e6]
#ifndef MOE_TRAIN_STATS_RECORDS_H
#define MOE_TRAIN_STATS_RECORDS_H

#include "layers/status.h"
#include "layers/timing.h"

#define STATS_MAX_EXPERTS 65536
#define STATS_MAX_LAYERS 65536
#define STATS_MAX_SECONDS 1e7 // a time field beyond this (116 days) is damage, not a time

// metrics.jsonl's "time" (layers/timing.h): the phases, then these
enum {
    STATS_TIME_OPTIMIZER = MOE_T_PHASES,
    STATS_TIME_EXCHANGE,
    STATS_TIME_VALIDATION,
    STATS_TIME_CHECKPOINT,
    STATS_TIME_N
};
// Phase i's name in "time" (i < STATS_TIME_N).
const char *stats_time_name(int i);

typedef struct {
    long line; // its line in the file
    long step, layer;
    const long *counts;                      // [E] assignments routed to each expert
    const long *kept;                        // [E], or NULL when absent or null
    long tokens, capacity;                   // -1 when absent or null
    long ranks;                              // 0 when absent (one rank)
    double dropped, entropy, aux, z, exch_s; // NaN when absent or null
    const long *micro;                       // [n_micro][E] per micro-batch, or NULL
    int n_micro;
    const long *coact; // [E (E-1) / 2] pair counts, or NULL when absent or null
} stats_load_rec;

typedef struct {
    long line, step;
    double step_s; // NaN when absent, null or skipped
    int skipped;
    int has_time;
    double time[STATS_TIME_N];
    double capacity_factor; // NaN when absent or null
} stats_metrics_rec;

// What a reader needs to know of the run, and what it tells back.
typedef struct {
    const char *path;     // the log
    const char *cfg_path; // its run's config.cfg, named in errors about it (NULL: none)
    int E;                // experts (config.cfg), or 0: the first record's, written back here
    int n_layers;         // model.n_layers (config.cfg), or 0: unknown
    int grad_accum;       // train.grad_accum (config.cfg), or 0: unknown (any micro_counts rows)
    long from;            // records of earlier steps are checked but not passed on (0: none)
    int required;         // a missing file is an error (else `missing` is set)
    // told back
    int missing;  // the file does not exist (not required)
    long partial; // the number of a partial last line that was skipped, 0: none
    int ranks;    // "ranks" of the records, 0: none
} stats_log;

typedef moe_status (*stats_load_fn)(void *ctx, const stats_load_rec *r);
typedef moe_status (*stats_metrics_fn)(void *ctx, const stats_metrics_rec *r);

// Reads lg->path as expert_load.jsonl, calling fn for every valid record at or after lg->from
// (the first error stops it; fn's errors too).
moe_status stats_read_load(stats_log *lg, stats_load_fn fn, void *ctx);

// Reads lg->path as metrics.jsonl (E, n_layers and grad_accum unused).
moe_status stats_read_metrics(stats_log *lg, stats_metrics_fn fn, void *ctx);

#endif
