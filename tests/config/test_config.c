// Tests of config/ (the config loader): every rejection class (the status, and a message that names the
// key and the right file:line or --set), and the acceptance paths (defaults, every key,
// integers for floats, 64-bit integers that libconfig 1.5 would wrap, --set, @include,
// write -> load round trip).
//
// Usage: test_config CASE...     (no CASE: all; each case writes its .cfg files into the
//        current directory, named after the case)
//        test_config --check-list CASE...   (the CMake list names exactly the cases here)
#define _POSIX_C_SOURCE 200809L
#include "config/config.h"

#include <libconfig.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int failures;

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                     \
        }                                                                   \
    } while (0)

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f || fputs(text, f) == EOF || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

// Writes `text` to `file` (unless text is NULL; file NULL: no file) and loads it with the
// overrides; expects status `want` and a message containing every needle (a needle that
// starts with '=' must be the whole message). Also checks that cfg is left untouched.
static void reject_v(int line, const char *file, const char *text, int n_set,
                     const char *const *sets, moe_status want, va_list ap) {
    if (file && text) write_file(file, text);
    static moe_train_config cfg, before;
    memset(&cfg, 0x5a, sizeof cfg);
    memcpy(&before, &cfg, sizeof cfg);
    moe_status st = moe_train_config_load(&cfg, file, n_set, (char *const *)sets);
    const char *msg = moe_last_error();
    printf("  rejected %-26s -> %s\n", file ? file : "(no file)", st ? msg : "(accepted!)");
    if (st != want) {
        fprintf(stderr, "FAIL line %d: %s: status %d, want %d\n", line, file ? file : "", st,
                (int)want);
        failures++;
        return;
    }
    CHECK(memcmp(&cfg, &before, sizeof cfg) == 0); // untouched on error
    for (const char *needle; (needle = va_arg(ap, const char *));) {
        int ok = needle[0] == '=' ? strcmp(msg, needle + 1) == 0 : strstr(msg, needle) != NULL;
        if (!ok) {
            fprintf(stderr, "FAIL line %d: message\n  %s\nlacks\n  %s\n", line, msg, needle);
            failures++;
        }
    }
}

static void reject_at(int line, const char *file, const char *text, int n_set,
                      const char *const *sets, moe_status want, ...) {
    va_list ap;
    va_start(ap, want);
    reject_v(line, file, text, n_set, sets, want, ap);
    va_end(ap);
}

#define REJECT(file, text, ...) \
    reject_at(__LINE__, file, text, 0, NULL, MOE_EINVAL, __VA_ARGS__, NULL)
#define REJECT_SET(file, text, set, ...)                                          \
    do {                                                                          \
        const char *sets_[] = {set};                                              \
        reject_at(__LINE__, file, text, 1, sets_, MOE_EINVAL, __VA_ARGS__, NULL); \
    } while (0)

// Loads and expects success.
static int accept_at(int line, const char *file, const char *text, int n_set,
                     const char *const *sets, moe_train_config *cfg) {
    if (file && text) write_file(file, text);
    moe_status st = moe_train_config_load(cfg, file, n_set, (char *const *)sets);
    if (st) {
        fprintf(stderr, "FAIL line %d: %s rejected: %s\n", line, file ? file : "(no file)",
                moe_last_error());
        failures++;
        return 0;
    }
    return 1;
}
#define ACCEPT(file, text, cfg) accept_at(__LINE__, file, text, 0, NULL, cfg)

// memcmp of two configs, `source` excluded; prints the first differing offset.
static int same_config(const moe_train_config *a, const moe_train_config *b) {
    static moe_train_config x, y;
    memcpy(&x, a, sizeof x);
    memcpy(&y, b, sizeof y);
    memset(x.source, 0, sizeof x.source);
    memset(y.source, 0, sizeof y.source);
    const unsigned char *p = (const unsigned char *)&x, *q = (const unsigned char *)&y;
    for (size_t i = 0; i < sizeof x; i++)
        if (p[i] != q[i]) {
            fprintf(stderr, "  configs differ at byte %zu\n", i);
            return 0;
        }
    return 1;
}

// ---- acceptance -----------------------------------------------------------------------

static void check_defaults(const moe_train_config *c) {
    CHECK(c->model.vocab_size == 256);
    CHECK(c->model.d_model == 128);
    CHECK(c->model.n_layers == 4);
    CHECK(c->model.n_heads == 4);
    CHECK(c->model.n_kv_heads == 4);
    CHECK(c->model.moe.d_ff == 256);
    CHECK(c->model.moe.n_experts == 8);
    CHECK(c->model.moe.top_k == 2);
    CHECK(c->model.max_seq_len == 256);
    CHECK(c->model.rope_theta == 1e6);
    CHECK(c->model.rms_norm_eps == 1e-5);
    CHECK(c->model.tie_embeddings == 0);
    CHECK(c->model.moe.norm_topk_prob == 1);
    CHECK(c->model.moe.capacity_factor == 0.0);
    CHECK(c->model.moe.drop_policy == 0);
    CHECK(c->model.moe.aux_coef == 0.01);
    CHECK(c->model.moe.z_coef == 0.001);
    CHECK(c->init_std == 0.02);
    CHECK(c->model.moe.scoring == 0 && c->model.moe.route_scale == 1.0 && c->bias_rate == 0.0);
    CHECK(c->model.moe.seq_aux_coef == 0.0 && c->model.moe.jitter_eps == 0.0);
    CHECK(c->seed == 1);
    CHECK(c->steps == 1000);
    CHECK(c->batch_size == 8);
    CHECK(c->seq_len == 128);
    CHECK(c->grad_accum == 1);
    CHECK(c->optimizer == 0);
    CHECK(c->lr == 3e-4);
    CHECK(c->min_lr == 3e-5);
    CHECK(c->warmup_steps == 100);
    CHECK(c->schedule == 0);
    CHECK(c->beta1 == 0.9);
    CHECK(c->beta2 == 0.95);
    CHECK(c->eps == 1e-8);
    CHECK(c->weight_decay == 0.1);
    CHECK(c->decay_norms == 0);
    CHECK(c->grad_clip == 1.0);
    CHECK(c->max_skipped == 10);
    CHECK(c->threads == 0);
    CHECK(c->eval_interval == 100);
    CHECK(c->eval_batches == 8);
    CHECK(c->load_alert_action == 0);
    CHECK(c->model.dtype == MOE_DTYPE_F32);
    CHECK(strcmp(c->init_from, "") == 0);
    CHECK(strcmp(c->train_path, "") == 0);
    CHECK(strcmp(c->val_path, "") == 0);
    CHECK(strcmp(c->dir, "data/cache/default") == 0);
    CHECK(c->n_text == 0);
    CHECK(c->val_fraction == 0.1);
    CHECK(strcmp(c->run_dir, "runs/default") == 0);
    CHECK(c->interval == 10);
    CHECK(c->load_alert == 2.0);
    CHECK(c->alert_after == 150);
    CHECK(c->alert_window == 50);
    CHECK(c->timing == 1 && c->coactivation == 1);
    CHECK(c->ckpt_interval == 0);
    CHECK(c->ckpt_keep == 2);
}

static void case_defaults(void) {
    static moe_train_config d, c;
    moe_train_config_default(&d);
    check_defaults(&d);
    if (ACCEPT("defaults_empty.cfg", "", &c)) {
        check_defaults(&c);
        CHECK(same_config(&c, &d));
        CHECK(strcmp(c.source, "defaults_empty.cfg") == 0);
    }
    if (ACCEPT("defaults_groups.cfg",
               "# only comments and empty groups\nmodel = {};\ntrain = {};\ndata = {};\n"
               "log = {};\ncheckpoint = {}; // nothing\n",
               &c))
        CHECK(same_config(&c, &d));
    if (ACCEPT(NULL, NULL, &c)) { // no file at all
        CHECK(same_config(&c, &d));
        CHECK(c.source[0] == '\0');
    }
}

