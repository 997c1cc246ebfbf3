// The file plan of a checkpoint's tensors and the writing of one writer's files (shards.h).
#include "ckpt/shards.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/path_internal.h"
#include "ckpt/json_fields.h"

static uint64_t tensor_bytes(const moe_model_tensor *t, moe_st_dtype dtype) {
    return (uint64_t)t->rows * (t->cols ? t->cols : 1) * moe_st_dtype_size(dtype);
}

// writer of a tensor: the one holding its expert (in slot slot_of[expert]); 0 for a dense
// tensor
static int writer_of(const moe_model_tensor *t, int E_local, const int *slot_of) {
    return t->expert < 0 ? 0 : (slot_of ? slot_of[t->expert] : t->expert) / E_local;
}

moe_status moe_shard_plan_make(moe_shard_plan *p, const moe_model_config *cfg, int E_local,
                               const int *placement, moe_st_dtype dtype, uint64_t max_bytes) {
    memset(p, 0, sizeof *p);
    const int E = cfg->moe.n_experts;
    if (E_local < 1 || E % E_local)
        return moe_error(MOE_EINVAL, "checkpoint: %d experts per process do not divide %d", E_local,
                         E);
    p->n = (int)moe_model_tensor_count(cfg);
    p->n_writers = E / E_local;
    p->tab = moe_model_tensor_table(cfg);
    p->file = malloc((size_t)p->n * sizeof(int));
    p->writer = malloc((size_t)p->n * sizeof(int)); // at most one file per tensor
    int *slot_of = placement ? malloc((size_t)E * sizeof(int)) : NULL;
    if (!p->tab || !p->file || !p->writer || (placement && !slot_of)) {
        free(slot_of);
        moe_shard_plan_free(p);
        return moe_error(MOE_ENOMEM, "checkpoint: out of memory");
    }
    for (int s = 0; placement && s < E; s++) slot_of[placement[s]] = s;
    for (int w = 0; w < p->n_writers; w++) {
        uint64_t in_file = 0;
        int first = p->n_files;
        for (int i = 0; i < p->n; i++) {
            const moe_model_tensor *t = &p->tab[i];
            if (writer_of(t, E_local, slot_of) != w) continue;
            const uint64_t bytes = tensor_bytes(t, dtype);
            if (p->n_files == first || (in_file > 0 && in_file + bytes > max_bytes)) {
                p->writer[p->n_files++] = w;
                in_file = 0;
            }
            p->file[i] = p->n_files - 1;
            in_file += bytes, p->total += bytes;
        }
        if (p->n_files - first > p->max_per_writer) p->max_per_writer = p->n_files - first;
    }
    free(slot_of);
    return MOE_OK;
}

void moe_shard_plan_free(moe_shard_plan *p) {
    free(p->tab), free(p->file), free(p->writer);
    memset(p, 0, sizeof *p);
}

void moe_shard_file_name(char *out, size_t n, const moe_shard_plan *p, const char *prefix, int f) {
    snprintf(out, n, "%s-%05d-of-%05d.safetensors", prefix, f + 1, p->n_files);
}

moe_status moe_shard_write(const char *folder, const moe_shard_plan *p, int w, const moe_model *m,
                           const real *host, const char *prefix, moe_st_dtype dtype, cJSON *files) {
    moe_st_entry *entries = malloc((size_t)m->n_tensors * sizeof *entries);
    int *file_of_local = malloc((size_t)m->n_tensors * sizeof(int));
    if (!entries || !file_of_local) {
        free(entries), free(file_of_local);
        return moe_error(MOE_ENOMEM, "checkpoint: out of memory");
    }
    // m's table is the plan's without the experts m does not hold, in the same order
    moe_status st = MOE_OK;
    int j = 0;
    for (int i = 0; i < p->n && !st; i++) {
        const moe_model_tensor *t = &p->tab[i];
        if (t->expert >= 0 && !moe_model_holds_expert(m, t->expert)) continue;
        if (j == m->n_tensors || strcmp(m->tensors[j].name, t->name))
            st = moe_error(MOE_EINVAL, "checkpoint: the model's tensor %d is not '%s'", j, t->name);
        else if (p->writer[p->file[i]] != w && t->expert >= 0)
            st = moe_error(MOE_EINVAL, "checkpoint: writer %d does not write '%s'", w, t->name);
        else
            file_of_local[j++] = p->file[i];
    }
    for (int f = 0; f < p->n_files && !st; f++) {
        if (p->writer[f] != w) continue;
        int n = 0;
        for (int k = 0; k < j; k++) {
            if (file_of_local[k] != f) continue;
            const moe_model_tensor *t = &m->tensors[k];
            entries[n++] = (moe_st_entry){.name = t->name,
                                          .data = host + t->offset,
                                          .ndim = t->cols ? 2 : 1,
                                          .shape = {t->rows, t->cols}};
        }
        char name[96], path[PATH_BUF];
        moe_shard_file_name(name, sizeof name, p, prefix, f);
        path_fmt(path, sizeof path, "%s/%s", folder, name);
        st = moe_st_write(path, entries, n, dtype);
        if (!st && files) cJSON_AddItemToArray(files, cJSON_CreateString(name));
    }
    free(entries), free(file_of_local);
    return st;
}

moe_status moe_shard_write_index(const char *folder, const moe_shard_plan *p) {
    cJSON *index = cJSON_CreateObject(), *meta = cJSON_CreateObject(), *map = cJSON_CreateObject();
    cJSON_AddNumberToObject(meta, "total_size", (double)p->total);
    cJSON_AddItemToObject(index, "metadata", meta);
    cJSON_AddItemToObject(index, "weight_map", map);
    for (int i = 0; i < p->n; i++) {
        char name[96];
        moe_shard_file_name(name, sizeof name, p, "model", p->file[i]);
        cJSON_AddStringToObject(map, p->tab[i].name, name);
    }
    char path[PATH_BUF];
    path_fmt(path, sizeof path, "%s/model.safetensors.index.json", folder);
    moe_status st = ckpt_json_write(path, index);
    cJSON_Delete(index);
    return st;
}
