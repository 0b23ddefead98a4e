"""A serving-shaped process tree, small enough to read in one go, built like real inference servers:

  api       (this process, no CUDA, never imports torch) answers HTTP-less JSON lines on TCP
            127.0.0.1:PORT, one request per connection, and forwards each to the engine;
  engine    (a child, no CUDA) listens on a unix socket in DIR, keeps the request queue and hands
            each request to a worker over multiprocessing queues (their semaphores are deleted
            files in /dev/shm: CRIU's link-remap);
  worker 0, worker 1 (the engine's children, torch on the GPU): worker 0 makes the weights and
            sends them to worker 1 through a queue (CUDA IPC: one copy on the GPU, mapped by
            both); each has a KV-cache-like pool of fixed-size blocks (one preallocated tensor,
            blocks taken per request and given back) and a decode step captured once as a CUDA
            graph and replayed for every token.

A request is {"tokens": [ints]}; the answer is {"tokens": [the greedy continuation], "sum": a
checksum of the KV blocks it used, "worker": which worker}. Both depend only on the request and
the weights: the same request always gets the same answer, before and after a checkpoint. The
format, and the check the API makes before a request reaches the engine, are protocol.py's (no
torch there): a bad request is answered {"error": ...} and the tree serves on.

    python serve.py --dir DIR [--port PORT]     # writes DIR/ready ({"port": ..., "pids": [...]})

Run it under the shim (`criu-gpushare run -- python serve.py ...`): every child inherits it.
"""
import argparse
import json
import multiprocessing as mp
import os
import socket
import sys
import threading
import time

from protocol import (VOCAB, BadRequest, answer_line, error_answer, parse_request, read_answer,
                      request_line)

DIM, BLOCK_TOKENS, BLOCKS, STEPS = 256, 16, 64, 8

for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
               ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_k] = _v  # NVLink multicast stays off here and in every child


def _one_request(conn, answer):
    """Read one request line from conn, write answer(tokens) back (an error answer for a bad
    request), close it. A peer gone (a connection CRIU closed at a dump) is not an error."""
    try:
        with conn, conn.makefile("rw") as f:
            line = f.readline()
            if not line:
                return
            try:
                reply = answer(parse_request(line))
            except BadRequest as e:
                reply = error_answer(e)
            f.write(answer_line(reply))
    except OSError:
        pass


# -- worker (torch, GPU) -------------------------------------------------------------------------