static const char *full_text = "# every key, none at its default\n"
                               "model = {\n"
                               "  vocab_size = 512;\n"
                               "  d_model = 96;\n"
                               "  n_layers = 3;\n"
                               "  n_heads = 6;\n"
                               "  n_kv_heads = 2;\n"
                               "  d_ff = 200;\n"
                               "  n_experts = 16;\n"
                               "  top_k = 4;\n"
                               "  max_seq_len = 1024;\n"
                               "  rope_theta = 10000.5;\n"
                               "  rms_norm_eps = 1e-6;\n"
                               "  tie_embeddings = true;\n"
                               "  norm_topk_prob = false;\n"
                               "  capacity_factor = 1.25;\n"
                               "  drop_policy = \"position\";\n"
                               "  aux_coef = 0.02;\n"
                               "  z_coef = 0.0;\n"
                               "  init_std = 0.01;\n"
                               "  scoring = \"sigmoid\";\n"
                               "  route_scale = 2.5;\n"
                               "  bias_rate = 0.001;\n"
                               "  seq_aux_coef = 0.0001;\n"
                               "  router_jitter = 0.01;\n"
                               "};\n"
                               "train = {\n"
                               "  seed = 12345678901;\n"
                               "  steps = 3000000000;\n"
                               "  batch_size = 4;\n"
                               "  seq_len = 512;\n"
                               "  grad_accum = 3;\n"
                               "  optimizer = \"sgd\";\n"
                               "  lr = 0.1;\n"
                               "  min_lr = 0.001;\n"
                               "  warmup_steps = 50;\n"
                               "  schedule = \"constant\";\n"
                               "  beta1 = 0.8;\n"
                               "  beta2 = 0.99;\n"
                               "  eps = 1e-10;\n"
                               "  weight_decay = 0.0;\n"
                               "  decay_norms = true;\n"
                               "  grad_clip = 0.5;\n"
                               "  max_skipped = 3;\n"
                               "  threads = 2;\n"
                               "  eval_interval = 0;\n"
                               "  eval_batches = 4;\n"
                               "  load_alert_action = \"stop\";\n"
                               "  dtype = \"bf16\";\n"
                               "  init_from = \"hf/mixtral-tiny\";\n"
                               "};\n"
                               "data = {\n"
                               "  train = \"tok/train.bin\";\n"
                               "  val = \"tok/val.bin\";\n"
                               "  dir = \"cache/x\";\n"
                               "  text = (\"a.txt\", \"dir/b\");\n"
                               "  val_fraction = 0.25;\n"
                               "};\n"
                               "log = {\n"
                               "  dir = \"runs/full\";\n"
                               "  interval = 1;\n"
                               "  load_alert = 2.0;\n"
                               "  timing = false;\n"
                               "  coactivation = false;\n"
                               "};\n"
                               "checkpoint = {\n"
                               "  interval = 250;\n"
                               "  keep = 5;\n"
                               "};\n";

static void case_full(void) {
    static moe_train_config c;
    if (!ACCEPT("full.cfg", full_text, &c)) return;
    CHECK(c.model.vocab_size == 512);
    CHECK(c.model.d_model == 96);
    CHECK(c.model.n_layers == 3);
    CHECK(c.model.n_heads == 6);
    CHECK(c.model.n_kv_heads == 2);
    CHECK(c.model.moe.d_ff == 200);
    CHECK(c.model.moe.n_experts == 16);
    CHECK(c.model.moe.top_k == 4);
    CHECK(c.model.max_seq_len == 1024);
    CHECK(c.model.rope_theta == 10000.5);
    CHECK(c.model.rms_norm_eps == 1e-6);
    CHECK(c.model.tie_embeddings == 1);
    CHECK(c.model.moe.norm_topk_prob == 0);
    CHECK(c.model.moe.capacity_factor == 1.25);
    CHECK(c.model.moe.drop_policy == 1);
    CHECK(c.model.moe.aux_coef == 0.02);
    CHECK(c.model.moe.z_coef == 0.0);
    CHECK(c.init_std == 0.01);
    CHECK(c.model.moe.scoring == 1 && c.model.moe.route_scale == 2.5 && c.bias_rate == 0.001);
    CHECK(c.model.moe.seq_aux_coef == 0.0001 && c.model.moe.jitter_eps == 0.01);
    CHECK(c.seed == INT64_C(12345678901));
    CHECK(c.steps == INT64_C(3000000000));
    CHECK(c.batch_size == 4);
    CHECK(c.seq_len == 512);
    CHECK(c.grad_accum == 3);
    CHECK(c.optimizer == 1);
    CHECK(c.lr == 0.1);
    CHECK(c.min_lr == 0.001);
    CHECK(c.warmup_steps == 50);
    CHECK(c.schedule == 1);
    CHECK(c.beta1 == 0.8);
    CHECK(c.beta2 == 0.99);
    CHECK(c.eps == 1e-10);
    CHECK(c.weight_decay == 0.0);
    CHECK(c.decay_norms == 1);
    CHECK(c.grad_clip == 0.5);
    CHECK(c.max_skipped == 3);
    CHECK(c.threads == 2);
    CHECK(c.eval_interval == 0);
    CHECK(c.eval_batches == 4);
    CHECK(c.load_alert_action == 1);
    CHECK(c.model.dtype == MOE_DTYPE_BF16);
    CHECK(strcmp(c.init_from, "hf/mixtral-tiny") == 0);
    CHECK(strcmp(c.train_path, "tok/train.bin") == 0);
    CHECK(strcmp(c.val_path, "tok/val.bin") == 0);
    CHECK(strcmp(c.dir, "cache/x") == 0);
    CHECK(c.n_text == 2);
    CHECK(strcmp(c.text[0], "a.txt") == 0);
    CHECK(strcmp(c.text[1], "dir/b") == 0);
    CHECK(c.val_fraction == 0.25);
    CHECK(strcmp(c.run_dir, "runs/full") == 0);
    CHECK(c.interval == 1);
    CHECK(c.load_alert == 2.0);
    CHECK(c.timing == 0 && c.coactivation == 0);
    CHECK(c.ckpt_interval == 250);
    CHECK(c.ckpt_keep == 5);
    CHECK(strcmp(c.source, "full.cfg") == 0);

    // a single string is a list of one; an array works like a list
    if (ACCEPT("full_text_one.cfg", "data = { text = \"corpus.txt\"; };", &c)) {
        CHECK(c.n_text == 1);
        CHECK(strcmp(c.text[0], "corpus.txt") == 0);
    }
    if (ACCEPT("full_text_array.cfg", "data = { text = [\"x\", \"y\", \"z\"]; };", &c))
        CHECK(c.n_text == 3 && strcmp(c.text[2], "z") == 0);
    // n_kv_heads defaults to n_heads; a drop policy with a capacity factor is fine
    if (ACCEPT(
            "full_kv_default.cfg",
            "model = {\n  n_heads = 8;\n  capacity_factor = 1.0;\n  drop_policy = \"probs\";\n};\n",
            &c)) {
        CHECK(c.model.n_heads == 8 && c.model.n_kv_heads == 8);
        CHECK(c.model.moe.capacity_factor == 1.0 && c.model.moe.drop_policy == 0);
    }
}

static void case_int_for_float(void) {
    static moe_train_config c;
    if (!ACCEPT("int_for_float.cfg",
                "model = {\n  rope_theta = 10000;\n  capacity_factor = 2;\n  z_coef = 0;\n};\n"
                "train = {\n  lr = 1;\n  min_lr = 0;\n  grad_clip = 5L;\n};\n"
                "log = { load_alert = 3; };\n",
                &c))
        return;
    CHECK(c.model.rope_theta == 10000.0);
    CHECK(c.model.moe.capacity_factor == 2.0);
    CHECK(c.model.moe.z_coef == 0.0);
    CHECK(c.lr == 1.0);
    CHECK(c.min_lr == 0.0);
    CHECK(c.grad_clip == 5.0);
    CHECK(c.load_alert == 3.0);
}

