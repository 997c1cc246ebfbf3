// Loading hostile or damaged checkpoints (issue 8, defects 1-4 and 7; issue 28, items 7, 8, 9
// and 13): every path that loads a moe.c checkpoint verifies it, trainer_state.json and
// config.json are validated field by field (and across fields) before anything is allocated
// from them, non-finite weights or results are errors, never a printed nan or inf, a key
// twice in a JSON file is refused, and so are special-token ids outside the vocabulary.
//
//   test_ckpt_hardening CASE     CASE: uaf | integrity | state | sizes | nonfinite | rope | hf5
//                                      | duplicates | special_ids
#define _POSIX_C_SOURCE 200809L // mkdtemp

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"
#include "ckpt/checkpoint.h"
#include "infer/infer.h"
#include "train/trainer.h"
#include "../test_backend.h"

static char work[64];

// A small model config: 2 layers, 4 experts top-2.
static moe_model_config small_config(void) {
    moe_model_config c = {.vocab_size = 256,
                          .d_model = 32,
                          .n_layers = 2,
                          .n_heads = 4,
                          .n_kv_heads = 2,
                          .max_seq_len = 32,
                          .rope_theta = 1e4,
                          .rms_norm_eps = 1e-5};
    c.moe = moe_config_default(32, 24, 4, 2);
    return c;
}

// A moe.c checkpoint (trainer_state.json, CRC32s, AdamW moments) at work/name/step_00000003;
// its folder goes to `folder`.
static void make_checkpoint(const char *name, optim_kind kind, char *folder, size_t n) {
    moe_train_config tc;
    moe_train_config_default(&tc);
    tc.optimizer = kind == OPTIM_SGD;
    moe_model_config mc = small_config();
    moe_model m;
    moe_model_create(&m, test_backend(), &mc, 1, 8);
    moe_model_init_weights(&m, 3, 0.1);
    optim_region all = {0, m.n_params, 1};
    optim_config oc = {kind, 0.9, 0.95, 1e-8, 0.1};
    moe_optimizer o;
    moe_optimizer_create(&o, m.be, &oc, m.n_params, &all, 1);
    o.t = 3;
    if (o.m) { // moments as after a few steps: not zero, so a load that drops them shows
        real *h = malloc(m.n_params * sizeof(real));
        for (size_t i = 0; i < m.n_params; i++) h[i] = (real)(1e-3 * ((i * 7919) % 1000) - 0.5);
        m.be->copy_to_device(m.be, o.m, h, m.n_params * sizeof(real));
        for (size_t i = 0; i < m.n_params; i++) h[i] = h[i] * h[i];
        m.be->copy_to_device(m.be, o.v, h, m.n_params * sizeof(real));
        free(h);
    }
    train_state ts = {.step = 3,
                      .loader = {.seed = 1, .position = 2, .n_windows = 9, .seq_len = 8}};
    char root[200];
    snprintf(root, sizeof root, "%s/%s", work, name);
    if (moe_checkpoint_save(root, &m, &o, &ts, &tc, 2, CKPT_SHARD_BYTES, NULL))
        printf("save: %s\n", moe_last_error());
    snprintf(folder, n, "%s/step_00000003", root);
    moe_optimizer_destroy(&o);
    moe_model_destroy(&m);
}

static void sh(const char *fmt, const char *a, const char *b) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    if (system(cmd) != 0) printf("    command failed: %s\n", cmd);
}

static void write_text_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

static cJSON *read_json_file(const char *path) {
    char *text = test_read_file(path);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

static void write_json_file(const char *path, cJSON *j) {
    char *text = cJSON_Print(j);
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
    free(text);
    cJSON_Delete(j);
}

// The object of j that holds *key, a dotted path one level deep ("optimizer.t"): *key moves
// past the dot.
static cJSON *field_parent(cJSON *j, const char **key) {
    const char *dot = strchr(*key, '.');
    if (!dot) return j;
    char group[64];
    snprintf(group, sizeof group, "%.*s", (int)(dot - *key), *key);
    *key = dot + 1;
    return cJSON_GetObjectItem(j, group);
}

// Sets folder/file's `key` (dotted one level deep) to the JSON value `json`.
static void set_field(const char *folder, const char *file, const char *key, const char *json) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", folder, file);
    cJSON *j = read_json_file(path), *obj = field_parent(j, &key);
    cJSON *v = cJSON_Parse(json);
    if (cJSON_GetObjectItem(obj, key))
        cJSON_ReplaceItemInObject(obj, key, v);
    else
        cJSON_AddItemToObject(obj, key, v);
    write_json_file(path, j);
}

