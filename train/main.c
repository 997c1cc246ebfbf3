// moe: the one command line. Subcommands: prepare, train, eval, generate, export.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/prepare.h"
#include "data/token_file.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/infer.h"
#include "train/smoke.h"
#include "train/stats.h"
#include "train/trainer.h"

static const char *usage =
    "usage: moe <command> [options]\n"
    "\n"
    "  moe prepare --text FILE_OR_DIR... --out DIR [--val-fraction F]\n"
    "      byte-tokenize text files into DIR/train.bin and DIR/val.bin (vocab 256)\n"
    "  moe train CONFIG [--set group.key=value]... [--resume RUN_DIR|RUN/ckpt/latest|STEP_DIR]\n"
    "                   [--overwrite]\n"
    "      train the model a libconfig file describes (see configs/default.cfg); a log.dir that\n"
    "      holds a run is refused unless --resume continues it or --overwrite deletes its logs\n"
    "      and checkpoints\n"
    "  moe smoke CONFIG [--steps N] [--set group.key=value]...\n"
    "      N steps (default 10): load table, router logits, drops, memory, tokens/s; exit 1 on an alert\n"
    "  moe stats RUN_DIR [--layer L] [--window N] [--alert A] [--json]\n"
    "  moe stats RUN_DIR --capacity [--max-drop 0.01] [--json]\n"
    "      expert-load report of a run (also while it runs), capacity planning from peaks\n"
    "  moe eval --ckpt DIR --data FILE.bin [--seq-len S] [--max-windows N] [--logits OUT.npy]\n"
    "      dropless loss and perplexity over the token file\n"
    "  moe generate --ckpt DIR --prompt TEXT [-n N] [--temperature T] [--top-k K] [--top-p P]\n"
    "               [--seed S] [--prefill-chunk C] [--stats]\n"
    "      prefill then decode with a KV cache (byte tokenizer)\n"
    "  moe export --ckpt DIR --out DIR [--dtype f32|bf16|f16]\n"
    "      an inference-only Hugging Face Mixtral folder\n"
    "  DIR: a checkpoint folder, RUN/ckpt/latest, or a Hugging Face Mixtral folder\n";

// Parses a number argument or exits naming the option.
static double number_arg(const char *opt, const char *text, double lo, double hi) {
    char *end;
    double v = strtod(text, &end);
    if (*end || end == text || !(v >= lo && v <= hi))
        moe_fatal("%s '%s': expected a number in [%g, %g]", opt, text, lo, hi);
    return v;
}

static int cmd_eval(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL, *logits = NULL;
    int seq_len = 128;
    long max_windows = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) moe_fatal("eval: '%s' needs a value\n%s", a, usage);
        if (!strcmp(a, "--ckpt")) ckpt = v;
        else if (!strcmp(a, "--data")) data = v;
        else if (!strcmp(a, "--logits")) logits = v;
        else if (!strcmp(a, "--seq-len")) seq_len = (int)number_arg(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--max-windows")) max_windows = (long)number_arg(a, v, 0, 1e12);
        else moe_fatal("eval: unknown argument '%s'\n%s", a, usage);
        i++;
    }
    if (!ckpt || !data) moe_fatal("eval: --ckpt and --data are required\n%s", usage);
    token_file tf;
    if (token_file_read(&tf, data)) moe_fatal("%s", moe_last_error());
    model m;
    if (infer_load(&m, ckpt, seq_len, seq_len)) moe_fatal("%s", moe_last_error());
    double loss;
    long n;
    if (infer_eval(&m, &tf, seq_len, max_windows, logits, &loss, &n)) moe_fatal("%s", moe_last_error());
    printf("loss %.6f ppl %.4f tokens %ld\n", loss, exp(loss), n);
    model_destroy(&m);
    token_file_free(&tf);
    return 0;
}

static int cmd_generate(int argc, char **argv) {
    const char *ckpt = NULL, *prompt = NULL;
    int n_new = 200, stats = 0;
    sampling s = {.temperature = 0.8, .top_k = 0, .top_p = 1.0, .seed = 1, .prefill_chunk = 64};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--stats")) {
            stats = 1;
            continue;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) moe_fatal("generate: '%s' needs a value\n%s", a, usage);
        if (!strcmp(a, "--ckpt")) ckpt = v;
        else if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "-n")) n_new = (int)number_arg(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--temperature")) s.temperature = number_arg(a, v, 0, 100);
        else if (!strcmp(a, "--top-k")) s.top_k = (int)number_arg(a, v, 0, 1 << 24);
        else if (!strcmp(a, "--top-p")) s.top_p = number_arg(a, v, 1e-9, 1);
        else if (!strcmp(a, "--seed")) s.seed = (uint64_t)number_arg(a, v, 0, 9007199254740992.0);
        else if (!strcmp(a, "--prefill-chunk")) s.prefill_chunk = (int)number_arg(a, v, 1, 1 << 20);
        else moe_fatal("generate: unknown argument '%s'\n%s", a, usage);
        i++;
    }
    if (!ckpt || !prompt) moe_fatal("generate: --ckpt and --prompt are required\n%s", usage);
    int n_prompt = (int)strlen(prompt);
    model m;
    // the KV cache holds what this call needs (at most max_position_embeddings)
    if (infer_load(&m, ckpt, n_prompt + n_new, s.prefill_chunk)) moe_fatal("%s", moe_last_error());
    if (m.cfg.vocab_size < 256)
        moe_fatal("generate: the model's vocabulary (%d) is not the byte tokenizer's 256",
                  m.cfg.vocab_size);
    int *tokens = malloc((size_t)(n_prompt + 1) * sizeof(int)), *out = malloc((size_t)n_new * sizeof(int));
    byte_tokenize(tokens, prompt, (size_t)n_prompt);
    int n_out;
    if (infer_generate(&m, tokens, n_prompt, n_new, &s, out, &n_out)) moe_fatal("%s", moe_last_error());
    char *text = malloc((size_t)n_out + 1);
    if (byte_detokenize(text, out, (size_t)n_out)) moe_fatal("%s", moe_last_error());
    fwrite(prompt, 1, (size_t)n_prompt, stdout);
    fwrite(text, 1, (size_t)n_out, stdout);
    putchar('\n');
    if (n_out < n_new) fprintf(stderr, "note: stopped after %d tokens: the KV cache (%d positions) is full\n", n_out, m.max_pos);
    if (stats) {
        const int E = m.cfg.moe.n_experts;
        printf("expert hits per layer while decoding %d tokens (top-%d assignments):\n",
               n_out > 0 ? n_out - 1 : 0, m.cfg.moe.top_k);
        for (int l = 0; l < m.cfg.n_layers; l++) {
            printf("  layer %d:", l);
            for (int e = 0; e < E; e++) printf(" %ld", m.expert_hits[(size_t)l * E + e]);
            printf("\n");
        }
    }
    free(tokens), free(out), free(text);
    model_destroy(&m);
    return 0;
}