// Integers libconfig 1.5 gets wrong (wraps to 32 bits without L): read as written.
static void case_int64(void) {
    static moe_train_config c;
    { // the reason for all this: libconfig itself
        config_t lc;
        config_init(&lc);
        long long v = 0;
        if (config_read_string(&lc, "steps = 3000000000;") && config_lookup_int64(&lc, "steps", &v))
            printf("  (libconfig %d.%d itself reads steps = 3000000000; as %lld)\n",
                   LIBCONFIG_VER_MAJOR, LIBCONFIG_VER_MINOR, v);
        config_destroy(&lc);
    }
    if (ACCEPT("int64_1.cfg", "train = {\n  steps = 3000000000;\n};\n", &c))
        CHECK(c.steps == INT64_C(3000000000));
    if (ACCEPT("int64_2.cfg", "train = {\n  steps = 3000000000L;\n};\n", &c))
        CHECK(c.steps == INT64_C(3000000000));
    if (ACCEPT("int64_3.cfg",
               "train = {\n  steps\n    =\n  3000000000 ; eval_interval = 4294967296;\n};\n", &c))
        CHECK(c.steps == INT64_C(3000000000) && c.eval_interval == INT64_C(4294967296));
    if (ACCEPT("int64_4.cfg", "train = {\n  seed = 9223372036854775807;\n  lr = 3000000000;\n};\n",
               &c))
        CHECK(c.seed == INT64_MAX && c.lr == 3e9);
    if (ACCEPT("int64_5.cfg",
               "train = { seed = 0x7FFFFFFFFFFFFFFFL; };\n"
               "model = { rope_theta = 4294967296; };\n",
               &c))
        CHECK(c.seed == INT64_MAX && c.model.rope_theta == 4294967296.0);
    // two settings named "interval" on one line, in either order
    if (ACCEPT("int64_6.cfg", "log = { interval = 7; }; checkpoint = { interval = 5000000000; };\n",
               &c))
        CHECK(c.interval == 7 && c.ckpt_interval == INT64_C(5000000000));
    if (ACCEPT("int64_7.cfg", "log = { interval = 5000000000; }; checkpoint = { interval = 7; };\n",
               &c))
        CHECK(c.interval == INT64_C(5000000000) && c.ckpt_interval == 7);
    // the key's name inside a string or a comment earlier on the line
    if (ACCEPT("int64_8.cfg",
               "train = { init_from = \"x; steps = 1\"; /* steps = 2 */ steps = 3000000000; # "
               "steps = 4\n};\n",
               &c))
        CHECK(c.steps == INT64_C(3000000000) && strcmp(c.init_from, "x; steps = 1") == 0);
    const char *sets[] = {"train.steps=3000000000", "train.seed = 5000000000"};
    if (accept_at(__LINE__, "int64_9.cfg", "train = { steps = 5; };\n", 2, sets, &c))
        CHECK(c.steps == INT64_C(3000000000) && c.seed == INT64_C(5000000000));
}

static void case_set(void) {
    static moe_train_config c;
    const char *sets[] = {
        "train.lr=0.2",      // replaces the file's value
        "checkpoint.keep=5", // the file has no checkpoint group
        "data.text=[\"a.txt\", \"b.txt\"]",
        " model.capacity_factor = 1.5 ", // blanks around name and value
        "model.drop_policy=\"position\"",
        "train.steps=700",
        "train.steps=800;", // the last one wins; a trailing ';' is fine
        "log.dir=\"runs/x\"",
        "model.tie_embeddings=true",
    };
    if (accept_at(__LINE__, "set_base.cfg",
                  "model = {\n  top_k = 2;\n  n_experts = 4;\n};\ntrain = {\n  lr = 0.1;\n  steps "
                  "= 500;\n};\n",
                  (int)(sizeof sets / sizeof sets[0]), sets, &c)) {
        CHECK(c.lr == 0.2);
        CHECK(c.ckpt_keep == 5);
        CHECK(c.n_text == 2 && strcmp(c.text[0], "a.txt") == 0 && strcmp(c.text[1], "b.txt") == 0);
        CHECK(c.model.moe.capacity_factor == 1.5);
        CHECK(c.model.moe.drop_policy == 1);
        CHECK(c.steps == 800);
        CHECK(strcmp(c.run_dir, "runs/x") == 0);
        CHECK(c.model.tie_embeddings == 1);
        CHECK(c.model.moe.top_k == 2 && c.model.moe.n_experts == 4); // the file's values stay
        CHECK(c.min_lr == 3e-5);                                     // and the defaults
    }
    const char *only[] = {"model.n_experts=16", "model.top_k=4"};
    if (accept_at(__LINE__, NULL, NULL, 2, only, &c)) // no file: defaults + overrides
        CHECK(c.model.moe.n_experts == 16 && c.model.moe.top_k == 4 && c.model.vocab_size == 256);
}

static void case_roundtrip(void) {
    static moe_train_config a, b, d;
    // every key away from its default, read back from what write() wrote
    if (!ACCEPT("roundtrip_src.cfg", full_text, &a)) return;
    FILE *f = fopen("roundtrip_1.cfg", "w");
    CHECK(f && moe_train_config_write(&a, f) == MOE_OK);
    if (f) fclose(f);
    if (ACCEPT("roundtrip_1.cfg", NULL, &b)) CHECK(same_config(&a, &b));

    // values that are hard to write: long doubles, -0, denormals, 64-bit integers,
    // strings with quotes, backslashes, control characters and UTF-8, 32 text sources
    a.lr = 1.0 / 3.0;
    a.min_lr = 1e-300;
    a.model.rope_theta = 0.1 + 0.2;
    a.init_std = 5e-324;
    a.model.moe.aux_coef = -0.0;
    a.model.moe.capacity_factor = 1e300;
    a.val_fraction = 0.5;
    a.seed = INT64_MAX;
    a.steps = INT64_C(999999999999);
    a.eval_interval = INT64_C(2147483648);
    a.ckpt_interval = INT64_C(-2147483648) + INT64_C(4294967296); // 2^31
    a.interval = 2147483647;
    memset(a.init_from, 0, sizeof a.init_from);
    strcpy(a.init_from, "we\"ird\\path\n\t\r\f\x01\x7f caf\xc3\xa9 # not a comment");
    a.n_text = MOE_MAX_TEXT_SOURCES;
    for (int i = 0; i < MOE_MAX_TEXT_SOURCES; i++) {
        memset(a.text[i], 0, sizeof a.text[i]);
        snprintf(a.text[i], sizeof a.text[i], "source %d/\"q\"", i);
    }
    f = fopen("roundtrip_2.cfg", "w");
    CHECK(f && moe_train_config_write(&a, f) == MOE_OK);
    if (f) fclose(f);
    if (ACCEPT("roundtrip_2.cfg", NULL, &b)) {
        CHECK(same_config(&a, &b));
        CHECK(strcmp(b.init_from, a.init_from) == 0);
        CHECK(b.lr == 1.0 / 3.0 && signbit(b.model.moe.aux_coef));
    }
    // the written text: every group, L where needed, shortest exact doubles
    f = fopen("roundtrip_2.cfg", "r");
    static char text[1 << 16];
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = '\0';
    if (f) fclose(f);
    printf("  roundtrip_2.cfg (excerpt):\n%.700s...\n", text);
    CHECK(strstr(text, "model = {") && strstr(text, "train = {") && strstr(text, "data = {") &&
          strstr(text, "log = {") && strstr(text, "checkpoint = {"));
    CHECK(strstr(text, "  seed = 9223372036854775807L;"));
    CHECK(strstr(text, "  eval_interval = 2147483648L;"));
    CHECK(strstr(text, "  interval = 2147483647;"));
    CHECK(strstr(text, "  rope_theta = 0.30000000000000004;"));
    CHECK(strstr(text, "  val_fraction = 0.5;"));
    CHECK(strstr(text, "  aux_coef = -0.0;"));
    CHECK(strstr(text, "  drop_policy = \"position\";"));
    CHECK(strstr(text, "  optimizer = \"sgd\";"));
    CHECK(strstr(
        text,
        "  init_from = \"we\\\"ird\\\\path\\n\\t\\r\\f\\x01\\x7f caf\xc3\xa9 # not a comment\";"));

    // the defaults round-trip too (empty text list, integral doubles stay floats)
    moe_train_config_default(&d);
    f = fopen("roundtrip_3.cfg", "w");
    CHECK(f && moe_train_config_write(&d, f) == MOE_OK);
    if (f) fclose(f);
    if (ACCEPT("roundtrip_3.cfg", NULL, &b)) CHECK(same_config(&d, &b));
    f = fopen("roundtrip_3.cfg", "r");
    n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = '\0';
    if (f) fclose(f);
    // dropless: drop_policy is written as a comment (set, it would be rejected)
    CHECK(strstr(text,
                 "  # drop_policy = \"probs\"; (no effect: capacity_factor = 0 is dropless)\n"));
    CHECK(strstr(text, "  text = [];\n") && strstr(text, "  capacity_factor = 0.0;\n") &&
          strstr(text, "  rope_theta = 1e+06;\n"));

    // write refuses what it cannot write back
    d.lr = NAN;
    f = fopen("roundtrip_4.cfg", "w");
    CHECK(f && moe_train_config_write(&d, f) == MOE_EINVAL && strstr(moe_last_error(), "train.lr"));
    printf("  write refused: %s\n", moe_last_error());
    moe_train_config_default(&d);
    d.model.moe.drop_policy = 7;
    CHECK(f && moe_train_config_write(&d, f) == MOE_EINVAL &&
          strstr(moe_last_error(), "model.drop_policy"));
    printf("  write refused: %s\n", moe_last_error());
    d.model.moe.drop_policy = 1; // "position" while dropless
    CHECK(f && moe_train_config_write(&d, f) == MOE_EINVAL &&
          strstr(moe_last_error(), "model.drop_policy"));
    printf("  write refused: %s\n", moe_last_error());
    if (f) fclose(f);
}

