// moe_token_file_read (data/token_file.h) on arbitrary bytes. A file it accepts has exactly
// 32 + count * dtype bytes and every token below vocab_size, as the format promises.
#include "data/token_file.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[FUZZ_PATH_MAX], path[FUZZ_PATH_MAX];
    fuzz_dir(dir, sizeof dir, "token_file");
    fuzz_write(path, sizeof path, dir, "input.bin", data, size);
    moe_token_file tf;
    if (moe_token_file_read(&tf, path) == MOE_OK) {
        if ((tf.dtype != 2 && tf.dtype != 4) ||
            MOE_TOKEN_FILE_HEADER_BYTES + tf.count * tf.dtype != size)
            fuzz_fail("%s: accepted with dtype %u, count %llu for a %zu-byte file", path, tf.dtype,
                      (unsigned long long)tf.count, size);
        for (uint64_t i = 0; i < tf.count; i++)
            if (tf.tokens[i] >= tf.vocab_size)
                fuzz_fail("%s: token %llu = %u >= vocab_size %u", path, (unsigned long long)i,
                          tf.tokens[i], tf.vocab_size);
    }
    moe_token_file_free(&tf); // safe on the empty token_file a failure leaves
    return 0;
}
