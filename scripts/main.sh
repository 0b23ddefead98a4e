#!/usr/bin/env bash
# The main job, from a fresh checkout: install criu-gpushare into ./.venv, check the machine, then run
# a GPU workload under the shim, suspend and resume it twice (its GPU memory goes to a chunk store
# and comes back), and check its memory; then, where PyTorch and CRIU >= 4 with pycriu are here (as
# root), dump a group of PyTorch processes sharing GPU memory, kill it, restore it and check that it
# continues with the same results (examples/torch_dump_restore.sh).
#   scripts/main.sh
# Exits 3 on a machine without a usable NVIDIA GPU, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# Inside a virtual environment already (e.g. a GPU image's torch venv): install there; else ./.venv.
if python3 -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
  bin=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
else
  [ -x .venv/bin/python ] || python3 -m venv --system-site-packages .venv
  bin=.venv/bin
fi
"$bin/python" -m pip install -q . 2>/dev/null ||
  "$bin/python" -m pip install -q --no-build-isolation --no-deps .  # an offline GPU machine

if [ ! -e /proc/driver/nvidia/version ]; then
  echo "main.sh: this machine has no NVIDIA GPU driver (/proc/driver/nvidia is missing)." >&2
  echo "main.sh: criu-gpushare checkpoints GPU processes and needs an NVIDIA GPU with driver >= 580." >&2
  "$bin/criu-gpushare" doctor || true
  exit 3
fi
"$bin/criu-gpushare" doctor || echo "main.sh: some checks failed (above); continuing with what works" >&2

work=$(mktemp -d)
"$bin/criu-gpushare" run -- "$bin/python" examples/hold_gpu_memory.py --mib 1024 --ready-file "$work/ready" &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 600); do [ -e "$work/ready" ] && break; sleep 0.1; done
[ -e "$work/ready" ] || { echo "main.sh: the workload did not start" >&2; exit 1; }
grep libcriu_gpushare "/proc/$pid/maps" >/dev/null && echo "main.sh: workload $pid runs with the shim"
store=${CRIU_GPUSHARE_STORE:-$work/store}
for cycle in 1 2; do
  CRIU_GPUSHARE_STORE=$store "$bin/criu-gpushare" suspend "$pid"   # GPU memory to the store, freed
  CRIU_GPUSHARE_STORE=$store "$bin/criu-gpushare" resume "$pid"    # back at the same addresses
done
kill -TERM "$pid"
wait "$pid"   # the workload checks its memory and exits non-zero if a byte changed
trap 'rm -rf "$work"' EXIT

if ! "$bin/python" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  echo "main.sh: no PyTorch with CUDA here: skipping the dump/restore example"
elif ! command -v criu >/dev/null || ! "$bin/python" -c 'import pycriu' 2>/dev/null || [ "$(id -u)" != 0 ]; then
  echo "main.sh: CRIU >= 4 with pycriu, as root, is needed for the dump/restore example: skipping it"
else
  CRIU_GPUSHARE="$bin/criu-gpushare" CRIU_GPUSHARE_STORE=$store examples/torch_dump_restore.sh "$work/example"
fi
echo "main.sh: done"