static void case_include(void) {
    static moe_train_config c;
    mkdir("inc", 0755);
    write_file("inc/include_part.cfg", "train = {\n  steps = 3000000000;\n};\n");
    if (ACCEPT("inc/include_main.cfg",
               "model = {\n  top_k = 2;\n};\n@include \"include_part.cfg\"\nlog = { interval = 3; "
               "};\n",
               &c))
        CHECK(c.steps == INT64_C(3000000000) && c.interval == 3 && c.model.moe.top_k == 2);
    // errors name the included file and its line; lines after the @include stay right
    write_file("inc/include_badpart.cfg", "train = {\n  lr = 0.1;\n  stepz = 1;\n};\n");
    REJECT("inc/include_bad.cfg", "model = {};\n@include \"include_badpart.cfg\"\n",
           "=inc/include_badpart.cfg:3: train.stepz: unknown key (did you mean steps?)");
    REJECT("inc/include_bad2.cfg",
           "model = {};\n@include \"include_part.cfg\"\n\nlog = {\n  intervall = 3;\n};\n",
           "=inc/include_bad2.cfg:5: log.intervall: unknown key (did you mean interval?)");
    write_file("inc/include_wrap.cfg", "\nmodel = {\n  n_layers = 4294967298;\n};\n");
    REJECT("inc/include_bad3.cfg", "@include \"include_wrap.cfg\"\n",
           "=inc/include_wrap.cfg:3: model.n_layers: 4294967298 is out of range [1, 1024]");
}

// ---- rejections -------------------------------------------------------------------------

static void case_unknown_key(void) {
    REJECT("unknown_key_1.cfg", "model = {\n  n_layers = 2;\n  n_expert = 4;\n};\n",
           "=unknown_key_1.cfg:3: model.n_expert: unknown key (did you mean n_experts?)");
    REJECT("unknown_key_2.cfg", "train = {\n  top_k = 2;\n};\n",
           "=unknown_key_2.cfg:2: train.top_k: unknown key (top_k is a key of model)");
    REJECT("unknown_key_3.cfg", "log = {\n\n  colour = true;\n};\n",
           "=unknown_key_3.cfg:3: log.colour: unknown key");
    REJECT("unknown_key_4.cfg", "model = { Top_K = 2; };\n", "unknown_key_4.cfg:1: model.Top_K",
           "(did you mean top_k?)");
    REJECT("unknown_key_5.cfg", "checkpoint = {\n  keep = 2;\n  intervall = 10;\n};\n",
           "=unknown_key_5.cfg:3: checkpoint.intervall: unknown key (did you mean interval?)");
    REJECT("unknown_key_6.cfg", "train = {\n  lr = 0.1;\n  learning_rate = 0.1;\n};\n",
           "unknown_key_6.cfg:3: train.learning_rate: unknown key");
}

static void case_unknown_group(void) {
    REJECT("unknown_group_1.cfg", "\nmodle = {\n  top_k = 2;\n};\n",
           "=unknown_group_1.cfg:2: modle: unknown group (did you mean model?)");
    REJECT("unknown_group_2.cfg", "model = {};\nsteps = 5;\n",
           "unknown_group_2.cfg:2: steps:", "unknown group", "steps is a key of train");
    REJECT("unknown_group_3.cfg", "trainer = {\n  lr = 1;\n};\n",
           "=unknown_group_3.cfg:1: trainer: unknown group (did you mean train?)");
    REJECT("unknown_group_4.cfg", "foo = {};\n", "unknown_group_4.cfg:1: foo: unknown group",
           "the groups are model, train, data, log, checkpoint");
    // a group nested inside a group
    REJECT("unknown_group_5.cfg",
           "model = {\n  top_k = 2;\n  block = {\n    heads = 4;\n  };\n};\n",
           "=unknown_group_5.cfg:3: model.block: unknown key (groups do not nest)");
}

static void case_wrong_type(void) {
    REJECT("wrong_type_1.cfg", "train = {\n  lr = \"fast\";\n};\n",
           "=wrong_type_1.cfg:2: train.lr: expected a number, got a string");
    REJECT("wrong_type_2.cfg", "model = {\n  d_model = 64;\n  n_layers = 2.5;\n};\n",
           "=wrong_type_2.cfg:3: model.n_layers: expected an integer, got a float");
    REJECT("wrong_type_3.cfg", "model = {\n  top_k = 2.0;\n};\n",
           "=wrong_type_3.cfg:2: model.top_k: expected an integer, got a float");
    REJECT("wrong_type_4.cfg", "model = {\n  tie_embeddings = 1;\n};\n",
           "=wrong_type_4.cfg:2: model.tie_embeddings: expected a boolean (true or false), got an "
           "integer");
    REJECT("wrong_type_5.cfg", "model = {\n  norm_topk_prob = \"yes\";\n};\n",
           "wrong_type_5.cfg:2: model.norm_topk_prob: expected a boolean");
    REJECT("wrong_type_6.cfg", "\nmodel = 5;\n",
           "=wrong_type_6.cfg:2: model: expected a group (model = { ... };), got an integer");
    REJECT("wrong_type_7.cfg", "checkpoint = {\n  keep = { n = 1; };\n};\n",
           "=wrong_type_7.cfg:2: checkpoint.keep: expected an integer, got a group");
    REJECT("wrong_type_8.cfg", "data = {\n  text = (\"a\",\n    2);\n};\n",
           "=wrong_type_8.cfg:3: data.text[1]: expected a string, got an integer");
    REJECT("wrong_type_9.cfg", "data = {\n  text = 5;\n};\n",
           "=wrong_type_9.cfg:2: data.text: expected a list of strings, got an integer");
    REJECT("wrong_type_10.cfg", "data = {\n  dir = 5;\n};\n",
           "=wrong_type_10.cfg:2: data.dir: expected a string, got an integer");
    REJECT("wrong_type_11.cfg", "train = {\n  optimizer = 1;\n};\n",
           "=wrong_type_11.cfg:2: train.optimizer: expected a string (\"adamw\" or \"sgd\"), got "
           "an integer");
    REJECT("wrong_type_12.cfg", "train = {\n  steps = \"many\";\n};\n",
           "=wrong_type_12.cfg:2: train.steps: expected an integer, got a string");
    REJECT("wrong_type_13.cfg", "train = {\n  lr = [0.1];\n};\n",
           "=wrong_type_13.cfg:2: train.lr: expected a number, got an array");
}

