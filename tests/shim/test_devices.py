"""GPUs by UUID (protocol 2): the devices `status` names, where each allocation and import lives,
and `recreate`/`adopt` with a devices map putting released memory on another GPU (the fake's two
devices), the program's data and later work intact, through more than one cycle."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from fakecuda.usage import read_usage
from shimtest import fake_only, fd_pass
from criu_gpushare.shimctl import client as control
from criu_gpushare.errors import ShimError

MiB = 1 << 20
UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

pytestmark = fake_only  # two devices


def driver_uuids(env):
    """The devices' UUIDs as cuda-python reads them from the driver (no shim)."""
    code = ("from cuda.bindings import driver as cu\n"
            "cu.cuInit(0)\n"
            "n = cu.cuDeviceGetCount()[1]\n"
            "print([bytes(cu.cuDeviceGetUuid(i)[1].bytes).hex() for i in range(n)])\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    return eval(out)  # noqa: S307 - a list of hex strings printed by the line above


def as_smi(hexuuid):
    h = hexuuid
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def test_status_names_every_device_and_where_memory_lives(workload, cuda_env, tmp_path):
    exporter, importer = workload(), workload()
    exporter.do("cumem a 2097152 1")  # cuMemCreate on device 1
    exporter.do("malloc b 4194304")  # backed cuMemAlloc on device 0
    st = exporter.status()
    assert st["protocol"] == 2
    devices = st["devices"]
    assert [d["ordinal"] for d in devices] == [0, 1]
    assert [d["uuid"] for d in devices] == [as_smi(h) for h in driver_uuids(cuda_env)]
    assert all(UUID.match(d["uuid"]) for d in devices)
    uuid = [d["uuid"] for d in devices]
    assert {a["device"]: a["gpu"] for a in st["allocations"]} == {0: uuid[0], 1: uuid[1]}

    fd = fd_pass(exporter, importer, "a", tmp_path)
    importer.do(f"import a {fd} 2097152")  # mapped with access for device 0
    (imp,) = importer.status()["imports"]
    assert (imp["device"], imp["gpu"]) == (0, uuid[0])
    importer.do("access a 1 rw")
    importer.do("access a 0 none")  # now only device 1 reaches it
    (imp,) = importer.status()["imports"]
    assert (imp["device"], imp["gpu"]) == (1, uuid[1])


def device_bytes(state, pid):
    """{device: bytes} that pid owns on each of the fake's two devices."""
    used = read_usage(state).get(pid, {})
    return {dev: used.get(dev, 0) for dev in (0, 1)}


def save(pid, cmd, ident, size):
    """The bytes behind an allocation (`export`) or an import (`export-import`): the fake's fds
    are memfds, so the test reads them itself."""
    _, fds = control.request(pid, cmd, id=ident)
    try:
        return os.pread(fds[0], size, 0)
    finally:
        os.close(fds[0])


def load(pid, cmd, ident, data):
    _, fds = control.request(pid, cmd, id=ident)
    try:
        os.pwrite(fds[0], data, 0)
    finally:
        os.close(fds[0])


def suspend_by_hand(w):
    """quiesce, save every allocation's bytes, release; returns {id: bytes}."""
    control.quiesce(w.pid)
    saved = {a["id"]: save(w.pid, "export", a["id"], a["size"]) for a in w.status()["allocations"]}
    control.request(w.pid, "release")
    return saved


def resume_by_hand(w, saved, **fields):
    reply, _ = control.request(w.pid, "recreate", **fields)
    for ident, data in saved.items():
        load(w.pid, "export", ident, data)
    control.resume(w.pid)
    return reply


def test_recreate_with_a_devices_map_moves_memory_to_the_other_gpu_and_back(workload, fake_env):
    state = fake_env["FAKECUDA_STATE"]
    w = workload()
    w.do("cumem c 4194304 0")  # the program's own cuMemCreate
    w.do("malloc m 4194304")  # cuMemAlloc backed by the shim
    w.do("fill c 5")
    w.do("fill m 6")
    w.do("sync")
    assert device_bytes(state, w.pid) == {0: 8 * MiB, 1: 0}

    saved = suspend_by_hand(w)
    assert sum(device_bytes(state, w.pid).values()) == 0
    assert resume_by_hand(w, saved, devices="0:1")["recreated"] == 2
    assert device_bytes(state, w.pid) == {0: 0, 1: 8 * MiB}
    st = w.status()
    uuid1 = st["devices"][1]["uuid"]
    assert [(a["device"], a["gpu"]) for a in st["allocations"]] == [(1, uuid1)] * 2
    assert {x["location"] for m in st["mappings"] for x in m["access"]} == {1}
    assert w.do("read c")["values"] == [5] * 4 and w.do("read m")["values"] == [6] * 4
    w.do("add c 1")  # kernels and copies go on, through the program's old handle and pointers
    w.do("add m 1")
    w.do("sync")
    assert w.do("read c")["values"] == [6] * 4 and w.do("read m")["values"] == [7] * 4

    # A second cycle without a map leaves it where it is; a map back brings it home.
    resume_by_hand(w, suspend_by_hand(w))
    assert device_bytes(state, w.pid) == {0: 0, 1: 8 * MiB}
    assert w.do("read c")["values"] == [6] * 4
    resume_by_hand(w, suspend_by_hand(w), devices="1:0")
    assert device_bytes(state, w.pid) == {0: 8 * MiB, 1: 0}
    assert w.do("read m")["values"] == [7] * 4
    w.do("release c")  # the program's handle value still means its memory
    w.do("unmap c")
    assert [a["origin"] for a in w.status()["allocations"]] == ["cuMemAlloc"]


def test_adopt_with_a_devices_map_puts_an_orphaned_import_on_the_other_gpu(workload, fake_env,
                                                                          tmp_path):
    state = fake_env["FAKECUDA_STATE"]
    exporter, importer = workload(), workload()
    exporter.do("cumem s 2097152")
    exporter.do("fill s 9")
    exporter.do("sync")
    fd = fd_pass(exporter, importer, "s", tmp_path)
    importer.do(f"import s {fd} 2097152")
    exporter.do("unmap s")
    exporter.do("release s")  # the exporter freed it: only the importer's mapping holds it
    control.quiesce(importer.pid)
    (imp,) = importer.status()["imports"]
    data = save(importer.pid, "export-import", imp["id"], imp["size"])
    control.request(importer.pid, "release")
    reply, _ = control.request(importer.pid, "adopt", id=imp["id"], devices="0:1")
    assert reply["adopted"] is True
    assert device_bytes(state, importer.pid) == {0: 0, 1: 2 * MiB}
    load(importer.pid, "export-import", imp["id"], data)
    control.resume(importer.pid)
    (imp,) = importer.status()["imports"]
    assert imp["device"] == 1
    assert importer.do("read s")["values"] == [9] * 4
    importer.do("add s 1")
    importer.do("sync")
    assert importer.do("read s")["values"] == [10] * 4


@pytest.mark.parametrize("spec", ["", "0", "0:", ":1", "0-1", "0:1,", "0:1;1:0", "a:b", " 0:1",
                                  "0:2", "7:0", "0:1,0:0", "99999999999999999999:0"])
def test_a_bad_devices_map_is_refused_and_changes_nothing(workload, spec):
    w = workload()
    w.do("malloc m 4194304")
    w.do("fill m 3")
    w.do("sync")
    saved = suspend_by_hand(w)
    for cmd, extra in (("recreate", {}), ("adopt", {"id": 1})):
        with pytest.raises(ShimError, match=f"{cmd} bad-request: .*devices"):
            control.request(w.pid, cmd, devices=spec, **extra)
    with pytest.raises(ShimError, match="recreate bad-request"):
        control.request(w.pid, "recreate", devices=1)
    assert all(a["dropped"] for a in w.status()["allocations"])
    resume_by_hand(w, saved)
    assert w.status()["allocations"][0]["device"] == 0
    assert w.do("read m")["values"] == [3] * 4


def test_status_answers_while_the_driver_holds_the_process_locked(workload, fake_env):
    """status makes no driver call: the device list is the driver's last answer."""
    from shimtest import ROOT
    w = workload()
    w.do("malloc m 4194304")
    tool = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "fake", "cuda_worker.py")],
                            env=fake_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert tool.stdout.readline().split()[:2] == ["ok", "ready"]
        tool.stdin.write(f"ck lock {w.pid}\n")
        tool.stdin.flush()
        assert tool.stdout.readline().split() == ["ok", "CUDA_SUCCESS"]
        st = control.status(w.pid, timeout=5)
        assert len(st["devices"]) == 2 and st["allocations"][0]["gpu"] == st["devices"][0]["uuid"]
        tool.stdin.write(f"ck unlock {w.pid}\n")
        tool.stdin.flush()
        assert tool.stdout.readline().split() == ["ok", "CUDA_SUCCESS"]
    finally:
        tool.kill()
        tool.wait()
    assert json.dumps(w.do("read m"))
