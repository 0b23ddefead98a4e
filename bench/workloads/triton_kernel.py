"""One torch process running Triton kernels over its GPU memory: kernels Triton compiles at run time
and loads as modules of their own, beside torch's (tests/gpu/test_criu_trees.py).

    python3 triton_kernel.py --gib 1 [--ctl DIR]

Commands (wlcommon.py): `check` -> {"sha": digest of the data and of what the kernel compiled at
start writes from it}: the kernel runs on every check, so a module the restore did not bring back
shows; `compile BLOCK` -> runs the kernel with a block size (a power of two, 64 to 4096) it may
never have run with, which Triton compiles and loads then, over the first 64 MiB of the data, and
answers {"ok": whether its output equals torch's own}.
"""
import argparse
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wlcommon  # noqa: E402

MASK = 0x2545F491  # xor: no overflow, so the same on every run
START_BLOCK = 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--ctl")
    args = ap.parse_args()
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def xor_kernel(src, dst, n, XOR: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        keep = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=keep) ^ XOR, mask=keep)

    def run(src, dst, block):
        xor_kernel[(triton.cdiv(src.numel(), block),)](src, dst, src.numel(), XOR=MASK, BLOCK=block)

    gen = torch.Generator(device="cuda")
    gen.manual_seed(os.getpid())
    data = torch.empty(wlcommon.gib_to_bytes(args.gib) // 8, device="cuda", dtype=torch.int64).random_(generator=gen)
    out = torch.empty_like(data)

    def check(_args):
        out.fill_(-1)
        run(data, out, START_BLOCK)
        both = wlcommon.torch_digest([data, out])
        return {"sha": hashlib.sha256(both.encode()).hexdigest()}

    def compile_block(words):
        block = int(words[0])
        if block < 64 or block > 4096 or block & (block - 1):
            raise ValueError(f"block {block}: a power of two from 64 to 4096")
        src = data[:(64 << 20) // 8]
        dst = torch.full_like(src, -1)
        run(src, dst, block)
        ok = bool(torch.equal(dst, src ^ MASK))
        del dst
        torch.cuda.empty_cache()
        return {"ok": ok, "block": block}

    run(data, out, START_BLOCK)
    torch.cuda.synchronize()
    wlcommon.serve(wlcommon.channel_from_args(args.ctl),
                   {"pids": [os.getpid()], "bytes": data.numel() * 16, "triton": triton.__version__},
                   {"check": check, "compile": compile_block})


if __name__ == "__main__":
    main()