static void case_out_of_range(void) {
    REJECT("out_of_range_1.cfg", "model = {\n  top_k = 0;\n};\n",
           "=out_of_range_1.cfg:2: model.top_k: 0 is out of range [1, 4096]");
    REJECT("out_of_range_2.cfg", "train = {\n  beta1 = 1.0;\n};\n",
           "=out_of_range_2.cfg:2: train.beta1: 1 is out of range [0, 1)");
    REJECT("out_of_range_3.cfg", "model = {\n  rms_norm_eps = 0.0;\n};\n",
           "=out_of_range_3.cfg:2: model.rms_norm_eps: 0 is out of range (0, 1)");
    REJECT("out_of_range_4.cfg", "train = {\n  lr = -0.001;\n};\n",
           "=out_of_range_4.cfg:2: train.lr: -0.001 is out of range [0, inf)");
    REJECT("out_of_range_5.cfg", "model = {\n  rope_theta = 1e999;\n};\n",
           "=out_of_range_5.cfg:2: model.rope_theta: inf is out of range (0, 1e+12]");
    REJECT("out_of_range_6.cfg", "model = {\n  vocab_size = 1;\n};\n",
           "=out_of_range_6.cfg:2: model.vocab_size: 1 is out of range [2, 16777216]");
    REJECT("out_of_range_7.cfg", "model = {\n  capacity_factor = -1;\n};\n",
           "=out_of_range_7.cfg:2: model.capacity_factor: -1 is out of range [0, inf)");
    REJECT("out_of_range_8.cfg", "train = {\n  seed = -1;\n};\n",
           "=out_of_range_8.cfg:2: train.seed: -1 is out of range [0, 9223372036854775807]");
    REJECT("out_of_range_9.cfg", "data = {\n  val_fraction = 0.6;\n};\n",
           "=out_of_range_9.cfg:2: data.val_fraction: 0.6 is out of range (0, 0.5]");
    REJECT("out_of_range_10.cfg", "train = {\n  threads = 2000;\n};\n",
           "=out_of_range_10.cfg:2: train.threads: 2000 is out of range [0, 1024]");
    REJECT("out_of_range_11.cfg", "log = {\n  dir = \"\";\n};\n",
           "=out_of_range_11.cfg:2: log.dir: must not be empty");
    static char text[4096];
    snprintf(text, sizeof text, "train = {\n  init_from = \"%01100d\";\n};\n", 0);
    REJECT("out_of_range_12.cfg", text,
           "=out_of_range_12.cfg:2: train.init_from: is too long (1100 bytes, at most 1023)");
    size_t len = (size_t)snprintf(text, sizeof text, "data = {\n  text = (");
    for (int i = 0; i < 33; i++)
        len += (size_t)snprintf(text + len, sizeof text - len, "%s\"t%d\"", i ? ", " : "", i);
    snprintf(text + len, sizeof text - len, ");\n};\n");
    REJECT("out_of_range_13.cfg", text,
           "=out_of_range_13.cfg:2: data.text: has 33 entries, at most 32");
    REJECT("out_of_range_14.cfg", "data = {\n  text = [\"a\", \"\"];\n};\n",
           "=out_of_range_14.cfg:2: data.text[1]: must not be empty");
    REJECT("out_of_range_15.cfg", "log = {\n  alert_window = 0;\n};\n",
           "=out_of_range_15.cfg:2: log.alert_window: 0 is out of range [1, 10000]");
    REJECT("out_of_range_16.cfg", "log = {\n  alert_after = -1;\n};\n",
           "=out_of_range_16.cfg:2: log.alert_after: -1 is out of range [0, 1000000000000]");
}

static void case_int_overflow(void) {
    REJECT("int_overflow_1.cfg", "train = {\n  batch_size = 3000000000;\n};\n",
           "=int_overflow_1.cfg:2: train.batch_size: 3000000000 is out of range [1, 1048576]");
    // wraps to 2, which would look valid
    REJECT("int_overflow_2.cfg", "model = {\n  n_layers = 4294967298;\n};\n",
           "=int_overflow_2.cfg:2: model.n_layers: 4294967298 is out of range [1, 1024]");
    REJECT("int_overflow_3.cfg", "train = {\n  steps = 99999999999999999999L;\n};\n",
           "=int_overflow_3.cfg:2: train.steps: 99999999999999999999L overflows a 64-bit integer "
           "(at most 9223372036854775807)");
    REJECT("int_overflow_4.cfg", "train = {\n  steps = 99999999999999999999;\n};\n",
           "int_overflow_4.cfg:2: train.steps: 99999999999999999999 overflows a 64-bit integer");
    REJECT("int_overflow_5.cfg", "train = {\n  threads = 0xFFFFFFFF;\n};\n",
           "=int_overflow_5.cfg:2: train.threads: 4294967295 is out of range [0, 1024]");
    REJECT(
        "int_overflow_6.cfg", "train = {\n  seed = -3000000000;\n};\n",
        "=int_overflow_6.cfg:2: train.seed: -3000000000 is out of range [0, 9223372036854775807]");
    REJECT("int_overflow_7.cfg", "checkpoint = {\n  keep = 2147483648;\n};\n",
           "=int_overflow_7.cfg:2: checkpoint.keep: 2147483648 is out of range [1, 2147483647]");
    REJECT("int_overflow_8.cfg", "train = {\n  lr = 0.1; min_lr = -5000000000;\n};\n",
           "=int_overflow_8.cfg:2: train.min_lr: -5000000000 is out of range [0, inf)");
    REJECT_SET(NULL, NULL, "train.batch_size=3000000000",
               "=--set train.batch_size: 3000000000 is out of range [1, 1048576]");
    REJECT_SET(NULL, NULL, "train.steps=0x8000000000000000L",
               "--set train.steps: 0x8000000000000000L overflows a 64-bit integer");
}

static void case_inconsistent(void) {
    REJECT("incons_topk.cfg", "model = {\n  n_experts = 4;\n  top_k = 8;\n};\n",
           "incons_topk.cfg:3: model.top_k = 8 exceeds model.n_experts = 4 (at incons_topk.cfg:2)");
    REJECT("incons_topk_default.cfg", "model = {\n  n_experts = 1;\n};\n",
           "incons_topk_default.cfg:2: model.top_k = 2 (default) exceeds model.n_experts = 1");
    REJECT("incons_divide.cfg", "model = {\n  d_model = 128;\n  n_heads = 3;\n};\n",
           "incons_divide.cfg:3: model.n_heads = 3 does not divide model.d_model = 128");
    REJECT("incons_gqa.cfg", "model = {\n  n_heads = 8;\n  n_kv_heads = 3;\n};\n",
           "incons_gqa.cfg:3: model.n_kv_heads = 3 does not divide model.n_heads = 8");
    REJECT("incons_kv.cfg", "model = {\n  n_heads = 4;\n  n_kv_heads = 8;\n};\n",
           "incons_kv.cfg:3: model.n_kv_heads = 8 exceeds model.n_heads = 4");
    REJECT("incons_headdim.cfg", "model = {\n  d_model = 12;\n  n_heads = 4;\n};\n",
           "incons_headdim.cfg:2: model.d_model = 12 with model.n_heads = 4", "head_dim",
           "head_dim = d_model / n_heads = 3 is odd", "RoPE");
    REJECT("incons_seq.cfg",
           "model = {\n  max_seq_len = 64;\n};\ntrain = {\n  seq_len = 128;\n};\n",
           "incons_seq.cfg:5: train.seq_len = 128 exceeds model.max_seq_len = 64 (at "
           "incons_seq.cfg:2)");
    REJECT(
        "incons_seq_default.cfg", "model = {\n  max_seq_len = 64;\n};\n",
        "incons_seq_default.cfg:2: train.seq_len = 128 (default) exceeds model.max_seq_len = 64");
    REJECT("incons_lr.cfg", "train = {\n  lr = 0.01;\n  min_lr = 0.1;\n};\n",
           "incons_lr.cfg:3: train.min_lr = 0.1 exceeds train.lr = 0.01");
    REJECT("incons_warmup.cfg", "train = {\n  steps = 100;\n  warmup_steps = 200;\n};\n",
           "incons_warmup.cfg:3: train.warmup_steps = 200 exceeds train.steps = 100");
    REJECT("incons_drop.cfg",
           "model = {\n  capacity_factor = 0.0;\n  drop_policy = \"position\";\n};\n",
           "incons_drop.cfg:3: model.drop_policy is set but model.capacity_factor = 0 (dropless): "
           "nothing is ever dropped");
    REJECT("incons_drop_default.cfg", "model = {\n  drop_policy = \"probs\";\n};\n",
           "incons_drop_default.cfg:2: model.drop_policy is set but model.capacity_factor = 0");
    REJECT_SET(
        "incons_set.cfg", "model = {\n  n_experts = 8;\n};\n", "model.top_k=16",
        "=--set model.top_k: model.top_k = 16 exceeds model.n_experts = 8 (at incons_set.cfg:2): "
        "each token is routed to top_k different experts");
}

