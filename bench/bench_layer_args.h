// The MoE-layer benchmarks' shape and timing options (bench_moe_layer on the CPU,
// bench_moe_layer_gpu on the device): --T --d --ff --E --k --reps --warmup --json.
#ifndef MOE_BENCH_LAYER_ARGS_H
#define MOE_BENCH_LAYER_ARGS_H

#include <stdlib.h>
#include <string.h>

typedef struct {
    int T, d, ff, E, k; // tokens, model width, expert width, experts, top-k
    int reps, warmup;   // timed repetitions (their median is reported), untimed ones first
    int json;           // one JSON line instead of the text line
} bench_layer_args;

// Takes argv[*i] (and its value, moving *i past it) when it is one of the options above;
// returns whether it was.
static inline int bench_layer_arg(bench_layer_args *a, int argc, char **argv, int *i) {
    const char *s = argv[*i];
    if (!strcmp(s, "--json")) return a->json = 1;
    int *v = !strcmp(s, "--T")        ? &a->T
             : !strcmp(s, "--d")      ? &a->d
             : !strcmp(s, "--ff")     ? &a->ff
             : !strcmp(s, "--E")      ? &a->E
             : !strcmp(s, "--k")      ? &a->k
             : !strcmp(s, "--reps")   ? &a->reps
             : !strcmp(s, "--warmup") ? &a->warmup
                                      : NULL;
    if (!v || *i + 1 >= argc) return 0;
    *v = atoi(argv[++*i]);
    return 1;
}

#endif
