// moe_checkpoint_save: the collective save (every writer its shards, rank 0 config.json, the
// index, the bias and tokenizer files, then trainer_state.json with every file's CRC32), the
// agreement between the ranks after each phase, the atomic publish (rename, `latest`) and
// the pruning of old checkpoints.
#define _GNU_SOURCE // open_memstream, dirent, renameat2

#include "ckpt/ckpt_internal.h"

#include "data/prepare.h" // DATA_BYTE_VOCAB_SIZE
#include "data/files.h"
#include "data/tokenizer.h" // the tokenizer files checkpoints carry
#include "ckpt/path_internal.h"
#include "ckpt/json_fields.h"
#include "ckpt/shards.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// Test-only: MOE_TEST_CRASH_AT=<point> kills the process with SIGKILL at that point of the
// MOE_TEST_CRASH_SAVE-th save (default 1) of this process.
static int save_count;
static void crash_point(const char *point) {
    const char *at = getenv("MOE_TEST_CRASH_AT"), *nth = getenv("MOE_TEST_CRASH_SAVE");
    if (at && !strcmp(at, point) && save_count == (nth ? atoi(nth) : 1)) raise(SIGKILL);
}

// ---- old checkpoints, the config text ---------------------------------------------------

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
            ckpt_remove_folder(path);
        } else if (ckpt_parse_step_name(e->d_name, &s) && n < 4096) {
            steps[n++] = s;
        }
    }
    closedir(d);
    for (int i = 0; i < n; i++) { // newest first
        int newer = 0;
        for (int j = 0; j < n; j++) newer += steps[j] > steps[i];
        if (newer >= keep) {
            path_fmt(path, sizeof path, "%s/step_%08lld", root, steps[i]);
            ckpt_remove_folder(path);
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
        else if (!(st = moe_file_crc32(path, &crc))) {
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

// ---- the phases of a save ------------------------------------------------------------

// The files every writer writes: its model shards and, with AdamW, its moment shards.
static moe_status write_tensors(const char *folder, const moe_shard_plan *plan, int w,
                                const moe_model *m, const moe_optimizer *opt, cJSON *files) {
    real *host = malloc(m->n_params * sizeof(real));
    if (!host)
        return moe_error(MOE_ENOMEM, "checkpoint: cannot allocate %zu parameters", m->n_params);
    m->be->copy_to_host(m->be, host, m->params, m->n_params * sizeof(real));
    moe_model_placement_image(m, host, 1); // files hold the gate rows in global expert order
    moe_status st = moe_shard_write(folder, plan, w, m, host, "model", MOE_ST_F32, files);
    crash_point("model_written");
    for (int i = 0; i < 2 && !st && opt && opt->m; i++) {
        m->be->copy_to_host(m->be, host, i ? opt->v : opt->m, m->n_params * sizeof(real));
        moe_model_placement_image(m, host, 1);
        st = moe_shard_write(folder, plan, w, m, host, i ? MOMENTS_SQ : MOMENTS, MOE_ST_F32, files);
    }
    free(host);
    return st;
}

// What only rank 0 writes besides its tensors: config.json, the index, the selection bias and
// the run's tokenizer.
static moe_status write_rank0_files(const char *tmp, const moe_model *m, const moe_shard_plan *plan,
                                    const moe_train_config *cfg, cJSON *files) {
    char path[PATH_BUF];
    path_fmt(path, sizeof path, "%s/config.json", tmp);
    cJSON *cj = moe_hf_config_json(&m->cfg, "float32");
    moe_status st = ckpt_json_write(path, cj);
    cJSON_Delete(cj);
    if (st || (st = moe_shard_write_index(tmp, plan))) return st;
    cJSON_AddItemToArray(files, cJSON_CreateString("config.json"));
    cJSON_AddItemToArray(files, cJSON_CreateString("model.safetensors.index.json"));
    if (m->router_bias) {
        if ((st = ckpt_write_bias(tmp, m))) return st;
        cJSON_AddItemToArray(files, cJSON_CreateString(BIAS_FILE));
    }
    // the run's tokenizer travels with the weights (the trainer's open_data makes the same
    // choice): its files, else the byte tokenizer's for a vocabulary of 256; CRC'd like the rest
    char tok[PATH_BUF];
    if ((st = moe_tokenizer_for_run(tok, sizeof tok, cfg->tokenizer, cfg->init_from, NULL)))
        return st;
    if (tok[0])
        st = moe_tokenizer_copy_hf(tok, tmp, NULL);
    else if (m->cfg.vocab_size == DATA_BYTE_VOCAB_SIZE)
        st = moe_tokenizer_write_byte_hf(tmp);
    for (const char *const *name = moe_tokenizer_hf_files; *name && !st; name++) {
        path_fmt(path, sizeof path, "%s/%s", tmp, *name);
        if (access(path, F_OK) == 0) cJSON_AddItemToArray(files, cJSON_CreateString(*name));
    }
    return st;
}

// trainer_state.json: everything else, and the CRC32 of every other file (the reports of
// all R ranks, blocks of 1 + max_files).
static moe_status write_state(const char *tmp, const moe_optimizer *opt, const train_state *ts,
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
                            cfg->schedule == MOE_SCHEDULE_CONSTANT ? "constant" : "cosine");
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
        const moe_capacity_state *cap = &ts->capacity;
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
    moe_status st = ckpt_fsync_path(tmp);
    if (st) return st;
    crash_point("before_rename");
    // `latest` may name the existing folder: swap the two atomically so that name is never
    // missing, then delete the old one. Without RENAME_EXCHANGE (some filesystems), replace.
    struct stat sb;
    if (stat(final, &sb) == 0) {
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
            ckpt_remove_folder(tmp);
        } else {
            ckpt_remove_folder(final);
            if (rename(tmp, final) != 0)
                return moe_error(MOE_EIO, "%s: cannot rename to %s: %s", tmp, final,
                                 strerror(errno));
        }
    } else if (rename(tmp, final) != 0) {
        return moe_error(MOE_EIO, "%s: cannot rename to %s: %s", tmp, final, strerror(errno));
    }
    if ((st = ckpt_fsync_path(ckpt_root))) return st;
    crash_point("after_rename");
    char latest[PATH_BUF], latest_tmp[PATH_BUF + 8], line[32];
    path_fmt(latest, sizeof latest, "%s/latest", ckpt_root);
    path_fmt(latest_tmp, sizeof latest_tmp, "%s.tmp", latest);
    snprintf(line, sizeof line, "step_%08lld\n", (long long)step);
    if ((st = moe_file_write_synced(latest_tmp, line, strlen(line)))) return st;
    crash_point("latest_written");
    if (rename(latest_tmp, latest) != 0)
        return moe_error(MOE_EIO, "%s: cannot rename: %s", latest_tmp, strerror(errno));
    if ((st = ckpt_fsync_path(ckpt_root))) return st;
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

moe_status moe_checkpoint_save(const char *ckpt_root, const moe_model *m, const moe_optimizer *opt,
                               const train_state *ts, const moe_train_config *cfg, int keep,
                               uint64_t max_shard_bytes, moe_comm *world) {
    save_count++;
    const int rank = world ? world->rank : 0, R = world ? world->size : 1;
    char tmp[PATH_BUF] = "", final[PATH_BUF];
    moe_shard_plan plan;
    void *reports = NULL;
    // phase 1: rank 0 makes the folder, every rank its plan
    moe_status st =
        moe_shard_plan_make(&plan, &m->cfg, m->E_local, m->placement, MOE_ST_F32, max_shard_bytes);
    const int w = rank < plan.n_writers ? rank : -1, max_files = 3 * plan.max_per_writer + 16;
    if (!st && w >= 0 && m->expert0 != w * m->E_local)
        st = moe_error(MOE_EINVAL, "checkpoint: rank %d holds experts from %d, not %d", rank,
                       m->expert0, w * m->E_local);
    if (!st && !(st = check_path_arg(ckpt_root))) {
        path_fmt(final, sizeof final, "%s/step_%08lld", ckpt_root, (long long)ts->step);
        path_fmt(tmp, sizeof tmp, "%s.tmp", final);
        if (rank == 0 && !(st = moe_file_make_dirs(ckpt_root))) st = ckpt_fresh_folder(tmp);
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
    if (st && rank == 0 && tmp[0]) ckpt_remove_folder(tmp);
    // every rank has the same status here; after a failure, wait for rank 0's clean-up
    // before anyone returns (a rank's fatal path MPI_Aborts the others)
    if (st && world) world->barrier(world);
    free(reports);
    moe_shard_plan_free(&plan);
    return st;
}
