// Model weights in and out of a folder: each tensor found by its HF name (in
// model.safetensors or the shards of model.safetensors.index.json), shape-checked, finite;
// the router bias file; moe_hf_load_weights (a moe.c checkpoint verified first) and
// moe_hf_check_sizes (the headers against a config before anything is allocated).
#define _GNU_SOURCE // access

#include "ckpt/ckpt_internal.h"

#include "data/files.h"
#include "ckpt/path_internal.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// The file of each tensor: from model.safetensors.index.json, else model.safetensors.
typedef struct {
    cJSON *index; // NULL when single-file
    int n_files;
    char (*names)[256]; // [WEIGHT_FILES_MAX] each
    moe_st_file *files;
    int *loaded;
    int headers_only;        // moe_st_read_header: names and shapes, no data
    const char *file_prefix; // NULL: the index's files; else theirs with it for "model"
} weight_source;

// one file per writer of an expert-parallel save (and its moments): EP sizes up to ~300
#define WEIGHT_FILES_MAX 1024

static moe_status source_init(weight_source *ws) {
    memset(ws, 0, sizeof *ws);
    ws->names = malloc(WEIGHT_FILES_MAX * sizeof *ws->names);
    ws->files = malloc(WEIGHT_FILES_MAX * sizeof *ws->files);
    ws->loaded = calloc(WEIGHT_FILES_MAX, sizeof *ws->loaded);
    if (!ws->names || !ws->files || !ws->loaded)
        return moe_error(MOE_ENOMEM, "checkpoint: out of memory");
    return MOE_OK;
}

static moe_status source_open(weight_source *ws, const char *folder) {
    moe_status st = source_init(ws);
    if (st) return st;
    char path[PATH_BUF];
    path_fmt(path, sizeof path, "%s/model.safetensors.index.json", folder);
    if (access(path, F_OK) == 0) {
        st = moe_file_read_json_object(path, SMALL_FILE_MAX, &ws->index);
        if (st) return st;
        if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(ws->index, "weight_map")))
            return moe_error(MOE_EIO, "%s: no \"weight_map\" object", path);
    } else {
        path_fmt(path, sizeof path, "%s/model.safetensors", folder);
        if (access(path, F_OK) != 0)
            return moe_error(MOE_EIO,
                             "%s: neither model.safetensors.index.json nor "
                             "model.safetensors is there",
                             folder);
    }
    return MOE_OK;
}

static void source_close(weight_source *ws) {
    for (int i = 0; i < ws->n_files; i++)
        if (ws->loaded[i]) moe_st_free(&ws->files[i]);
    cJSON_Delete(ws->index);
    free(ws->names), free(ws->files), free(ws->loaded);
}

// The safetensors file holding `name` (read on first use).
static moe_status source_file(moe_st_file **out, weight_source *ws, const char *folder,
                              const char *name) {
    const char *file = "model.safetensors";
    if (ws->index) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(ws->index, "weight_map"), name);
        if (!cJSON_IsString(f))
            return moe_error(MOE_EIO,
                             "%s/model.safetensors.index.json: tensor '%s' missing from "
                             "weight_map",
                             folder, name);
        file = f->valuestring;
        if (strchr(file, '/'))
            return moe_error(MOE_EIO,
                             "%s/model.safetensors.index.json: file '%s' of tensor '%s' "
                             "is not in the folder",
                             folder, file, name);
    }
    char mapped[256];
    if (ws->file_prefix) {
        if (strncmp(file, "model-", 6) || snprintf(mapped, sizeof mapped, "%s%s", ws->file_prefix,
                                                   file + 5) >= (int)sizeof mapped)
            return moe_error(MOE_EIO,
                             "%s/model.safetensors.index.json: file '%s' of tensor '%s' is "
                             "not a model-* shard (no %s shard to match it)",
                             folder, file, name, ws->file_prefix);
        file = mapped;
    }
    for (int i = 0; i < ws->n_files; i++)
        if (!strcmp(ws->names[i], file)) {
            *out = &ws->files[i];
            return MOE_OK;
        }
    if (ws->n_files == WEIGHT_FILES_MAX)
        return moe_error(MOE_EIO, "%s: more than %d weight files", folder, WEIGHT_FILES_MAX);
    int i = ws->n_files++;
    snprintf(ws->names[i], sizeof ws->names[i], "%s", file);
    char path[PATH_BUF];
    path_fmt(path, sizeof path, "%s/%s", folder, file);
    moe_status st = ws->headers_only ? moe_st_read_header(&ws->files[i], path)
                                     : moe_st_read(&ws->files[i], path);
    if (st) return st;
    ws->loaded[i] = 1;
    *out = &ws->files[i];
    return MOE_OK;
}

