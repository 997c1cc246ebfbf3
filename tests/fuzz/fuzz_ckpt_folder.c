// A whole checkpoint folder: moe_checkpoint_verify (ckpt/checkpoint.h), then infer_load
// (infer/infer.h) with a small KV cache, as `moe eval` / `moe generate` load one.
//
// The input is an archive of the folder's files (archive.h); tests/fuzz/archive.py packs
// and unpacks it. infer_load runs whatever moe_checkpoint_verify said: verification only
// covers folders with a trainer_state.json (an HF folder is loaded unchecked), and the CRCs
// would otherwise shield the loader from nearly every mutation.
#include <stdlib.h>

#include "archive.h"
#include "fuzz.h"
#include "ckpt/checkpoint.h"
#include "infer/infer.h"

enum { MAX_POS = 16, MAX_CHUNK = 4 };

// The reals infer_load allocates for this config, in double (no overflow), roughly: the
// parameters, the KV cache and one chunk's activations.
static double model_reals(const moe_model_config *c) {
    const double V = c->vocab_size, d = c->d_model, L = c->n_layers, H = c->n_heads,
                 KV = c->n_kv_heads, hd = moe_model_head_dim(c), E = c->moe.n_experts,
                 ff = c->moe.d_ff;
    const double per_layer = 2 * d + (H + 2 * KV) * hd * d + d * H * hd + E * d + 3 * E * ff * d;
    const double params = V * d * (c->tie_embeddings ? 1 : 2) + L * per_layer + d;
    return params + MAX_POS * L * 2 * KV * hd + MAX_CHUNK * (V + E * ff + 8 * d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[FUZZ_PATH_MAX];
    fuzz_dir(dir, sizeof dir, "ckpt");
    fuzz_clear(dir);
    archive_unpack(dir, data, size);
    (void)moe_checkpoint_verify(dir);
    // A config.json declaring a big model makes infer_load allocate it before it reads a
    // shard; that is the loader working, not a bug, and would stop the fuzzer (out of
    // memory). Such inputs skip the load; 16M reals = 64 MiB.
    moe_model_config cfg;
    if (moe_hf_config_read(&cfg, dir) == MOE_OK && model_reals(&cfg) > (double)(1 << 24)) return 0;
    moe_model m;
    static moe_backend *be;
    if (!be && moe_backend_create(&be, "cpu", NULL)) abort();
    if (infer_load(&m, be, dir, MAX_POS, MAX_CHUNK) == MOE_OK) moe_model_destroy(&m);
    return 0;
}
