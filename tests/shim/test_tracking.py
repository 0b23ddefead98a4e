"""What the shim records for each kind of object a program creates or shares (fake driver)."""
from __future__ import annotations

import pytest

from shimtest import fake_only, fd_pass
from criu_gpushare.shimctl import client as control
from criu_gpushare.errors import ShimError

MiB = 1 << 20


def by_id(items, id_):
    return next(x for x in items if x["id"] == id_)


def alloc_at(st, ptr):
    return next(a for a in st["allocations"] if a["va"] == ptr)


def test_large_cumemalloc_is_backed_by_exportable_cumem_and_works(workload):
    w = workload()
    big = w.do("malloc big 4194304")["ptr"]
    small = w.do("malloc small 65536")["ptr"]
    w.do("fill big 7")
    w.do("add big 5")
    w.do("sync")
    assert w.do("read big 4")["values"] == [12] * 4

    st = w.status()
    a = alloc_at(st, big)
    assert a["origin"] == "cuMemAlloc" and a["size"] >= 4 * MiB and a["device"] == 0
    assert a["handle_types"] & 1, "the backing memory must be exportable as a POSIX fd"
    assert [a for a in st["allocations"] if a["va"] == small] == [], "small ones stay the driver's"
    m = next(m for m in st["mappings"] if m["va"] == big)
    assert m["object"] == "allocation" and m["id"] == a["id"]
    assert [(x["location"], x["prot"]) for x in m["access"]] == [(0, "rw")]

    w.do("free big")
    assert w.status()["allocations"] == []


def test_backing_threshold_is_configurable(workload):
    w = workload({"CRIU_GPUSHARE_MALLOC_MIN": "0"})  # 0 turns the backing off
    w.do("malloc big 4194304")
    assert w.status()["allocations"] == []


@fake_only
def test_cumemcreate_gets_fd_capability_and_access_is_merged(workload):
    w = workload()
    r = w.do("cumem buf 2097152 0 0")  # created without any shareable handle type
    st = w.status()
    a = st["allocations"][0]
    assert a["origin"] == "cuMemCreate" and a["handle_types"] & 1
    w.do("export buf")  # possible only because the shim added the capability

    w.do("access buf 1 rw")
    w.do("access buf 0 r")
    m = next(m for m in w.status()["mappings"] if m["va"] == r["ptr"])
    assert sorted((x["location"], x["prot"]) for x in m["access"]) == [(0, "r"), (1, "rw")]
    w.do("access buf 1 none")
    m = next(m for m in w.status()["mappings"] if m["va"] == r["ptr"])
    assert [(x["location"], x["prot"]) for x in m["access"]] == [(0, "r")]


def test_released_allocation_lives_while_mapped_and_its_id_dies_with_it(workload):
    w = workload()
    w.do("cumem buf 2097152")
    w.do("export buf")
    w.do("release buf")
    st = w.status()
    assert st["allocations"][0]["app_released"] is True
    assert len(st["exports"]) == 1
    w.do("unmap buf")
    st = w.status()
    assert st["allocations"] == [] and st["mappings"] == [] and st["exports"] == []


def test_retained_handle_resolves_to_its_allocation(workload):
    w = workload()
    w.do("cumem buf 2097152")
    w.do("release buf")
    w.do("retain buf")
    w.do("export buf")  # NCCL exports a retained handle
    st = w.status()
    assert st["exports"][0]["object"] == "allocation"
    assert st["exports"][0]["id"] == st["allocations"][0]["id"]
    assert st["untracked"] == []


def test_fd_import_is_linked_to_its_exporter(workload, tmp_path):
    exporter, importer = workload(), workload()
    exporter.do("cumem shared 2097152")
    exporter.do("fill shared 41")
    exporter.do("sync")
    fd = fd_pass(exporter, importer, "shared", tmp_path)
    importer.do(f"import shared {fd} 2097152")
    assert importer.do("read shared 2")["values"] == [41, 41]

    alloc_id = exporter.status()["allocations"][0]["id"]
    st = importer.status()
    (imp,) = st["imports"]
    assert imp["kind"] == "posix-fd" and imp["size"] == 2097152
    assert imp["exporter"] == {"pid": exporter.pid, "id": alloc_id}
    assert st["untracked"] == []
    m = next(m for m in st["mappings"] if m["object"] == "import")
    assert m["id"] == imp["id"]


