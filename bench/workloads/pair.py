"""Two torch processes, each with private GPU memory, sharing one tensor through CUDA IPC (bench b;
tests/gpu/test_suspend_torch.py and test_stress.py).

    python3 pair.py --gib 20 --shared-gib 1 [--busy] [--ctl DIR]

The producer (this process) holds --gib GiB of random data and a --shared-gib GiB tensor, and
hands the shared tensor to a consumer it spawns (torch.multiprocessing: CUDA IPC, the importer
maps the producer's memory); the consumer holds --gib GiB of its own. With --busy, each process
also keeps a thread looping on its own stream over its first private block: a kernel (2 * src into
a scratch tensor), a device copy, a copy to pinned host memory, a synchronize, counting its
iterations; nothing it writes is checked data, so checks need not stop it. Commands (wlcommon.py):
`check` -> {"sha": digest over the producer's data, the consumer's data and the shared tensor as
each of them reads it, "parts": the four digests, "shared_agree": whether both read the same shared
tensor, and with --busy "busy": the producer's and the consumer's {"scratch_ok", "iters"}};
`write V` -> the producer fills the shared tensor with V and waits (the sharing is live when the
consumer then reads the new contents).
"""
import argparse
import hashlib
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wlcommon  # noqa: E402


def random_tensors(torch, total, block=1 << 30):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(os.getpid())
    out = []
    while total > 0:
        size = min(block, total)
        out.append(torch.empty(size // 8, device="cuda", dtype=torch.int64).random_(generator=gen))
        total -= size
    torch.cuda.synchronize()
    return out


class Busy:
    """Kernels and copies kept running over src on a stream of their own (--busy)."""

    def __init__(self, torch, src):
        self.torch, self.src, self.iters, self.stop = torch, src, 0, False
        self.scratch = torch.empty_like(src)
        self.copy = torch.empty_like(src)
        self.host = torch.empty(min(1 << 16, src.numel()), dtype=src.dtype, pin_memory=True)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        torch = self.torch
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            while not self.stop:
                torch.mul(self.src, 2, out=self.scratch)
                self.copy.copy_(self.scratch)
                self.host.copy_(self.copy[:self.host.numel()], non_blocking=True)
                stream.synchronize()
                self.iters += 1

    def figures(self):
        self.torch.cuda.synchronize()
        return {"scratch_ok": bool(self.torch.equal(self.copy, self.src * 2)), "iters": self.iters}


def consumer(inbox, outbox, private_bytes, busy):
    import torch

    shared = inbox.get()  # opened through CUDA IPC
    mine = random_tensors(torch, private_bytes)
    work = Busy(torch, mine[0]) if busy else None
    outbox.put(os.getpid())
    while True:
        cmd = inbox.get()
        if cmd == "exit":
            return
        torch.cuda.synchronize()
        outbox.put([wlcommon.torch_digest(mine), wlcommon.torch_digest([shared]),
                    work.figures() if work else None])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0, help="private GiB in each process")
    ap.add_argument("--shared-gib", type=float, default=0.25)
    ap.add_argument("--busy", action="store_true", help="kernels and copies running in both")
    ap.add_argument("--ctl")
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as mp

    private = wlcommon.gib_to_bytes(args.gib)
    shared_bytes = wlcommon.gib_to_bytes(args.shared_gib)
    shared = random_tensors(torch, shared_bytes, block=shared_bytes)[0]
    mine = random_tensors(torch, private)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=consumer, args=(inbox, outbox, private, args.busy), daemon=True)
    child.start()
    inbox.put(shared)
    consumer_pid = outbox.get(timeout=600)
    work = Busy(torch, mine[0]) if args.busy else None

    def check(_args):
        torch.cuda.synchronize()
        inbox.put("check")
        theirs = outbox.get(timeout=600)
        parts = [wlcommon.torch_digest(mine), theirs[0], wlcommon.torch_digest([shared]), theirs[1]]
        reply = {"sha": hashlib.sha256("".join(parts).encode()).hexdigest(), "parts": parts,
                 "shared_agree": parts[2] == parts[3]}
        if work:
            reply["busy"] = [work.figures(), theirs[2]]
        return reply

    def write(cmd_args):
        shared.fill_(int(cmd_args[0]))
        torch.cuda.synchronize()
        return {"written": int(cmd_args[0])}

    try:
        wlcommon.serve(wlcommon.channel_from_args(args.ctl),
                       {"pids": [os.getpid(), consumer_pid], "bytes": 2 * private + shared_bytes,
                        "shared_bytes": shared_bytes},
                       {"check": check, "write": write})
    finally:
        if work:
            work.stop = True
        inbox.put("exit")
        child.join(30)


if __name__ == "__main__":
    main()
