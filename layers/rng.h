// splitmix64 (Steele, Lea, Flood 2014), the one random-number primitive of the code base:
// moe_mix64 is its output function, a bijective 64-bit mix with good avalanche (a
// counter-based generator: the value for counter i is moe_mix64(key ^ i * golden)); the
// stream is moe_splitmix64(&state). Used for weight init, router jitter noise, the data
// loader's permutations and sampling, so every backend and every rank draws the same numbers.
#ifndef MOE_RNG_H
#define MOE_RNG_H

#include <stdint.h>

#include "layers/hd.h"

#define MOE_GOLDEN_GAMMA 0x9E3779B97F4A7C15ull // 2^64 / golden ratio, odd

MOE_HD static inline uint64_t moe_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The next number of the stream whose state is *s.
static inline uint64_t moe_splitmix64(uint64_t *s) { return moe_mix64(*s += MOE_GOLDEN_GAMMA); }

// Uniform in [0, 1) with 53 random bits.
MOE_HD static inline double moe_uniform01(uint64_t x) { return (double)(x >> 11) * 0x1.0p-53; }

#endif
