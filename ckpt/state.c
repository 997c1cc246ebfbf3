// trainer_state.json read back: every field checked for type and range before it is used
// (a JSON number is a double, and casting 1e300 to int64 is undefined behaviour), and against
// the others (skips <= steps, the folder's step name, the schedule, the world layout).
#include "ckpt/ckpt_internal.h"

#include "data/files.h"
#include "ckpt/path_internal.h"
#include "ckpt/json_fields.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define STATE_MAX_STEPS INT64_C(1000000000000) // train.steps' limit (config/config.h)

static moe_status st_int64(const cJSON *obj, const char *file, const char *key, int64_t lo,
                           int64_t hi, int64_t *out) {
    return ckpt_json_integer(obj, file, key, lo, hi, MOE_EIO, out);
}

// A 64-bit unsigned integer written as a decimal string (JSON numbers are doubles).
static moe_status st_u64(const cJSON *obj, const char *file, const char *key, uint64_t *out) {
    const cJSON *v = ckpt_json_field(obj, key);
    const char *s = cJSON_IsString(v) ? v->valuestring : NULL;
    char *end = NULL;
    errno = 0;
    unsigned long long x = s && *s >= '0' && *s <= '9' ? strtoull(s, &end, 10) : 0;
    if (!s || !end || *end || end == s || errno)
        return moe_error(MOE_EIO,
                         "%s: \"%s\" is missing or not a decimal string of a 64-bit "
                         "unsigned integer",
                         file, key);
    *out = x;
    return MOE_OK;
}

// "capacity" (auto capacity runs only): {"factor", "layers", "window_need": [[L numbers]...]}
static moe_status parse_capacity(moe_capacity_state *cap, const cJSON *c, const char *file) {
    memset(cap, 0, sizeof *cap);
    if (!c) return MOE_OK;
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "factor"),
                *w = cJSON_GetObjectItemCaseSensitive(c, "window_need");
    int64_t L;
    moe_status st = st_int64(c, file, "capacity.layers", 1, 1024, &L);
    if (st) return st;
    if (!cJSON_IsNumber(f) || !(f->valuedouble > 0) || !isfinite(f->valuedouble))
        return moe_error(MOE_EIO, "%s: \"capacity.factor\" is not a positive number", file);
    if (!cJSON_IsArray(w) || cJSON_GetArraySize(w) > 1000000)
        return moe_error(MOE_EIO, "%s: \"capacity.window_need\" is not an array (of at most 1e6)",
                         file);
    const int n = cJSON_GetArraySize(w);
    double *need = malloc(((size_t)n * (size_t)L + 1) * sizeof *need);
    if (!need) return moe_error(MOE_ENOMEM, "%s: out of memory", file);
    int i = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, w) {
        const cJSON *x;
        int j = 0;
        if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) != L) break;
        cJSON_ArrayForEach(x, row) {
            if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0) || !isfinite(x->valuedouble)) break;
            need[(size_t)i * L + j++] = x->valuedouble;
        }
        if (j != L) break;
        i++;
    }
    if (i != n) {
        free(need);
        return moe_error(MOE_EIO,
                         "%s: \"capacity.window_need\"[%d] is not %lld finite numbers >= 0", file,
                         i, (long long)L);
    }
    *cap = (moe_capacity_state){
        .present = 1, .factor = f->valuedouble, .n = n, .L = (int)L, .need = need};
    return MOE_OK;
}

// A save names its folder after its step: in a folder step_NNNNNNNN, "step" must be NNNNNNNN
// (else a renamed or damaged checkpoint resumes at another step than its name says).
static moe_status check_folder_step(const char *folder, const char *file, int64_t step) {
    long long named;
    if (!ckpt_folder_step(folder, &named) || named == step) return MOE_OK;
    return moe_error(MOE_EIO,
                     "%s: \"step\" = %lld, but the folder is named step_%08lld (a renamed or "
                     "damaged checkpoint)",
                     file, (long long)step, named);
}

// "schedule" (older states have none): {kind "cosine" | "constant", lr and min_lr finite
// numbers >= 0, warmup_steps and steps integers >= 0}; a run stops at its steps, so step <=
// schedule.steps.
static moe_status check_schedule(const cJSON *state, const char *file, int64_t step) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(state, "schedule");
    if (!s) return MOE_OK;
    if (!cJSON_IsObject(s)) return moe_error(MOE_EIO, "%s: \"schedule\" is not an object", file);
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(s, "kind");
    if (!cJSON_IsString(kind) ||
        (strcmp(kind->valuestring, "cosine") && strcmp(kind->valuestring, "constant")))
        return moe_error(MOE_EIO, "%s: \"schedule.kind\" is not \"cosine\" or \"constant\"", file);
    static const char *const rates[2] = {"schedule.lr", "schedule.min_lr"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = ckpt_json_field(s, rates[i]);
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0)
            return moe_error(MOE_EIO, "%s: \"%s\" is missing or not a finite number >= 0", file,
                             rates[i]);
    }
    int64_t warmup, steps;
    moe_status st;
    if ((st = st_int64(s, file, "schedule.warmup_steps", 0, STATE_MAX_STEPS, &warmup)) ||
        (st = st_int64(s, file, "schedule.steps", 0, STATE_MAX_STEPS, &steps)))
        return st;
    if (step > steps)
        return moe_error(MOE_EIO,
                         "%s: \"step\" = %lld is beyond \"schedule.steps\" = %lld (a run stops "
                         "at train.steps)",
                         file, (long long)step, (long long)steps);
    return MOE_OK;
}

