// Checkpoints as Hugging Face Mixtral folders (see checkpoint.h).
#define _GNU_SOURCE // fsync, open_memstream, dirent, renameat2

#include "train/ckpt/checkpoint.h"

#include "data/prepare.h" // BYTE_VOCAB_SIZE
#include "data/files.h"
#include "data/tokenizer.h" // the tokenizer files checkpoints and exports carry
#include "train/ckpt/ckpt_path.h"
#include "train/ckpt/json_fields.h"
#include "train/ckpt/shards.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(sizeof(real) == sizeof(float), "checkpoints hold fp32 tensors");

// ---- small file helpers ------------------------------------------------------------

// "step_NNNNNNNN" (a checkpoint folder's name) -> N.
static int parse_step_name(const char *name, long long *step) {
    char tail;
    return strlen(name) == 13 && sscanf(name, "step_%lld%c", step, &tail) == 1 && *step >= 0;
}

static moe_status fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return moe_error(MOE_EIO, "%s: cannot open to fsync: %s", path, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    if (rc != 0) return moe_error(MOE_EIO, "%s: fsync failed: %s", path, strerror(errno));
    return MOE_OK;
}

// Removes a folder of plain files (a checkpoint), then the folder.
static void remove_folder(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char file[PATH_BUF];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            path_fmt(file, sizeof file, "%s/%s", path, e->d_name);
            unlink(file);
        }
    closedir(d);
    rmdir(path);
}

// An empty folder at path, where a save or an export writes before its rename: the leftover
// of an interrupted one is removed; anything else there (a folder in it) is an error.
static moe_status fresh_folder(const char *path) {
    remove_folder(path);
    if (mkdir(path, 0755) != 0)
        return moe_error(MOE_EIO, "%s: cannot create: %s", path, strerror(errno));
    return MOE_OK;
}

// Test-only: MOE_TEST_CRASH_AT=<point> kills the process with SIGKILL at that point of the
// MOE_TEST_CRASH_SAVE-th save (default 1) of this process.
static int save_count;
static void crash_point(const char *point) {
    const char *at = getenv("MOE_TEST_CRASH_AT"), *nth = getenv("MOE_TEST_CRASH_SAVE");
    if (at && !strcmp(at, point) && save_count == (nth ? atoi(nth) : 1)) raise(SIGKILL);
}

// ---- weights ------------------------------------------------------------------------

// The prefixes of AdamW's moment shards (shards.h).
#define MOMENTS "optimizer-exp_avg"
#define MOMENTS_SQ "optimizer-exp_avg_sq"

// The file of each tensor: from model.safetensors.index.json, else model.safetensors.
typedef struct {
    cJSON *index; // NULL when single-file
    int n_files;
    char (*names)[256]; // [WEIGHT_FILES_MAX] each
    st_file *files;
    int *loaded;
    int headers_only;        // st_read_header: names and shapes, no data
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
        st = file_read_json_object(path, SMALL_FILE_MAX, &ws->index);
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
        if (ws->loaded[i]) st_free(&ws->files[i]);
    cJSON_Delete(ws->index);
    free(ws->names), free(ws->files), free(ws->loaded);
}