// Adds a second `key` (dotted one level deep, as set_field) = json to folder/file, after the
// one it has: cJSON keeps both, and writes both.
static void add_duplicate(const char *folder, const char *file, const char *key, const char *json) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", folder, file);
    cJSON *j = read_json_file(path), *obj = field_parent(j, &key); // (key: past the dot)
    cJSON_AddItemToObject(obj, key, cJSON_Parse(json));
    write_json_file(path, j);
}

static void remove_field(const char *folder, const char *file, const char *key) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", folder, file);
    cJSON *j = read_json_file(path);
    cJSON_DeleteItemFromObject(j, key);
    write_json_file(path, j);
}

// infer_load must fail with `code` and a message holding `a` (and `b` when not NULL).
static void expect_load_error(const char *what, const char *folder, moe_status code, const char *a,
                              const char *b) {
    moe_model m;
    moe_status st = infer_load(&m, test_backend(), folder, 8, 8);
    int ok = st == code && strstr(moe_last_error(), a) && (!b || strstr(moe_last_error(), b));
    check_true(what, ok);
    printf("    -> %s\n", st ? moe_last_error() : "(loaded)");
    if (!st) moe_model_destroy(&m);
}

// A fresh copy of src named work/name; its path goes to out.
static void copy_folder(const char *src, const char *name, char *out, size_t n) {
    snprintf(out, n, "%s/%s/step_00000003", work, name);
    char parent[300];
    snprintf(parent, sizeof parent, "%s/%s", work, name);
    sh("rm -rf %s && mkdir -p %s", parent, parent);
    sh("cp -r %s %s/", src, parent);
}

// ---- 1: the error about an unknown scoring_func is formatted before the JSON is freed ----
static void case_uaf(void) {
    char ck[300], dir[300];
    make_checkpoint("uaf_src", OPTIM_ADAMW, ck, sizeof ck);
    copy_folder(ck, "uaf", dir, sizeof dir);
    set_field(dir, "config.json", "scoring_func", "\"bogus_scoring_function_name\"");
    moe_model_config c;
    moe_status st = moe_hf_config_read(&c, dir);
    check_true("unknown scoring_func: an error naming the field (ASan: no use after free)",
               st == MOE_EINVAL && strstr(moe_last_error(), "scoring_func") &&
                   strstr(moe_last_error(), "softmax"));
    printf("    -> %s\n", moe_last_error());
}

// ---- 2: eval, generate, export and init_from verify; the CRC list cannot be emptied -------
static void damage_last_byte(const char *path) {
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, -1, SEEK_END);
    int last = fgetc(f);
    fseek(f, -1, SEEK_END);
    fputc(last ^ 0x40, f);
    fclose(f);
}

// The AdamW moments that a and b load into a fresh model are equal (and not all zero).
static int same_moments(const char *a, const char *b) {
    moe_model_config mc = small_config();
    optim_config oc = {OPTIM_ADAMW, 0.9, 0.95, 1e-8, 0.1};
    real *host[2][2] = {{0}};
    size_t n = 0;
    int ok = 1;
    for (int k = 0; k < 2; k++) {
        moe_model m;
        moe_optimizer o;
        train_state ts;
        moe_model_create(&m, test_backend(), &mc, 1, 8);
        n = m.n_params;
        optim_region all = {0, n, 1};
        moe_optimizer_create(&o, m.be, &oc, n, &all, 1);
        moe_status st = moe_checkpoint_load(k ? b : a, &m, &o, &ts);
        if (st) printf("    -> %s\n", moe_last_error());
        ok &= st == MOE_OK;
        for (int i = 0; i < 2; i++) {
            host[k][i] = malloc(n * sizeof(real));
            m.be->copy_to_host(m.be, host[k][i], i ? o.v : o.m, n * sizeof(real));
        }
        moe_optimizer_destroy(&o);
        moe_model_destroy(&m);
    }
    double norm = 0;
    for (int i = 0; i < 2; i++) {
        ok &= !memcmp(host[0][i], host[1][i], n * sizeof(real));
        for (size_t e = 0; e < n; e++) norm += fabs(host[0][i][e]);
        free(host[0][i]), free(host[1][i]);
    }
    return ok && norm > 0;
}