// A tensor with a NaN or an infinity gives garbage downstream (and training never saves one:
// such steps are skipped), so loading one is an error naming it.
static moe_status check_finite(const real *x, size_t n, const char *file, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return moe_error(MOE_EIO,
                             "%s: tensor '%s' holds a non-finite value (%g at element %zu)", file,
                             name, (double)x[i], i);
    return MOE_OK;
}

// Copies the n tensors of tab into host (a buffer laid out like m->params), from
// folder/single_file when not NULL, else from the files the index names (model-*) under
// file_prefix instead of "model" (the moment shards of write_tensors). host NULL: only checks
// that every tensor is there with its shape, reading the headers alone.
moe_status ckpt_load_tensors(real *host, const moe_model_tensor *tab, int n, const char *folder,
                             const char *single_file, const char *file_prefix) {
    weight_source ws;
    moe_status st = MOE_OK;
    if (single_file) {
        char path[PATH_BUF];
        path_fmt(path, sizeof path, "%s/%s", folder, single_file);
        if ((st = source_init(&ws)) || (st = moe_st_read(&ws.files[0], path))) {
            source_close(&ws);
            return st;
        }
        ws.loaded[0] = 1;
        ws.n_files = 1;
    } else if ((st = source_open(&ws, folder))) {
        source_close(&ws);
        return st;
    }
    ws.headers_only = host == NULL;
    ws.file_prefix = file_prefix;
    for (int i = 0; i < n && !st; i++) {
        const moe_model_tensor *t = &tab[i];
        const char *name = t->name;
        moe_st_file *f = &ws.files[0];
        if (!single_file && (st = source_file(&f, &ws, folder, name))) break;
        const moe_st_tensor *s = moe_st_find(f, name);
        if (!s) {
            st = moe_error(MOE_EIO, "%s: tensor '%s' missing", f->path, name);
            break;
        }
        int ndim = t->cols ? 2 : 1;
        if (s->ndim != ndim || s->shape[0] != t->rows || (ndim == 2 && s->shape[1] != t->cols)) {
            char got[128] = "";
            for (int d = 0, u = 0; d < s->ndim && u < 120; d++)
                u += snprintf(got + u, sizeof got - u, "%s%" PRId64, d ? ", " : "", s->shape[d]);
            st = ndim == 2 ? moe_error(MOE_EIO, "%s: tensor '%s' has shape [%s], expected [%d, %d]",
                                       f->path, name, got, t->rows, t->cols)
                           : moe_error(MOE_EIO, "%s: tensor '%s' has shape [%s], expected [%d]",
                                       f->path, name, got, t->rows);
            break;
        }
        if (!host) continue;
        moe_st_to_f32(host + t->offset, f, s);
        st = check_finite(host + t->offset, (size_t)t->rows * (t->cols ? t->cols : 1), f->path,
                          name);
    }
    source_close(&ws);
    return st;
}

// The router bias: in BIAS_FILE (ckpt_internal.h), one [E] tensor per layer named so.
#define BIAS_NAME "model.layers.%d.block_sparse_moe.gate.e_score_correction_bias"

moe_status ckpt_write_bias(const char *folder, const moe_model *m) {
    const int L = m->cfg.n_layers, E = m->cfg.moe.n_experts;
    real *b = malloc((size_t)L * E * sizeof(real));
    moe_st_entry *entries = malloc((size_t)L * sizeof(moe_st_entry));
    char(*names)[96] = malloc((size_t)L * sizeof *names);
    moe_status st = MOE_OK;
    if (!b || !entries || !names) st = moe_error(MOE_ENOMEM, "out of memory");
    if (!st) {
        m->be->copy_to_host(m->be, b, m->router_bias, (size_t)L * E * sizeof(real));
        moe_model_placement_permute(m, b, L, 1, 1); // the file is in global expert order
        for (int l = 0; l < L; l++) {
            snprintf(names[l], sizeof names[l], BIAS_NAME, l);
            entries[l] = (moe_st_entry){
                .name = names[l], .data = b + (size_t)l * E, .ndim = 1, .shape = {E}};
        }
        char path[PATH_BUF];
        path_fmt(path, sizeof path, "%s/" BIAS_FILE, folder);
        st = moe_st_write(path, entries, L, MOE_ST_F32);
    }
    free(b), free(entries), free(names);
    return st;
}

