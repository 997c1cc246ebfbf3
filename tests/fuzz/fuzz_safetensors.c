// moe_st_read (ckpt/safetensors.h) on arbitrary bytes. A file it accepts must keep the
// promises of its header comment: offsets inside the data, sizes that match shape x dtype,
// names that moe_st_find finds; and every tensor converts to float32.
#include <stdlib.h>

#include "fuzz.h"
#include "ckpt/safetensors.h"

// Elements of t, checked against its byte range.
static size_t check_tensor(const moe_st_file *f, const moe_st_tensor *t) {
    if (t->begin > t->end || t->end > f->data_size)
        fuzz_fail("%s: tensor '%s' [%llu, %llu) beyond the data (%llu bytes)", f->path, t->name,
                  (unsigned long long)t->begin, (unsigned long long)t->end,
                  (unsigned long long)f->data_size);
    if (t->ndim < 0 || t->ndim > MOE_ST_MAX_DIMS)
        fuzz_fail("%s: '%s' has %d dims", f->path, t->name, t->ndim);
    uint64_t count = 1;
    for (int d = 0; d < t->ndim; d++) count *= (uint64_t)t->shape[d];
    if (count * moe_st_dtype_size(t->dtype) != t->end - t->begin)
        fuzz_fail("%s: '%s' shape x dtype differs from its data_offsets", f->path, t->name);
    if (moe_st_find(f, t->name) != t)
        fuzz_fail("%s: moe_st_find('%s') finds another tensor", f->path, t->name);
    return (size_t)count;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[FUZZ_PATH_MAX], path[FUZZ_PATH_MAX];
    fuzz_dir(dir, sizeof dir, "safetensors");
    fuzz_write(path, sizeof path, dir, "input.safetensors", data, size);
    moe_st_file f;
    if (moe_st_read(&f, path) == MOE_OK) {
        for (int i = 0; i < f.n; i++) {
            const size_t count = check_tensor(&f, &f.tensors[i]);
            float *out = malloc(count ? count * sizeof *out : 1);
            if (!out) fuzz_fail("no memory for %zu floats", count);
            moe_st_to_f32(out, &f, &f.tensors[i]);
            free(out);
        }
    }
    moe_st_free(
        &f); // also after a failure: moe_st_read leaves nothing to free, moe_st_free must cope
    return 0;
}
