"""Drive the CUDA checkpoint API on other processes, from threads of this one process.

    checkpointer.py [--lock-timeout-ms MS] [--call-timeout-s S] [--barrier DIR NAME] STEP...
    STEP is OP:PID[,PID...] with OP one of lock, checkpoint, restore, unlock, state, tid

Steps run one after the other; inside a step the call is made on every listed pid at once, one
thread per pid (the driver allows this; two PROCESSES calling at once hang the real driver, so a
test never runs two checkpointers at once on a GPU). Every call prints

    PROBE ckpt_call step=I op=OP pid=P result=CUDA_... secs=S [state=CU_PROCESS_STATE_...] [tid=T]

and every step `PROBE ckpt_step step=I op=OP pids=P,Q secs=S`. A failing call does not stop the
steps after it (probes want to see what a stuck process answers next). A call still running after
--call-timeout-s prints result=TIMEOUT and the program exits 3 at once (a driver call cannot be
cancelled; the test then kills this process).

--barrier DIR NAME: announce `NAME.ready` in DIR and wait for `NAME.go` before the first step, so
a test can start two checkpointers at the same moment (fake driver only).
"""
import argparse
import os
import threading
import time

from cuda.bindings import driver as cu

import probelib as pl

EXIT_TIMEOUT = 3


def call(op, pid, lock_timeout_ms):
    """One driver call; returns (result name, extra figures)."""
    if op == "lock":
        args = cu.CUcheckpointLockArgs()
        args.timeoutMs = lock_timeout_ms
        return pl.result_name(cu.cuCheckpointProcessLock(pid, args)), {}
    if op == "checkpoint":
        return pl.result_name(cu.cuCheckpointProcessCheckpoint(pid, None)), {}
    if op == "restore":
        return pl.result_name(cu.cuCheckpointProcessRestore(pid, None)), {}
    if op == "unlock":
        return pl.result_name(cu.cuCheckpointProcessUnlock(pid, None)), {}
    if op == "state":
        err, state = cu.cuCheckpointProcessGetState(pid)
        extra = {"state": state.name} if err == cu.CUresult.CUDA_SUCCESS else {}
        return err.name, extra
    if op == "tid":
        err, tid = cu.cuCheckpointProcessGetRestoreThreadId(pid)
        return err.name, ({"tid": tid} if err == cu.CUresult.CUDA_SUCCESS else {})
    raise ValueError(op)


def run_step(index, op, pids, args):
    start = time.monotonic()
    done = {}

    def worker(pid):
        t0 = time.monotonic()
        name, extra = call(op, pid, args.lock_timeout_ms)
        done[pid] = True
        pl.probe_line("ckpt_call", step=index, op=op, pid=pid, result=name,
                      secs=f"{time.monotonic() - t0:.3f}", **extra)

    threads = [threading.Thread(target=worker, args=(pid,), daemon=True) for pid in pids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, args.call_timeout_s - (time.monotonic() - start)))
    for pid in pids:
        if pid not in done:
            pl.probe_line("ckpt_call", step=index, op=op, pid=pid, result="TIMEOUT",
                          secs=f"{time.monotonic() - start:.3f}")
    if len(done) < len(pids):
        os._exit(EXIT_TIMEOUT)  # threads stuck in the driver cannot be joined
    pl.probe_line("ckpt_step", step=index, op=op, pids=",".join(map(str, pids)),
                  secs=f"{time.monotonic() - start:.3f}")


def parse_step(text):
    op, _, pids = text.partition(":")
    if op not in ("lock", "checkpoint", "restore", "unlock", "state", "tid") or not pids:
        raise argparse.ArgumentTypeError(f"bad step {text!r}: want OP:PID[,PID...]")
    try:
        return op, [int(p) for p in pids.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad pid in step {text!r}") from None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lock-timeout-ms", type=int, default=10000)
    parser.add_argument("--call-timeout-s", type=float, default=120.0)
    parser.add_argument("--barrier", nargs=2, metavar=("DIR", "NAME"))
    parser.add_argument("steps", nargs="+", type=parse_step)
    args = parser.parse_args()
    pl.check(cu.cuInit(0), "cuInit")
    if args.barrier:
        rv = pl.Rendezvous(args.barrier[0], args.barrier[1])
        rv.announce(f"{rv.role}.ready", {"pid": os.getpid()})
        rv.wait(f"{rv.role}.go")
    for index, (op, pids) in enumerate(args.steps):
        run_step(index, op, pids, args)


if __name__ == "__main__":
    try:
        main()
    except pl.ProbeFailure as e:
        raise SystemExit(f"checkpointer: {e}")