// The safetensors file holding `name` (read on first use).
static moe_status source_file(st_file **out, weight_source *ws, const char *folder,
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
    moe_status st =
        ws->headers_only ? st_read_header(&ws->files[i], path) : st_read(&ws->files[i], path);
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
static moe_status load_tensors(real *host, const model_tensor *tab, int n, const char *folder,
                               const char *single_file, const char *file_prefix) {
    weight_source ws;
    moe_status st = MOE_OK;
    if (single_file) {
        char path[PATH_BUF];
        path_fmt(path, sizeof path, "%s/%s", folder, single_file);
        if ((st = source_init(&ws)) || (st = st_read(&ws.files[0], path))) {
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
        const model_tensor *t = &tab[i];
        const char *name = t->name;
        st_file *f = &ws.files[0];
        if (!single_file && (st = source_file(&f, &ws, folder, name))) break;
        const st_tensor *s = st_find(f, name);
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
        st_to_f32(host + t->offset, f, s);
        st = check_finite(host + t->offset, (size_t)t->rows * (t->cols ? t->cols : 1), f->path,
                          name);
    }
    source_close(&ws);
    return st;
}

// The selection bias (aux-loss-free balancing) lives in router_bias.safetensors, one [E]
// tensor per layer named like DeepSeek-V3's; transformers' Mixtral ignores the file.
#define BIAS_FILE "router_bias.safetensors"
#define BIAS_NAME "model.layers.%d.block_sparse_moe.gate.e_score_correction_bias"

static moe_status write_bias(const char *folder, const model *m) {
    const int L = m->cfg.n_layers, E = m->cfg.moe.n_experts;
    real *b = malloc((size_t)L * E * sizeof(real));
    st_entry *entries = malloc((size_t)L * sizeof(st_entry));
    char(*names)[96] = malloc((size_t)L * sizeof *names);
    moe_status st = MOE_OK;
    if (!b || !entries || !names) st = moe_error(MOE_ENOMEM, "out of memory");
    if (!st) {
        m->be->copy_to_host(m->be, b, m->router_bias, (size_t)L * E * sizeof(real));
        model_placement_permute(m, b, L, 1, 1); // the file is in global expert order
        for (int l = 0; l < L; l++) {
            snprintf(names[l], sizeof names[l], BIAS_NAME, l);
            entries[l] =
                (st_entry){.name = names[l], .data = b + (size_t)l * E, .ndim = 1, .shape = {E}};
        }
        char path[PATH_BUF];
        path_fmt(path, sizeof path, "%s/" BIAS_FILE, folder);
        st = st_write(path, entries, L, ST_F32);
    }
    free(b), free(entries), free(names);
    return st;
}

static moe_status load_bias(model *m, const char *folder) {
    const int L = m->cfg.n_layers, E = m->cfg.moe.n_experts;
    char path[PATH_BUF], name[96];
    path_fmt(path, sizeof path, "%s/" BIAS_FILE, folder);
    st_file f;
    moe_status st = st_read(&f, path);
    if (st) return st;
    real *b = malloc((size_t)L * E * sizeof(real));
    if (!b) st = moe_error(MOE_ENOMEM, "out of memory");
    for (int l = 0; l < L && !st; l++) {
        snprintf(name, sizeof name, BIAS_NAME, l);
        const st_tensor *t = st_find(&f, name);
        if (!t)
            st = moe_error(MOE_EIO, "%s: tensor '%s' missing", path, name);
        else if (t->ndim != 1 || t->shape[0] != E)
            st = moe_error(MOE_EIO, "%s: tensor '%s' is not of shape [%d]", path, name, E);
        else {
            st_to_f32(b + (size_t)l * E, &f, t);
            st = check_finite(b + (size_t)l * E, (size_t)E, path, name);
        }
    }
    if (!st) {
        model_placement_permute(m, b, L, 1, 0);
        m->be->copy_to_device(m->be, m->router_bias, b, (size_t)L * E * sizeof(real));
    }
    free(b);
    st_free(&f);
    return st;
}

static moe_status load_weights(model *m, const char *folder) {
    real *host = malloc(m->n_params * sizeof(real));
    if (!host) return moe_error(MOE_ENOMEM, "cannot allocate %zu parameters", m->n_params);
    moe_status st = load_tensors(host, m->tensors, m->n_tensors, folder, NULL, NULL);
    model_placement_image(m, host, 0); // the gate rows of the file are in global order
    if (!st) m->be->copy_to_device(m->be, m->params, host, m->n_params * sizeof(real));
    free(host);
    char path[PATH_BUF];
    path_fmt(path, sizeof path, "%s/" BIAS_FILE, folder);
    // a model with a selection bias starts from the folder's, or from zero if it has none
    if (!st && m->router_bias && access(path, F_OK) == 0) st = load_bias(m, folder);
    return st;
}

// 1 and *step when the last component of folder (trailing slashes allowed) is step_NNNNNNNN.
static int folder_step(const char *folder, long long *step) {
    char path[PATH_BUF];
    path_fmt(path, sizeof path, "%s", folder);
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') path[--n] = 0;
    const char *base = strrchr(path, '/');
    return parse_step_name(base ? base + 1 : path, step);
}

// A folder whose name is step_NNNNNNNN, or that has a trainer_state.json, is a moe.c
// checkpoint: it is loaded only when intact.
static int is_moe_checkpoint(const char *folder) {
    char path[PATH_BUF];
    path_fmt(path, sizeof path, "%s/trainer_state.json", folder);
    if (access(path, F_OK) == 0) return 1;
    long long step;
    return folder_step(folder, &step);
}

moe_status hf_load_weights(model *m, const char *folder) {
    if (check_path_arg(folder)) return MOE_EINVAL;
    char path[PATH_BUF];
    path_fmt(path, sizeof path, "%s/trainer_state.json", folder);
    if (!is_moe_checkpoint(folder)) return load_weights(m, folder); // an HF folder
    if (access(path, F_OK) != 0)
        return moe_error(MOE_EIO,
                         "%s: a moe.c checkpoint folder without its trainer_state.json "
                         "(damaged or incomplete; an HF folder must not be named step_N)",
                         folder);
    moe_status st = checkpoint_verify(folder);
    return st ? st : load_weights(m, folder);
}

// ---- save -----------------------------------------------------------------------------


// Deletes leftovers of interrupted saves (step_*.tmp) and all but the newest `keep`
// complete checkpoints.
static void prune(const char *root, int keep) {
    DIR *d = opendir(root);
    if (!d) return;
    long long steps[4096];
    int n = 0;
    struct dirent *e;
    char path[PATH_BUF];
    while ((e = readdir(d))) {
        long long s;
        size_t len = strlen(e->d_name);
        if (!strncmp(e->d_name, "step_", 5) && len > 4 && !strcmp(e->d_name + len - 4, ".tmp")) {
            path_fmt(path, sizeof path, "%s/%s", root, e->d_name);
            remove_folder(path);
        } else if (parse_step_name(e->d_name, &s) && n < 4096) {
            steps[n++] = s;
        }
    }
    closedir(d);
    for (int i = 0; i < n; i++) { // newest first
        int newer = 0;
        for (int j = 0; j < n; j++) newer += steps[j] > steps[i];
        if (newer >= keep) {
            path_fmt(path, sizeof path, "%s/step_%08lld", root, steps[i]);
            remove_folder(path);
        }
    }
}

static char *config_text(const moe_train_config *cfg) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    moe_train_config_write(cfg, f);
    fclose(f);
    return buf;
}

// ---- agreement between the ranks of a save ---------------------------------------

// What each rank reports after a phase of a collective save: its status (with its message)
// and the files it wrote with their CRC32s.
#define REPORT_MSG 400
typedef struct {
    char name[64];
    char crc[12]; // 8 hex digits
} file_crc;

typedef struct {
    int status;
    int n_files;
    char msg[REPORT_MSG];
} report_head;

// Every rank's report, on every rank: status st and the CRC32s of the files it names (in
// folder). Returns the first failure in rank order (a failure elsewhere becomes
// "rank R: <its message>" here), else MOE_OK with *all [size][1 + max_files] blocks (free it).
static moe_status gather_reports(moe_comm *world, moe_status st, const char *folder,
                                 const cJSON *files, int max_files, void **all) {
    const size_t block = sizeof(report_head) + (size_t)max_files * sizeof(file_crc);
    const int R = world ? world->size : 1;
    char *mine = calloc(1, block), *every = calloc((size_t)R, block);
    if (!mine || !every) moe_fatal("checkpoint: out of memory");
    report_head *h = (report_head *)mine;
    file_crc *crcs = (file_crc *)(mine + sizeof *h);
    const cJSON *f;
    cJSON_ArrayForEach(f, (st ? NULL : files)) {
        char path[PATH_BUF];
        uint32_t crc;
        path_fmt(path, sizeof path, "%s/%s", folder, f->valuestring);
        if (h->n_files == max_files)
            st = moe_error(MOE_EINVAL, "checkpoint: more than %d files from one rank", max_files);
        else if (!(st = file_crc32(path, &crc))) {
            snprintf(crcs[h->n_files].name, sizeof crcs->name, "%s", f->valuestring);
            snprintf(crcs[h->n_files++].crc, sizeof crcs->crc, "%08" PRIx32, crc);
        }
        if (st) break;
    }
    h->status = st;
    if (st) snprintf(h->msg, sizeof h->msg, "%s", moe_last_error());
    if (world)
        world->allgather(world, every, mine, block);
    else
        memcpy(every, mine, block);
    free(mine);
    for (int r = 0; r < R; r++) {
        const report_head *o = (const report_head *)(every + (size_t)r * block);
        if (!o->status) continue;
        moe_status code = (moe_status)o->status;
        if (!world || r != world->rank) moe_error(code, "rank %d: %s", r, o->msg);
        free(every);
        return code;
    }
    *all = every;
    return MOE_OK;
}

// ---- save -----------------------------------------------------------------------------

// The files every writer writes: its model shards and, with AdamW, its moment shards.
static moe_status write_tensors(const char *folder, const shard_plan *plan, int w, const model *m,
                                const optimizer *opt, cJSON *files) {
    real *host = malloc(m->n_params * sizeof(real));
    if (!host)
        return moe_error(MOE_ENOMEM, "checkpoint: cannot allocate %zu parameters", m->n_params);
    m->be->copy_to_host(m->be, host, m->params, m->n_params * sizeof(real));
    model_placement_image(m, host, 1); // files hold the gate rows in global expert order
    moe_status st = shard_write(folder, plan, w, m, host, "model", ST_F32, files);
    crash_point("model_written");
    for (int i = 0; i < 2 && !st && opt && opt->m; i++) {
        m->be->copy_to_host(m->be, host, i ? opt->v : opt->m, m->n_params * sizeof(real));
        model_placement_image(m, host, 1);
        st = shard_write(folder, plan, w, m, host, i ? MOMENTS_SQ : MOMENTS, ST_F32, files);
    }
    free(host);
    return st;
}

// What only rank 0 writes besides its tensors: config.json, the index, the selection bias and
// the run's tokenizer.
static moe_status write_rank0_files(const char *tmp, const model *m, const shard_plan *plan,
                                    const moe_train_config *cfg, cJSON *files) {
    char path[PATH_BUF];
    path_fmt(path, sizeof path, "%s/config.json", tmp);
    cJSON *cj = hf_config_json(&m->cfg, "float32");
    moe_status st = ckpt_json_write(path, cj);
    cJSON_Delete(cj);
    if (st || (st = shard_write_index(tmp, plan))) return st;
    cJSON_AddItemToArray(files, cJSON_CreateString("config.json"));
    cJSON_AddItemToArray(files, cJSON_CreateString("model.safetensors.index.json"));
    if (m->router_bias) {
        if ((st = write_bias(tmp, m))) return st;
        cJSON_AddItemToArray(files, cJSON_CreateString(BIAS_FILE));
    }
    // the run's tokenizer travels with the weights (the trainer's open_data makes the same
    // choice): its files, else the byte tokenizer's for a vocabulary of 256; CRC'd like the rest
    char tok[PATH_BUF];
    if ((st = tokenizer_for_run(tok, sizeof tok, cfg->tokenizer, cfg->init_from, NULL))) return st;
    if (tok[0])
        st = tokenizer_copy_hf(tok, tmp, NULL);
    else if (m->cfg.vocab_size == BYTE_VOCAB_SIZE)
        st = tokenizer_write_byte_hf(tmp);
    for (const char *const *name = tokenizer_hf_files; *name && !st; name++) {
        path_fmt(path, sizeof path, "%s/%s", tmp, *name);
        if (access(path, F_OK) == 0) cJSON_AddItemToArray(files, cJSON_CreateString(*name));
    }
    return st;
}

// trainer_state.json: everything else, and the CRC32 of every other file (the reports of
// all R ranks, blocks of 1 + max_files).
static moe_status write_state(const char *tmp, const optimizer *opt, const train_state *ts,
                              const moe_train_config *cfg, const void *reports, int R,
                              int max_files) {
    cJSON *state = cJSON_CreateObject();
    cJSON_AddStringToObject(state, "format", "moe.c trainer state");
    cJSON_AddNumberToObject(state, "version", 1);
    cJSON_AddNumberToObject(state, "step", (double)ts->step);
    cJSON_AddNumberToObject(state, "skipped", (double)ts->skipped);
    cJSON_AddNumberToObject(state, "consecutive_skips", (double)ts->consecutive_skips);
    cJSON *o = cJSON_AddObjectToObject(state, "optimizer");
    cJSON_AddStringToObject(o, "kind", opt && opt->cfg.kind == OPTIM_SGD ? "sgd" : "adamw");
    cJSON_AddNumberToObject(o, "t", opt ? (double)opt->t : 0);
    cJSON *sch = cJSON_AddObjectToObject(state, "schedule");
    cJSON_AddStringToObject(sch, "kind",
                            cfg->schedule == SCHEDULE_CONSTANT ? "constant" : "cosine");
    cJSON_AddNumberToObject(sch, "lr", cfg->lr);
    cJSON_AddNumberToObject(sch, "min_lr", cfg->min_lr);
    cJSON_AddNumberToObject(sch, "warmup_steps", (double)cfg->warmup_steps);
    cJSON_AddNumberToObject(sch, "steps", (double)cfg->steps);
    // the only random stream of a run after initialisation is the data order; 64-bit values
    // are strings (JSON numbers are doubles)
    cJSON *rng = cJSON_AddObjectToObject(state, "rng");
    char num[32];
    snprintf(num, sizeof num, "%" PRIu64, (uint64_t)cfg->seed);
    cJSON_AddStringToObject(rng, "init_seed", num);
    cJSON *ld = cJSON_AddObjectToObject(rng, "data_loader");
#define ADD_U64(obj, key, v) \
    (snprintf(num, sizeof num, "%" PRIu64, (uint64_t)(v)), cJSON_AddStringToObject(obj, key, num))
    ADD_U64(ld, "seed", ts->loader.seed);
    ADD_U64(ld, "epoch", ts->loader.epoch);
    ADD_U64(ld, "position", ts->loader.position);
    ADD_U64(ld, "n_windows", ts->loader.n_windows);
    ADD_U64(ld, "seq_len", ts->loader.seq_len);
#undef ADD_U64
    cJSON *world = cJSON_AddObjectToObject(state, "world");
    cJSON_AddNumberToObject(world, "size", (double)(ts->world_size > 0 ? ts->world_size : 1));
    cJSON_AddNumberToObject(world, "ep_size", (double)(ts->ep_size > 0 ? ts->ep_size : 1));
    if (ts->capacity.present) {
        const capacity_state *cap = &ts->capacity;
        cJSON *c = cJSON_AddObjectToObject(state, "capacity");
        cJSON_AddNumberToObject(c, "factor", cap->factor);
        cJSON_AddNumberToObject(c, "layers", cap->L);
        cJSON *w = cJSON_AddArrayToObject(c, "window_need");
        for (int64_t i = 0; i < cap->n; i++)
            cJSON_AddItemToArray(w, cJSON_CreateDoubleArray(cap->need + i * cap->L, cap->L));
    }
    char *cfg_text = config_text(cfg);
    moe_status st =
        cfg_text ? MOE_OK : moe_error(MOE_ENOMEM, "checkpoint: cannot format the config");
    if (cfg_text) cJSON_AddStringToObject(state, "config", cfg_text);
    cJSON *crcs = cJSON_AddObjectToObject(state, "crc32");
    const size_t block = sizeof(report_head) + (size_t)max_files * sizeof(file_crc);
    for (int r = 0; r < R; r++) {
        const char *b = (const char *)reports + (size_t)r * block;
        const report_head *h = (const report_head *)b;
        const file_crc *fc = (const file_crc *)(b + sizeof *h);
        for (int i = 0; i < h->n_files; i++) cJSON_AddStringToObject(crcs, fc[i].name, fc[i].crc);
    }
    char path[PATH_BUF];
    path_fmt(path, sizeof path, "%s/trainer_state.json", tmp);
    if (!st) st = ckpt_json_write(path, state);
    free(cfg_text);
    cJSON_Delete(state);
    return st;
}

// Renames the complete tmp folder to final (the same step may exist: a run resumed from an
// earlier step, in place), then points `latest` at it, then prunes.
static moe_status publish(const char *ckpt_root, const char *tmp, const char *final, int64_t step,
                          int keep) {
    moe_status st = fsync_path(tmp);
    if (st) return st;
    crash_point("before_rename");
    // `latest` may name the existing folder: swap the two atomically so that name is never
    // missing, then delete the old one. Without RENAME_EXCHANGE (some filesystems), replace.
    struct stat sb;
    if (stat(final, &sb) == 0) {
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
            remove_folder(tmp);
        } else {
            remove_folder(final);
            if (rename(tmp, final) != 0)
                return moe_error(MOE_EIO, "%s: cannot rename to %s: %s", tmp, final,
                                 strerror(errno));
        }
    } else if (rename(tmp, final) != 0) {
        return moe_error(MOE_EIO, "%s: cannot rename to %s: %s", tmp, final, strerror(errno));
    }
    if ((st = fsync_path(ckpt_root))) return st;
    crash_point("after_rename");
    char latest[PATH_BUF], latest_tmp[PATH_BUF + 8], line[32];
    path_fmt(latest, sizeof latest, "%s/latest", ckpt_root);
    path_fmt(latest_tmp, sizeof latest_tmp, "%s.tmp", latest);
    snprintf(line, sizeof line, "step_%08lld\n", (long long)step);
    if ((st = file_write_synced(latest_tmp, line, strlen(line)))) return st;
    crash_point("latest_written");
    if (rename(latest_tmp, latest) != 0)
        return moe_error(MOE_EIO, "%s: cannot rename: %s", latest_tmp, strerror(errno));
    if ((st = fsync_path(ckpt_root))) return st;
    crash_point("before_prune");
    prune(ckpt_root, keep);
    return MOE_OK;
}

