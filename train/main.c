// moe: the one command line. Subcommands: prepare, train.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/prepare.h"
#include "train/config.h"
#include "train/trainer.h"

static const char *usage =
    "usage: moe <command> [options]\n"
    "\n"
    "  moe prepare --text FILE_OR_DIR... --out DIR [--val-fraction F]\n"
    "      byte-tokenize text files into DIR/train.bin and DIR/val.bin (vocab 256)\n"
    "  moe train CONFIG [--set group.key=value]...\n"
    "      train the model a libconfig file describes (see configs/default.cfg)\n";

static int cmd_prepare(int argc, char **argv) {
    const char *sources[MOE_MAX_TEXT_SOURCES], *out = NULL;
    int n = 0;
    double val_fraction = 0.1;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--text")) {
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
                if (n == MOE_MAX_TEXT_SOURCES)
                    moe_fatal("prepare: at most %d --text sources", MOE_MAX_TEXT_SOURCES);
                sources[n++] = argv[++i];
            }
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--val-fraction") && i + 1 < argc) {
            char *end;
            val_fraction = strtod(argv[++i], &end);
            if (*end) moe_fatal("prepare: --val-fraction '%s' is not a number", argv[i]);
        } else {
            moe_fatal("prepare: unknown argument '%s'\n%s", argv[i], usage);
        }
    }
    if (!n || !out) moe_fatal("prepare: --text and --out are required\n%s", usage);
    uint64_t n_train, n_val;
    if (data_prepare_text(sources, n, out, val_fraction, &n_train, &n_val))
        moe_fatal("%s", moe_last_error());
    printf("%s/train.bin: %llu tokens, %s/val.bin: %llu tokens\n", out,
           (unsigned long long)n_train, out, (unsigned long long)n_val);
    return 0;
}

static int cmd_train(int argc, char **argv) {
    if (argc < 1 || argv[0][0] == '-') moe_fatal("train: a CONFIG file is required\n%s", usage);
    const char *path = argv[0];
    char **sets = calloc((size_t)argc, sizeof(char *));
    int n_set = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc) sets[n_set++] = argv[++i];
        else if (!strncmp(argv[i], "--set=", 6)) sets[n_set++] = argv[i] + 6;
        else moe_fatal("train: unknown argument '%s'\n%s", argv[i], usage);
    }
    moe_train_config *cfg = malloc(sizeof *cfg);
    if (!cfg) moe_fatal("out of memory");
    if (moe_train_config_load(cfg, path, n_set, sets)) moe_fatal("%s", moe_last_error());
    free(sets);
    trainer_result res;
    moe_status st = trainer_run(cfg, NULL, &res);
    free(cfg);
    if (st) moe_fatal("%s", moe_last_error());
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "prepare")) return cmd_prepare(argc - 2, argv + 2);
    if (!strcmp(argv[1], "train")) return cmd_train(argc - 2, argv + 2);
    moe_fatal("unknown command '%s'\n%s", argv[1], usage);
}