static void case_bad_enum(void) {
    REJECT(
        "bad_enum_1.cfg", "model = {\n  capacity_factor = 1.0;\n  drop_policy = \"tokens\";\n};\n",
        "=bad_enum_1.cfg:3: model.drop_policy: \"tokens\" is not one of \"probs\" or \"position\"");
    REJECT("bad_enum_2.cfg", "train = {\n  optimizer = \"adam\";\n};\n",
           "=bad_enum_2.cfg:2: train.optimizer: \"adam\" is not one of \"adamw\" or \"sgd\" "
           "(did you mean \"adamw\"?)");
    REJECT(
        "bad_enum_3.cfg", "train = {\n  schedule = \"linear\";\n};\n",
        "=bad_enum_3.cfg:2: train.schedule: \"linear\" is not one of \"cosine\" or \"constant\"");
    REJECT("bad_enum_4.cfg", "train = {\n  seed = 3;\n  dtype = \"fp16\";\n};\n",
           "=bad_enum_4.cfg:3: train.dtype: \"fp16\" is not one of \"fp32\" or \"bf16\"");
}

static void case_syntax_error(void) {
    REJECT("syntax_error_1.cfg", "model = {\n  top_k = ;\n};\n",
           "=syntax_error_1.cfg:2: syntax error: syntax error");
    REJECT("syntax_error_2.cfg", "model = {\n  top_k = 2;\n  n_experts 4;\n};\n",
           "syntax_error_2.cfg:3: syntax error");
    REJECT("syntax_error_3.cfg", "train = {\n  lr = 0.1;\n  lr = 0.2;\n};\n",
           "=syntax_error_3.cfg:3: syntax error: duplicate setting name");
    reject_at(__LINE__, "syntax_error_4.cfg", "\n@include \"syntax_error_nope.cfg\"\n", 0, NULL,
              MOE_EIO,
              "=syntax_error_4.cfg:2: @include \"syntax_error_nope.cfg\": "
              "syntax_error_nope.cfg: cannot read: No such file or directory",
              NULL);
    REJECT("syntax_error_5.cfg", "model = {\n  drop_policy = \"probs;\n};\n",
           "syntax_error_5.cfg:", "syntax error");
    FILE *f = fopen("syntax_error_6.cfg", "wb");
    if (f) {
        fwrite("model = {};\0", 1, 12, f);
        fclose(f);
    }
    REJECT("syntax_error_6.cfg", NULL, "syntax_error_6.cfg: contains a NUL byte");
}

static void case_missing_file(void) {
    reject_at(__LINE__, "missing_file_nope.cfg", NULL, 0, NULL, MOE_EIO,
              "=missing_file_nope.cfg: cannot read: No such file or directory", NULL);
    reject_at(__LINE__, ".", NULL, 0, NULL, MOE_EIO, "=.: cannot read: Is a directory", NULL);
}

static void case_bad_set(void) {
    REJECT_SET(NULL, NULL, "model.n_expert=4",
               "=--set model.n_expert: unknown key (did you mean n_experts?)");
    REJECT_SET(NULL, NULL, "model.lr=4", "=--set model.lr: unknown key (lr is a key of train)");
    REJECT_SET(NULL, NULL, "modle.top_k=2",
               "=--set modle.top_k: unknown group modle (did you mean model?)");
    REJECT_SET(NULL, NULL, "train.lr=\"fast\"", "=--set train.lr: expected a number, got a string");
    REJECT_SET(NULL, NULL, "model.n_layers=2.5",
               "=--set model.n_layers: expected an integer, got a float");
    REJECT_SET(NULL, NULL, "model.tie_embeddings=1",
               "=--set model.tie_embeddings: expected a boolean (true or false), got an integer");
    REJECT_SET(NULL, NULL, "model.top_k=0", "=--set model.top_k: 0 is out of range [1, 4096]");
    REJECT_SET(NULL, NULL, "model.top_k", "=--set model.top_k: expected group.key=value");
    REJECT_SET(NULL, NULL, "top_k=2", "--set top_k: expected group.key=value",
               "top_k is a key of model");
    REJECT_SET(NULL, NULL, "train.optimizer=sgd", "--set train.optimizer: syntax error",
               "double quotes: --set 'train.optimizer=\"sgd\"'");
    REJECT_SET(NULL, NULL, "train.steps=5; lr = 3",
               "=--set train.steps: expected one value, got \"5; lr = 3\"");
    REJECT_SET(NULL, NULL, "train.lr=", "--set train.lr: missing value");
    REJECT_SET(NULL, NULL, "data.text=(\"a\", 3)",
               "=--set data.text: data.text[1]: expected a string, got an integer");
    REJECT_SET(NULL, NULL, "train.optimizer=\"adam\"",
               "--set train.optimizer: \"adam\" is not one of \"adamw\" or \"sgd\"");
    // the file's top-level "model" is not a group, so the override has nowhere to go
    REJECT_SET("bad_set_scalar.cfg", "\nmodel = 5;\n", "model.top_k=2",
               "=bad_set_scalar.cfg:2: model: expected a group (model = { ... };), got an integer");
    // a file error is still found with overrides present
    REJECT_SET("bad_set_file.cfg", "train = {\n  lr = \"x\";\n};\n", "train.steps=10",
               "=bad_set_file.cfg:2: train.lr: expected a number, got a string");
}

// ---- unbounded inputs, sizes, NUL (issue 8) -------------------------------------------------

// A FIFO in the test folder (left from an earlier run is fine).
static void make_fifo(const char *path) {
    struct stat sb;
    if (mkfifo(path, 0644) != 0 && !(stat(path, &sb) == 0 && S_ISFIFO(sb.st_mode))) {
        fprintf(stderr, "cannot make the FIFO %s\n", path);
        exit(1);
    }
}

