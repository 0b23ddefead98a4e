"""Two torch processes, each with private GPU memory, sharing one tensor through CUDA IPC (bench b).

    python3 pair.py --gib 20 --shared-gib 1 [--ctl DIR]

The producer (this process) holds --gib GiB of random data and a --shared-gib GiB tensor, and
hands the shared tensor to a consumer it spawns (torch.multiprocessing: CUDA IPC, the importer
maps the producer's memory); the consumer holds --gib GiB of its own. Commands (wlcommon.py):
`check` -> {"sha": digest over the producer's data, the consumer's data and the shared tensor as
each of them reads it, "parts": the four digests}.
"""
import argparse
import hashlib
import os
import sys

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


def consumer(inbox, outbox, private_bytes):
    import torch

    shared = inbox.get()  # opened through CUDA IPC
    mine = random_tensors(torch, private_bytes)
    outbox.put(os.getpid())
    while True:
        cmd = inbox.get()
        if cmd == "exit":
            return
        torch.cuda.synchronize()
        outbox.put([wlcommon.torch_digest(mine), wlcommon.torch_digest([shared])])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0, help="private GiB in each process")
    ap.add_argument("--shared-gib", type=float, default=0.25)
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
    child = ctx.Process(target=consumer, args=(inbox, outbox, private), daemon=True)
    child.start()
    inbox.put(shared)
    consumer_pid = outbox.get(timeout=600)

    def check(_args):
        torch.cuda.synchronize()
        inbox.put("check")
        theirs = outbox.get(timeout=600)
        parts = [wlcommon.torch_digest(mine), theirs[0], wlcommon.torch_digest([shared]), theirs[1]]
        return {"sha": hashlib.sha256("".join(parts).encode()).hexdigest(), "parts": parts,
                "shared_agree": parts[2] == parts[3]}

    try:
        wlcommon.serve(wlcommon.channel_from_args(args.ctl),
                       {"pids": [os.getpid(), consumer_pid], "bytes": 2 * private + shared_bytes,
                        "shared_bytes": shared_bytes},
                       {"check": check})
    finally:
        inbox.put("exit")
        child.join(30)


if __name__ == "__main__":
    main()
