"""Suspend and resume with the store in an S3 bucket (a real server on 127.0.0.1), every `store`
verb on it with --json, the server gone before a resume (a clear error, nothing changed, the
retry works), and no secret in any output or state file."""
import json

import pytest

from lctest import resume, share, suspend, values, write
from s3server import SECRET_KEY


@pytest.fixture
def s3lc(lc, s3_server, s3_store_url):
    aws = {k: v for k, v in s3_server.env().items() if k.startswith("AWS_")}
    for env in (lc.tool, lc.app):
        env.update(aws, CRIU_GPUSHARE_STORE=s3_store_url)
    lc.store = s3_store_url
    return lc


def no_secret(lc, *results):
    texts = [r.stdout + r.stderr for r in results]
    from pathlib import Path
    texts += [p.read_text(errors="replace") for p in Path(lc.run_dir).rglob("*") if p.is_file()]
    assert not [t for t in texts if SECRET_KEY in t]


def test_suspend_resume_and_every_store_verb_through_s3(s3lc, workload, tmp_path):
    lc = s3lc
    a, b = workload(), workload()
    share(a, b, tmp_path)
    write(a, "buf", 31)
    outputs = [suspend(lc, a.pid, b.pid)]
    ls = lc.cli("store", "ls", "--json")
    assert ls.returncode == 0, ls.stderr
    doc = json.loads(ls.stdout)
    assert doc["store"] == lc.store and len(doc["checkpoints"]) == 1
    assert doc["checkpoints"][0]["held_by"]  # the suspension holds it
    name = doc["checkpoints"][0]["name"]
    for verb in (["du"], ["verify"], ["gc", "--grace", "0"], ["gc", "--dry-run"]):
        r = lc.cli("store", *verb, "--json")
        assert r.returncode == 0, (verb, r.stderr)
        outputs.append(r)
    assert json.loads(outputs[-2].stdout)["chunks_removed"] == 0  # referenced and held
    r = lc.cli("store", "rm", name)
    assert r.returncode == 6 and "is held" in r.stderr
    outputs += [ls, r, resume(lc, a.pid)]
    assert values(b, "buf") == [31] * 4
    r = lc.cli("store", "rm", name)  # no longer held
    assert r.returncode == 0, r.stderr
    no_secret(lc, *outputs, r)


def test_the_server_gone_before_a_resume_changes_nothing_and_the_retry_works(s3lc, workload,
                                                                           s3_server):
    lc = s3lc
    a = workload()
    a.do("cumem buf 4194304")
    write(a, "buf", 9)
    suspend(lc, a.pid)
    s3_server.stop()
    try:
        r = resume(lc, a.pid, ok=False)
    finally:
        s3_server.start()
    assert r.returncode == 6 and "cannot reach the S3 server" in r.stderr, r.stderr
    assert "suspended by criu-gpushare" in lc.cli("status", a.pid).stdout
    resume(lc, a.pid)
    assert values(a, "buf") == [9] * 4