static moe_status parse_state(moe_checkpoint_state *cs, const cJSON *state, const char *folder,
                              const char *file) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(state, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "moe.c trainer state"))
        return moe_error(MOE_EIO, "%s: \"format\" is not \"moe.c trainer state\"", file);
    int64_t version, world, ep;
    moe_status st;
    if ((st = st_int64(state, file, "version", 1, 1, &version))) return st;
    memset(cs, 0, sizeof *cs);
    train_state *ts = &cs->ts;
    if ((st = st_int64(state, file, "step", 0, STATE_MAX_STEPS, &ts->step)) ||
        (st = st_int64(state, file, "skipped", 0, ts->step, &ts->skipped)) ||
        (st = st_int64(state, file, "consecutive_skips", 0, ts->skipped, &ts->consecutive_skips)) ||
        (st = check_folder_step(folder, file, ts->step)) ||
        (st = check_schedule(state, file, ts->step)))
        return st;
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(state, "optimizer");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
    if (!cJSON_IsString(kind) ||
        (strcmp(kind->valuestring, "adamw") && strcmp(kind->valuestring, "sgd")))
        return moe_error(MOE_EIO, "%s: \"optimizer.kind\" is not \"adamw\" or \"sgd\"", file);
    cs->optimizer = strcmp(kind->valuestring, "sgd") ? OPTIM_ADAMW : OPTIM_SGD;
    // the optimizer counts the updates it made: never more than the steps
    if ((st = st_int64(o, file, "optimizer.t", 0, ts->step, &cs->optimizer_t))) return st;
    const cJSON *world_obj = cJSON_GetObjectItemCaseSensitive(state, "world");
    if ((st = st_int64(world_obj, file, "world.size", 1, 65536, &world)) ||
        (st = st_int64(world_obj, file, "world.ep_size", 1, world, &ep)))
        return st;
    if (world % ep)
        return moe_error(MOE_EIO, "%s: \"world.ep_size\" %lld does not divide \"world.size\" %lld",
                         file, (long long)ep, (long long)world);
    ts->world_size = world, ts->ep_size = ep;
    const cJSON *ld = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(state, "rng"), "data_loader");
    data_loader_state *l = &ts->loader;
    if ((st = st_u64(ld, file, "rng.data_loader.seed", &l->seed)) ||
        (st = st_u64(ld, file, "rng.data_loader.epoch", &l->epoch)) ||
        (st = st_u64(ld, file, "rng.data_loader.position", &l->position)) ||
        (st = st_u64(ld, file, "rng.data_loader.n_windows", &l->n_windows)) ||
        (st = st_u64(ld, file, "rng.data_loader.seq_len", &l->seq_len)))
        return st;
    if (l->position > l->n_windows)
        return moe_error(MOE_EIO,
                         "%s: rng.data_loader.position %" PRIu64 " exceeds n_windows %" PRIu64,
                         file, l->position, l->n_windows);
    if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(state, "crc32")))
        return moe_error(MOE_EIO, "%s: no \"crc32\" object", file);
    return parse_capacity(&ts->capacity, cJSON_GetObjectItemCaseSensitive(state, "capacity"), file);
}

// folder/trainer_state.json, parsed into *json and validated into *cs.
moe_status ckpt_read_state(cJSON **json, moe_checkpoint_state *cs, const char *folder) {
    if (check_path_arg(folder)) return MOE_EINVAL;
    char file[PATH_BUF];
    path_fmt(file, sizeof file, "%s/trainer_state.json", folder);
    moe_status st = moe_file_read_json_object(file, SMALL_FILE_MAX, json);
    if (!st && (st = parse_state(cs, *json, folder, file))) cJSON_Delete(*json), *json = NULL;
    return st; // (parse_state frees what it allocated when it fails)
}

void ckpt_capacity_state_free(moe_capacity_state *c) {
    free(c->need);
    c->need = NULL;
}

moe_status moe_checkpoint_state_read(moe_checkpoint_state *cs, const char *folder) {
    cJSON *state;
    moe_status st = ckpt_read_state(&state, cs, folder);
    cJSON_Delete(state);
    if (!st) ckpt_capacity_state_free(&cs->ts.capacity); // (checkpoint.h: no needs from here)
    return st;
}
