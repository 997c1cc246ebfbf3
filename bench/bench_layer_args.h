// The MoE-layer benchmarks' shape and timing options (bench_moe_layer on the CPU,
// bench_moe_layer_gpu on the device): --T --d --ff --E --k --reps --warmup --json, the entries
// of each program's option table (cli/options.h), with that program's defaults.
#ifndef MOE_BENCH_LAYER_ARGS_H
#define MOE_BENCH_LAYER_ARGS_H

#include <stdint.h>

#include "cli/options.h"

typedef struct {
    int64_t T, d, ff, E, k; // tokens, model width, expert width, experts, top-k
    int64_t reps, warmup;   // timed repetitions (their median is reported), untimed ones first
    int json;               // one JSON line instead of the text line
    int dtype;              // bench_moe_layer --dtype: 0 fp32, 1 bf16
    int64_t shared;         // bench_moe_layer --shared: a shared expert's width (0: none)
} bench_layer_args;

#define BENCH_STR_(x) #x
#define BENCH_STR(x) BENCH_STR_(x)

// The table entries, defaults T d ff E k reps warmup (numbers: they are also the help's).
#define BENCH_LAYER_OPTIONS(T_, d_, ff_, E_, k_, reps_, warmup_)                       \
    {"--T",         CLI_INT(bench_layer_args, T), .value = "T",    .lo = 1,            \
     .hi = 1 << 24, .def = BENCH_STR(T_),         .help = "tokens"},                   \
        {"--d",         CLI_INT(bench_layer_args, d), .value = "D",         .lo = 1,   \
         .hi = 1 << 24, .def = BENCH_STR(d_),         .help = "model width"},          \
        {"--ff",        CLI_INT(bench_layer_args, ff), .value = "FF",         .lo = 1, \
         .hi = 1 << 24, .def = BENCH_STR(ff_),         .help = "expert width"},        \
        {"--E",      CLI_INT(bench_layer_args, E), .value = "E",     .lo = 1,          \
         .hi = 4096, .def = BENCH_STR(E_),         .help = "experts"},                 \
        {"--k",                                                                        \
         CLI_INT(bench_layer_args, k),                                                 \
         .value = "K",                                                                 \
         .lo = 1,                                                                      \
         .hi = 4096,                                                                   \
         .def = BENCH_STR(k_),                                                         \
         .help = "experts per token, top-k"},                                          \
        {"--reps",                                                                     \
         CLI_INT(bench_layer_args, reps),                                              \
         .value = "N",                                                                 \
         .lo = 1,                                                                      \
         .hi = 1000,                                                                   \
         .def = BENCH_STR(reps_),                                                      \
         .help = "timed repetitions (their median is reported)"},                      \
        {"--warmup",                                                                   \
         CLI_INT(bench_layer_args, warmup),                                            \
         .value = "N",                                                                 \
         .lo = 0,                                                                      \
         .hi = 1000000,                                                                \
         .def = BENCH_STR(warmup_),                                                    \
         .help = "untimed repetitions first"},                                         \
    {                                                                                  \
        "--json", CLI_FLAG(bench_layer_args, json),                                    \
            .help = "one JSON line instead of the text line"                           \
    }

#endif