def test_import_from_a_process_without_shim_is_refused_at_quiesce(workload, cuda_env, tmp_path):
    exporter = workload(env=cuda_env)  # no shim
    importer = workload()
    exporter.do("cumem shared 2097152")
    fd = fd_pass(exporter, importer, "shared", tmp_path)
    importer.do(f"import shared {fd} 2097152")
    st = importer.status()
    assert st["imports"][0]["exporter"] is None
    assert any("no process with the shim exported" in u for u in st["untracked"])
    with pytest.raises(ShimError, match="refused.*no process with the shim exported"):
        control.quiesce(importer.pid)
    assert not importer.status()["gates"]["launch"]["closed"]


def test_import_made_before_the_exporter_had_a_shim_socket_resolves_at_quiesce(workload, tmp_path):
    """An import whose exporter did not answer at import time is asked about again at quiesce."""
    exporter, importer = workload(), workload()
    exporter.do("cumem shared 2097152")
    fd = fd_pass(exporter, importer, "shared", tmp_path)
    exporter.proc.send_signal(19)  # SIGSTOP: the exporter cannot answer during the import
    try:
        importer.do(f"import shared {fd} 2097152", timeout=60)
    finally:
        exporter.proc.send_signal(18)  # SIGCONT
    assert importer.status()["imports"][0]["exporter"] is None
    control.quiesce(importer.pid)
    control.resume(importer.pid)
    alloc_id = exporter.status()["allocations"][0]["id"]
    assert importer.status()["imports"][0]["exporter"] == {"pid": exporter.pid, "id": alloc_id}


def test_legacy_ipc_of_shim_memory_goes_through_the_shim(workload):
    exporter, importer = workload(), workload()
    exporter.do("malloc buf 4194304")
    exporter.do("fill buf 99")
    exporter.do("sync")
    handle = exporter.do("ipcget buf")["handle"]
    ptr = importer.do(f"ipcopen buf {handle} 4194304")["ptr"]
    assert importer.do("read buf 3")["values"] == [99, 99, 99]
    importer.do("add buf 1")
    importer.do("sync")
    assert exporter.do("read buf 1")["values"] == [100]

    (alloc,) = exporter.status()["allocations"]
    assert alloc["ipc_handles"] == 1
    alloc_id = alloc["id"]
    st = importer.status()
    (imp,) = st["imports"]
    assert imp["kind"] == "cuda-ipc" and imp["va"] == ptr
    assert imp["exporter"] == {"pid": exporter.pid, "id": alloc_id}
    assert st["untracked"] == []
    importer.do("ipcclose buf")
    st = importer.status()
    assert st["imports"] == [] and st["mappings"] == []


def test_legacy_ipc_of_foreign_memory_is_recorded_as_untracked(workload, cuda_env):
    exporter = workload(env=cuda_env)  # no shim: a real driver IPC handle
    importer = workload()
    exporter.do("malloc buf 4194304")
    handle = exporter.do("ipcget buf")["handle"]
    importer.do(f"ipcopen buf {handle}")
    st = importer.status()
    assert st["notes"] == []
    assert any("CUDA IPC import(s) of memory not allocated through the shim" in u
               for u in st["untracked"])
    with pytest.raises(ShimError, match="refused"):
        control.quiesce(importer.pid)
    importer.do("ipcclose buf")
    assert importer.status()["untracked"] == []


def test_ipc_of_memory_below_the_backing_threshold_is_refused_in_the_importer_only(workload):
    exporter, importer = workload(), workload()
    exporter.do("malloc small 65536")  # the driver's own memory: a driver IPC handle
    handle = exporter.do("ipcget small")["handle"]
    importer.do(f"ipcopen small {handle} 65536")
    assert any("CUDA IPC handle(s)" in n for n in exporter.status()["notes"])
    control.quiesce(exporter.pid)  # the exporter itself can be checkpointed
    control.resume(exporter.pid)
    with pytest.raises(ShimError, match="refused.*below the cuMem backing threshold, "
                                        "CRIU_GPUSHARE_MALLOC_MIN in the exporter's environment"):
        control.quiesce(importer.pid)
    importer.do("ipcclose small")
    control.quiesce(importer.pid)  # nothing of the exporter's left open: it can be checkpointed
    control.resume(importer.pid)