static moe_status load_bias(moe_model *m, const char *folder) {
    const int L = m->cfg.n_layers, E = m->cfg.moe.n_experts;
    char path[PATH_BUF], name[96];
    path_fmt(path, sizeof path, "%s/" BIAS_FILE, folder);
    moe_st_file f;
    moe_status st = moe_st_read(&f, path);
    if (st) return st;
    real *b = malloc((size_t)L * E * sizeof(real));
    if (!b) st = moe_error(MOE_ENOMEM, "out of memory");
    for (int l = 0; l < L && !st; l++) {
        snprintf(name, sizeof name, BIAS_NAME, l);
        const moe_st_tensor *t = moe_st_find(&f, name);
        if (!t)
            st = moe_error(MOE_EIO, "%s: tensor '%s' missing", path, name);
        else if (t->ndim != 1 || t->shape[0] != E)
            st = moe_error(MOE_EIO, "%s: tensor '%s' is not of shape [%d]", path, name, E);
        else {
            moe_st_to_f32(b + (size_t)l * E, &f, t);
            st = check_finite(b + (size_t)l * E, (size_t)E, path, name);
        }
    }
    if (!st) {
        moe_model_placement_permute(m, b, L, 1, 0);
        m->be->copy_to_device(m->be, m->router_bias, b, (size_t)L * E * sizeof(real));
    }
    free(b);
    moe_st_free(&f);
    return st;
}

moe_status ckpt_load_weights(moe_model *m, const char *folder) {
    real *host = malloc(m->n_params * sizeof(real));
    if (!host) return moe_error(MOE_ENOMEM, "cannot allocate %zu parameters", m->n_params);
    moe_status st = ckpt_load_tensors(host, m->tensors, m->n_tensors, folder, NULL, NULL);
    moe_model_placement_image(m, host, 0); // the gate rows of the file are in global order
    if (!st) m->be->copy_to_device(m->be, m->params, host, m->n_params * sizeof(real));
    free(host);
    char path[PATH_BUF];
    path_fmt(path, sizeof path, "%s/" BIAS_FILE, folder);
    // a model with a selection bias starts from the folder's, or from zero if it has none
    if (!st && m->router_bias && access(path, F_OK) == 0) st = load_bias(m, folder);
    return st;
}

// A folder whose name is step_NNNNNNNN, or that has a trainer_state.json, is a moe.c
// checkpoint: it is loaded only when intact.
static int is_moe_checkpoint(const char *folder) {
    char path[PATH_BUF];
    path_fmt(path, sizeof path, "%s/trainer_state.json", folder);
    if (access(path, F_OK) == 0) return 1;
    long long step;
    return ckpt_folder_step(folder, &step);
}

moe_status moe_hf_load_weights(moe_model *m, const char *folder) {
    if (check_path_arg(folder)) return MOE_EINVAL;
    char path[PATH_BUF];
    path_fmt(path, sizeof path, "%s/trainer_state.json", folder);
    if (!is_moe_checkpoint(folder)) return ckpt_load_weights(m, folder); // an HF folder
    if (access(path, F_OK) != 0)
        return moe_error(MOE_EIO,
                         "%s: a moe.c checkpoint folder without its trainer_state.json "
                         "(damaged or incomplete; an HF folder must not be named step_N)",
                         folder);
    moe_status st = moe_checkpoint_verify(folder);
    return st ? st : ckpt_load_weights(m, folder);
}

moe_status moe_hf_check_sizes(const char *folder, const moe_model_config *cfg) {
    if (check_path_arg(folder)) return MOE_EINVAL;
    weight_source ws;
    moe_status st = source_open(&ws, folder);
    int64_t have = 0; // tensors the folder names: the index's entries, or the file's
    if (!st && ws.index) {
        have = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(ws.index, "weight_map"));
    } else if (!st) {
        char path[PATH_BUF];
        path_fmt(path, sizeof path, "%s/model.safetensors", folder);
        moe_st_file f;
        if (!(st = moe_st_read_header(&f, path))) have = f.n;
        moe_st_free(&f);
    }
    source_close(&ws);
    if (st) return st;
    // the table is no bigger than the headers, which are bounded (ST_MAX_HEADER per file)
    const int64_t need = moe_model_tensor_count(cfg);
    if (need > have)
        return moe_error(MOE_EIO,
                         "%s/config.json describes %" PRId64 " tensors (num_hidden_layers "
                         "= %d, num_local_experts = %d), the folder's weights have %" PRId64
                         ": config.json does not match the weights",
                         folder, need, cfg->n_layers, cfg->moe.n_experts, have);
    moe_model_tensor *tab = moe_model_tensor_table(cfg);
    if (!tab) return moe_error(MOE_ENOMEM, "out of memory");
    st = ckpt_load_tensors(NULL, tab, (int)need, folder, NULL, NULL);
    free(tab);
    return st;
}
