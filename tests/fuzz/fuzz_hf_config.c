// moe_hf_config_read (ckpt/hf_config.h) on an arbitrary config.json. What it accepts must
// pass moe_model_config_check, since every loader builds a model from it.
#include "fuzz.h"
#include "ckpt/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[FUZZ_PATH_MAX], path[FUZZ_PATH_MAX];
    fuzz_dir(dir, sizeof dir, "hf");
    fuzz_write(path, sizeof path, dir, "config.json", data, size);
    moe_model_config cfg;
    if (moe_hf_config_read(&cfg, dir) == MOE_OK && moe_model_config_check(&cfg) != MOE_OK)
        fuzz_fail("%s: accepted, but moe_model_config_check refuses it: %s", path,
                  moe_last_error());
    return 0;
}
