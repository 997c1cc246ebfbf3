// bf16 <-> fp32 on one value (host code, the CPU and the CUDA kernels): the one definition of the
// rounding that the conversion kernels, the checkpoint export and the tests share.
//
// bf16 is the upper half of an fp32. Rounding to nearest, ties to even, on the bits: add
// 0x7FFF plus the lowest kept bit, then truncate; a carry out of the mantissa raises the
// exponent (so the largest finite values round to Inf, as they should). NaN is excluded first
// (the add could carry a NaN into Inf) and kept quiet (bit 6 of the result set), with its sign.
// Written as a select, not an early return, so that loops over it vectorize (GCC 12 does not
// if-convert the return: cpu_adamw_update's bf16 pass ran 4x slower than its fp32 one).
#ifndef MOE_BF16_H
#define MOE_BF16_H

#include <stdint.h>
#include <string.h>

#include "layers/hd.h" // the CUDA conversion kernels run these same bodies

MOE_HD static inline uint16_t moe_f32_to_bf16(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    const uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16,
                   quiet_nan = (b >> 16) | 0x0040u;
    return (uint16_t)((b & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

MOE_HD static inline float moe_bf16_to_f32(uint16_t h) {
    const uint32_t b = (uint32_t)h << 16;
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

#endif
