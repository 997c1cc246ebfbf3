// Checkpoints: save -> load round trip (bitwise: parameters, AdamW moments, step, loader
// state), sharding, exact resume (the losses after resuming equal the uninterrupted run's,
// capacity dropping on), refusals of damaged checkpoints (missing tensor or file, shape
// mismatch, CRC mismatch, disagreeing config.json), init_from, and the inference commands'
// library functions (eval == training forward with capacity 0; generate is deterministic).
#define _POSIX_C_SOURCE 200809L // mkdtemp

#include <cjson/cJSON.h>
#include <math.h>
#include <glob.h>
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

static void fill(real *x, size_t n, test_rng *r, double scale) {
    for (size_t i = 0; i < n; i++) x[i] = (real)(scale * rng_normal(r));
}

static void tiny(moe_train_config *c, const char *run) {
    moe_train_config_default(c);
    c->model.d_model = 32, c->model.n_layers = 2, c->model.n_heads = 4;
    c->model.n_kv_heads = 2, c->model.max_seq_len = 32;
    c->model.moe.d_ff = 24, c->model.moe.n_experts = 4, c->model.moe.top_k = 2;
    c->model.moe.capacity_factor = 1.0;
    c->steps = 8, c->batch_size = 2, c->seq_len = 32, c->lr = 1e-2, c->min_lr = 1e-3;
    c->warmup_steps = 2, c->eval_interval = 0, c->eval_batches = 1, c->interval = 100;
    c->ckpt_interval = 4, c->ckpt_keep = 2, c->threads = 2;
    snprintf(c->dir, sizeof c->dir, "%s/data", work);
    c->n_text = 1;
    snprintf(c->text[0], sizeof c->text[0], "%s/corpus.txt", work);
    snprintf(c->run_dir, sizeof c->run_dir, "%s/%s", work, run);
    // the trainer's backend: the test backend's ($MOE_TEST_DEVICE, e.g. the strict variant's
    // "cpu-strict"), else the default
    const char *device = getenv("MOE_TEST_DEVICE");
    if (device && *device) snprintf(c->device, sizeof c->device, "%s", device);
}

// Fills n reals of backend memory (through a host buffer).
static void fill_device(moe_backend *be, real *dev, size_t n, test_rng *r, double scale) {
    real *host = malloc(n * sizeof(real));
    fill(host, n, r, scale);
    be->copy_to_device(be, dev, host, n * sizeof(real));
    free(host);
}

// 1 when n reals of backend memory at a and b are bitwise equal (compared in host copies).
static int device_equal(moe_backend *be, const real *a, const real *b, size_t n) {
    real *ha = malloc(n * sizeof(real)), *hb = malloc(n * sizeof(real));
    be->copy_to_host(be, ha, a, n * sizeof(real));
    be->copy_to_host(be, hb, b, n * sizeof(real));
    int equal = !memcmp(ha, hb, n * sizeof(real));
    free(ha), free(hb);
    return equal;
}

