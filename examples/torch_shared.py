"""Several processes sharing GPU memory through PyTorch: a parent and N workers (torch.multiprocessing,
CUDA tensors passed through CUDA IPC) that count up, each in its own slice of one shared tensor.

Every step each worker adds 1 to its slice and checks it against its own step count, and the
parent checks every slice; each writes "ok <step>" (or "MISMATCH ...") to the log. So a checkpoint
that loses or corrupts GPU memory, or breaks the sharing, shows as MISMATCH once the processes
continue. Run it under the shim, detached (CRIU dumps it as it is):

    setsid criu-gpushare run -- python3 examples/torch_shared.py --log /tmp/ts.log < /dev/null &> /dev/null &
"""
import argparse
import os
import sys
import time

import torch
import torch.multiprocessing as mp

SLICE = 1 << 20  # floats per worker (4 MiB)


def log(path, text):
    with open(path, "a") as f:
        f.write(f"{time.time():.3f} pid {os.getpid()} {text}\n")


def worker(index, shared, logfile, period):
    part = shared[index * SLICE:(index + 1) * SLICE]
    step = int(part[0].item())
    while True:
        part += 1
        torch.cuda.synchronize()
        step += 1
        got = part.sum().item()
        log(logfile, f"worker {index} " + (f"ok {step}" if got == step * SLICE else
                                             f"MISMATCH step {step} sum {got} want {step * SLICE}"))
        time.sleep(period)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--log", required=True)
    ap.add_argument("--period", type=float, default=0.2)
    args = ap.parse_args()
    mp.set_start_method("spawn")
    shared = torch.zeros(args.workers * SLICE, device="cuda")
    procs = [mp.Process(target=worker, args=(i, shared, args.log, args.period)) for i in range(args.workers)]
    for p in procs:
        p.start()
    log(args.log, f"READY workers {' '.join(str(p.pid) for p in procs)}")
    while True:  # the parent reads every worker's slice: the sharing must stay live
        time.sleep(args.period * 5)
        sums = [shared[i * SLICE:(i + 1) * SLICE].sum().item() / SLICE for i in range(args.workers)]
        whole = all(s == int(s) for s in sums)
        log(args.log, f"parent {'ok' if whole else 'MISMATCH'} steps {' '.join(str(int(s)) for s in sums)}")
        if any(not p.is_alive() for p in procs):
            log(args.log, "MISMATCH a worker died")
            sys.exit(1)


if __name__ == "__main__":
    main()
