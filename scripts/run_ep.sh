#!/usr/bin/env bash
# Expert-parallel training on this machine: R ranks of `moe train` under Open MPI's mpirun.
#   scripts/run_ep.sh R CONFIG [moe train args...]    e.g. scripts/run_ep.sh 2 configs/shakespeare.cfg
# What a single machine (a container run as root, fewer cores than ranks) needs: root allowed,
# more ranks than cores, ranks not pinned to one core, and the threads split among the ranks
# (train.threads = 0 divides the usable cores by the ranks on the node). On a cluster, call
# mpirun yourself with your hostfile or scheduler (srun/mpirun -np R --hostfile H build/moe
# train CONFIG); parallel.ep_size (default: all ranks) sets how many ranks share the experts.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,8p' "$0" >&2; exit 2; }
R=$1
shift
here=$(cd "$(dirname "$0")/.." && pwd)
moe=${MOE_BIN:-$here/build/moe}
[ -x "$moe" ] || { echo "run_ep.sh: $moe not found: build first (scripts/test.sh)" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "run_ep.sh: mpirun not found (Debian: openmpi-bin)" >&2; exit 1; }
args=(--oversubscribe --bind-to none -x OMP_WAIT_POLICY=PASSIVE)
[ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
exec mpirun "${args[@]}" -np "$R" "$moe" train "$@"