// Test-only: MOE_TEST_SAVE_FAIL="R:N" makes rank R's tensor writing fail in this process's
// N-th save (a full disk on one node), to check that every rank returns its error and the
// previous checkpoint stays.
static moe_status test_save_fail(moe_comm *world) {
    const char *spec = getenv("MOE_TEST_SAVE_FAIL");
    int r, nth;
    if (spec && world && sscanf(spec, "%d:%d", &r, &nth) == 2 && r == world->rank &&
        nth == save_count)
        return moe_error(MOE_EIO, "checkpoint: a write failure injected on rank %d", r);
    return MOE_OK;
}

moe_status checkpoint_save(const char *ckpt_root, const model *m, const optimizer *opt,
                           const train_state *ts, const moe_train_config *cfg, int keep,
                           uint64_t max_shard_bytes, moe_comm *world) {
    save_count++;
    const int rank = world ? world->rank : 0, R = world ? world->size : 1;
    char tmp[PATH_BUF] = "", final[PATH_BUF];
    shard_plan plan;
    void *reports = NULL;
    // phase 1: rank 0 makes the folder, every rank its plan
    moe_status st =
        shard_plan_make(&plan, &m->cfg, m->E_local, m->placement, ST_F32, max_shard_bytes);
    const int w = rank < plan.n_writers ? rank : -1, max_files = 3 * plan.max_per_writer + 16;
    if (!st && w >= 0 && m->expert0 != w * m->E_local)
        st = moe_error(MOE_EINVAL, "checkpoint: rank %d holds experts from %d, not %d", rank,
                       m->expert0, w * m->E_local);
    if (!st && !(st = check_path_arg(ckpt_root))) {
        path_fmt(final, sizeof final, "%s/step_%08lld", ckpt_root, (long long)ts->step);
        path_fmt(tmp, sizeof tmp, "%s.tmp", final);
        if (rank == 0 && !(st = file_make_dirs(ckpt_root))) st = fresh_folder(tmp);
    }
    if ((st = gather_reports(world, st, NULL, NULL, max_files, &reports))) goto done;
    free(reports), reports = NULL;
    // phase 2: every writer its tensors, rank 0 the rest
    cJSON *files = cJSON_CreateArray();
    if (w >= 0) st = test_save_fail(world);
    if (!st && w >= 0) st = write_tensors(tmp, &plan, w, m, opt, files);
    if (!st && rank == 0) st = write_rank0_files(tmp, m, &plan, cfg, files);
    st = gather_reports(world, st, tmp, files, max_files, &reports);
    cJSON_Delete(files);
    // phase 3: rank 0 writes trainer_state.json and publishes; every rank learns how it went
    // (after a failed phase 2 every rank already has the same error)
    const moe_status written = st;
    if (!st && rank == 0 && !(st = write_state(tmp, opt, ts, cfg, reports, R, max_files)))
        st = publish(ckpt_root, tmp, final, ts->step, keep);
    if (world && !written) {
        free(reports), reports = NULL;
        moe_status agreed = gather_reports(world, st, NULL, NULL, 0, &reports);
        st = st ? st : agreed;
    }
done:
    if (st && rank == 0 && tmp[0]) remove_folder(tmp);
    // every rank has the same status here; after a failure, wait for rank 0's clean-up
    // before anyone returns (a rank's fatal path MPI_Aborts the others)
    if (st && world) world->barrier(world);
    free(reports);
    shard_plan_free(&plan);
    return st;
}