static void case_integrity(void) {
    char ck[300], dir[300], path[400];
    make_checkpoint("int_src", OPTIM_ADAMW, ck, sizeof ck);
    moe_model m;
    moe_status st = infer_load(&m, test_backend(), ck, 8, 8);
    check_true("an intact checkpoint loads for inference", st == MOE_OK);
    if (!st) moe_model_destroy(&m);

    copy_folder(ck, "int_shard", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", dir);
    damage_last_byte(path);
    expect_load_error("eval/generate/export: a damaged shard is refused (CRC32)", dir, MOE_EIO,
                      "CRC32 mismatch", "model-00001-of-00001.safetensors");
    // init_from loads through moe_hf_load_weights
    moe_model t;
    moe_model_config mc = small_config();
    moe_model_create(&t, test_backend(), &mc, 1, 8);
    st = moe_hf_load_weights(&t, dir);
    check_true("init_from: a damaged shard is refused (CRC32)",
               st == MOE_EIO && strstr(moe_last_error(), "CRC32 mismatch"));
    moe_model_destroy(&t);

    copy_folder(ck, "int_empty", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", dir);
    damage_last_byte(path);
    set_field(dir, "trainer_state.json", "crc32", "{}");
    expect_load_error("\"crc32\": {} does not disable the checks", dir, MOE_EIO, "config.json",
                      "no CRC32");

    copy_folder(ck, "int_drop", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    cJSON *j = read_json_file(path);
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(j, "crc32"), "model-00001-of-00001.safetensors");
    write_json_file(path, j);
    expect_load_error("a shard whose CRC32 entry was removed is refused", dir, MOE_EIO,
                      "model-00001-of-00001.safetensors", "no CRC32");

    copy_folder(ck, "int_moments", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    j = read_json_file(path);
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(j, "crc32"),
                               "optimizer-exp_avg-00001-of-00001.safetensors");
    write_json_file(path, j);
    expect_load_error("the moments must be covered too (AdamW)", dir, MOE_EIO,
                      "optimizer-exp_avg-00001-of-00001.safetensors", "no CRC32");

    copy_folder(ck, "int_nomoment", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/optimizer-exp_avg_sq-00001-of-00001.safetensors", dir);
    unlink(path);
    expect_load_error("a missing moment shard is refused, named", dir, MOE_EIO,
                      "optimizer-exp_avg_sq-00001-of-00001.safetensors", NULL);

    // checkpoints from before the per-shard moments hold one optimizer-exp_avg.safetensors
    copy_folder(ck, "int_old_moments", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    j = read_json_file(path);
    cJSON *crcs = cJSON_GetObjectItem(j, "crc32");
    for (int i = 0; i < 2; i++) {
        const char *pre = i ? "optimizer-exp_avg_sq" : "optimizer-exp_avg";
        char from[600], to[600], key[96];
        snprintf(key, sizeof key, "%s-00001-of-00001.safetensors", pre);
        snprintf(from, sizeof from, "%s/%s", dir, key);
        snprintf(to, sizeof to, "%s/%s.safetensors", dir, pre);
        check_true("renamed to the single moment file", rename(from, to) == 0);
        cJSON *crc = cJSON_DetachItemFromObject(crcs, key);
        snprintf(key, sizeof key, "%s.safetensors", pre);
        cJSON_AddItemToObject(crcs, key, crc);
    }
    write_json_file(path, j);
    check_true("the single moment files of older checkpoints load, equal to the shards",
               same_moments(ck, dir));

    copy_folder(ck, "int_nostate", dir, sizeof dir);
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    unlink(path);
    expect_load_error("a step folder without trainer_state.json is refused", dir, MOE_EIO,
                      "trainer_state.json", NULL);
}

// ---- 3: trainer_state.json is validated field by field ------------------------------------
static void state_error(const char *what, const char *src, const char *key, const char *json,
                        const char *expect) {
    char dir[300];
    copy_folder(src, "state", dir, sizeof dir);
    if (json)
        set_field(dir, "trainer_state.json", key, json);
    else
        remove_field(dir, "trainer_state.json", key);
    moe_checkpoint_state cs;
    moe_status st = moe_checkpoint_state_read(&cs, dir);
    check_true(what, st == MOE_EIO && strstr(moe_last_error(), "trainer_state.json") &&
                         strstr(moe_last_error(), expect));
    printf("    -> %s\n", st ? moe_last_error() : "(accepted)");
}

// The case: "step": 100 with schedule.steps = 4, in a folder not named step_N (so the
// folder's name does not refuse it first): refused by schedule.steps.
static void state_outside_step_folder(const char *src) {
    char dir[300], renamed[300];
    copy_folder(src, "state_named", dir, sizeof dir);
    snprintf(renamed, sizeof renamed, "%s/state_named/my_checkpoint", work);
    if (rename(dir, renamed) != 0) printf("    rename failed\n");
    set_field(renamed, "trainer_state.json", "step", "100");
    set_field(renamed, "trainer_state.json", "schedule.steps", "4");
    moe_checkpoint_state cs;
    moe_status st = moe_checkpoint_state_read(&cs, renamed);
    check_true("step 100 with schedule.steps = 4 refused (not \"run already finished\")",
               st == MOE_EIO && strstr(moe_last_error(), "trainer_state.json") &&
                   strstr(moe_last_error(), "\"schedule.steps\" = 4"));
    printf("    -> %s\n", st ? moe_last_error() : "(accepted)");
}

static void case_state(void) {
    char ck[300];
    make_checkpoint("state_src", OPTIM_ADAMW, ck, sizeof ck);
    moe_checkpoint_state cs;
    moe_status st = moe_checkpoint_state_read(&cs, ck);
    check_true("a saved state reads back", st == MOE_OK && cs.ts.step == 3 && cs.optimizer_t == 3 &&
                                               cs.optimizer == OPTIM_ADAMW &&
                                               cs.ts.loader.position == 2);
    state_error("step = 1e300 refused", ck, "step", "1e300", "\"step\"");
    state_error("negative step refused", ck, "step", "-4", "\"step\"");
    state_error("fractional step refused", ck, "step", "2.5", "\"step\"");
    state_error("step as a string refused", ck, "step", "\"3\"", "\"step\"");
    state_error("missing step refused", ck, "step", NULL, "\"step\"");
    state_error("negative skip count refused", ck, "skipped", "-1", "\"skipped\"");
    state_error("more skips than steps refused", ck, "skipped", "4", "\"skipped\"");
    state_error("optimizer.t beyond the steps refused", ck, "optimizer.t", "1e18",
                "\"optimizer.t\"");
    state_error("unknown optimizer refused", ck, "optimizer.kind", "\"lion\"", "optimizer.kind");
    state_error("a loader seed that is not a u64 string refused", ck, "rng",
                "{\"data_loader\": "
                "{\"seed\": \"-1\", \"epoch\": \"0\", \"position\": \"0\", \"n_windows\": \"9\", "
                "\"seq_len\": \"8\"}}",
                "\"rng.data_loader.seed\"");
    state_error("a loader position beyond its windows refused", ck, "rng",
                "{\"data_loader\": "
                "{\"seed\": \"1\", \"epoch\": \"0\", \"position\": \"10\", \"n_windows\": \"9\", "
                "\"seq_len\": \"8\"}}",
                "position");
    state_error("an ep_size that does not divide the world refused", ck, "world",
                "{\"size\": 4, \"ep_size\": 3}", "ep_size");
    state_error("an ep_size beyond the world refused", ck, "world", "{\"size\": 2, \"ep_size\": 4}",
                "ep_size");
    state_error("unknown format version refused", ck, "version", "2", "\"version\"");
    // across fields (issue 28, item 13): the folder's name, the schedule
    state_error("a step other than the folder's step_00000003 refused", ck, "step", "100",
                "step_00000003");
    state_error("a schedule that is not an object refused", ck, "schedule", "5", "\"schedule\"");
    state_error("an unknown schedule kind refused", ck, "schedule.kind", "\"linear\"",
                "\"schedule.kind\"");
    state_error("schedule.lr = \"nan\" (a string) refused", ck, "schedule.lr", "\"nan\"",
                "\"schedule.lr\"");
    state_error("schedule.lr = null refused", ck, "schedule.lr", "null", "\"schedule.lr\"");
    state_error("a negative schedule.min_lr refused", ck, "schedule.min_lr", "-1e-4",
                "\"schedule.min_lr\"");
    state_error("a fractional schedule.warmup_steps refused", ck, "schedule.warmup_steps", "2.5",
                "\"schedule.warmup_steps\"");
    state_error("schedule.steps as a string refused", ck, "schedule.steps", "\"4\"",
                "\"schedule.steps\"");
    state_error("a step beyond schedule.steps refused", ck, "schedule.steps", "2",
                "\"schedule.steps\"");
    state_outside_step_folder(ck);
    char dir[300];
    copy_folder(ck, "state", dir, sizeof dir);
    remove_field(dir, "trainer_state.json", "schedule");
    st = moe_checkpoint_state_read(&cs, dir);
    check_true("a state without \"schedule\" (older checkpoints) is still read", st == MOE_OK);
    if (st) printf("    -> %s\n", moe_last_error());

    // resuming with another optimizer: refused, naming both
    char sgd[300];
    make_checkpoint("state_sgd", OPTIM_SGD, sgd, sizeof sgd);
    moe_model m;
    moe_model_config mc = small_config();
    moe_model_create(&m, test_backend(), &mc, 1, 8);
    optim_region all = {0, m.n_params, 1};
    optim_config oc = {OPTIM_ADAMW, 0.9, 0.95, 1e-8, 0.1};
    moe_optimizer o;
    moe_optimizer_create(&o, m.be, &oc, m.n_params, &all, 1);
    train_state ts;
    st = moe_checkpoint_load(sgd, &m, &o, &ts);
    check_true("switching the optimizer on resume is refused, naming both",
               st == MOE_EINVAL && strstr(moe_last_error(), "sgd") &&
                   strstr(moe_last_error(), "adamw"));
    printf("    -> %s\n", moe_last_error());
    moe_optimizer_destroy(&o);
    moe_model_destroy(&m);
}

// ---- 4: config.json sizes are bounded and checked against the headers before allocating ---
static moe_status code_of(const char *msg) {
    return strstr(msg, "describes") || strstr(msg, "shape") ? MOE_EIO : MOE_EINVAL;
}

// An HF folder (the checkpoint without trainer_state.json, under a name that is not a step
// folder's) whose config.json has key = json: the field checks alone must refuse it.
static void config_error(const char *what, const char *src, const char *key, const char *json,
                         const char *a, const char *b) {
    char dir[300], path[400], hf[300];
    copy_folder(src, "sizes", dir, sizeof dir);
    set_field(dir, "config.json", key, json);
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    unlink(path);
    snprintf(hf, sizeof hf, "%s/sizes/hf", work);
    if (rename(dir, hf) != 0) printf("    rename failed\n");
    expect_load_error(what, hf, code_of(a), a, b);
}

static void case_sizes(void) {
    char ck[300];
    make_checkpoint("sizes_src", OPTIM_ADAMW, ck, sizeof ck);
    config_error("a million layers: refused by its range, nothing allocated", ck,
                 "num_hidden_layers", "1000000", "num_hidden_layers", "[1, 1024]");
    config_error("1000 layers (in range): refused against the headers, nothing allocated", ck,
                 "num_hidden_layers", "1000", "describes", "num_hidden_layers = 1000");
    config_error("4096 experts (in range): refused against the headers", ck, "num_local_experts",
                 "4096", "describes", "num_local_experts = 4096");
    config_error("max_position_embeddings = 1e9 refused", ck, "max_position_embeddings", "1e9",
                 "max_position_embeddings", NULL);
    config_error("head_dim * num_attention_heads beyond int refused", ck, "head_dim", "1073741824",
                 "head_dim", NULL);
    config_error("a larger vocabulary: the shapes named from the headers alone", ck, "vocab_size",
                 "300", "has shape [256, 32], expected [300, 32]", NULL);
    config_error("hidden_size as a string refused", ck, "hidden_size", "\"32\"", "hidden_size",
                 "integer");
    config_error("fractional intermediate_size refused", ck, "intermediate_size", "24.5",
                 "intermediate_size", "integer");
}

// ---- 7: non-finite weights, results and config values --------------------------------------
static void case_nonfinite(void) {
    char ck[300];
    make_checkpoint("nf_src", OPTIM_ADAMW, ck, sizeof ck);
    config_error("rms_norm_eps = 1e300 refused", ck, "rms_norm_eps", "1e300", "rms_norm_eps", NULL);
    config_error("routed_scaling_factor = 1e300 refused", ck, "routed_scaling_factor", "1e300",
                 "routed_scaling_factor", NULL);
    config_error("rope_theta = 1e999 (inf) refused", ck, "rope_theta", "1e999", "rope_theta", NULL);

    // an HF folder whose weights hold a NaN: refused at load, naming the tensor
    moe_model_config mc = small_config();
    moe_model m, back;
    moe_model_create_inference(&m, test_backend(), &mc, 32, 32);
    moe_model_init_weights(&m, 4, 0.1);
    m.p.wo[5] = NAN;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/nf_nan", work);
    moe_hf_export(dir, &m, MOE_ST_F32, CKPT_SHARD_BYTES);
    expect_load_error("a NaN weight is refused, naming the tensor", dir, MOE_EIO,
                      "model.layers.0.self_attn.o_proj.weight", "non-finite");

    // finite weights whose forward overflows: eval and generate fail, never print nan
    moe_model_init_weights(&m, 4, 0.1);
    for (int i = 0; i < mc.vocab_size * mc.d_model; i++) m.p.lm_head[i] = 3e38f;
    snprintf(dir, sizeof dir, "%s/nf_overflow", work);
    moe_hf_export(dir, &m, MOE_ST_F32, CKPT_SHARD_BYTES);
    moe_status st = infer_load(&back, test_backend(), dir, 32, 32);
    check_true("overflowing weights still load (they are finite)", st == MOE_OK);
    uint32_t toks[33];
    for (int i = 0; i < 33; i++) toks[i] = (uint32_t)(i * 7 % 256);
    moe_token_file tf = {.count = 33, .vocab_size = 256, .dtype = 2, .tokens = toks};
    snprintf(tf.path, sizeof tf.path, "in-memory");
    double loss = 0;
    long n = 0;
    st = st ? st : infer_eval(&back, &tf, 16, 1, NULL, &loss, &n, NULL);
    check_true("eval: non-finite logits are an error (not 'loss nan', exit 0)",
               st == MOE_ENUMERIC && strstr(moe_last_error(), "non-finite logit"));
    printf("    -> %s\n", moe_last_error());
    moe_sampling s = {.temperature = 0, .top_p = 1, .seed = 1, .prefill_chunk = 8};
    int prompt[4] = {1, 2, 3, 4}, out[8], n_out = 0;
    st = infer_generate(&back, prompt, 4, 8, &s, out, &n_out);
    check_true("generate: non-finite logits are an error (not byte 255 forever)",
               st == MOE_ENUMERIC && n_out == 0 && strstr(moe_last_error(), "non-finite logit"));
    printf("    -> %s\n", moe_last_error());
    moe_model_destroy(&back);

    // finite logits, but a loss whose perplexity overflows (issue 28, item 7): an error naming
    // the largest weight, never "ppl inf"
    moe_model_init_weights(&m, 4, 0.1);
    for (int i = 0; i < mc.d_model; i++) m.p.final_norm[i] = 1e30f;
    snprintf(dir, sizeof dir, "%s/nf_norm", work);
    moe_hf_export(dir, &m, MOE_ST_F32, CKPT_SHARD_BYTES);
    const moe_status loaded = infer_load(&back, test_backend(), dir, 32, 32);
    st = loaded ? loaded : infer_eval(&back, &tf, 16, 1, NULL, &loss, &n, NULL);
    check_true("eval: a loss whose perplexity overflows is an error naming the largest weight",
               st == MOE_ENUMERIC && strstr(moe_last_error(), "perplexity overflows") &&
                   strstr(moe_last_error(), "1e+30 in model.norm.weight"));
    printf("    -> %s\n", st ? moe_last_error() : "(accepted)");
    if (!st) printf("    (loss %g)\n", loss);
    if (!loaded) moe_model_destroy(&back);
    moe_model_destroy(&m);
}

// ---- transformers 5.x writes rope_parameters instead of rope_theta --------------------------
static void case_rope(void) {
    char ck[300], dir[300];
    make_checkpoint("rope_src", OPTIM_ADAMW, ck, sizeof ck);
    copy_folder(ck, "rope", dir, sizeof dir);
    remove_field(dir, "config.json", "rope_theta");
    set_field(dir, "config.json", "rope_parameters",
              "{\"rope_theta\": 10000.0, \"rope_type\": \"default\"}");
    moe_model_config c;
    moe_status st = moe_hf_config_read(&c, dir);
    check_true("rope_parameters.rope_theta is read (transformers 5.x)",
               st == MOE_OK && c.rope_theta == 1e4);
    set_field(dir, "config.json", "rope_parameters",
              "{\"rope_theta\": 10000.0, \"rope_type\": \"yarn\"}");
    st = moe_hf_config_read(&c, dir);
    check_true("an unsupported rope_type is an error, not a silent default",
               st == MOE_EINVAL && strstr(moe_last_error(), "rope_type"));
    printf("    -> %s\n", moe_last_error());
}

// ---- what transformers 5.x reads and writes ---------------------------------------------------
static void case_hf5(void) {
    char ck[300], dir[300], path[400];
    make_checkpoint("hf5_src", OPTIM_ADAMW, ck, sizeof ck);
    // our float fields are JSON floats: transformers 5 refuses `"router_jitter_noise": 0`
    snprintf(path, sizeof path, "%s/config.json", ck);
    char *text = test_read_file(path);
    check_true("float fields are written as floats (0.0, not 0)",
               text && strstr(text, "\"router_jitter_noise\":\t0.0") &&
                   strstr(text, "\"attention_dropout\":\t0.0") &&
                   strstr(text, "\"rope_theta\":\t10000.0"));
    free(text);
    copy_folder(ck, "hf5", dir, sizeof dir);
    set_field(dir, "config.json", "head_dim", "null");
    set_field(dir, "config.json", "pad_token_id", "null");
    set_field(dir, "config.json", "dtype", "\"float32\"");
    moe_model_config c;
    moe_status st = moe_hf_config_read(&c, dir);
    check_true("transformers 5.x fields (head_dim null, dtype, pad_token_id) are read",
               st == MOE_OK);
    set_field(dir, "config.json", "quantization_config", "{\"quant_method\": \"fp8\"}");
    st = moe_hf_config_read(&c, dir);
    check_true("a field moe.c does not understand is an error naming it",
               st == MOE_EINVAL &&
                   strstr(moe_last_error(), "\"quantization_config\" is not understood"));
    printf("    -> %s\n", moe_last_error());
    remove_field(dir, "config.json", "quantization_config");
    set_field(dir, "config.json", "architectures", "[\"LlamaForCausalLM\"]");
    st = moe_hf_config_read(&c, dir);
    check_true("architectures without MixtralForCausalLM is refused",
               st == MOE_EINVAL && strstr(moe_last_error(), "architectures"));
}

// ---- a key twice in a JSON file (issue 28, item 9): cJSON reads the first, Python the last --

// A copy of src as an HF folder (without trainer_state.json, not named step_N): work/name/hf.
static void hf_copy(const char *src, const char *name, char *out, size_t n) {
    char dir[300], path[400];
    copy_folder(src, name, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    unlink(path);
    snprintf(out, n, "%s/%s/hf", work, name);
    if (rename(dir, out) != 0) printf("    rename failed\n");
}

static void case_duplicates(void) {
    char ck[300], dir[300];
    make_checkpoint("dup_src", OPTIM_ADAMW, ck, sizeof ck);
    hf_copy(ck, "dup_config", dir, sizeof dir);
    add_duplicate(dir, "config.json", "hidden_size", "64");
    expect_load_error("config.json with \"hidden_size\" twice is refused, naming the key", dir,
                      MOE_EIO, "config.json", "key \"hidden_size\" appears twice in the top level");
    hf_copy(ck, "dup_rope", dir, sizeof dir);
    remove_field(dir, "config.json", "rope_theta");
    set_field(dir, "config.json", "rope_parameters",
              "{\"rope_theta\": 10000.0, \"rope_type\": \"default\"}");
    add_duplicate(dir, "config.json", "rope_parameters.rope_theta", "500000.0");
    expect_load_error("a nested key twice is named with its object", dir, MOE_EIO, "config.json",
                      "key \"rope_theta\" appears twice in rope_parameters");
    hf_copy(ck, "dup_index", dir, sizeof dir);
    add_duplicate(dir, "model.safetensors.index.json", "weight_map.model.norm.weight",
                  "\"model-00001-of-00001.safetensors\"");
    expect_load_error("a tensor twice in the index's weight_map is refused", dir, MOE_EIO,
                      "model.safetensors.index.json",
                      "key \"model.norm.weight\" appears twice in weight_map");
    copy_folder(ck, "dup_state", dir, sizeof dir);
    add_duplicate(dir, "trainer_state.json", "step", "2");
    moe_checkpoint_state cs;
    moe_status st = moe_checkpoint_state_read(&cs, dir);
    check_true("trainer_state.json with \"step\" twice is refused",
               st == MOE_EIO && strstr(moe_last_error(), "trainer_state.json") &&
                   strstr(moe_last_error(), "key \"step\" appears twice in the top level"));
    printf("    -> %s\n", st ? moe_last_error() : "(accepted)");
    expect_load_error("  and so is every load of that checkpoint", dir, MOE_EIO,
                      "trainer_state.json", "appears twice");
}

// ---- special-token ids of tokenizer.json (issue 28, item 8) --------------------------------

// A tokenizer folder work/tok_K: <s> (the bos token) an added token of id `added`, <pad> (the
// pad token) in model.vocab with id `vocab`; its path goes to dir.
static void tokenizer_folder(char *dir, size_t n, const char *added, const char *vocab) {
    static int k;
    char path[400], text[512];
    snprintf(dir, n, "%s/tok_%d", work, k++);
    sh("mkdir -p %s%s", dir, "");
    snprintf(text, sizeof text,
             "{\"added_tokens\": [{\"id\": %s, \"content\": \"<s>\", \"special\": true}], "
             "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"<pad>\": %s}}}",
             added, vocab);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_text_file(path, text);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    snprintf(text, sizeof text, "{\"bos_token\": \"<s>\", \"pad_token\": \"<pad>\"}");
    write_text_file(path, text);
}

// The export of m with such a tokenizer is refused naming tokenizer.json and `expect`, and
// leaves nothing behind.
static void special_id_error(const char *what, const moe_model *m, const char *added,
                             const char *vocab, const char *expect) {
    char src[300], out[400];
    tokenizer_folder(src, sizeof src, added, vocab);
    snprintf(out, sizeof out, "%s_export", src);
    moe_status st = moe_hf_export_from(out, src, m, MOE_ST_F32, CKPT_SHARD_BYTES);
    check_true(what, st == MOE_EIO && strstr(moe_last_error(), "tokenizer.json") &&
                         strstr(moe_last_error(), expect) && access(out, F_OK) != 0);
    printf("    -> %s\n", st ? moe_last_error() : "(exported)");
}

static void case_special_ids(void) {
    moe_model_config mc = small_config(); // a vocabulary of 256
    moe_model m;
    moe_model_create_inference(&m, test_backend(), &mc, 32, 32);
    moe_model_init_weights(&m, 4, 0.1);
    char src[300], out[400], path[500];
    tokenizer_folder(src, sizeof src, "1", "7");
    snprintf(out, sizeof out, "%s_export", src);
    moe_status st = moe_hf_export_from(out, src, &m, MOE_ST_F32, CKPT_SHARD_BYTES);
    snprintf(path, sizeof path, "%s/generation_config.json", out);
    cJSON *gen = st ? NULL : read_json_file(path);
    const cJSON *bos = cJSON_GetObjectItem(gen, "bos_token_id"),
                *pad = cJSON_GetObjectItem(gen, "pad_token_id");
    check_true("ids in the vocabulary are exported (bos 1, pad 7)",
               !st && cJSON_IsNumber(bos) && bos->valueint == 1 && cJSON_IsNumber(pad) &&
                   pad->valueint == 7);
    if (st) printf("    -> %s\n", moe_last_error());
    cJSON_Delete(gen);
    special_id_error("an added token with id 4e9 is refused (it became bos_token_id 2147483647)",
                     &m, "4e9", "7", "added token \"<s>\" has id 4000000000");
    special_id_error("a negative id is refused", &m, "-3", "7", "\"<s>\" has id -3");
    special_id_error("a fractional id is refused", &m, "1.5", "7", "\"<s>\" has id 1.5");
    special_id_error("an id as a string is refused", &m, "\"1\"", "7", "\"<s>\" has no numeric id");
    special_id_error("an id beyond the model's vocabulary is refused", &m, "256", "7",
                     "has id 256, not an integer in [0, 256)");
    special_id_error("a special token's model.vocab id beyond the vocabulary is refused", &m, "1",
                     "4e9", "pad_token \"<pad>\" has id 4000000000");
    moe_model_destroy(&m);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_ckpt_hardening "
                        "uaf|integrity|state|sizes|nonfinite|rope|hf5|duplicates|special_ids\n");
        return 2;
    }
    snprintf(work, sizeof work, "/tmp/moe_ckhard_XXXXXX");
    if (!mkdtemp(work)) return 1;
    const char *c = argv[1];
    if (!strcmp(c, "uaf"))
        case_uaf();
    else if (!strcmp(c, "integrity"))
        case_integrity();
    else if (!strcmp(c, "state"))
        case_state();
    else if (!strcmp(c, "sizes"))
        case_sizes();
    else if (!strcmp(c, "nonfinite"))
        case_nonfinite();
    else if (!strcmp(c, "rope"))
        case_rope();
    else if (!strcmp(c, "hf5"))
        case_hf5();
    else if (!strcmp(c, "duplicates"))
        case_duplicates();
    else if (!strcmp(c, "special_ids"))
        case_special_ids();
    else {
        fprintf(stderr, "unknown case '%s'\n", c);
        return 2;
    }
    printf("%d failure(s)\n", test_failures());
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf %s", work);
    if (!test_failures() && system(rm) != 0) printf("note: could not remove %s\n", work);
    return test_failures() != 0;
}
