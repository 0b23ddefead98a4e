#!/usr/bin/env bash
# Dump a group of PyTorch processes that share GPU memory to a directory, kill them, restore them,
# and show them continuing with the same results (examples/torch_shared.py).
#   examples/torch_dump_restore.sh [WORKDIR]
# Needs an NVIDIA GPU, torch, CRIU >= 4 with pycriu, root. Exits non-zero if a step fails or the
# restored processes report a MISMATCH.
set -euo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
here=$(cd "$(dirname "$0")" && pwd)
work=${1:-$(mktemp -d)}
mkdir -p "$work"
cg=${CRIU_GPUSHARE:-criu-gpushare}
log=$work/torch_shared.log
: > "$log"
export CRIU_GPUSHARE_STORE=${CRIU_GPUSHARE_STORE:-$work/store}

setsid $cg run -- python3 "$here/torch_shared.py" --log "$log" </dev/null >"$work/out.log" 2>&1 &
for _ in $(seq 600); do grep -q READY "$log" && break; sleep 0.1; done
grep -q READY "$log" || { echo "the workload did not start:"; cat "$work/out.log"; exit 1; }
# `run` execs python: the parent of the group is the pid that wrote READY
root=$(grep READY "$log" | awk '{print $3}')
# spawned workers import torch and initialise CUDA for seconds: dump once every one is counting
for _ in $(seq 600); do
  grep -q "worker 0 ok" "$log" && grep -q "worker 1 ok" "$log" && break; sleep 0.1
done
grep -q "worker 1 ok" "$log" || { echo "the workers did not start counting:"; cat "$log"; exit 1; }
sleep 1
echo "before the dump: $(grep -c ' ok' "$log") ok lines, last: $(tail -n 1 "$log")"
$cg dump "$root" "$work/images"
sleep 1
if kill -0 "$root" 2>/dev/null; then echo "the tree still runs after the dump"; exit 1; fi
echo "dumped and killed; image: $(du -sh "$work/images" | cut -f1), store: $(du -sh "$CRIU_GPUSHARE_STORE" | cut -f1)"
lines=$(wc -l < "$log")
restored=$($cg restore "$work/images" | tail -n 1)
echo "restored, root pid $restored"
sleep 3
tail -n +"$((lines + 1))" "$log" > "$work/after.log"
echo "after the restore: $(grep -c ' ok' "$work/after.log") ok lines, last: $(tail -n 1 "$work/after.log")"
status=0
grep -q MISMATCH "$log" && { echo "MISMATCH after the restore:"; grep MISMATCH "$log" | head; status=1; }
grep -q ' ok' "$work/after.log" || { echo "the restored processes do not run"; status=1; }
kill -9 -- "-$restored" 2>/dev/null || kill -9 "$restored" 2>/dev/null || true
pkill -9 -f "$here/torch_shared.py" 2>/dev/null || true
[ $status = 0 ] && echo "torch_dump_restore: ok"
exit $status
