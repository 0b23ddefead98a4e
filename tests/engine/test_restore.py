"""criu_gpushare/engine/restore.py on its own: what a restore refuses (the image and the store
before CRIU restores anything, the GPUs at CRIU's post-restore; each refusal names what is wrong and
what to do), and the pid map from the dump's pids to the restored tree's. The whole restore under
CRIU is tests/hook/test_gpu_dump.py."""
import os
import random

import pytest

from criu_gpushare.engine import record, restore
from criu_gpushare.errors import ImageError, StoreError
from criu_gpushare.gpu.copy_engine import CHUNK_SIZE
from criu_gpushare.store import Allocation, Manifest, ProcessEntry, Store

H200 = {"uuid": "GPU-aaaa", "name": "NVIDIA H200", "memory": 140 * 2**30}


@pytest.fixture
def image(tmp_path, monkeypatch):
    """An image directory whose record names a checkpoint of 2 chunks (8 KiB) on GPU-aaaa, and a
    machine with that GPU (the driver's answers stand in: nothing here needs a GPU)."""
    store_dir = str(tmp_path / "store")
    with Store.open(store_dir, create=True) as store, store.begin_write("dump-1") as session:
        puts = [session.put(random.Random(i).randbytes(4096)) for i in range(2)]
        mid = session.commit("dump-1", Manifest([ProcessEntry(1, [Allocation.from_puts("a", puts)])]))
    rec = {"format": 1, "tool": "0", "protocol": 2, "created": 0.0, "gpu_state": True,
           "store": store_dir, "ref": "dump-1", "manifest": mid, "gpus": [H200],
           "processes": [{"pid": 1, "nspid": 1}],
           "group": {"pids": [1], "gpus": ["GPU-aaaa"], "done": [],
                     "members": [{"cuda": True, "served": True}],
                     "units": [{"gpu": "GPU-aaaa", "device": 0, "size": 8192}], "attachments": []}}
    images = tmp_path / "images"
    images.mkdir()
    record.write(str(images), rec)
    gpus = [H200]
    monkeypatch.setattr(restore.drv, "gpu_inventory", lambda: gpus)
    monkeypatch.setattr(restore, "free_memory", lambda ordinal: 2**30)
    return str(images), rec, store_dir, gpus, puts


def check(images, store_path=None, gpu_map=None, has_libcuda=None, headroom=None):
    """The whole check, as a restore makes it: the image and the store, then the GPUs."""
    rec, manifest = restore.check_image(images, store_path, has_libcuda)
    if rec is not None:
        room = restore.check_gpus(images, rec, gpu_map)
        if headroom is not None:
            headroom.update(room)
    return rec, manifest


def test_an_image_that_fits_this_machine_passes(image):
    images, rec, *_ = image
    assert check(images)[0] == rec


def test_an_image_without_gpu_state_needs_nothing(image):
    images, rec, *_ = image
    record.write(images, dict(rec, gpu_state=False))
    assert check(images) == (None, None)


def test_an_image_without_a_record_is_refused_unless_its_tree_has_no_cuda(tmp_path):
    with pytest.raises(record.RecordMissing, match="not dumped through criu-gpushare"):
        check(str(tmp_path), has_libcuda=lambda: True)
    assert check(str(tmp_path), has_libcuda=lambda: False) == (None, None)


def test_a_lost_chunk_is_refused_naming_it(image):
    images, _, store_dir, _, puts = image
    with Store.open(store_dir) as store:
        lost = store.chunk_path(puts[1].chunk_id)
    os.unlink(lost)
    with pytest.raises(StoreError, match=f"missing {lost}.*nothing was restored"):
        check(images)


def test_another_store_can_be_named(image, tmp_path):
    images, _, store_dir, *_ = image
    os.rename(store_dir, str(tmp_path / "moved"))
    with pytest.raises(StoreError):
        check(images)
    assert check(images, store_path=str(tmp_path / "moved"))[0]["ref"] == "dump-1"


def test_a_missing_gpu_is_refused_saying_how_to_map_it(image):
    images, _, _, gpus, _ = image
    gpus[:] = [dict(H200, uuid="GPU-bbbb")]
    with pytest.raises(ImageError, match="GPU-aaaa .NVIDIA H200. is not on this machine: restore "
                                         "it with --gpu-map GPU-aaaa=<UUID of a GPU here> "
                                         r"\(here: GPU-bbbb\)"):
        check(images)
    assert check(images, gpu_map={"GPU-aaaa": "GPU-bbbb"})[0]["ref"] == "dump-1"


def test_a_gpu_of_another_model_is_refused(image):
    images, _, _, gpus, _ = image
    gpus[:] = [dict(H200, name="NVIDIA A100")]
    with pytest.raises(ImageError, match="was a NVIDIA H200; GPU-aaaa here is a NVIDIA A100"):
        check(images)


def test_a_gpu_without_room_is_refused(image, monkeypatch):
    images, *_ = image
    monkeypatch.setattr(restore, "free_memory", lambda ordinal: 4096)
    with pytest.raises(ImageError, match="needs 0.00 GiB on GPU GPU-aaaa, which has 0.00 GiB free"):
        check(images)


def test_the_pid_map_follows_each_process_by_its_pid_in_its_namespace(monkeypatch):
    rec = {"processes": [{"pid": 100, "nspid": 7}, {"pid": 101, "nspid": 8}]}
    monkeypatch.setattr(restore, "process_tree", lambda root: [500, 501])
    monkeypatch.setattr(restore.control, "ns_pid", {500: 8, 501: 7}.get)
    assert restore.pid_map(rec, 500) == {100: 501, 101: 500}
    monkeypatch.setattr(restore, "process_tree", lambda root: [500])
    with pytest.raises(ImageError, match="process 100 .pid 7 in its namespace. of the dump is not "
                                         "in the restored tree"):
        restore.pid_map(rec, 500)


def test_check_tells_each_gpus_room_to_spare(image):
    images, rec, *_ = image
    room = {}
    check(images, headroom=room)
    assert room == {0: 2**30 - 8192}, "free (1 GiB) less the 8 KiB that comes back"


@pytest.mark.parametrize("room, pinned", [({0: 8 << 30}, True), ({0: 8 << 30, 1: 1 << 30}, False),
                                          ({}, False)])
def test_the_loads_ring_is_pinned_ahead_only_where_every_gpu_has_room(monkeypatch, room, pinned):
    """Pinning ahead makes this process's context before the driver restores the processes' memory:
    on a GPU with little to spare the old order stays (the ring pinned by the load, after)."""
    calls, released = [], []
    monkeypatch.setattr(restore, "pin_ahead", lambda size, count, device: calls.append((size, count, device)))
    monkeypatch.setattr(restore, "release_device", released.append)
    assert restore.pin_ring_ahead(room, 3 * CHUNK_SIZE + 1) is pinned
    assert calls == ([(CHUNK_SIZE, 4, 0)] if pinned else [])
    # the contexts the GPU check made are kept only for the ring (and the load ahead)
    assert released == ([] if pinned else sorted(room))
