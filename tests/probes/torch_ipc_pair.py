"""A torch.multiprocessing CUDA-IPC pair (real GPU only: needs torch).

    torch_ipc_pair.py --dir D --size-mib N

The producer fills a CUDA tensor of N MiB with 7.0 and sends it through a torch.multiprocessing
queue (spawn) to a consumer, which therefore maps it through legacy CUDA IPC. The consumer checks
the values and announces `consumer.ready` {pid, data_ok}; then the producer announces
`producer.ready` {pid, consumer_pid}. Both idle until `D/stop`.
"""
import argparse
import os

import probelib as pl

FILL = 7.0


def consumer(directory, queue):
    import torch

    rv = pl.Rendezvous(directory, "consumer")
    shared = queue.get(timeout=pl.DEFAULT_WAIT_S)
    data_ok = bool((shared == FILL).all().item())
    torch.cuda.synchronize()
    rv.announce("consumer.ready", {"pid": os.getpid(), "data_ok": data_ok})
    rv.serve()
    del shared


def producer(args, rv):
    import torch
    import torch.multiprocessing as mp

    tensor = torch.full((args.size_mib * pl.MiB // 4,), FILL, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=consumer, args=(args.dir, queue), name="ipc-consumer")
    child.start()
    queue.put(tensor)
    ready = rv.wait("consumer.ready")
    rv.announce("producer.ready", {"pid": os.getpid(), "consumer_pid": ready["pid"]})
    rv.serve()
    child.join(timeout=10)
    if child.is_alive():
        child.kill()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--size-mib", type=int, default=256)
    args = parser.parse_args()
    rv = pl.Rendezvous(args.dir, "producer")
    pl.run_role(rv, lambda: producer(args, rv))


if __name__ == "__main__":
    main()
