#!/usr/bin/env bash
# Packs a CUDA build made on this machine for a GPU machine that has the CUDA runtime, cuBLAS
# and NCCL but not the build's other dependencies (libconfig, cJSON, OpenBLAS, Open MPI): a
# cluster node, or a lent device with no package registry. One file, unpacked and used by
# scripts/gpu_check.sh --prebuilt FILE:
#   BUILD/...           the build tree (executables, CTest files; no objects or archives)
#   gpu_pack/lib/       every shared library the executables load that is neither glibc's nor
#                       CUDA's (the GPU machine's own CUDA libraries are used)
#   gpu_pack/ompi/      Open MPI's runtime (mpirun, orted, its components and help files),
#                       relocated with OPAL_PREFIX, for the NCCL exchange's MPI launch
#   gpu_pack/paths      the absolute source and build paths the CTest files name
#
#   scripts/gpu_pack.sh [OUT.tar.xz]   (default .gpu_pack/moe-gpu.tar.xz; BUILD=build-gpu)
# The build is configured here with MOE_CUDA=ON and MOE_NATIVE=OFF (the GPU machine's CPU
# may lack this one's instruction set extensions) and built first.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${BUILD:-build-gpu}
out=${1:-.gpu_pack/moe-gpu.tar.xz}
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=ON -DMOE_NATIVE=OFF > /dev/null
cmake --build "$build" -j"$(nproc)" > /dev/null

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/gpu_pack/lib" "$stage/gpu_pack/ompi"

# the build tree without what only the build needs
(cd "$root" && find "$build" -type f ! -name '*.o' ! -name '*.a' ! -name '*.ii' \
    ! -path '*/CMakeFiles/*' -print0 | tar --null -cf - -T -) | tar -xf - -C "$stage"

# a library the GPU machine has anyway, in a version at least as new: glibc's, the dynamic
# loader, GCC's C++ runtime, zlib, udev's, and CUDA's own
system_lib() {
    case "$(basename "$1")" in
    libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux*) return 0 ;;
    libstdc++.so* | libgcc_s.so* | libatomic.so* | libz.so* | libudev.so* | libuuid.so*) return 0 ;;
    libcuda.so* | libcudart.so* | libcublas*.so* | libnccl.so* | libcudnn*.so*) return 0 ;;
    esac
    return 1
}
copy_deps() { # FILE...: the libraries they load, into gpu_pack/lib
    ldd "$@" 2>/dev/null | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
        system_lib "$lib" || cp -Lf "$lib" "$stage/gpu_pack/lib/"
    done
}
mapfile -t exes < <(find "$stage/$build" -type f -perm -u+x ! -name '*.sh' ! -name '*.py')
copy_deps "${exes[@]}"

# Open MPI under a prefix of its own (Debian's layout below /usr)
if command -v orted > /dev/null; then
    omp=/usr/lib/x86_64-linux-gnu/openmpi
    mkdir -p "$stage/gpu_pack/ompi/usr/bin" "$stage/gpu_pack/ompi$omp/lib" "$stage/gpu_pack/ompi/usr/share"
    cp -L "$(command -v orted)" "$(readlink -f "$(command -v mpirun)")" "$stage/gpu_pack/ompi/usr/bin/"
    ln -sf "$(basename "$(readlink -f "$(command -v mpirun)")")" "$stage/gpu_pack/ompi/usr/bin/mpirun"
    cp -rL "$omp/lib/openmpi3" "$stage/gpu_pack/ompi$omp/lib/"
    cp -rL /usr/share/openmpi "$stage/gpu_pack/ompi/usr/share/"
    [ -d /usr/lib/x86_64-linux-gnu/pmix2 ] && cp -rL /usr/lib/x86_64-linux-gnu/pmix2 "$stage/gpu_pack/ompi/usr/lib/x86_64-linux-gnu/"
    mapfile -t comps < <(find "$stage/gpu_pack/ompi" -name '*.so' -o -type f -path '*/bin/*')
    copy_deps "${comps[@]}"
fi
# Each executable and library finds the packed libraries through its RUNPATH ($ORIGIN-relative:
# no LD_LIBRARY_PATH, which would also reach the GPU machine's Python and PyTorch)
runpath() { # FILE: $ORIGIN/<the way up to the stage's root>gpu_pack/lib
    local rel=${1#"$stage"/} up=""
    while [[ $rel == */* ]]; do up="$up../"; rel=${rel#*/}; done
    patchelf --set-rpath "\$ORIGIN/${up}gpu_pack/lib" "$1"
}
command -v patchelf > /dev/null || { echo "gpu_pack: needs patchelf (apt-get install patchelf)"; exit 1; }
while IFS= read -r -d '' f; do
    head -c4 "$f" | grep -q ELF && runpath "$f"
done < <(find "$stage" -type f \( -perm -u+x -o -name '*.so*' \) -print0)
printf 'source %s\nbuild %s\n' "$root" "$root/$build" > "$stage/gpu_pack/paths"

tar -C "$stage" -cJf "$out" .
echo "gpu_pack: $out ($(du -h "$out" | cut -f1); $(ls "$stage/gpu_pack/lib" | wc -l) libraries)"