// ---- finding a checkpoint ------------------------------------------------------------

moe_status checkpoint_resolve(char *folder, size_t n, const char *path) {
    if (check_path_arg(path)) return MOE_EINVAL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return moe_error(MOE_EIO, "%s: no such checkpoint: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        snprintf(folder, n, "%s", path);
        return MOE_OK;
    }
    char *text;
    moe_status st = file_read_all(path, SMALL_FILE_MAX, &text, NULL);
    if (st) return st;
    text[strcspn(text, "\r\n")] = 0;
    long long step;
    if (!parse_step_name(text, &step)) {
        free(text);
        return moe_error(MOE_EIO, "%s: expected a line 'step_NNNNNNNN'", path);
    }
    char dir[PATH_BUF];
    path_fmt(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        path_fmt(dir, sizeof dir, ".");
    snprintf(folder, n, "%s/%s", dir, text);
    free(text);
    return MOE_OK;
}

// ---- trainer_state.json -------------------------------------------------------------
//
// Every field is checked for type and range before it is used: a JSON number is a double,
// and casting 1e300 to int64 is undefined behaviour.

#define STATE_MAX_STEPS INT64_C(1000000000000) // train.steps' limit (train/config/config.h)

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
static moe_status parse_capacity(capacity_state *cap, const cJSON *c, const char *file) {
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
    *cap =
        (capacity_state){.present = 1, .factor = f->valuedouble, .n = n, .L = (int)L, .need = need};
    return MOE_OK;
}

// A save names its folder after its step: in a folder step_NNNNNNNN, "step" must be NNNNNNNN
// (else a renamed or damaged checkpoint resumes at another step than its name says).
static moe_status check_folder_step(const char *folder, const char *file, int64_t step) {
    long long named;
    if (!folder_step(folder, &named) || named == step) return MOE_OK;
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

static moe_status parse_state(checkpoint_state *cs, const cJSON *state, const char *folder,
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
static moe_status read_state(cJSON **json, checkpoint_state *cs, const char *folder) {
    if (check_path_arg(folder)) return MOE_EINVAL;
    char file[PATH_BUF];
    path_fmt(file, sizeof file, "%s/trainer_state.json", folder);
    moe_status st = file_read_json_object(file, SMALL_FILE_MAX, json);
    if (!st && (st = parse_state(cs, *json, folder, file))) cJSON_Delete(*json), *json = NULL;
    return st; // (parse_state frees what it allocated when it fails)
}

static void capacity_state_free(capacity_state *c) {
    free(c->need);
    c->need = NULL;
}

moe_status checkpoint_state_read(checkpoint_state *cs, const char *folder) {
    cJSON *state;
    moe_status st = read_state(&state, cs, folder);
    cJSON_Delete(state);
    if (!st) capacity_state_free(&cs->ts.capacity); // (checkpoint.h: no needs from here)
    return st;
}

// ---- integrity -----------------------------------------------------------------------

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
    moe_status st = file_crc32(path, &crc);
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
    moe_status st = file_read_json_object(path, SMALL_FILE_MAX, &index);
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
    if (!st && !(st = file_read_json_object(path, SMALL_FILE_MAX, &config)) &&
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

// checkpoint_verify, also giving the validated state (trainer_state.json is read once).
static moe_status verify(checkpoint_state *cs, const char *folder) {
    cJSON *state = NULL;
    moe_status st = read_state(&state, cs, folder);
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
    if (st) capacity_state_free(&cs->ts.capacity);
    return st;
}

moe_status checkpoint_verify(const char *folder) {
    checkpoint_state cs;
    moe_status st = verify(&cs, folder);
    if (!st) capacity_state_free(&cs.ts.capacity);
    return st;
}

// ---- sizes before allocation -------------------------------------------------------------

moe_status hf_check_sizes(const char *folder, const model_config *cfg) {
    if (check_path_arg(folder)) return MOE_EINVAL;
    weight_source ws;
    moe_status st = source_open(&ws, folder);
    int64_t have = 0; // tensors the folder names: the index's entries, or the file's
    if (!st && ws.index) {
        have = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(ws.index, "weight_map"));
    } else if (!st) {
        char path[PATH_BUF];
        path_fmt(path, sizeof path, "%s/model.safetensors", folder);
        st_file f;
        if (!(st = st_read_header(&f, path))) have = f.n;
        st_free(&f);
    }
    source_close(&ws);
    if (st) return st;
    // the table is no bigger than the headers, which are bounded (ST_MAX_HEADER per file)
    const int64_t need = model_tensor_count(cfg);
    if (need > have)
        return moe_error(MOE_EIO,
                         "%s/config.json describes %" PRId64 " tensors (num_hidden_layers "
                         "= %d, num_local_experts = %d), the folder's weights have %" PRId64
                         ": config.json does not match the weights",
                         folder, need, cfg->n_layers, cfg->moe.n_experts, have);
    model_tensor *tab = model_tensor_table(cfg);
    if (!tab) return moe_error(MOE_ENOMEM, "out of memory");
    st = load_tensors(NULL, tab, (int)need, folder, NULL, NULL);
    free(tab);
    return st;
}

// ---- load -------------------------------------------------------------------------------

// One AdamW moment of m's tensors into host: from its shards (PREFIX-0000F-of-0000N, beside
// the model's), or from the single PREFIX.safetensors of checkpoints before expert-parallel
// saves.
static moe_status load_moments(real *host, const model *m, const char *folder, const char *prefix) {
    char single[96], path[PATH_BUF];
    snprintf(single, sizeof single, "%s.safetensors", prefix);
    path_fmt(path, sizeof path, "%s/%s", folder, single);
    if (access(path, F_OK) == 0)
        return load_tensors(host, m->tensors, m->n_tensors, folder, single, NULL);
    return load_tensors(host, m->tensors, m->n_tensors, folder, NULL, prefix);
}

// checkpoint_load after verify: weights, moments, optimizer count.
static moe_status load_verified(const char *folder, checkpoint_state *cs, model *m,
                                optimizer *opt) {
    real *host = NULL;
    moe_status st;
    if (opt && opt->cfg.kind != cs->optimizer)
        return moe_error(
            MOE_EINVAL,
            "%s/trainer_state.json: the checkpoint was trained with %s, "
            "the config says train.optimizer = \"%s\" (switching optimizers on resume "
            "is not supported: use train.init_from to start a new run from the weights)",
            folder, cs->optimizer == OPTIM_SGD ? "sgd" : "adamw",
            opt->cfg.kind == OPTIM_SGD ? "sgd" : "adamw");
    if ((st = hf_config_check(folder, &m->cfg))) return st;
    if ((st = load_weights(m, folder))) return st;
    if (opt && opt->m) {
        if (!(host = malloc(m->n_params * sizeof(real))))
            return moe_error(MOE_ENOMEM, "checkpoint: out of memory");
        for (int i = 0; i < 2 && !st; i++)
            if (!(st = load_moments(host, m, folder, i ? MOMENTS_SQ : MOMENTS))) {
                model_placement_image(m, host, 0);
                m->be->copy_to_device(m->be, i ? opt->v : opt->m, host, m->n_params * sizeof(real));
            }
        free(host);
        if (st) return st;
    }
    if (opt) opt->t = cs->optimizer_t;
    return MOE_OK;
}

moe_status checkpoint_load(const char *path, model *m, optimizer *opt, train_state *ts) {
    char folder[PATH_BUF];
    moe_status st = checkpoint_resolve(folder, sizeof folder, path);
    if (st) return st;
    checkpoint_state cs;
    if ((st = verify(&cs, folder))) return st;
    st = load_verified(folder, &cs, m, opt);
    if (!st && ts)
        *ts = cs.ts; // the capacity needs go with it
    else
        capacity_state_free(&cs.ts.capacity);
    return st;
}

// ---- export ---------------------------------------------------------------------------

// What a user needs to run an export (into tmp): the tokenizer of the weights (the files of
// src, "" for none; else the byte tokenizer's for a vocabulary of 256), its special ids (in
// [0, vocab_size), read from src's files so that an error names them) and
// generation_config.json.
static moe_status export_tokenizer(const char *src, const char *tmp, int vocab_size, int *bos,
                                   int *eos, int *pad) {
    const int from_src = src[0] && tokenizer_has_hf(src);
    moe_status st = MOE_OK;
    if (from_src)
        st = tokenizer_copy_hf(src, tmp, NULL);
    else if (vocab_size == BYTE_VOCAB_SIZE)
        st = tokenizer_write_byte_hf(tmp);
    const char *tok = from_src ? src : tmp;
    if (!st) st = tokenizer_special_ids(tok, vocab_size, bos, eos, pad);
    if (!st) st = tokenizer_write_generation_config(src[0] ? src : NULL, tok, vocab_size, tmp);
    return st;
}

moe_status hf_export_from(const char *out_folder, const char *src_folder, const model *m,
                          st_dtype dtype, uint64_t max_shard_bytes) {
    char tmp[PATH_BUF], path[PATH_BUF + 32], src[PATH_BUF] = "";
    struct stat sb;
    if (check_path_arg(out_folder)) return MOE_EINVAL;
    moe_status st = src_folder ? checkpoint_resolve(src, sizeof src, src_folder) : MOE_OK;
    if (st) return st;
    if (stat(out_folder, &sb) == 0)
        return moe_error(MOE_EINVAL, "%s: already exists (export never overwrites)", out_folder);
    path_fmt(tmp, sizeof tmp, "%s.tmp", out_folder);
    if ((st = fresh_folder(tmp))) return st;
    real *host = malloc(m->n_params * sizeof(real));
    if (!host) st = moe_error(MOE_ENOMEM, "export: out of memory");
    int bos = -1, eos = -1, pad = -1;
    if (!st) st = export_tokenizer(src, tmp, m->cfg.vocab_size, &bos, &eos, &pad);
    if (!st) {
        path_fmt(path, sizeof path, "%s/config.json", tmp);
        cJSON *cj = hf_config_json(&m->cfg, dtype == ST_BF16  ? "bfloat16"
                                            : dtype == ST_F16 ? "float16"
                                                              : "float32");
        // the tokenizer's ids: MixtralConfig's defaults (bos 1, eos 2) would name real tokens
        if (bos >= 0)
            cJSON_AddNumberToObject(cj, "bos_token_id", bos);
        else
            cJSON_AddNullToObject(cj, "bos_token_id");
        if (eos >= 0)
            cJSON_AddNumberToObject(cj, "eos_token_id", eos);
        else
            cJSON_AddNullToObject(cj, "eos_token_id");
        if (pad >= 0) cJSON_AddNumberToObject(cj, "pad_token_id", pad);
        st = ckpt_json_write(path, cj);
        cJSON_Delete(cj);
    }
    if (!st) {
        m->be->copy_to_host(m->be, host, m->params, m->n_params * sizeof(real));
        model_placement_image(m, host, 1);
        shard_plan plan;
        if (!(st = shard_plan_make(&plan, &m->cfg, m->E_local, m->placement, dtype,
                                   max_shard_bytes)) &&
            !(st = shard_write(tmp, &plan, 0, m, host, "model", dtype, NULL)))
            st = shard_write_index(tmp, &plan);
        shard_plan_free(&plan);
    }
    if (!st && m->router_bias) st = write_bias(tmp, m);
    if (!st) st = fsync_path(tmp);
    if (!st && rename(tmp, out_folder) != 0)
        st = moe_error(MOE_EIO, "%s: cannot rename to %s: %s", tmp, out_folder, strerror(errno));
    free(host);
    if (st) remove_folder(tmp);
    return st;
}
