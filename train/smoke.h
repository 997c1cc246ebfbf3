// moe smoke CONFIG [--steps N] [--set group.key=value]...: a short run of a config that
// reports what a launch needs to know, and exits non-zero when an alert fires.
#ifndef MOE_SMOKE_H
#define MOE_SMOKE_H

#include <stdint.h>

#include "cli/options.h"

// The arguments of moe smoke, as moe_smoke_cli reads them.
typedef struct {
    const char *config; // CONFIG
    int64_t steps;      // --steps N
    cli_list sets;      // --set group.key=value, in order
} moe_smoke_opts;

// moe smoke's options: its parser (cli_args) and its --help (cli_help).
extern const cli_command moe_smoke_cli;

// The smoke run and its report on stdout: 0 when the gate passes, 1 when a check failed.
int moe_smoke_run(const moe_smoke_opts *o);

// moe_smoke_run with the arguments argv[0..argc) read by moe_smoke_cli: also 0 after --help and 2
// after a usage error (the message and the usage on stderr).
int moe_smoke_main(int argc, char **argv);

#endif