static int cmd_export(int argc, char **argv) {
    const char *ckpt = NULL, *out = NULL;
    st_dtype dtype = ST_F32;
    for (int i = 0; i + 1 < argc || (i < argc && (moe_fatal("export: '%s' needs a value", argv[i]), 0)); i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--ckpt")) ckpt = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "f32") || !strcmp(v, "float32")) dtype = ST_F32;
            else if (!strcmp(v, "bf16") || !strcmp(v, "bfloat16")) dtype = ST_BF16;
            else if (!strcmp(v, "f16") || !strcmp(v, "float16")) dtype = ST_F16;
            else moe_fatal("export: --dtype '%s': expected f32, bf16 or f16", v);
        } else moe_fatal("export: unknown argument '%s'\n%s", a, usage);
    }
    if (!ckpt || !out) moe_fatal("export: --ckpt and --out are required\n%s", usage);
    model m;
    if (infer_load(&m, ckpt, 1, 1)) moe_fatal("%s", moe_last_error());
    if (hf_export(out, &m, dtype, CHECKPOINT_SHARD_BYTES)) moe_fatal("%s", moe_last_error());
    printf("exported %s (%s, %.2fM parameters) to %s\n", ckpt, st_dtype_name(dtype), m.n_params / 1e6, out);
    model_destroy(&m);
    return 0;
}

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
    const char *resume = NULL;
    int n_set = 0, overwrite = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc) sets[n_set++] = argv[++i];
        else if (!strncmp(argv[i], "--set=", 6)) sets[n_set++] = argv[i] + 6;
        else if (!strcmp(argv[i], "--resume") && i + 1 < argc) resume = argv[++i];
        else if (!strcmp(argv[i], "--overwrite")) overwrite = 1;
        else moe_fatal("train: unknown argument '%s'\n%s", argv[i], usage);
    }
    if (resume && overwrite)
        moe_fatal("train: --resume continues a run and --overwrite deletes it: give one of them");
    moe_train_config *cfg = malloc(sizeof *cfg);
    if (!cfg) moe_fatal("out of memory");
    if (moe_train_config_load(cfg, path, n_set, sets)) moe_fatal("%s", moe_last_error());
    free(sets);
    // a new run truncates the logs, and its checkpoints would mix with (and be rotated
    // against) the old run's: never into a directory that holds a run, unless asked
    char resolved[MOE_PATH_MAX + 32], what[64];
    if (resume) {
        if (trainer_resolve_resume(resolved, sizeof resolved, resume)) moe_fatal("%s", moe_last_error());
        resume = resolved;
    } else if (trainer_run_dir_holds(cfg->run_dir, what, sizeof what)) {
        if (!overwrite)
            moe_fatal("train: %s already holds a run (%s); a new run would overwrite its logs. "
                      "Add one of:\n"
                      "  --resume %s  (continue it from its latest checkpoint)\n"
                      "  --overwrite  (delete its logs and checkpoints and start over)\n"
                      "  --set 'log.dir=\"NEW_DIR\"'  (train into another directory)",
                      cfg->run_dir, what, cfg->run_dir);
        if (trainer_clear_run_dir(cfg->run_dir)) moe_fatal("%s", moe_last_error());
        printf("--overwrite: deleted the logs and checkpoints of %s\n", cfg->run_dir);
    }
    trainer_result res;
    moe_status st = trainer_run(cfg, resume, NULL, &res);
    trainer_result_free(&res);
    free(cfg);
    if (st) moe_fatal("%s", moe_last_error());
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    // automatic threads (OMP_NUM_THREADS, else the cores capped by a CPU quota); training
    // applies train.threads on top
    moe_cpu_threads(0);
    if (!strcmp(argv[1], "prepare")) return cmd_prepare(argc - 2, argv + 2);
    if (!strcmp(argv[1], "train")) return cmd_train(argc - 2, argv + 2);
    if (!strcmp(argv[1], "eval")) return cmd_eval(argc - 2, argv + 2);
    if (!strcmp(argv[1], "smoke")) return smoke_main(argc - 2, argv + 2);
    if (!strcmp(argv[1], "stats")) return stats_main(argc - 2, argv + 2);
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 2, argv + 2);
    if (!strcmp(argv[1], "export")) return cmd_export(argc - 2, argv + 2);
    moe_fatal("unknown command '%s'\n%s", argv[1], usage);
}
