"""examples/serving without torch, a GPU or CRIU: the message format (protocol.py), and serve.py's
tree on its pure-Python model answering over TCP: a bad request gets an error answer and the tree
serves on, the same request always gets the same answer. The tree through CRIU is
tests/hook/test_serving_tree_cpu.py (cpu) and tests/gpu/test_serving_tree.py (GPU)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVING = Path(__file__).resolve().parents[2] / "examples" / "serving"
sys.path.insert(0, str(SERVING))

from procs import named_semaphores, semaphores_unlinked  # noqa: E402
from protocol import (MAX_LINE, MAX_TOKENS, VOCAB, BadRequest, parse_request,  # noqa: E402
                      read_answer, same_answer)

START_TIMEOUT_S = 60


@pytest.mark.parametrize("line, why", [
    ("{", "not JSON"),
    (b"\xff\n", "not JSON"),
    ("[1, 2]", "JSON object"),
    ('{"tokens": []}', '"tokens"'),
    ('{"tokens": "123"}', '"tokens"'),
    ('{"tokens": [1, "2"]}', '"tokens"'),
    ('{"tokens": [1, true]}', '"tokens"'),
    ('{"tokens": [1.0]}', '"tokens"'),
    ('{"tokens": [-1]}', '"tokens"'),
    (json.dumps({"tokens": [VOCAB]}), '"tokens"'),
    (json.dumps({"tokens": [1] * (MAX_TOKENS + 1)}), '"tokens"'),
    ("1" * (MAX_LINE + 1), "at most"),
])
def test_a_bad_request_is_refused_saying_what_is_wrong(line, why):
    with pytest.raises(BadRequest, match=why):
        parse_request(line)


def test_a_good_request_gives_its_tokens():
    assert parse_request('{"tokens": [0, 511], "extra": 1}\n') == [0, VOCAB - 1]
    assert parse_request(json.dumps({"tokens": [7] * MAX_TOKENS}).encode()) == [7] * MAX_TOKENS


def test_answers_read_and_compared_without_the_worker():
    with pytest.raises(ConnectionError):
        read_answer("")
    with pytest.raises(ValueError):
        read_answer('{"tokens": [1]}\n')  # no checksum
    a = read_answer('{"tokens": [1, 2], "sum": 3.5, "worker": 0}\n')
    assert same_answer(a, dict(a, worker=1))
    assert not same_answer(a, dict(a, sum=3.25))
    assert not same_answer(a, {"error": "x"})


class CpuTree:
    """serve.py --model cpu started directly (no shim), in its own session, stdio on a log file."""

    def __init__(self, directory):
        self.dir = directory
        self.log = os.path.join(directory, "serve.log")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, str(SERVING / "serve.py"), "--dir", directory,
                                          "--model", "cpu"], stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, start_new_session=True)
        ready = os.path.join(directory, "ready")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not os.path.exists(ready):
            assert self.proc.poll() is None, f"serve.py exited {self.proc.returncode}: {self.log_tail()}"
            assert time.monotonic() < deadline, f"not ready in {START_TIMEOUT_S} s: {self.log_tail()}"
            time.sleep(0.1)
        with open(ready) as f:
            info = json.load(f)
        self.port, self.pids = info["port"], info["pids"]

    def log_tail(self):
        with open(self.log, errors="replace") as f:
            return f.read()[-2000:]

    def send(self, raw: bytes):
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
            s.sendall(raw)
            with s.makefile("r") as f:
                return read_answer(f.readline())

    def kill(self):
        with semaphores_unlinked(self.pids):  # the killed tree's resource tracker unlinks none
            for pid in self.pids:  # the workers are not in the API's process group alone
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)


@pytest.fixture
def cpu_tree(tmp_path):
    tree = CpuTree(str(tmp_path))
    yield tree
    tree.kill()


def test_the_tree_answers_bad_requests_with_errors_and_serves_on(cpu_tree):
    good = b'{"tokens": [1, 2, 3]}\n'
    first = cpu_tree.send(good)
    assert len(first["tokens"]) > 0 and "sum" in first and "error" not in first
    for raw in (b"{\n", b'{"tokens": ["a"]}\n', b'{"tokens": [999999]}\n', b'{"tokens": []}\n'):
        answer = cpu_tree.send(raw)
        assert "error" in answer, (raw, answer)
    assert cpu_tree.proc.poll() is None, cpu_tree.log_tail()
    assert all(os.path.exists(f"/proc/{pid}") for pid in cpu_tree.pids), cpu_tree.log_tail()
    assert cpu_tree.send(good) == first


def test_the_same_request_gets_the_same_answer_from_the_worker_it_is_routed_to(cpu_tree):
    requests = [[1, 2, 3], [7, 7, 7, 7], [100, 3], [42] * 20]
    first = [cpu_tree.send(json.dumps({"tokens": t}).encode() + b"\n") for t in requests]
    assert {a["worker"] for a in first} == {0, 1}
    again = [cpu_tree.send(json.dumps({"tokens": t}).encode() + b"\n") for t in reversed(requests)][::-1]
    assert again == first


def test_the_tree_ended_leaves_none_of_its_named_semaphores(cpu_tree):
    """The tests kill their trees with SIGKILL, the resource tracker with them: what it would have
    unlinked is unlinked after the kill, so that runs leave /dev/shm as they found it."""
    semaphores = named_semaphores(cpu_tree.pids)
    assert semaphores and all(os.path.exists(s) for s in semaphores), semaphores
    cpu_tree.kill()
    assert not [s for s in semaphores if os.path.exists(s)]