def test_ipc_of_small_memory_backed_by_a_lower_threshold_can_be_checkpointed_in_the_importer(
        workload):
    """CRIU_GPUSHARE_MALLOC_MIN lowered in the exporter: the small allocation is the shim's (its
    IPC handle names it by id), so its importer is no longer refused."""
    exporter, importer = workload({"CRIU_GPUSHARE_MALLOC_MIN": "4096"}), workload()
    exporter.do("malloc small 4096")
    exporter.do("fill small 9")
    exporter.do("sync")
    handle = exporter.do("ipcget small")["handle"]
    assert bytes.fromhex(handle)[:8] == b"CRIUGSH1"
    importer.do(f"ipcopen small {handle} 4096")
    assert importer.do("read small")["values"] == [9] * 4
    control.quiesce(importer.pid)
    control.resume(importer.pid)


def test_page_locked_host_memory_is_tracked(workload):
    w = workload()
    a = w.do("hostalloc a 65536 4")["ptr"]  # WRITECOMBINED
    b = w.do("allochost b 65536")["ptr"]
    c = w.do("hostreg c 65536")["ptr"]
    hosts = {h["ptr"]: h for h in w.status()["host_buffers"]}
    # Registered PORTABLE | DEVICEMAP: usable from every context, at a device pointer kept for
    # re-registering after a restore.
    assert hosts[a]["owned"] and hosts[a]["register_flags"] == 3 and hosts[a]["device_ptr"]
    assert hosts[b]["owned"] and hosts[b]["register_flags"] == 3 and hosts[b]["device_ptr"]
    assert not hosts[c]["owned"] and hosts[c]["register_flags"] == 0
    w.do("hostunreg c")
    w.do("freehost a")
    w.do("freehost b")
    assert w.status()["host_buffers"] == []


@fake_only
def test_peer_access_is_recorded_and_applied_to_backed_memory(workload):
    w = workload()
    ptr = w.do("malloc remote 2097152 1")["ptr"]  # on device 1
    w.do("peer 1")  # device 0 may access device 1's memory
    st = w.status()
    assert st["peer_access"] == [{"owner": 1, "accessor": 0}]
    m = next(m for m in st["mappings"] if m["va"] == ptr)
    assert sorted(x["location"] for x in m["access"]) == [0, 1]


@fake_only
def test_multicast_objects_and_binds_are_tracked(workload):
    w = workload()
    w.do("cumem buf 2097152")
    w.do("mc buf")
    st = w.status()
    (mc,) = st["multicast"]
    assert mc["devices"] == [0] and mc["num_devices"] == 1
    (bind,) = st["multicast_binds"]
    assert bind["multicast"] == mc["id"] and bind["allocation"] == st["allocations"][0]["id"]
    w.do("unbind buf")
    assert w.status()["multicast_binds"] == []


@fake_only
def test_joined_multicast_object_is_linked_to_its_creator(workload, tmp_path):
    creator, member = workload(), workload()
    creator.do("cumem buf 2097152")
    creator.do("mc buf")
    path = str(tmp_path / "mc.sock")
    member.do(f"listen {path}")
    fd = creator.do("mcexport buf")["fd"]
    creator.do(f"sendfd {fd} {path}")
    member.do(f"mcimport group {member.do('recvfd')['fd']}")
    (mc,) = creator.status()["multicast"]
    assert mc["creator"] is None and creator.status()["notes"] == []
    st = member.status()
    assert st["imports"] == [] and st["untracked"] == []
    (joined,) = st["multicast"]
    assert joined["creator"] == {"pid": creator.pid, "id": mc["id"]}
    assert joined["devices"] == [1]
