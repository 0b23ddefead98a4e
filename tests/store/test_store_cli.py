"""`criu-gpushare store ...`: tables, --json, and exit codes from criu_gpushare.errors."""
import json
import os

import pytest
from click.testing import CliRunner

from criu_gpushare.cli import main
from criu_gpushare.errors import ConfigError, StoreError

from store_helpers import age, age_store, chunk_bytes, chunk_path, commit_checkpoint


@pytest.fixture
def run(store_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CRIU_GPUSHARE_CONFIG", str(tmp_path / "config.toml"))
    (tmp_path / "config.toml").write_text("")
    monkeypatch.delenv("CRIU_GPUSHARE_STORE", raising=False)
    monkeypatch.delenv("CRIU_GPUSHARE_CACHE", raising=False)

    def invoke(*args):
        return CliRunner().invoke(main, ["store", "--store", store_dir, *args])
    return invoke


@pytest.fixture
def two_checkpoints(store):
    commit_checkpoint(store, "ck-1", [chunk_bytes(1), chunk_bytes(2), bytes(4096)], pid=11)
    commit_checkpoint(store, "ck-2", [chunk_bytes(2), chunk_bytes(3)], pid=12)
    return store


def test_ls_table_and_json(run, two_checkpoints):
    r = run("ls")
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert lines[0].split() == ["NAME", "CREATED", "PROCS", "ALLOCS", "SIZE", "STORED", "HELD"]
    assert [line.split()[0] for line in lines[1:]] == ["ck-1", "ck-2"]
    doc = json.loads(run("ls", "--json").output)
    ck1 = doc["checkpoints"][0]
    assert (ck1["name"], ck1["bytes"], ck1["stored_bytes"], ck1["processes"]) == (
        "ck-1", 3 * 4096, 2 * 4096, 1)


def test_du_counts_dedup_zero_and_reclaimable(run, two_checkpoints):
    two_checkpoints.put(chunk_bytes(4))
    doc = json.loads(run("du", "--json").output)
    assert (doc["refs"], doc["chunks"], doc["referenced_chunks"], doc["unreferenced_chunks"]) == (
        2, 4, 3, 1)
    assert (doc["logical_bytes"], doc["zero_bytes"]) == (5 * 4096, 4096)
    assert doc["dedup_ratio"] == pytest.approx(5 / 3, abs=1e-3)
    assert "dedup ratio 1.67" in run("du").output


def test_verify_names_every_bad_or_missing_chunk_and_fails(run, two_checkpoints):
    store = two_checkpoints
    ids = [c for name in ("ck-1", "ck-2")
           for c, _ in store.read_manifest(store.read_ref(name).manifest).chunk_ids()]
    c1, c2, c3 = ids[0], ids[1], ids[3]
    os.unlink(chunk_path(store, c1))
    with open(chunk_path(store, c2), "r+b") as f:
        f.write(b"\x00" * 8)
    with open(chunk_path(store, c3), "r+b") as f:
        f.truncate(10)
    r = run("verify")
    assert r.exit_code == StoreError.exit_code
    assert f"missing    {chunk_path(store, c1)}: chunk {c1} missing (used by ck-1)" in r.output
    assert f"corrupt    {chunk_path(store, c2)}: content hashes to" in r.output
    assert "(used by ck-1, ck-2)" in r.output
    assert f"truncated  {chunk_path(store, c3)}: 10 bytes, expected 4096" in r.output
    assert "verify found 3 problem(s)" in r.output
    doc = json.loads(run("verify", "--json").output.split("\ncriu-gpushare:")[0])
    assert sorted(p["kind"] for p in doc["problems"]) == ["corrupt", "missing", "truncated"]


def test_verify_of_a_healthy_store_and_of_one_checkpoint(run, two_checkpoints):
    r = run("verify", "ck-2", "--all")
    assert r.exit_code == 0 and "0 problem(s)" in r.output
    r = run("verify", "no-such")
    assert r.exit_code == StoreError.exit_code and "refs/no-such: no such checkpoint" in r.output


def test_gc_and_rm(run, two_checkpoints):
    store = two_checkpoints
    cid = store.put(chunk_bytes(9)).chunk_id
    age(chunk_path(store, cid), 7200)
    r = run("gc", "--dry-run")
    assert r.exit_code == 0 and r.output.startswith("would remove 1 chunk(s)")
    assert store.has_chunk(cid)
    assert run("rm", "ck-1").output == "removed ck-1\n"
    age_store(store.path)
    doc = json.loads(run("gc", "--grace", "0", "--json").output)
    assert (doc["chunks_removed"], doc["manifests_removed"], doc["refs"]) == (2, 1, 1)
    assert run("rm", "ck-1").exit_code == StoreError.exit_code


def test_prefetch_needs_a_cache_and_fills_it(run, two_checkpoints, tmp_path):
    r = run("prefetch")
    assert r.exit_code == ConfigError.exit_code and "no node cache configured" in r.output
    cache = tmp_path / "cache"
    doc = json.loads(CliRunner().invoke(main, ["store", "--store", two_checkpoints.path,
                                               "--cache", str(cache), "prefetch", "--json"]).output)
    assert (doc["fetched"], doc["failed"]) == (3, [])
    out = CliRunner().invoke(main, ["store", "--store", two_checkpoints.path, "--cache",
                                    str(cache), "--cache-limit", "1G", "du", "--json"]).output
    assert json.loads(out)["cache"]["chunks"] == 3


def test_a_missing_store_is_a_store_error(run, tmp_path):
    r = CliRunner().invoke(main, ["store", "--store", str(tmp_path / "none"), "ls"])
    assert r.exit_code == StoreError.exit_code
    assert f"{tmp_path / 'none'}: no store here (no such directory)" in r.output


def test_environment_variable_chooses_the_store(two_checkpoints, monkeypatch, tmp_path):
    monkeypatch.setenv("CRIU_GPUSHARE_CONFIG", str(tmp_path / "c.toml"))
    (tmp_path / "c.toml").write_text("")
    monkeypatch.setenv("CRIU_GPUSHARE_STORE", two_checkpoints.path)
    r = CliRunner().invoke(main, ["store", "ls", "--json"])
    assert [c["name"] for c in json.loads(r.output)["checkpoints"]] == ["ck-1", "ck-2"]


def test_ls_lists_an_unreadable_checkpoint_with_its_error(run, two_checkpoints):
    mid = two_checkpoints.read_ref("ck-2").manifest
    os.unlink(os.path.join(two_checkpoints.path, "manifests", mid + ".json"))
    r = run("ls")
    assert r.exit_code == StoreError.exit_code
    assert "ck-1" in r.output and f"ck-2: unreadable: {two_checkpoints.path}/manifests/{mid}.json"\
        in r.output


def test_verify_quick_checks_presence_and_size_without_hashing(run, two_checkpoints):
    store = two_checkpoints
    ids = [c for c, _ in store.read_manifest(store.read_ref("ck-2").manifest).chunk_ids()]
    with open(chunk_path(store, ids[0]), "r+b") as f:
        f.write(b"\x00" * 8)  # corrupt, same size: only a full verify sees it
    assert run("verify", "--quick").exit_code == 0
    os.unlink(chunk_path(store, ids[1]))
    r = run("verify", "--quick", "ck-2")
    assert r.exit_code == StoreError.exit_code and f"missing    {chunk_path(store, ids[1])}" in r.output
    assert run("verify").exit_code == StoreError.exit_code


def test_check_present_is_the_pre_restore_check(two_checkpoints):
    from criu_gpushare.store import check_present
    store = two_checkpoints
    manifest = store.read_manifest(store.read_ref("ck-1").manifest)
    assert check_present(store, manifest) == []
    cid = next(manifest.chunk_ids())[0]
    os.unlink(chunk_path(store, cid))
    (problem,) = check_present(store, manifest)
    assert (problem.kind, problem.path) == ("missing", chunk_path(store, cid))
