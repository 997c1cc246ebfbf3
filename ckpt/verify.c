// The integrity check of a moe.c checkpoint (moe_checkpoint_verify): the files the folder must
// hold, from what its index and configs say, and every file's CRC32 against
// trainer_state.json.
#define _GNU_SOURCE // access

#include "ckpt/ckpt_internal.h"

#include "data/files.h"
#include "ckpt/path_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// name's CRC32 in crcs (8 hex digits) equals the file's.
static moe_status verify_file(const char *folder, const cJSON *crcs, const char *name) {
    char path[PATH_BUF + 300], hex[16];
    path_fmt(path, sizeof path, "%s/%s", folder, name);
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(crcs, name);
    if (!want)
        return moe_error(MOE_EIO, "%s: no CRC32 for it in trainer_state.json (damaged state file)",
                         path);
    if (!cJSON_IsString(want) || strlen(want->valuestring) != 8 ||
        strspn(want->valuestring, "0123456789abcdef") != 8)
        return moe_error(MOE_EIO, "%s/trainer_state.json: crc32.\"%s\" is not 8 hex digits", folder,
                         name);
    uint32_t crc;
    moe_status st = moe_file_crc32(path, &crc);
    if (st) return st;
    snprintf(hex, sizeof hex, "%08" PRIx32, crc);
    if (strcmp(hex, want->valuestring))
        return moe_error(MOE_EIO, "%s: CRC32 mismatch: the file has %s, trainer_state.json says %s",
                         path, hex, want->valuestring);
    return MOE_OK;
}

// Appends name to the list of files to verify (once).
static int add_required(char (*names)[256], int n, int cap, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], name)) return n;
    if (n < cap) snprintf(names[n++], sizeof names[0], "%s", name);
    return n;
}

// The moment files of AdamW (or whenever there): the single files of older checkpoints, else
// one of each prefix per model shard of the index's weight_map.
static int required_moments(char (*names)[256], int n, int cap, const char *folder,
                            const cJSON *map, optim_kind kind) {
    char path[PATH_BUF], name[256];
    static const char *const prefix[2] = {MOMENTS, MOMENTS_SQ};
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s.safetensors", prefix[i]);
        path_fmt(path, sizeof path, "%s/%s", folder, name);
        if (access(path, F_OK) == 0) {
            n = add_required(names, n, cap, name);
            continue;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, map) {
            if (strncmp(e->valuestring, "model-", 6) ||
                snprintf(name, sizeof name, "%s%s", prefix[i], e->valuestring + 5) >=
                    (int)sizeof name)
                continue; // not a shard of ours (weight_map names were checked < 256)
            path_fmt(path, sizeof path, "%s/%s", folder, name);
            if (kind == OPTIM_ADAMW || access(path, F_OK) == 0)
                n = add_required(names, n, cap, name);
        }
    }
    return n;
}

// The files a checkpoint must hold, from what the folder itself says: config.json, the index
// and every shard it names, the bias file when config.json has router_bias, the optimizer
// moments for AdamW or whenever present.
static moe_status required_files(char (*names)[256], int *n_out, int cap, const char *folder,
                                 optim_kind kind) {
    char path[PATH_BUF];
    int n = 0;
    n = add_required(names, n, cap, "config.json");
    n = add_required(names, n, cap, "model.safetensors.index.json");
    cJSON *index = NULL, *config = NULL;
    path_fmt(path, sizeof path, "%s/model.safetensors.index.json", folder);
    moe_status st = moe_file_read_json_object(path, SMALL_FILE_MAX, &index);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(index, "weight_map"), *e;
    if (!st && !cJSON_IsObject(map)) st = moe_error(MOE_EIO, "%s: no \"weight_map\" object", path);
    cJSON_ArrayForEach(e, (st ? NULL : map)) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || strlen(e->valuestring) >= 256) {
            st = moe_error(MOE_EIO, "%s: weight_map.\"%s\" is not a file name of this folder", path,
                           e->string);
            break;
        }
        n = add_required(names, n, cap, e->valuestring);
    }
    path_fmt(path, sizeof path, "%s/config.json", folder);
    if (!st && !(st = moe_file_read_json_object(path, SMALL_FILE_MAX, &config)) &&
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(config, "router_bias")))
        n = add_required(names, n, cap, BIAS_FILE);
    path_fmt(path, sizeof path, "%s/" BIAS_FILE, folder);
    if (!st && access(path, F_OK) == 0) n = add_required(names, n, cap, BIAS_FILE);
    if (!st) n = required_moments(names, n, cap, folder, map, kind);
    if (!st && n == cap)
        st = moe_error(MOE_EIO, "%s: more than %d files to verify", folder, cap - 1);
    cJSON_Delete(index);
    cJSON_Delete(config);
    *n_out = n;
    return st;
}

#define VERIFY_MAX_FILES 1024

// moe_checkpoint_verify, also giving the validated state (trainer_state.json is read once).
moe_status ckpt_verify(moe_checkpoint_state *cs, const char *folder) {
    cJSON *state = NULL;
    moe_status st = ckpt_read_state(&state, cs, folder);
    if (st) return st;
    char(*names)[256] = malloc(VERIFY_MAX_FILES * sizeof *names);
    int n = 0;
    st = names ? required_files(names, &n, VERIFY_MAX_FILES, folder, cs->optimizer)
               : moe_error(MOE_ENOMEM, "checkpoint: out of memory");
    const cJSON *crcs = cJSON_GetObjectItemCaseSensitive(state, "crc32"), *c;
    for (int i = 0; i < n && !st; i++) st = verify_file(folder, crcs, names[i]);
    cJSON_ArrayForEach(c, (st ? NULL : crcs)) { // and whatever else it lists
        if (strchr(c->string, '/') || !strcmp(c->string, "trainer_state.json")) {
            st = moe_error(MOE_EIO,
                           "%s/trainer_state.json: crc32.\"%s\" does not name a file of "
                           "the folder",
                           folder, c->string);
            break;
        }
        if ((st = verify_file(folder, crcs, c->string))) break;
    }
    free(names);
    cJSON_Delete(state);
    if (st) ckpt_capacity_state_free(&cs->ts.capacity);
    return st;
}

moe_status moe_checkpoint_verify(const char *folder) {
    moe_checkpoint_state cs;
    moe_status st = ckpt_verify(&cs, folder);
    if (!st) ckpt_capacity_state_free(&cs.ts.capacity);
    return st;
}
