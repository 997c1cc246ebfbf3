#!/usr/bin/env bash
# The device check of the CUDA backend, one command from a fresh copy of the tree (< 6 min on
# an H200): configure with CUDA for sm_90, build, run the GPU-labelled tests (and the host
# harness of the kernels' bodies), run the GPU benchmark, print a short table last.
#   scripts/gpu_check.sh [OUTDIR]        (default: $OUT when set, else ./gpu_check_out)
# Environment: BUILD (build folder, default build-gpu), JOBS (build parallelism, default the
# cores), MOE_TORCH_PYTHON (the PyTorch of the benchmark, default python3), GPU_CHECK_BENCH=0
# (skip the benchmark), GPU_CHECK_SMALL=1 (the benchmark's small shape only).
# cuDNN and NCCL: the system's, else those of PyTorch's pip packages (nvidia-cudnn-cu*,
# nvidia-nccl-cu*), found through that python and put on CMAKE_PREFIX_PATH / LD_LIBRARY_PATH.
# The backend itself needs only the CUDA runtime and cuBLAS; the paths are printed either way.
set -u
cd "$(dirname "$0")/.."
out=${1:-${OUT:-$PWD/gpu_check_out}}
mkdir -p "$out"
build=${BUILD:-build-gpu}
jobs=${JOBS:-$(nproc)}
py=${MOE_TORCH_PYTHON:-python3}
log() { echo "gpu_check: $*" | tee -a "$out/gpu_check.log"; }
t0=$(date +%s)

# ---- toolchain: nvcc, then cuDNN and NCCL ------------------------------------------------
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
site=$("$py" -c 'import os, nvidia; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null || true)
if [ -z "$nvcc" ] && [ -n "$site" ] && [ -x "$site/nvidia/cuda_nvcc/bin/nvcc" ]; then
    nvcc=$site/nvidia/cuda_nvcc/bin/nvcc # pip's nvidia-cuda-nvcc
fi
log "nvcc: ${nvcc:-none}; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
for lib in cudnn nccl; do
    sys=$(ldconfig -p 2>/dev/null | grep -m1 "lib$lib.so" | awk '{print $NF}')
    if [ -n "$sys" ]; then
        log "$lib: system $sys"
    elif [ -n "$site" ] && [ -d "$site/nvidia/$lib/lib" ]; then
        export LD_LIBRARY_PATH="$site/nvidia/$lib/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export CMAKE_PREFIX_PATH="$site/nvidia/$lib${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
        log "$lib: pip $site/nvidia/$lib"
    else
        log "$lib: not found (not needed by the backend)"
    fi
done

# ---- configure and build -----------------------------------------------------------------
if [ -n "$nvcc" ]; then
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=ON \
        -DCMAKE_CUDA_COMPILER="$nvcc" > "$out/configure.log" 2>&1 || { log "configure failed"; tail -20 "$out/configure.log"; exit 1; }
    tb=$(date +%s)
    # only what the GPU tests and the benchmark run (the whole tree is the CI's job)
    targets=(moe test_cuda_bodies test_cuda_twin test_moe_fixtures test_moe_properties
             test_model_fixtures test_model_infer test_checkpoint bench_moe_layer_gpu)
    cmake --build "$build" -j"$jobs" --target "${targets[@]}" > "$out/build.log" 2>&1 ||
        { log "build failed"; grep -E "error|warning" "$out/build.log" | head -20; exit 1; }
    log "built in $(( $(date +%s) - tb )) s ($build, -j$jobs)"
elif [ -x "$build/tests/cuda/test_cuda_twin" ]; then
    log "no nvcc: using the existing build in $build"
else
    log "no nvcc and no CUDA build in $build"; exit 1
fi

# ---- tests -------------------------------------------------------------------------------
(cd "$build" && ctest -L GPU -R . --output-on-failure --timeout 300 -j2) > "$out/ctest_gpu.log" 2>&1
(cd "$build" && ctest -R '^cuda_bodies$' --output-on-failure) >> "$out/ctest_gpu.log" 2>&1
passed=$(grep -cE "Test +#[0-9]+: .* Passed" "$out/ctest_gpu.log")
failed=$(grep -cE "\*\*\*Failed|\*\*\*Timeout|\*\*\*Exception|Not Run" "$out/ctest_gpu.log")
skipped=$(grep -cE "\*\*\*Skipped" "$out/ctest_gpu.log")
"$build/tests/cuda/test_cuda_twin" > "$out/cuda_twin.log" 2>&1 # the per-kernel numbers, kept
# NCCL with 2 ranks where there are 2 GPUs (one GPU: exchange_nccl_1 above is all NCCL allows)
nccl2=skipped
if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ] && [ -x "$build/tests/test_exchange" ]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none \
        -np 2 -x MOE_TEST_DEVICE=cuda -x MOE_TEST_TRANSPORT=device "$build/tests/test_exchange" \
        > "$out/exchange_nccl_2.log" 2>&1 && nccl2=passed || nccl2=failed
fi
log "NCCL exchange on 2 ranks / 2 GPUs: $nccl2"
[ "$nccl2" = failed ] && failed=$((failed + 1))

# ---- benchmark ---------------------------------------------------------------------------
bench_rc=skipped
if [ "${GPU_CHECK_BENCH:-1}" != 0 ]; then
    small=()
    [ "${GPU_CHECK_SMALL:-0}" = 1 ] && small=(--small)
    python3 scripts/bench_gpu --build "$build" --python "$py" --out "$out/bench_gpu.json" \
        "${small[@]}" > "$out/bench_gpu.txt" 2>&1
    bench_rc=$?
fi

# ---- the table ---------------------------------------------------------------------------
echo
echo "==== gpu_check ($(( $(date +%s) - t0 )) s) ===="
grep -E "Test +#[0-9]+:" "$out/ctest_gpu.log" | sed -E 's/^ *[0-9]+\/[0-9]+ +//' | cut -c1-90
echo "tests: $passed passed, $failed failed, $skipped skipped"
grep -h "FAIL" "$out/cuda_twin.log" | head -20
if [ -f "$out/bench_gpu.txt" ]; then
    echo "benchmark (exit $bench_rc):"
    cat "$out/bench_gpu.txt"
fi
[ "$failed" = 0 ] && [ "$passed" -gt 0 ]
