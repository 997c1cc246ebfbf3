// moe_checkpoint_state_read (ckpt/checkpoint.h) on an arbitrary trainer_state.json. An
// accepted state keeps its documented ranges.
#include "fuzz.h"
#include "ckpt/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[FUZZ_PATH_MAX], path[FUZZ_PATH_MAX];
    fuzz_dir(dir, sizeof dir, "state");
    fuzz_write(path, sizeof path, dir, "trainer_state.json", data, size);
    moe_checkpoint_state cs;
    if (moe_checkpoint_state_read(&cs, dir) == MOE_OK &&
        (cs.ts.step < 0 || cs.optimizer_t < 0 || cs.optimizer_t > cs.ts.step))
        fuzz_fail("%s: accepted with step %lld, optimizer_t %lld", path, (long long)cs.ts.step,
                  (long long)cs.optimizer_t);
    return 0;
}
