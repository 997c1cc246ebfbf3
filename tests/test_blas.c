// The BLAS start-up check (layers/cpu/blas.c): the level each kernel family needs, the verdict
// and the family it proposes for CPUs this machine is not (a table of known answers: OpenBLAS's
// and BLIS's own kernel lists and the ISA each needs), and the loaded BLAS on this CPU.
#include <stdio.h>
#include <string.h>

#include "layers/blas.h"

static int failures;

static void expect(int ok, const char *what) {
    if (!ok) {
        printf("FAIL: %s\n", what);
        failures++;
    }
}

typedef struct {
    const char *kernel;
    moe_isa cpu;
    int amd, bf16;
    moe_blas_verdict want;
    const char *fix_openblas, *fix_blis; // the family proposed by each build ("" when none)
} judge_case;

int main(int argc, char **argv) {
    (void)argc;
    // as moe's main does: where the BLAS loaded generic kernels, this re-executes the test
    // with OPENBLAS_CORETYPE set (the last check below then sees what moe would run)
    const int warned = moe_blas_check(argv);
    expect(moe_blas_kernel_isa("Prescott") == MOE_ISA_SSE, "Prescott is SSE");
    expect(moe_blas_kernel_isa("haswell") == MOE_ISA_AVX2, "names are case-insensitive");
    expect(moe_blas_kernel_isa("Zen") == MOE_ISA_AVX2, "Zen is AVX2");
    expect(moe_blas_kernel_isa("SkylakeX") == MOE_ISA_AVX512, "SkylakeX is AVX-512");
    expect(moe_blas_kernel_isa("skx") == MOE_ISA_AVX512, "BLIS skx is AVX-512");
    expect(moe_blas_kernel_isa("generic") == MOE_ISA_SSE, "BLIS generic is SSE");
    expect(moe_blas_kernel_isa("Sandybridge") == MOE_ISA_AVX, "Sandybridge is AVX");
    expect(moe_blas_kernel_isa("NoSuchCore") == MOE_ISA_UNKNOWN, "unknown names");
    expect(moe_blas_kernel_isa(NULL) == MOE_ISA_UNKNOWN, "NULL");

    const judge_case cases[] = {
        // the case: Debian's OpenBLAS on a Xeon it does not know
        {"Prescott", MOE_ISA_AVX512, 0, 0, MOE_BLAS_GENERIC, "SkylakeX", "skx"},
        {"Prescott", MOE_ISA_AVX512, 0, 1, MOE_BLAS_GENERIC, "Cooperlake", "skx"},
        {"Prescott", MOE_ISA_AVX2, 0, 0, MOE_BLAS_GENERIC, "Haswell", "haswell"},
        {"Prescott", MOE_ISA_AVX2, 1, 0, MOE_BLAS_GENERIC, "Zen", "zen3"},
        {"generic", MOE_ISA_AVX2, 1, 0, MOE_BLAS_GENERIC, "Zen", "zen3"},
        {"Sandybridge", MOE_ISA_AVX2, 0, 0, MOE_BLAS_GENERIC, "Haswell", "haswell"},
        {"Haswell", MOE_ISA_AVX512, 0, 0, MOE_BLAS_GENERIC, "SkylakeX", "skx"},
        // fitting kernels
        {"Haswell", MOE_ISA_AVX2, 0, 0, MOE_BLAS_FITS, "", ""},
        {"Zen", MOE_ISA_AVX2, 1, 0, MOE_BLAS_FITS, "", ""},
        {"SkylakeX", MOE_ISA_AVX512, 0, 0, MOE_BLAS_FITS, "", ""},
        {"zen3", MOE_ISA_AVX2, 1, 0, MOE_BLAS_FITS, "", ""},
        // AMD with AVX-512 (Zen 4, Zen 5): the AVX-512 kernels (2x the Zen ones on a Zen 5)
        {"Zen", MOE_ISA_AVX512, 1, 1, MOE_BLAS_GENERIC, "Cooperlake", "zen4"},
        {"Haswell", MOE_ISA_AVX512, 1, 0, MOE_BLAS_GENERIC, "SkylakeX", "zen4"},
        {"Prescott", MOE_ISA_AVX512, 1, 1, MOE_BLAS_GENERIC, "Cooperlake", "zen4"},
        {"zen3", MOE_ISA_AVX512, 1, 1, MOE_BLAS_GENERIC, "Cooperlake", "zen4"},
        {"Cooperlake", MOE_ISA_AVX512, 1, 1, MOE_BLAS_FITS, "", ""},
        {"zen4", MOE_ISA_AVX512, 1, 1, MOE_BLAS_FITS, "", ""},
        // a CPU without AVX: the generic kernels are right; unknown names are not judged
        {"Prescott", MOE_ISA_SSE, 0, 0, MOE_BLAS_FITS, "", ""},
        {"NoSuchCore", MOE_ISA_AVX512, 0, 0, MOE_BLAS_FITS, "", ""},
    };
#if defined(MOE_BLAS_BLIS)
    const int blis = 1;
#else
    const int blis = 0;
#endif
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const judge_case *c = &cases[i];
        char fix[32] = "x", what[160];
        const moe_blas_verdict v =
            moe_blas_judge(c->kernel, c->cpu, c->amd, c->bf16, fix, sizeof fix);
        const char *want_fix = blis ? c->fix_blis : c->fix_openblas;
#if defined(MOE_BLAS_MKL)
        if (c->want == MOE_BLAS_GENERIC) want_fix = fix; // MKL: the family is not settable
#endif
        snprintf(what, sizeof what,
                 "case %zu: %s on ISA %d amd %d: verdict %d (want %d), fix '%s' (want '%s')", i,
                 c->kernel, c->cpu, c->amd, v, c->want, fix, want_fix);
        expect(v == c->want && !strcmp(fix, want_fix), what);
    }

    // this machine: after the start-up check the loaded BLAS runs kernels that fit this CPU
    // (OPENBLAS_CORETYPE unset by ctest), without a warning
    expect(!warned, "the start-up check gave no warning");
    if (*moe_blas_note()) printf("start-up check: %s\n", moe_blas_note());
    int amd, bf16;
    const moe_isa cpu = moe_cpu_isa(&amd, &bf16);
    char fix[32];
    printf("this CPU: ISA %d, amd %d, avx512_bf16 %d; %s, kernels %s\n", cpu, amd, bf16,
           moe_blas_name(), moe_blas_kernel());
    expect(moe_blas_judge(moe_blas_kernel(), cpu, amd, bf16, fix, sizeof fix) == MOE_BLAS_FITS,
           "the loaded BLAS fits this CPU");
    printf(failures ? "%d checks failed\n" : "all checks passed\n", failures);
    return failures != 0;
}
