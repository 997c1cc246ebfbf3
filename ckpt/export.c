// moe_hf_export_from: a model's weights as an inference-only HF folder (config.json with the
// tokenizer's ids, the shards in the chosen dtype, the index, the bias), with the tokenizer
// and generation_config.json, written beside and renamed into place.
#define _GNU_SOURCE // stat

#include "ckpt/ckpt_internal.h"

#include "data/prepare.h"   // DATA_BYTE_VOCAB_SIZE
#include "data/tokenizer.h" // the tokenizer files exports carry
#include "ckpt/path_internal.h"
#include "ckpt/json_fields.h"
#include "ckpt/shards.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// What a user needs to run an export (into tmp): the tokenizer of the weights (the files of
// src, "" for none; else the byte tokenizer's for a vocabulary of 256), its special ids (in
// [0, vocab_size), read from src's files so that an error names them) and
// generation_config.json.
static moe_status export_tokenizer(const char *src, const char *tmp, int vocab_size, int *bos,
                                   int *eos, int *pad) {
    const int from_src = src[0] && moe_tokenizer_has_hf(src);
    moe_status st = MOE_OK;
    if (from_src)
        st = moe_tokenizer_copy_hf(src, tmp, NULL);
    else if (vocab_size == DATA_BYTE_VOCAB_SIZE)
        st = moe_tokenizer_write_byte_hf(tmp);
    const char *tok = from_src ? src : tmp;
    if (!st) st = moe_tokenizer_special_ids(tok, vocab_size, bos, eos, pad);
    if (!st) st = moe_tokenizer_write_generation_config(src[0] ? src : NULL, tok, vocab_size, tmp);
    return st;
}

moe_status moe_hf_export_from(const char *out_folder, const char *src_folder, const moe_model *m,
                              moe_st_dtype dtype, uint64_t max_shard_bytes) {
    char tmp[PATH_BUF], path[PATH_BUF + 32], src[PATH_BUF] = "";
    struct stat sb;
    if (check_path_arg(out_folder)) return MOE_EINVAL;
    moe_status st = src_folder ? moe_checkpoint_resolve(src, sizeof src, src_folder) : MOE_OK;
    if (st) return st;
    if (stat(out_folder, &sb) == 0)
        return moe_error(MOE_EINVAL, "%s: already exists (export never overwrites)", out_folder);
    path_fmt(tmp, sizeof tmp, "%s.tmp", out_folder);
    if ((st = ckpt_fresh_folder(tmp))) return st;
    real *host = malloc(m->n_params * sizeof(real));
    if (!host) st = moe_error(MOE_ENOMEM, "export: out of memory");
    int bos = -1, eos = -1, pad = -1;
    if (!st) st = export_tokenizer(src, tmp, m->cfg.vocab_size, &bos, &eos, &pad);
    if (!st) {
        path_fmt(path, sizeof path, "%s/config.json", tmp);
        cJSON *cj = moe_hf_config_json(&m->cfg, dtype == MOE_ST_BF16  ? "bfloat16"
                                                : dtype == MOE_ST_F16 ? "float16"
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
        moe_model_placement_image(m, host, 1);
        moe_shard_plan plan;
        if (!(st = moe_shard_plan_make(&plan, &m->cfg, m->E_local, m->placement, dtype,
                                       max_shard_bytes)) &&
            !(st = moe_shard_write(tmp, &plan, 0, m, host, "model", dtype, NULL)))
            st = moe_shard_write_index(tmp, &plan);
        moe_shard_plan_free(&plan);
    }
    if (!st && m->router_bias) st = ckpt_write_bias(tmp, m);
    if (!st) st = ckpt_fsync_path(tmp);
    if (!st && rename(tmp, out_folder) != 0)
        st = moe_error(MOE_EIO, "%s: cannot rename to %s: %s", tmp, out_folder, strerror(errno));
    free(host);
    if (st) ckpt_remove_folder(tmp);
    return st;
}
