"""A torch program with three CUDA graphs, replayed on command (tests/gpu/test_cuda_graphs.py).

    python3 graphs.py [--ctl DIR]

  g1  matmul, copied into a static output tensor
  g2  captured on a side stream: a kernel (mul), a memcpy node (device copy), a memset node
      (cuMemsetD32Async on the capturing stream) and a kernel that reads both
  g3  its outputs allocated during capture, so they live in the graph's private memory pool
Commands (wlcommon.py): `check` -> {"sha": digest of the three, "graphs": {"g1": sha256, "g2": ...,
"g3": ...}}: every output is first overwritten with -1, then each graph is replayed and its outputs
hashed (bytes copied to the host), so a replay that did nothing shows.
"""
import argparse
import hashlib
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wlcommon  # noqa: E402

N = 1024


def sha(torch, *tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(torch.int32).numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctl")
    args = ap.parse_args()
    import torch
    from cuda.bindings import driver as cu

    gen = torch.Generator(device="cuda").manual_seed(1234)
    a = torch.randn(N, N, device="cuda", generator=gen)
    b = torch.randn(N, N, device="cuda", generator=gen)
    x = torch.randn(N * N, device="cuda", generator=gen)
    y = torch.randn(N, N // 2, device="cuda", generator=gen)
    out1 = torch.empty(N, N, device="cuda")
    k2, m2, z2, out2 = (torch.empty(N * N, device="cuda") for _ in range(4))
    side = torch.cuda.Stream()
    fill = struct.unpack("<I", struct.pack("<f", 2.5))[0]

    def body2(stream):
        torch.mul(x, 3.0, out=k2)                     # kernel node
        m2.copy_(k2)                                   # memcpy node (device to device)
        err, = cu.cuMemsetD32Async(z2.data_ptr(), fill, z2.numel(), cu.CUstream(stream.cuda_stream))
        assert err == cu.CUresult.CUDA_SUCCESS, err    # memset node
        torch.add(m2, z2, out=out2)

    warm = torch.cuda.Stream()  # warm-up outside capture (cuBLAS workspaces, lazy module loads)
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        out1.copy_(a @ b)
        body2(warm)
        torch.relu(y @ y.T).sum(dim=1)
    torch.cuda.synchronize()

    g1, g2, g3 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        out1.copy_(a @ b)
    with torch.cuda.graph(g2, stream=side):
        body2(side)
    with torch.cuda.graph(g3):                          # outputs from the graph's private pool
        p3 = torch.relu(y @ y.T) + 1.0
        out3 = p3.sum(dim=1)
    torch.cuda.synchronize()
    outputs = {"g1": (g1, [out1]), "g2": (g2, [k2, m2, z2, out2]), "g3": (g3, [p3, out3])}

    def replay():
        for _, outs in outputs.values():
            for t in outs:
                t.fill_(-1.0)
        torch.cuda.synchronize()
        found = {}
        for name, (graph, outs) in outputs.items():
            graph.replay()
            torch.cuda.synchronize()
            found[name] = sha(torch, *outs)
        return found

    def check(_args):
        found = replay()
        return {"sha": hashlib.sha256(" ".join(found[k] for k in sorted(found)).encode()).hexdigest(),
                "graphs": found}

    wlcommon.serve(wlcommon.channel_from_args(args.ctl), {"pids": [os.getpid()], "bytes": 0},
                   {"check": check})


if __name__ == "__main__":
    main()
