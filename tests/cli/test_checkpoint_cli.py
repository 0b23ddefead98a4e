"""criu_gpushare/cli/checkpoint.py: `criu-gpushare dump` and `restore` refuse bad input before CRIU
runs, with the README's exit code and a message naming what is wrong, never a traceback, and
nothing changed. (No CRIU needed; dumps and restores through CRIU are tests/hook/.)"""
import json
import os
import random

import pytest

from criu_gpushare.engine import record
from criu_gpushare.store import Allocation, Manifest, ProcessEntry, Store


@pytest.fixture
def image(tmp_path):
    """An image directory whose record names a stored checkpoint (no CRIU images: every refusal
    below comes before CRIU would read them)."""
    store_dir = str(tmp_path / "dumpstore")
    with Store.open(store_dir, create=True) as store, store.begin_write("dump-1") as session:
        puts = [session.put(random.Random(1).randbytes(4096))]
        mid = session.commit("dump-1", Manifest([ProcessEntry(1, [Allocation.from_puts("a", puts)])]))
    images = tmp_path / "images"
    images.mkdir()
    record.write(str(images), {
        "format": 1, "tool": "0", "protocol": 2, "created": 0.0, "gpu_state": True,
        "store": store_dir, "ref": "dump-1", "manifest": mid, "gpus": [],
        "processes": [{"pid": 1, "nspid": 1}],
        "group": {"pids": [1], "gpus": [], "done": [], "members": [], "units": [], "attachments": []}})
    return images, store_dir, mid


def test_dump_of_a_pid_that_does_not_exist(cli, env, tmp_path):
    r = cli(env, "dump", 2**22 + 1, tmp_path / "images")
    assert r.returncode == 5 and f"process {2**22 + 1}: no such process" in r.stderr
    assert not (tmp_path / "images").exists()


@pytest.mark.parametrize("args", [["--criu-opt", "restore-detached"], ["--criu-opt", "bad name"],
                                  ["--gpu-map", "GPU-a"]])
def test_restore_refuses_a_bad_option_before_anything(cli, env, image, args):
    images, *_ = image
    before = sorted(os.listdir(images))
    r = cli(env, "restore", images, *args)
    assert r.returncode == 2 and args[0] in r.stderr, r.stderr
    assert sorted(os.listdir(images)) == before


def test_restore_of_a_directory_that_does_not_exist(cli, env, tmp_path):
    r = cli(env, "restore", tmp_path / "nothing")
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_restore_of_a_damaged_record(cli, env, image):
    images, *_ = image
    (images / record.RECORD_NAME).write_text('{"format": 1}')
    r = cli(env, "restore", images)
    assert r.returncode == 12 and "field 'gpu_state' is missing" in r.stderr, r.stderr


def test_restore_whose_checkpoint_is_gone_from_the_store(cli, env, image):
    images, store_dir, _ = image
    os.unlink(os.path.join(store_dir, "refs", "dump-1"))
    r = cli(env, "restore", images)
    assert r.returncode == 6 and "refs/dump-1: no such checkpoint" in r.stderr, r.stderr


def test_restore_with_a_corrupt_manifest(cli, env, image):
    images, store_dir, mid = image
    path = os.path.join(store_dir, "manifests", f"{mid}.json")
    doc = json.load(open(path))
    doc["processes"][0]["pid"] = 2
    with open(path, "w") as f:
        json.dump(doc, f)
    r = cli(env, "restore", images)
    assert r.returncode == 6 and f"{path}: content hashes to" in r.stderr, r.stderr


def test_restore_from_a_store_named_on_the_command_line(cli, env, image, tmp_path):
    """--store wins over the record's store: an empty one lacks the checkpoint."""
    images, *_ = image
    Store.open(str(tmp_path / "other"), create=True).close()
    r = cli(env, "restore", images, "--store", tmp_path / "other")
    assert r.returncode == 6 and f"{tmp_path / 'other'}/refs/dump-1: no such checkpoint" in r.stderr
