"""A torch producer/consumer pair sharing a CUDA tensor, both keeping kernels and copies running
(tests/gpu/test_stress.py).

The producer (this process) holds a shared tensor S and a private P; the consumer gets S through
torch.multiprocessing (CUDA IPC) and holds a private Q. In each process a background thread loops
on its own stream: a kernel (2 * src into a scratch tensor), a device copy, a copy to pinned host
memory, then a synchronize, counting its iterations. Nothing it writes is checked data, so checks
need not stop it. Commands on stdin, one JSON line answered on stdout for each:
  pids   -> {"producer": pid, "consumer": pid}
  check  -> {"producer": {...}, "consumer": {...}}: sums of S and of the private tensor, whether the
            scratch results are right, and the background iteration count
  exit
"""
import json
import os
import sys
import threading

for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[k] = v

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def pattern(n, mod):
    return (torch.arange(n, device="cuda", dtype=torch.int64) % mod).float()  # exact in float32


class Background:
    def __init__(self, src):
        self.src, self.iters, self.stop = src, 0, False
        self.scratch = torch.empty_like(src)
        self.copy = torch.empty_like(src)
        self.host = torch.empty(1 << 16, dtype=src.dtype, pin_memory=True)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            while not self.stop:
                torch.mul(self.src, 2.0, out=self.scratch)
                self.copy.copy_(self.scratch)
                self.host.copy_(self.copy[: self.host.numel()], non_blocking=True)
                stream.synchronize()
                self.iters += 1

    def figures(self, shared, private):
        torch.cuda.synchronize()
        return {"shared": float(shared.double().sum().item()), "private": float(private.double().sum().item()),
                "scratch_ok": bool(torch.equal(self.copy, self.src * 2.0)), "iters": self.iters}


def consumer(inbox, outbox, n):
    shared = inbox.get()
    private = pattern(n, 1000)
    work = Background(private)
    outbox.put(os.getpid())
    while True:
        cmd = inbox.get()
        if cmd == "exit":
            work.stop = True
            return
        outbox.put(work.figures(shared, private))


def main():
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    n = mib * (1 << 20) // 4
    shared, private = pattern(n, 4096), pattern(n, 777)
    torch.cuda.synchronize()
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=consumer, args=(inbox, outbox, n), daemon=True)
    child.start()
    inbox.put(shared)
    consumer_pid = outbox.get(timeout=120)
    work = Background(private)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "pids":
            reply = {"producer": os.getpid(), "consumer": consumer_pid}
        elif cmd[0] == "check":
            inbox.put("check")
            reply = {"producer": work.figures(shared, private), "consumer": outbox.get(timeout=120)}
        elif cmd[0] == "exit":
            work.stop = True
            inbox.put("exit")
            child.join(30)
            return
        else:
            reply = {"error": f"unknown command {cmd[0]}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
