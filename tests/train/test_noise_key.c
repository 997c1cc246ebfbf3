// moe_trainer_noise_key (train/trainer.h): the router-jitter noise key of each micro-batch is
// distinct for every (step, micro) of a run. The old key, mix(seed ^ mix(step * 1024 +
// micro)), made micro-batch 1024 of step s draw the noise of micro-batch 0 of step s + 1
// (train.grad_accum goes up to 2^20).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "train/trainer.h"

static int fails;
#define CHECK(c)                                                                        \
    do {                                                                                \
        if (!(c)) fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c), fails++; \
    } while (0)

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int main(void) {
    const uint64_t seeds[] = {0, 1, 12345};
    for (int i = 0; i < 3; i++) {
        const uint64_t seed = seeds[i];
        // the pairs the old key confused
        for (int64_t s = 0; s < 100; s++) {
            CHECK(moe_trainer_noise_key(seed, s, 1024) != moe_trainer_noise_key(seed, s + 1, 0));
            CHECK(moe_trainer_noise_key(seed, s, 2048) != moe_trainer_noise_key(seed, s + 2, 0));
        }
        // a function of (seed, step, micro) alone: a resume draws the same noise
        CHECK(moe_trainer_noise_key(seed, 7, 3) == moe_trainer_noise_key(seed, 7, 3));
        // distinct over a grid of steps x micro-batches around the old period, with the
        // largest micro-batch index and steps near train.steps' bound
        static const int micros[] = {0, 1, 2, 1023, 1024, 1025, 2047, 2048, 4096, (1 << 20) - 1};
        enum { N_STEPS = 1200, N_MICRO = sizeof micros / sizeof *micros };
        uint64_t *keys = malloc((N_STEPS + 2) * N_MICRO * sizeof *keys);
        if (!keys) return 1;
        size_t n = 0;
        for (int64_t s = 0; s < N_STEPS; s++)
            for (int j = 0; j < N_MICRO; j++) keys[n++] = moe_trainer_noise_key(seed, s, micros[j]);
        for (int j = 0; j < N_MICRO; j++) {
            keys[n++] = moe_trainer_noise_key(seed, INT64_C(1000000000000) - 1, micros[j]);
            keys[n++] = moe_trainer_noise_key(seed, INT64_C(999999999998), micros[j]);
        }
        qsort(keys, n, sizeof *keys, cmp_u64);
        size_t dup = 0;
        for (size_t k = 1; k < n; k++) dup += keys[k] == keys[k - 1];
        CHECK(dup == 0);
        // and every micro-batch of a few steps with grad_accum = 4096
        uint64_t *all = malloc(3 * 4096 * sizeof *all);
        if (!all) return 1;
        for (int s = 0; s < 3; s++)
            for (int m = 0; m < 4096; m++) all[s * 4096 + m] = moe_trainer_noise_key(seed, s, m);
        qsort(all, 3 * 4096, sizeof *all, cmp_u64);
        dup = 0;
        for (size_t k = 1; k < 3 * 4096; k++) dup += all[k] == all[k - 1];
        CHECK(dup == 0);
        free(keys), free(all);
    }
    if (fails) return 1;
    printf("noise keys: ok\n");
    return 0;
}