static void round_trip(void) {
    printf("save -> load round trip is bitwise (and sharded)\n");
    moe_train_config c;
    tiny(&c, "roundtrip");
    c.steps = 20; // the state below is at step 17: a run stops at train.steps (schedule.steps)
    moe_model_config mc = moe_trainer_model_config(&c);
    moe_model a, b;
    moe_model_create(&a, test_backend(), &mc, 1, 8);
    moe_model_create(&b, test_backend(), &mc, 1, 8);
    optim_region all = {0, a.n_params, 1};
    optim_config oc = {OPTIM_ADAMW, 0.9, 0.95, 1e-8, 0.1};
    moe_optimizer oa, ob;
    moe_optimizer_create(&oa, a.be, &oc, a.n_params, &all, 1);
    moe_optimizer_create(&ob, b.be, &oc, b.n_params, &all, 1);
    test_rng r;
    rng_seed(&r, 5);
    fill_device(a.be, a.params, a.n_params, &r, 1), fill_device(a.be, oa.m, a.n_params, &r, 1e-3);
    fill_device(a.be, oa.v, a.n_params, &r, 1e-6);
    oa.t = 17;
    train_state ts = {.step = 17,
                      .skipped = 2,
                      .consecutive_skips = 1,
                      .loader = {.seed = 0xFFFFFFFFFFFFFFF1ull,
                                 .epoch = 3,
                                 .position = 12,
                                 .n_windows = 99,
                                 .seq_len = 32}};
    char root[300];
    snprintf(root, sizeof root, "%s/rt_ckpt", work);
    // 8 KiB shards: the 2-layer model is spread over many files
    moe_status st = moe_checkpoint_save(root, &a, &oa, &ts, &c, 2, 8192, NULL);
    check_true("save succeeds", st == MOE_OK);
    char path[400];
    snprintf(path, sizeof path, "%s/step_00000017/model-00002-of-", root);
    snprintf(path, sizeof path, "%s/step_00000017/model.safetensors.index.json", root);
    cJSON *index = NULL;
    FILE *f = fopen(path, "r");
    char buf[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    index = cJSON_Parse(buf);
    const cJSON *wm = cJSON_GetObjectItem(index, "weight_map");
    const cJSON *e1 = cJSON_GetObjectItem(wm, "model.embed_tokens.weight");
    const cJSON *e2 = cJSON_GetObjectItem(wm, "lm_head.weight");
    check_true("sharded: embed and lm_head live in different files",
               e1 && e2 && strcmp(e1->valuestring, e2->valuestring) != 0);
    cJSON_Delete(index);

    snprintf(path, sizeof path, "%s/latest", root);
    train_state back;
    st = moe_checkpoint_load(path, &b, &ob, &back);
    if (st) printf("    -> %s\n", moe_last_error());
    check_true("load via latest succeeds", st == MOE_OK);
    check_true("parameters bitwise", device_equal(a.be, a.params, b.params, a.n_params));
    check_true("AdamW moments bitwise", device_equal(a.be, oa.m, ob.m, a.n_params) &&
                                            device_equal(a.be, oa.v, ob.v, a.n_params));
    check_true("step, skips, optimizer t",
               back.step == 17 && back.skipped == 2 && back.consecutive_skips == 1 && ob.t == 17);
    check_true("loader/RNG state (64-bit seed kept exactly)",
               !memcmp(&back.loader, &ts.loader, sizeof ts.loader));

    // damage: one byte of a shard -> CRC mismatch naming the file
    char shard[400];
    glob_t g;
    snprintf(path, sizeof path, "%s/step_00000017/optimizer-exp_avg-00001-of-*.safetensors", root);
    check_true("the first moment shard beside the first model shard",
               glob(path, 0, NULL, &g) == 0 && g.gl_pathc == 1);
    snprintf(shard, sizeof shard, "%s", g.gl_pathc ? g.gl_pathv[0] : path);
    globfree(&g);
    f = fopen(shard, "r+b");
    fseek(f, -1, SEEK_END);
    int last = fgetc(f);
    fseek(f, -1, SEEK_END);
    fputc(last ^ 1, f);
    fclose(f);
    st = moe_checkpoint_load(root, &b, &ob, &back); // a folder that is not a checkpoint
    check_true("a folder without trainer_state.json is refused", st == MOE_EIO);
    printf("    -> %s\n", moe_last_error());
    snprintf(path, sizeof path, "%s/step_00000017", root);
    st = moe_checkpoint_load(path, &b, &ob, &back);
    check_true("CRC mismatch refused, naming the file",
               st == MOE_EIO && strstr(moe_last_error(), "CRC32 mismatch") &&
                   strstr(moe_last_error(), "optimizer-exp_avg-00001-of-"));
    printf("    -> %s\n", moe_last_error());

    moe_optimizer_destroy(&oa), moe_optimizer_destroy(&ob);
    moe_model_destroy(&a), moe_model_destroy(&b);
}

// Writes an HF folder (export) of a model with random weights; returns its params.
static void make_hf_folder(const char *dir, const moe_model_config *mc, moe_model *m) {
    moe_model_create_inference(m, test_backend(), mc, mc->max_seq_len, mc->max_seq_len);
    moe_model_init_weights(m, 9, 0.3);
    if (moe_hf_export(dir, m, MOE_ST_F32, CKPT_SHARD_BYTES))
        printf("export: %s\n", moe_last_error());
}

static void hf_folder_errors(void) {
    printf("HF folders: loads, and damaged ones are refused with the file and the reason\n");
    moe_train_config c;
    tiny(&c, "hf");
    moe_model_config mc = moe_trainer_model_config(&c);
    moe_model src, dst;
    char dir[300], cmd[1024];
    snprintf(dir, sizeof dir, "%s/hf_ok", work);
    make_hf_folder(dir, &mc, &src);
    check_true("load of an exported folder is bitwise",
               infer_load(&dst, test_backend(), dir, 0, 8) == MOE_OK &&
                   device_equal(src.be, src.params, dst.params, src.n_params));
    moe_model_destroy(&dst);

    // config.json disagreeing: every field named
    moe_model_config other = mc;
    other.d_model = 64, other.moe.d_ff = 48, other.moe.d_model = 64;
    moe_status st = moe_hf_config_check(dir, &other);
    check_true("disagreeing config.json names each field",
               st == MOE_EINVAL &&
                   strstr(moe_last_error(), "hidden_size = 32 (model.d_model = 64)") &&
                   strstr(moe_last_error(), "intermediate_size = 24 (model.d_ff = 48)"));
    printf("    -> %s\n", moe_last_error());

    // a tensor missing from the index
    snprintf(cmd, sizeof cmd,
             "cp -r %s %s/hf_missing && sed -i 's/\"model.norm.weight\"/\"model.norm.weightX\"/' "
             "%s/hf_missing/model.safetensors.index.json",
             dir, work, work);
    if (system(cmd)) printf("cmd failed\n");
    snprintf(dir, sizeof dir, "%s/hf_missing", work);
    st = infer_load(&dst, test_backend(), dir, 0, 8);
    check_true("tensor missing from the index refused",
               st == MOE_EIO && strstr(moe_last_error(), "model.norm.weight") &&
                   strstr(moe_last_error(), "missing"));
    printf("    -> %s\n", moe_last_error());

    // the shard an index names is missing
    snprintf(cmd, sizeof cmd,
             "cp -r %s/hf_ok %s/hf_noshard && rm %s/hf_noshard/model-00001-of-00001.safetensors",
             work, work, work);
    if (system(cmd)) printf("cmd failed\n");
    snprintf(dir, sizeof dir, "%s/hf_noshard", work);
    st = infer_load(&dst, test_backend(), dir, 0, 8);
    check_true("missing shard refused, naming it",
               st == MOE_EIO && strstr(moe_last_error(), "model-00001-of-00001.safetensors"));
    printf("    -> %s\n", moe_last_error());

    // shape mismatch: a model config with more experts per... a larger vocab in config.json
    snprintf(
        cmd, sizeof cmd,
        "cp -r %s/hf_ok %s/hf_shape && sed -i 's/\"vocab_size\":.*256,/\"vocab_size\":\t300,/' "
        "%s/hf_shape/config.json",
        work, work, work);
    if (system(cmd)) printf("cmd failed\n");
    snprintf(dir, sizeof dir, "%s/hf_shape", work);
    st = infer_load(&dst, test_backend(), dir, 0, 8);
    check_true("shape mismatch refused with both shapes",
               st == MOE_EIO &&
                   strstr(moe_last_error(), "has shape [256, 32], expected [300, 32]"));
    printf("    -> %s\n", moe_last_error());

    // config.json that does not parse
    snprintf(cmd, sizeof cmd,
             "cp -r %s/hf_ok %s/hf_json && echo '{\"model_type\": ' > %s/hf_json/config.json", work,
             work, work);
    if (system(cmd)) printf("cmd failed\n");
    snprintf(dir, sizeof dir, "%s/hf_json", work);
    st = infer_load(&dst, test_backend(), dir, 0, 8);
    check_true("config.json that does not parse refused",
               st == MOE_EIO && strstr(moe_last_error(), "config.json"));
    printf("    -> %s\n", moe_last_error());

    // export never overwrites
    snprintf(dir, sizeof dir, "%s/hf_ok", work);
    check_true("export refuses an existing folder",
               moe_hf_export(dir, &src, MOE_ST_F32, CKPT_SHARD_BYTES) == MOE_EINVAL);
    moe_model_destroy(&src);
}


// The "loss" field of every record of metrics.jsonl, as printed (17 significant digits
// where needed: equal text means equal doubles).
static int losses_of(const char *run, char out[][40], int max) {
    char path[400];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    char *text = test_read_file(path), *line = text;
    int n = 0;
    while (line && *line && n < max) {
        char *nl = strchr(line, '\n');
        *nl = 0;
        const char *l = strstr(line, "\"loss\":");
        if (l) sscanf(l + 7, "%39[^,]", out[n++]);
        line = nl + 1;
    }
    free(text);
    return n;
}

static void exact_resume(void) {
    printf("resume at step 4 of 8 (capacity dropping on) equals the uninterrupted run, bitwise\n");
    moe_train_config c;
    tiny(&c, "full");
    moe_trainer_result r;
    check_true("uninterrupted run", moe_trainer_run(&c, NULL, NULL, &r) == MOE_OK);
    moe_trainer_result_free(&r);
    char full[8][40], resumed[8][40], ckpt[1200];
    int n_full = losses_of(c.run_dir, full, 8);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt/step_00000004", c.run_dir);
    moe_train_config c2;
    tiny(&c2, "resumed");
    moe_status st = moe_trainer_run(&c2, ckpt, NULL, &r);
    moe_trainer_result_free(&r);
    if (st) printf("    -> %s\n", moe_last_error());
    int n_res = losses_of(c2.run_dir, resumed, 8);
    int equal = n_full == 8 && n_res == 4;
    for (int i = 0; equal && i < 4; i++) {
        printf("  step %d: %s | %s\n", i + 5, full[i + 4], resumed[i]);
        equal &= !strcmp(full[i + 4], resumed[i]);
    }
    check_true("steps 5..8 have bitwise equal losses", equal);
    check_true("keep = 2: step_4 and step_8 kept", access(ckpt, F_OK) == 0);

    // resuming in place from step 4 saves step 8 again over the existing step_00000008 (which
    // `latest` names): the folders are swapped atomically, and the new one loads
    snprintf(ckpt, sizeof ckpt, "%s/ckpt/step_00000004", c.run_dir);
    st = moe_trainer_run(&c, ckpt, NULL, &r);
    moe_trainer_result_free(&r);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt/latest", c.run_dir);
    char *latest = test_read_file(ckpt);
    moe_model probe;
    moe_model_config pmc = moe_trainer_model_config(&c);
    moe_model_create(&probe, test_backend(), &pmc, 1, 8);
    check_true("re-saving an existing step: latest names it and it loads",
               st == MOE_OK && latest && !strcmp(latest, "step_00000008\n") &&
                   moe_checkpoint_load(ckpt, &probe, NULL, NULL) == MOE_OK);
    free(latest);
    moe_model_destroy(&probe);

    // resuming in the same run dir truncates its logs to the checkpoint's step
    moe_train_config c3 = c;
    snprintf(ckpt, sizeof ckpt, "%s/ckpt/latest", c.run_dir);
    c3.steps = 10;
    st = moe_trainer_run(&c3, ckpt, NULL, &r);
    moe_trainer_result_free(&r);
    char mpath[1300];
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", c.run_dir);
    char *metrics = test_read_file(mpath);
    int lines = 0, step5 = 0;
    for (char *p = metrics; p && *p; p++) lines += *p == '\n';
    for (char *p = metrics; p && (p = strstr(p, "\"step\":5,")); p++) step5++;
    free(metrics);
    check_true("resume in place: the logs hold steps 1..10 once each",
               st == MOE_OK && r.steps_done == 10 && lines == 10 && step5 == 1);

    // eval on the val file == the training forward's CE with capacity 0 (dropless)
    printf("eval (inference path) == training forward ce with capacity_factor 0\n");
    moe_model inf, tr;
    snprintf(ckpt, sizeof ckpt, "%s/ckpt/latest", c.run_dir);
    st = infer_load(&inf, test_backend(), ckpt, 32, 32);
    char valpath[400];
    snprintf(valpath, sizeof valpath, "%s/data/val.bin", work);
    moe_token_file val;
    moe_token_file_read(&val, valpath);
    double loss;
    long ntok;
    st = st ? st : infer_eval(&inf, &val, 32, 1, NULL, &loss, &ntok, NULL);
    moe_model_config mc = moe_trainer_model_config(&c);
    mc.moe.capacity_factor = 0;
    moe_model_create(&tr, test_backend(), &mc, 1, 32);
    tr.be->copy_on_device(tr.be, tr.params, inf.params, inf.n_params * sizeof(real));
    int in[32], tg[32];
    for (int t = 0; t < 32; t++) in[t] = (int)val.tokens[t], tg[t] = (int)val.tokens[t + 1];
    moe_model_forward(&tr, in, tg, 1, 32, moe_pass_train(tr.cfg.moe.capacity_factor));
    check_rel("eval loss vs training forward ce", &loss, &tr.ce, 1, 1e-5);

    printf("generate with a fixed seed is deterministic\n");
    moe_sampling s = {
        .temperature = 0.9, .top_k = 20, .top_p = 0.95, .seed = 42, .prefill_chunk = 5};
    int prompt[12], o1[16], o2[16], o3[64], n1, n2, n3;
    for (int i = 0; i < 12; i++) prompt[i] = (int)val.tokens[i];
    infer_generate(&inf, prompt, 12, 16, &s, o1, &n1);
    infer_generate(&inf, prompt, 12, 16, &s, o2, &n2);
    s.seed = 43;
    infer_generate(&inf, prompt, 12, 16, &s, o3, &n3);
    check_true("same seed, same tokens", n1 == 16 && n2 == 16 && !memcmp(o1, o2, sizeof o1));
    check_true("another seed, other tokens", n3 == 16 && memcmp(o1, o3, sizeof o1) != 0);
    s.temperature = 0, s.prefill_chunk = 12;
    infer_generate(&inf, prompt, 12, 16, &s, o1, &n1);
    s.prefill_chunk = 3;
    infer_generate(&inf, prompt, 12, 16, &s, o2, &n2);
    check_true("greedy: chunked prefill gives the same continuation", !memcmp(o1, o2, sizeof o1));
    s.prefill_chunk = 8;
    infer_generate(&inf, prompt, 12, 40, &s, o3, &n3);
    check_true("decoding stops when the KV cache (32) is full", n3 == 32 - 12 + 1);
    moe_token_file_free(&val);
    moe_model_destroy(&inf), moe_model_destroy(&tr);

    printf("init_from an HF folder\n");
    moe_train_config c4;
    tiny(&c4, "initfrom");
    snprintf(c4.init_from, sizeof c4.init_from, "%s/full/ckpt/step_00000008", work);
    c4.steps = 1;
    st = moe_trainer_run(&c4, NULL, NULL, &r);
    moe_trainer_result_free(&r);
    check_true("init_from a checkpoint folder trains", st == MOE_OK);
    c4.model.moe.d_ff = 32;
    st = moe_trainer_run(&c4, NULL, NULL, &r);
    moe_trainer_result_free(&r);
    check_true("init_from with a disagreeing config stops, naming the field",
               st == MOE_EINVAL &&
                   strstr(moe_last_error(), "intermediate_size = 24 (model.d_ff = 32)"));
    printf("    -> %s\n", moe_last_error());
}

int main(void) {
    snprintf(work, sizeof work, "/tmp/moe_ckpt_test_XXXXXX");
    if (!mkdtemp(work)) return 1;
    char path[300];
    snprintf(path, sizeof path, "%s/corpus.txt", work);
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 300; i++) fprintf(f, "checkpoint %d of a mixture of experts; ", i % 11);
    fclose(f);
    round_trip();
    hf_folder_errors();
    exact_resume();
    printf("%d failure(s)\n", test_failures());
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf %s", work);
    if (!test_failures() && system(rm) != 0) printf("note: could not remove %s\n", work);
    return test_failures() != 0;
}