class Model:
    def __init__(self, torch, weights):
        self.torch = torch
        self.emb, self.w1, self.w2 = weights
        self.pool = torch.zeros(BLOCKS, BLOCK_TOKENS, DIM, device="cuda")  # the KV-cache-like pool
        self.free = list(range(BLOCKS))
        self.state = torch.zeros(1, DIM, device="cuda")  # the graph's static input and output
        self.logits = torch.zeros(1, VOCAB, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up before capture, as torch asks
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._step()
        torch.cuda.synchronize()

    def _step(self):
        hidden = self.torch.tanh(self.state @ self.w1)
        self.logits.copy_(hidden @ self.w2)

    def answer(self, tokens):
        torch = self.torch
        need = (len(tokens) + STEPS + BLOCK_TOKENS - 1) // BLOCK_TOKENS
        if need > len(self.free):
            raise RuntimeError("KV pool exhausted")
        blocks = [self.free.pop() for _ in range(need)]
        try:
            kv = self.pool[blocks].view(-1, DIM)
            kv[:len(tokens)] = self.emb[torch.tensor(tokens, device="cuda") % VOCAB]
            out, n = [], len(tokens)
            for _ in range(STEPS):
                self.state.copy_(kv[:n].mean(0, keepdim=True))
                self.graph.replay()
                nxt = int(self.logits.argmax())
                out.append(nxt)
                kv[n] = self.emb[nxt]
                n += 1
            self.pool[blocks] = kv.view(len(blocks), BLOCK_TOKENS, DIM)
            checksum = float(kv[:n].double().sum())
            return out, round(checksum, 6)
        finally:
            self.pool[blocks] = 0
            self.free.extend(blocks)


class CpuModel:
    """--model cpu: the same protocol and processes without torch or a GPU (a pure-Python
    stand-in, deterministic too), so the tree's plumbing can be tried and tested anywhere."""

    def __init__(self, weights):
        self.weights = weights

    def answer(self, tokens):
        out, state = [], sum(self.weights[t % VOCAB] for t in tokens)
        for _ in range(STEPS):
            state = (state * 1103515245 + 12345) % (1 << 31)
            out.append(state % VOCAB)
        return out, float(sum(out) + len(tokens))


def worker(index, inbox, outbox, weights_q, model_kind):
    if model_kind == "cpu":
        if index == 0:
            weights_q.put([(i * 2654435761) % (1 << 31) for i in range(VOCAB)])
            model = CpuModel([(i * 2654435761) % (1 << 31) for i in range(VOCAB)])
        else:
            model = CpuModel(weights_q.get())
        _serve_requests(index, model, inbox, outbox)
        return
    import torch
    import torch.multiprocessing  # noqa: F401  (registers CUDA tensors' sharing through queues)

    torch.manual_seed(1234)
    if index == 0:
        gen = torch.Generator(device="cuda").manual_seed(1234)
        weights = [torch.randn(VOCAB, DIM, device="cuda", generator=gen),
                   torch.randn(DIM, DIM, device="cuda", generator=gen) / DIM ** 0.5,
                   torch.randn(DIM, VOCAB, device="cuda", generator=gen) / DIM ** 0.5]
        torch.cuda.synchronize()
        weights_q.put(weights)  # to worker 1, through CUDA IPC
        keep = weights
    else:
        keep = weights_q.get()  # the same GPU memory as worker 0's
    _serve_requests(index, Model(torch, keep), inbox, outbox)


def _serve_requests(index, model, inbox, outbox):
    outbox.put(("ready", index, os.getpid()))
    while True:
        rid, tokens = inbox.get()
        try:
            out, checksum = model.answer(tokens)
            outbox.put((rid, {"tokens": out, "sum": checksum, "worker": index}))
        except Exception as e:  # the request fails, the worker serves on
            outbox.put((rid, {"error": f"{type(e).__name__}: {e}"}))


# -- engine (no CUDA) ----------------------------------------------------------------------------

def _get_while_alive(queue, procs, what, timeout=900):
    """queue.get(), failing as soon as one of procs has died (rather than waiting out timeout)."""
    import queue as q
    deadline = time.monotonic() + timeout
    while True:
        try:
            return queue.get(timeout=1)
        except q.Empty:
            dead = [p for p in procs if not p.is_alive()]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"{what}: {'process exited: ' + str(dead) if dead else 'timed out'}")


def engine(directory, started, model_kind):
    ctx = mp.get_context("spawn")
    weights_q, outbox = ctx.Queue(), ctx.Queue()
    inboxes = [ctx.Queue(), ctx.Queue()]
    workers = [ctx.Process(target=worker, args=(i, inboxes[i], outbox, weights_q, model_kind),
                           daemon=True) for i in range(2)]
    for w in workers:
        w.start()
    pids = {}
    while len(pids) < 2:
        tag, index, pid = _get_while_alive(outbox, workers, "starting the workers")
        pids[index] = pid
    path = os.path.join(directory, "engine.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)  # CRIU restores a listening socket at the name it was bound to
    srv.listen(64)
    started.put([os.getpid(), pids[0], pids[1]])
    seq = [0]

    def answer(tokens):  # one request at a time on the queues: answers never cross
        seq[0] += 1
        inboxes[sum(tokens) % 2].put((seq[0], tokens))
        got, reply = outbox.get(timeout=600)
        return reply if got == seq[0] else error_answer("answer out of order")

    while True:
        conn, _ = srv.accept()
        _one_request(conn, answer)


# -- api (no CUDA) -------------------------------------------------------------------------------

def ask_engine(directory, tokens):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(600)
        s.connect(os.path.join(directory, "engine.sock"))
        s.sendall(request_line(tokens).encode())
        with s.makefile("r") as f:
            return read_answer(f.readline())


def serve_client(conn, directory):
    _one_request(conn, lambda tokens: ask_engine(directory, tokens))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--model", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a pure-Python stand-in for the model (no torch, no GPU)")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    started = ctx.Queue()
    # Not a daemon: a daemonic process may not start children, and the engine starts the workers.
    eng = ctx.Process(target=engine, args=(args.dir, started, args.model))
    eng.start()
    engine_pids = _get_while_alive(started, [eng], "starting the engine")
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", args.port))
    srv.listen(64)
    info = {"port": srv.getsockname()[1], "pids": [os.getpid(), *engine_pids]}
    tmp = os.path.join(args.dir, "ready.tmp")
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.rename(tmp, os.path.join(args.dir, "ready"))
    print(f"serving on 127.0.0.1:{info['port']}, pids {info['pids']}", flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve_client, args=(conn, args.dir), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
