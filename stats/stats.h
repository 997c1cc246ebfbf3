// `moe stats`: the expert-load report and capacity planning, read from a run's logs
// (RUN_DIR/expert_load.jsonl, metrics.jsonl and config.cfg; docs/training.md "Console and
// logs", docs/expert-load.md "moe stats").
//
//   moe stats RUN_DIR [--layer L] [--window N] [--alert A] [--from STEP] [--wide] [--json]
//       per MoE layer: max/mean load (mean, P95, P99 over steps), CV, the hottest expert and
//       dead experts of the last window, drop fraction in the first and the last window,
//       router entropy, aux/z trend, exchange share of step time; then the alerts.
//   moe stats RUN_DIR --capacity [--max-drop F] [--layer L] [--from STEP] [--wide] [--json]
//   moe stats RUN_DIR --placement R [--json]
//       an expert-to-rank mapping for R ranks from the load and co-activation logs, beside
//       the contiguous default, random and greedy ones (placement.c)
//   moe stats RUN_DIR --watch [--interval S] [--count N] [options of the two above, no --json]
//       the report (or --capacity) redrawn every S seconds while a run writes its logs, until
//       the run logged its last step (watch.c)
//       per MoE layer: the capacity factor that would have dropped at most F of the
//       assignments on the P99 step and on the worst step, and the expert buffers it needs.
//
// The tables and notes fit 100 columns; --wide prints the full tables (every column) and the
// notes unwrapped. --from STEP ignores the records of earlier steps (both logs).
// A partial last line (a run in progress) is ignored; any other malformed line is an error
// naming the file and the line.
#ifndef MOE_TRAIN_STATS_H
#define MOE_TRAIN_STATS_H

#include <stddef.h>
#include <stdio.h>

#include "config/config.h"
#include "stats/quantile.h" // (the numbers: part of this interface)

// The subcommand: argv[0..argc) are its arguments (RUN_DIR and the options, in any order).
// Writes the report to stdout and messages to stderr. Returns 0 when the report was printed
// (alerts or not), 1 when an input file is missing or malformed, 2 on a usage error.
int stats_main(int argc, char **argv);

// stats_main writing to `out` (the report) and `err` (errors and notes).
int stats_cli(int argc, char **argv, FILE *out, FILE *err);

// --placement R (placement.c): an expert-to-rank mapping for R ranks from dir's
// expert_load.jsonl (read by records.h against cfg, the run's config.cfg: its experts, layers,
// top_k, d_model for the bytes), against the contiguous default, random and greedy ones.
// 0 printed, 1 a bad or missing log, 2 a bad R.
int stats_placement(const char *dir, const moe_train_config *cfg, int R, int json, FILE *out,
                    FILE *err);

#endif
