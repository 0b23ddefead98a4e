"""One torch process holding GPU memory of random contents (bench workloads a, c, d; allocator bench).

    python3 blocks.py --gib 40 [--block-mib 1024] [--ctl DIR]      # N GiB in tensors of M MiB
    python3 blocks.py --count 2000 --block-mib 4 --no-caching      # 2,000 allocations of 4 MiB
    python3 blocks.py --gib 0                                      # a near-empty CUDA process

--no-caching sets PYTORCH_NO_CUDA_MEMORY_CACHING=1, so every tensor is its own cudaMalloc (the
caching allocator would carve 4 MiB tensors out of 20 MiB segments). The allocator in use is
torch's, as PYTORCH_CUDA_ALLOC_CONF says (the allocator bench sets it). Commands: see wlcommon.py;
`check` -> {"sha": digest of every tensor}; `info` -> torch's memory figures.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wlcommon  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--block-mib", type=int, default=1024)
    ap.add_argument("--count", type=int, help="exactly COUNT tensors of --block-mib (instead of --gib)")
    ap.add_argument("--no-caching", action="store_true")
    ap.add_argument("--ctl")
    args = ap.parse_args()
    if args.no_caching:
        os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    import torch

    block = args.block_mib << 20
    if args.count is not None:
        sizes = [block] * args.count
    elif args.gib <= 0:
        sizes = []
    else:
        total = wlcommon.gib_to_bytes(args.gib)
        sizes = [block] * (total // block) + ([total % block] if total % block else [])
    gen = torch.Generator(device="cuda")
    gen.manual_seed(os.getpid())
    tensors = [torch.empty(1, device="cuda", dtype=torch.int64).fill_(7)]  # a CUDA context at least
    for size in sizes:
        t = torch.empty(size // 8, device="cuda", dtype=torch.int64)
        t.random_(generator=gen)  # random words: no dedup, no zero chunks
        tensors.append(t)
    torch.cuda.synchronize()

    def info(_args):
        return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
                "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}

    wlcommon.serve(wlcommon.channel_from_args(args.ctl),
                   {"pids": [os.getpid()], "bytes": sum(sizes), "tensors": len(sizes)},
                   {"check": lambda _a: {"sha": wlcommon.torch_digest(tensors)}, "info": info})


if __name__ == "__main__":
    main()