// `bytes` bytes of comment lines (a valid config of that size).
static void write_big(const char *path, long bytes) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    static char line[64];
    memset(line, ' ', sizeof line);
    line[0] = '#', line[sizeof line - 1] = '\n';
    for (; bytes >= (long)sizeof line; bytes -= (long)sizeof line) fwrite(line, 1, sizeof line, f);
    for (; bytes > 0; bytes--) fputc('\n', f);
    if (fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

#define MIB (1L << 20)
#define REJECT_IO(file, text, ...) \
    reject_at(__LINE__, file, text, 0, NULL, MOE_EIO, __VA_ARGS__, NULL)

// Only regular files of at most 16 MiB are read: /dev/zero never ends, a FIFO blocks.
static void case_unbounded_input(void) {
    reject_at(__LINE__, "/dev/zero", NULL, 0, NULL, MOE_EIO,
              "=/dev/zero: not a regular file (a character device): a config must be a regular "
              "file",
              NULL);
    make_fifo("unbounded_fifo.cfg");
    reject_at(__LINE__, "unbounded_fifo.cfg", NULL, 0, NULL, MOE_EIO,
              "=unbounded_fifo.cfg: not a regular file (a FIFO): a config must be a regular file",
              NULL);
    write_big("unbounded_big.cfg", 17 * MIB);
    reject_at(__LINE__, "unbounded_big.cfg", NULL, 0, NULL, MOE_EIO,
              "=unbounded_big.cfg: is 17825792 bytes, more than the 16777216 (16 MiB) a config "
              "file may have",
              NULL);
    write_big("unbounded_big.cfg", 16 * MIB + 1);
    reject_at(__LINE__, "unbounded_big.cfg", NULL, 0, NULL, MOE_EIO,
              "unbounded_big.cfg: is 16777217 bytes, more than", NULL);
    static moe_train_config c;
    write_big("unbounded_big.cfg", 16 * MIB); // the limit itself is fine
    ACCEPT("unbounded_big.cfg", NULL, &c);
    remove("unbounded_big.cfg");
}

// @include reads only what the main file may be, at most 10 deep and 16 MiB in all.
static void case_include_limits(void) {
    static moe_train_config c;
    REJECT_IO("include_limits_zero.cfg", "model = {};\n@include \"/dev/zero\"\n",
              "=include_limits_zero.cfg:2: @include \"/dev/zero\": /dev/zero: not a regular file "
              "(a character device): a config must be a regular file");
    make_fifo("include_limits_fifo");
    REJECT_IO("include_limits_fifo.cfg", "\n\n  @include \"include_limits_fifo\"\n",
              "=include_limits_fifo.cfg:3: @include \"include_limits_fifo\": include_limits_fifo: "
              "not a regular file (a FIFO): a config must be a regular file");
    // nested, from a folder (relative to the main file's folder, as libconfig does)
    mkdir("inc2", 0755);
    make_fifo("inc2/fifo");
    write_file("inc2/part.cfg", "train = {\n  lr = 0.1;\n};\n@include \"fifo\"\n");
    REJECT_IO("inc2/main.cfg", "model = {};\n@include \"part.cfg\"\n",
              "=inc2/part.cfg:4: @include \"fifo\": inc2/fifo: not a regular file (a FIFO): a "
              "config must be a regular file");
    write_big("inc2/big.cfg", 17 * MIB);
    REJECT_IO("inc2/main_big.cfg", "@include \"big.cfg\"\n",
              "=inc2/main_big.cfg:1: @include \"big.cfg\": inc2/big.cfg: is 17825792 bytes, more "
              "than the 16777216 (16 MiB) a config file may have");
    remove("inc2/big.cfg");
    FILE *f = fopen("inc2/nul.cfg", "wb");
    if (f) {
        fwrite("model = {};\n\0", 1, 13, f);
        fclose(f);
    }
    REJECT("inc2/main_nul.cfg", "@include \"nul.cfg\"\n",
           "=inc2/main_nul.cfg:1: @include \"nul.cfg\": inc2/nul.cfg: contains a NUL byte at "
           "offset 12: not a config file");
    REJECT("include_limits_self.cfg", "model = {};\n@include \"include_limits_self.cfg\"\n",
           "include_limits_self.cfg:2: @include \"include_limits_self.cfg\": more than 10 "
           "nested @includes (does a file include itself?)");
    // 17 inclusions of 1 MiB: each file is small, together they are not
    write_big("include_limits_1m.cfg", MIB);
    static char text[1024];
    size_t len = 0;
    for (int i = 0; i < 17; i++)
        len +=
            (size_t)snprintf(text + len, sizeof text - len, "@include \"include_limits_1m.cfg\"\n");
    REJECT_IO("include_limits_many.cfg", text,
              "=include_limits_many.cfg:16: @include \"include_limits_1m.cfg\": the config and its "
              "@includes come to more than 16777216 bytes (16 MiB; a file counts each time it is "
              "included)");
    remove("include_limits_1m.cfg");
    // an @include inside a comment or a string is not one
    if (ACCEPT("include_limits_text.cfg",
               "/*\n@include \"/dev/zero\"\n*/\n# @include \"/dev/zero\"\n"
               "train = { init_from = \"x\n@include \\\"/dev/zero\\\"\"; };\n",
               &c))
        CHECK(strcmp(c.init_from, "x\n@include \"/dev/zero\"") == 0);
    // a --set value cannot include (it would be read relative to wherever moe runs)
    REJECT_SET(NULL, NULL, "train.lr=1\n@include \"/dev/zero\"",
               "=--set train.lr: @include is not allowed in a --set value");
}

// Products of config values that size buffers are bounded in 64 bits, every key named.
static void case_size_limits(void) {
    REJECT("size_tokens.cfg",
           "model = {\n  max_seq_len = 1048576;\n};\ntrain = {\n  batch_size = 1048576;\n"
           "  seq_len = 1048576;\n};\n",
           "=size_tokens.cfg:5: train.batch_size * train.seq_len = 1099511627776 exceeds 2^24 "
           "tokens per micro-batch (train.batch_size = 1048576, train.seq_len = 1048576 (at "
           "size_tokens.cfg:6)): the model counts a micro-batch's tokens in an int");
    REJECT("size_tokens_2.cfg", "train = {\n  batch_size = 131073;\n};\n",
           "size_tokens_2.cfg:2: train.batch_size * train.seq_len = 16777344 exceeds 2^24",
           "train.seq_len = 128 (default)");
    static moe_train_config c;
    if (ACCEPT("size_tokens_ok.cfg",
               "model = { max_seq_len = 16; d_model = 64; d_ff = 64; top_k = 1; };\n"
               "train = { batch_size = 1048576; seq_len = 16; };\n",
               &c)) // exactly 2^24 tokens
        CHECK(c.batch_size == 1048576 && c.seq_len == 16);
    REJECT("size_dispatch.cfg",
           "model = {\n  top_k = 8;\n  d_ff = 1048576;\n};\ntrain = {\n  batch_size = 64;\n"
           "  seq_len = 256;\n};\n",
           "=size_dispatch.cfg:6: train.batch_size * train.seq_len * model.top_k * model.d_ff = "
           "137438953472 exceeds 2^31-1 (train.batch_size = 64, train.seq_len = 256 (at "
           "size_dispatch.cfg:7), model.top_k = 8 (at size_dispatch.cfg:2), model.d_ff = 1048576 "
           "(at size_dispatch.cfg:3)): the MoE layer indexes its dispatch buffers with an int");
    REJECT("size_logits.cfg",
           "model = {\n  vocab_size = 16777216;\n  d_model = 8;\n  n_heads = 2;\n};\ntrain = {\n"
           "  batch_size = 4096;\n};\n",
           "size_logits.cfg:7: train.batch_size * train.seq_len * model.vocab_size = "
           "8796093022208 exceeds 2^36 logits per micro-batch");
    REJECT("size_activations.cfg",
           "model = {\n  n_layers = 1024;\n  d_model = 4096;\n  d_ff = 8;\n};\ntrain = {\n"
           "  batch_size = 256;\n};\n",
           "size_activations.cfg:2: model.n_layers * train.batch_size * train.seq_len * "
           "model.d_model = 137438953472 exceeds 2^36 activations");
    REJECT("size_counts.cfg",
           "model = {\n  n_layers = 64;\n  n_experts = 64;\n};\n"
           "train = {\n  grad_accum = 1048576;\n};\n",
           "=size_counts.cfg:6: train.grad_accum * model.n_layers * model.n_experts = 4294967296 "
           "exceeds 2^26 routing counts (train.grad_accum = 1048576, model.n_layers = 64 (at "
           "size_counts.cfg:2), model.n_experts = 64 (at size_counts.cfg:3)): the trainer keeps "
           "every micro-batch's counts of every layer and expert");
    REJECT("size_eval.cfg",
           "train = {\n  batch_size = 1024;\n  seq_len = 256;\n  eval_batches = 1048576;\n};\n"
           "model = { d_ff = 8; };\n",
           "size_eval.cfg:4: train.eval_batches * train.batch_size * train.seq_len = "
           "274877906944 exceeds 2^36 tokens per validation pass");
    REJECT("size_embed.cfg", "model = {\n  vocab_size = 16777216;\n  d_model = 512;\n};\n",
           "size_embed.cfg:2: model.vocab_size * model.d_model = 8589934592 exceeds 2^32 "
           "embedding weights (model.vocab_size = 16777216, model.d_model = 512 (at "
           "size_embed.cfg:3))");
    REJECT("size_attn_weights.cfg",
           "model = {\n  n_layers = 1024;\n  d_model = 8192;\n  n_experts = 2;\n  d_ff = 1;\n};\n"
           "train = { batch_size = 1; seq_len = 8; };\n",
           "size_attn_weights.cfg:2: model.n_layers * model.d_model^2 = 68719476736 exceeds "
           "2^34");
    REJECT("size_experts.cfg",
           "model = {\n  n_layers = 64;\n  n_experts = 256;\n  d_ff = 4096;\n"
           "  d_model = 1024;\n};\ntrain = { batch_size = 1; };\n",
           "size_experts.cfg:2: model.n_layers * model.n_experts * 3 * model.d_ff * model.d_model "
           "= 206158430208 exceeds 2^34 expert weights");
    // an override is named like any other place
    REJECT_SET("size_set.cfg",
               "model = {\n  max_seq_len = 1048576;\n};\ntrain = {\n  seq_len = 1048576;\n};\n",
               "train.batch_size=64",
               "=--set train.batch_size: train.batch_size * train.seq_len = 67108864 exceeds 2^24 "
               "tokens per micro-batch (train.batch_size = 64, train.seq_len = 1048576 (at "
               "size_set.cfg:5)): the model counts a micro-batch's tokens in an int");
}

// "\x00" in a string is refused (libconfig 1.5 silently drops it: "a\x00b" reads as "ab").
static void case_nul_string(void) {
    REJECT("nul_string_1.cfg", "train = {\n  init_from = \"a\\x00b\";\n};\n",
           "=nul_string_1.cfg:2: train.init_from: \"\\x00\" in a string: a string cannot hold "
           "a NUL character (libconfig would silently drop it)");
    REJECT("nul_string_2.cfg", "data = {\n  text = (\"a\",\n    \"b\\X00\");\n};\n",
           "nul_string_2.cfg:3: data.text: \"\\x00\" in a string");
    mkdir("inc3", 0755);
    write_file("inc3/part.cfg", "\nlog = { dir = \"r\\x00\"; };\n");
    REJECT("inc3/main.cfg", "model = {};\n@include \"part.cfg\"\n",
           "inc3/part.cfg:2: log.dir: \"\\x00\" in a string");
    REJECT_SET(NULL, NULL, "train.init_from=\"a\\x00\"",
               "=--set train.init_from: \"\\x00\" in a string: a string cannot hold a NUL "
               "character (libconfig would silently drop it)");
    // an escaped backslash before x00, and other \x escapes, are fine
    static moe_train_config c;
    if (ACCEPT("nul_string_ok.cfg", "train = { init_from = \"a\\\\x00\\x41\"; };\n", &c))
        CHECK(strcmp(c.init_from, "a\\x00A") == 0);
}

// ---- driver -------------------------------------------------------------------------------

typedef struct {
    const char *name;
    void (*fn)(void);
} test_case;

// model.capacity_factor as a schedule or "auto", with auto's keys (train/capacity.h).
static void case_capacity(void) {
    static moe_train_config a, b;
    if (ACCEPT("capacity_sched.cfg",
               "model = {\n  capacity_factor = ((0, 2.0), (100, 1), (5000000000L, 1.5));\n};\n",
               &a)) {
        const moe_capacity_plan *p = &a.capacity;
        CHECK(p->mode == MOE_CAPACITY_SCHEDULE && p->n_points == 3 && p->step[1] == 100 &&
              p->factor[1] == 1.0 && p->step[2] == INT64_C(5000000000) &&
              a.model.moe.capacity_factor == 2.0);
        FILE *f = fopen("capacity_sched_rt.cfg", "w");
        CHECK(f && moe_train_config_write(&a, f) == MOE_OK);
        if (f) fclose(f);
        if (ACCEPT("capacity_sched_rt.cfg", NULL, &b)) CHECK(same_config(&a, &b));
    }
    if (ACCEPT("capacity_auto.cfg",
               "model = {\n  capacity_factor = \"auto\";\n  max_drop = 0.02;\n"
               "  capacity_window = 50;\n  capacity_max = 3;\n};\n",
               &a)) {
        const moe_capacity_plan *p = &a.capacity;
        CHECK(p->mode == MOE_CAPACITY_AUTO && p->max_drop == 0.02 && p->window == 50 &&
              p->min == 1.0 && p->max == 3.0 && p->max_change == 1.25 &&
              a.model.moe.capacity_factor == 3.0); // starts at the upper bound
        FILE *f = fopen("capacity_auto_rt.cfg", "w");
        CHECK(f && moe_train_config_write(&a, f) == MOE_OK);
        if (f) fclose(f);
        if (ACCEPT("capacity_auto_rt.cfg", NULL, &b)) CHECK(same_config(&a, &b));
    }
    REJECT(
        "capacity_1.cfg", "model = {\n  capacity_factor = ((0, 2.0), (0, 1.0));\n};\n",
        "=capacity_1.cfg:2: model.capacity_factor[1]: steps must be >= 0 and increase (0 after 0)");
    REJECT("capacity_2.cfg", "model = {\n  capacity_factor = ((0, 2.0), (10, 0.0));\n};\n",
           "capacity_2.cfg:2: model.capacity_factor[1]: a scheduled factor must be > 0");
    REJECT("capacity_3.cfg", "model = {\n  capacity_factor = ((0, 2.0, 3), (10, 1.0));\n};\n",
           "capacity_3.cfg:2: model.capacity_factor[0]: expected a (step, factor) pair");
    REJECT("capacity_4.cfg", "model = {\n  capacity_factor = ((0.5, 2.0));\n};\n",
           "model.capacity_factor[0]: the step must be an integer");
    REJECT("capacity_5.cfg", "model = {\n  capacity_factor = \"automatic\";\n};\n",
           "capacity_5.cfg:2: model.capacity_factor: \"automatic\" is not \"auto\"");
    REJECT("capacity_6.cfg", "model = {\n  capacity_factor = 1.25;\n  capacity_window = 10;\n};\n",
           "capacity_6.cfg:3: model.capacity_window is set but model.capacity_factor is not "
           "\"auto\"");
    REJECT("capacity_7.cfg",
           "model = {\n  capacity_factor = \"auto\";\n  capacity_min = 2.5;\n};\n",
           "capacity_7.cfg:3: model.capacity_min = 2.5 exceeds model.capacity_max = 2 (default)");
    REJECT("capacity_8.cfg", "model = {\n  capacity_factor = ();\n};\n",
           "capacity_8.cfg:2: model.capacity_factor: a schedule needs 1 to 64");
    REJECT("capacity_9.cfg", "model = {\n  capacity_factor = \"auto\";\n  max_drop = 1.0;\n};\n",
           "=capacity_9.cfg:3: model.max_drop: 1 is out of range (0, 1)");
}

static const test_case cases[] = {
    {"defaults", case_defaults},
    {"full", case_full},
    {"int_for_float", case_int_for_float},
    {"int64", case_int64},
    {"set", case_set},
    {"roundtrip", case_roundtrip},
    {"include", case_include},
    {"unknown_key", case_unknown_key},
    {"unknown_group", case_unknown_group},
    {"wrong_type", case_wrong_type},
    {"out_of_range", case_out_of_range},
    {"int_overflow", case_int_overflow},
    {"inconsistent", case_inconsistent},
    {"bad_enum", case_bad_enum},
    {"syntax_error", case_syntax_error},
    {"missing_file", case_missing_file},
    {"bad_set", case_bad_set},
    {"unbounded_input", case_unbounded_input},
    {"include_limits", case_include_limits},
    {"size_limits", case_size_limits},
    {"nul_string", case_nul_string},
    {"capacity", case_capacity},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

static int find_case(const char *name) {
    for (int i = 0; i < N_CASES; i++)
        if (strcmp(cases[i].name, name) == 0) return i;
    return -1;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "--check-list") == 0) { // CMake's list == this table
        int seen[N_CASES] = {0};
        for (int i = 2; i < argc; i++) {
            int c = find_case(argv[i]);
            if (c < 0) {
                fprintf(stderr, "FAIL: CMake lists case %s, which test_config.c lacks\n", argv[i]);
                failures++;
            } else {
                seen[c] = 1;
            }
        }
        for (int c = 0; c < N_CASES; c++)
            if (!seen[c]) {
                fprintf(stderr, "FAIL: case %s is not registered in config/config.cmake\n",
                        cases[c].name);
                failures++;
            }
        printf("%s\n", failures ? "FAILED" : "OK: every case is a ctest");
        return failures ? 1 : 0;
    }
    for (int i = 1; i < argc || (argc == 1 && i == 1); i++) {
        for (int c = 0; c < N_CASES; c++) {
            if (argc > 1 && strcmp(cases[c].name, argv[i]) != 0) continue;
            printf("[%s]\n", cases[c].name);
            cases[c].fn();
        }
        if (argc > 1 && find_case(argv[i]) < 0) {
            fprintf(stderr, "FAIL: no case %s\n", argv[i]);
            failures++;
        }
    }
    printf("%s (%d failure%s)\n", failures ? "FAILED" : "OK", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
