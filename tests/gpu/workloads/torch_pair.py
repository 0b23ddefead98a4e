"""A PyTorch producer and consumer sharing one CUDA tensor through torch.multiprocessing (CUDA IPC).

Started as the producer; it spawns the consumer and hands it the tensor over a queue. Commands on
stdin, one JSON line answered on stdout for each:
  pids            -> {"producer": pid, "consumer": pid}
  check           -> {"producer": sum, "consumer": sum}: both read the whole shared tensor
  write V         -> the producer fills the tensor with V (and waits); the consumer's sum follows
  exit
The tensor holds MIB MiB of float32 (argv[1], default 256), first filled with 0..n-1 modulo 4096.
"""
import json
import os
import sys

import torch
import torch.multiprocessing as mp


def consumer(inbox, outbox):
    x = inbox.get()  # the CUDA tensor, opened through CUDA IPC
    outbox.put(os.getpid())
    while True:
        cmd = inbox.get()
        if cmd == "exit":
            return
        torch.cuda.synchronize()
        outbox.put(float(x.double().sum().item()))


def main():
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    n = mib * (1 << 20) // 4
    x = (torch.arange(n, device="cuda", dtype=torch.int64) % 4096).float()  # exact in float32
    torch.cuda.synchronize()
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=consumer, args=(inbox, outbox), daemon=True)
    child.start()
    inbox.put(x)
    consumer_pid = outbox.get(timeout=120)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "pids":
            reply = {"producer": os.getpid(), "consumer": consumer_pid}
        elif cmd[0] == "check":
            torch.cuda.synchronize()
            mine = float(x.double().sum().item())
            inbox.put("check")
            reply = {"producer": mine, "consumer": outbox.get(timeout=120)}
        elif cmd[0] == "write":
            x.fill_(float(cmd[1]))
            torch.cuda.synchronize()
            reply = {"written": float(cmd[1]) * n}
        elif cmd[0] == "exit":
            inbox.put("exit")
            child.join(30)
            return
        else:
            reply = {"error": f"unknown command {cmd[0]}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
