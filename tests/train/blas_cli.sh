#!/usr/bin/env bash
# Never silently generic (layers/blas.h): moe train's header names the BLAS and its kernels;
# with OpenBLAS's generic kernels forced by the user (OPENBLAS_CORETYPE=Prescott) on a CPU with
# AVX2 it warns and names the value to set; when OpenBLAS picked them itself (simulated with
# MOE_BLAS_TEST_KERNEL=Prescott) moe restarts itself with the right kernels and says so.
# The family expected for this CPU is worked out here from /proc/cpuinfo.
#   blas_cli.sh MOE_BINARY WORKDIR SOURCE_DIR
set -u
moe=$1 work=$2 src=$3
rm -rf "$work" && mkdir -p "$work" && cd "$src" || exit 1
unset OPENBLAS_CORETYPE BLIS_ARCH_TYPE MOE_BLAS_TEST_KERNEL
fail=0
check() { if eval "$2"; then echo "  ok    $1"; else echo "  FAIL  $1"; fail=1; fi; }
dry() { "$moe" train configs/default.cfg --dry-run > "$work/$1.out" 2> "$work/$1.err"; }

dry plain
check "the header names the BLAS and its kernels" "grep -q '^BLAS: .* (kernels [^)]*); .*threads: ' '$work/plain.out'"
check "no BLAS warning with the kernels the BLAS picked" "! grep -q 'moe: warning:' '$work/plain.err'"
grep -q '^BLAS: OpenBLAS' "$work/plain.out" || { echo "not OpenBLAS: the rest is skipped"; exit $((fail ? 1 : 77)); }
# a single-target OpenBLAS (built from source without DYNAMIC_ARCH) ignores OPENBLAS_CORETYPE
grep -q '^BLAS: OpenBLAS.*DYNAMIC_ARCH' "$work/plain.out" ||
  { echo "OpenBLAS without DYNAMIC_ARCH: its kernels are fixed at build time; the rest is skipped"; exit $((fail ? 1 : 77)); }
flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }
if ! has avx2 || ! has fma; then echo "no AVX2: generic kernels are right here; skipped"; exit $((fail ? 1 : 77)); fi
# AVX-512 kernels wherever the CPU has AVX-512, AMD's Zen 4/5 too; else AMD's Zen (AVX2)
if has avx512f && has avx512bw && has avx512vl && has avx512dq; then
  if has avx512_bf16; then best=Cooperlake; else best=SkylakeX; fi
elif grep -q -m1 AuthenticAMD /proc/cpuinfo; then best=Zen
else best=Haswell; fi
echo "this CPU's kernels: $best"

OPENBLAS_CORETYPE=Prescott dry user
check "user's OPENBLAS_CORETYPE=Prescott kept (kernels Prescott)" "grep -q '(kernels Prescott)' '$work/user.out'"
check "... and a warning naming OPENBLAS_CORETYPE=$best" \
  "grep -q 'moe: warning: OPENBLAS_CORETYPE=Prescott gives OpenBLAS.s Prescott kernels (SSE) on this CPU, which has AVX.*set OPENBLAS_CORETYPE=$best\$' '$work/user.err'"

MOE_BLAS_TEST_KERNEL=Prescott dry auto
check "OpenBLAS's own generic pick: moe restarts with OPENBLAS_CORETYPE=$best and says so" \
  "grep -q '(kernels $best, OPENBLAS_CORETYPE=$best set by moe: OpenBLAS had picked Prescott on this AVX.* CPU)' '$work/auto.out'"
check "... with the same arguments (the run's header follows)" "grep -q '^model: 4 layers' '$work/auto.out' && ! grep -q 'moe: warning' '$work/auto.err'"

OPENBLAS_CORETYPE=$best dry right
check "OPENBLAS_CORETYPE=$best: no warning" "grep -q '(kernels $best)' '$work/right.out' && ! grep -q 'moe: warning' '$work/right.err'"
exit $fail
