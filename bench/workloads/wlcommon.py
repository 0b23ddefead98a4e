"""What every bench workload shares: the command channel and the GPU-side digest.

Channel. A workload answers commands, one JSON object per command. Two transports:
  --ctl DIR   files (what the benchmarks use: CRIU can dump a process that holds no pipe or socket
              to the bench): the workload writes DIR/ready once, then for command number N
              (0, 1, ...) waits for DIR/cmd-N, deletes it, and writes DIR/reply-N (each written to a
              temporary name and renamed, so a reader never sees half a file);
  (default)   stdin/stdout: commands are lines on stdin, each answered by one line on stdout.
Either way the first thing printed on stdout is `READY {json}` and every reply is also printed as
`OK {json}` or `ERR {json}`. Commands every workload knows: `check` (digest of its GPU contents,
computed on the GPU) and `quit`.

Digest. Per block of at most 32 Mi int64 words: the wrapping sum of the words and the wrapping sum
of word * (2i + 1); the sha256 of all those pairs, in order, is the digest. A changed, moved or
zeroed word changes it. It is a check of contents, not a cryptographic hash.
"""
import hashlib
import json
import os
import struct
import sys
import time

for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
               ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_k] = _v  # NVLink multicast stays off in every workload and what it starts

BLOCK_WORDS = 32 << 20


def _write_atomic(path, text):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, path)


class FileChannel:
    def __init__(self, directory):
        self.dir, self.seq = directory, 0

    def ready(self, info):
        print("READY " + json.dumps(info), flush=True)
        _write_atomic(os.path.join(self.dir, "ready"), json.dumps(info))

    def commands(self):
        while True:
            path = os.path.join(self.dir, f"cmd-{self.seq}")
            try:
                with open(path) as f:
                    text = f.read()
            except FileNotFoundError:
                time.sleep(0.01)
                continue
            os.unlink(path)
            yield text.strip()

    def reply(self, obj):
        _write_atomic(os.path.join(self.dir, f"reply-{self.seq}"), json.dumps(obj))
        self.seq += 1


class StdioChannel:
    def ready(self, info):
        print("READY " + json.dumps(info), flush=True)

    def commands(self):
        for line in sys.stdin:
            if line.strip():
                yield line.strip()

    def reply(self, obj):
        pass  # serve() prints every reply


def channel_from_args(ctl):
    return FileChannel(ctl) if ctl else StdioChannel()


def serve(channel, info, handlers):
    """Announce `info`, then answer commands with handlers[name](args) -> dict until `quit`."""
    channel.ready(info)
    for text in channel.commands():
        name, *args = text.split()
        if name == "quit":
            channel.reply({"quit": True})
            print("OK {\"quit\": true}", flush=True)
            return
        try:
            if name not in handlers:
                raise ValueError(f"unknown command {name!r}")
            t0 = time.monotonic()
            reply = dict(handlers[name](args))
            reply.setdefault("seconds", round(time.monotonic() - t0, 4))
            tag = "OK"
        except Exception as e:  # reported to the bench, the workload stays up
            reply, tag = {"error": f"{type(e).__name__}: {e}"}, "ERR"
        channel.reply(reply)
        print(f"{tag} {json.dumps(reply)}", flush=True)


def torch_digest(tensors):
    """The digest (see the module docstring) of torch tensors, computed on their GPU."""
    import torch

    parts, weights = [], None
    for t in tensors:
        flat = t.detach().contiguous().view(-1).view(torch.uint8)
        n = flat.numel() // 8 * 8
        words = flat[:n].view(torch.int64)
        for off in range(0, words.numel(), BLOCK_WORDS):
            block = words[off:off + BLOCK_WORDS]
            if weights is None or weights.numel() < block.numel():
                weights = torch.arange(block.numel(), device=t.device, dtype=torch.int64) * 2 + 1
            parts.append(block.sum())
            parts.append((block * weights[:block.numel()]).sum())
        if n != flat.numel():
            parts.append(flat[n:].to(torch.int64).sum())
    del weights
    h = hashlib.sha256()
    if parts:
        values = torch.stack(parts).cpu().tolist()
        h.update(struct.pack(f"<{len(values)}q", *values))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the digest's own temporaries are not left for the suspend to save
    return h.hexdigest()


def gib_to_bytes(gib, align=2 << 20):
    return max(align, int(gib * (1 << 30)) // align * align)
