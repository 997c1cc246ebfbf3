// Rotary position embedding, Hugging Face rotate_half convention: dimension i pairs with
// i + hd/2 (not adjacent pairs).
#include <string.h>

#include "layers/cpu/cpu_kernels.h"

void cpu_rope(moe_backend *be, real *out, const real *inp, const real *cos, const real *sin,
              moe_rope_args ra) {
    CPU_KERNEL(be);
    const int T = ra.T, S = ra.S, pos0 = ra.pos0, n_rot = ra.n_rot, hd = ra.hd, half = hd / 2;
    const size_t row = (size_t)ra.n_heads * hd;
    const real sign = ra.inverse ? -1 : 1;
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * row))
    for (int t = 0; t < T; t++) {
        const size_t pos = (size_t)pos0 + t % S;
        const real *c = cos + pos * half, *s = sin + pos * half;
        const real *x = inp + t * row;
        real *o = out + t * row;
        for (int h = 0; h < n_rot; h++) {
            const real *xa = x + (size_t)h * hd, *xb = xa + half;
            real *oa = o + (size_t)h * hd, *ob = oa + half;
            for (int i = 0; i < half; i++) {
                real a = xa[i], b = xb[i], si = sign * s[i];
                oa[i] = a * c[i] - b * si;
                ob[i] = b * c[i] + a * si;
            }
        }
        if (out != inp)
            memcpy(o + (size_t)n_rot * hd, x + (size_t)n_rot * hd,
                   (row - (size_t)n_rot * hd) * sizeof(real));
    }
}
