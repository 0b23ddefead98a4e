"""The shim's suspend/resume commands one by one (protocol.md, "Suspend and resume"), without the
tool: what each drops and brings back, idempotence, and the refusals."""
import os

import pytest

from criu_gpushare.shimctl import client as control
from criu_gpushare.errors import ShimError

from lctest import SIZE, device_usage, share, values, write


def test_commands_need_the_quiesced_state(workload):
    a = workload()
    a.do(f"cumem buf {SIZE}")
    for cmd in ("release", "void-exports", "recreate"):
        with pytest.raises(ShimError, match=f"{cmd} not-quiesced"):
            control.request(a.pid, cmd)
    with pytest.raises(ShimError, match="adopt not-quiesced"):
        control.request(a.pid, "adopt", id=1)
    assert control.status(a.pid)["state"] == "running"
    write(a, "buf", 3)  # nothing was dropped
    assert values(a, "buf") == [3] * 4


def test_bad_requests(workload):
    a = workload()
    control.quiesce(a.pid)
    with pytest.raises(ShimError, match="attach bad-request: attach takes exactly one fd"):
        control.request(a.pid, "attach", id=1)
    with pytest.raises(ShimError, match="adopt bad-request"):
        control.request(a.pid, "adopt")
    with pytest.raises(ShimError, match="bad-request"):
        control.request(a.pid, "release", only="owned")
    with pytest.raises(ShimError, match="export-import gone"):
        control.request(a.pid, "export-import", id=999)
    control.resume(a.pid)


def test_release_recreate_resume_by_hand(lc, workload, tmp_path):
    a, b = workload(), workload()
    export_fd, _ = share(a, b, tmp_path)
    a.do("hostalloc pinned 65536 0")
    for w in (a, b):
        control.quiesce(w.pid)
    assert control.status(a.pid)["state"] == "quiesced"
    reply, _ = control.request(b.pid, "release", only="imports")
    assert reply["imports"] == 1 and reply["allocations"] == 0
    reply, _ = control.request(a.pid, "release")
    assert (reply["allocations"], reply["host_buffers"]) == (1, 1)
    assert control.request(a.pid, "release")[0]["allocations"] == 0  # idempotent
    st = control.status(a.pid)
    assert st["state"] == "released"
    assert all(x["dropped"] for x in st["allocations"] + st["mappings"] + st["host_buffers"])
    # the gates stay closed while anything is released
    with pytest.raises(ShimError, match="resume refused: 1 allocation"):
        control.resume(a.pid)
    reply, _ = control.request(a.pid, "void-exports")
    assert reply["voided"] == 1
    assert os.readlink(f"/proc/{a.pid}/fd/{export_fd}") == "/dev/null"
    if lc.state:  # the fake counts allocations only (a real GPU shows the context's memory too)
        assert device_usage(lc, a.pid) == 0
    assert control.request(a.pid, "recreate")[0]["recreated"] == 1
    assert control.request(a.pid, "recreate")[0]["recreated"] == 0  # idempotent
    reply, fds = control.request(a.pid, "export", id=st["allocations"][0]["id"])
    try:
        imp = control.status(b.pid)["imports"][0]
        assert control.request(b.pid, "attach", fds=(fds[0],), id=imp["id"])[0]["attached"]
        assert not control.request(b.pid, "attach", fds=(fds[0],), id=imp["id"])[0]["attached"]
    finally:
        os.close(fds[0])
    for w in (a, b):
        control.resume(w.pid)
    st = control.status(a.pid)
    assert st["state"] == "running" and not st["host_buffers"][0]["dropped"]
    write(a, "buf", 12)
    assert values(b, "buf") == [12] * 4


def test_export_of_many_ids_sends_their_fds_in_their_order(lc, workload):
    a = workload()
    sizes = [2 << 20, 6 << 20, 4 << 20]
    for k, size in enumerate(sizes):
        a.do(f"cumem m{k} {size}")
    ids = [x["id"] for x in control.status(a.pid)["allocations"]]
    _, fds = control.request(a.pid, "export", ids=",".join(map(str, ids)))
    try:
        assert len(fds) == 3
        if lc.state:  # the fake's exports are memfds of the allocation's size
            assert [os.fstat(fd).st_size for fd in fds] == sizes
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.parametrize("fields", [{"ids": ""}, {"ids": "1,x"}, {"ids": "1,,2"}, {"ids": "0"},
                                    {"ids": ",".join(["1"] * 33)}, {"id": 1, "ids": "1"}, {}])
def test_export_refuses_bad_id_lists(workload, fields):
    a = workload()
    a.do(f"cumem buf {SIZE}")
    with pytest.raises(ShimError, match="export bad-request"):
        control.request(a.pid, "export", **fields)


def test_export_of_many_ids_with_one_unknown_sends_no_fd(workload):
    a = workload()
    a.do(f"cumem buf {SIZE}")
    known = control.status(a.pid)["allocations"][0]["id"]
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(ShimError, match="export (failed|gone)"):
        control.request(a.pid, "export", ids=f"{known},999999")
    assert set(os.listdir("/proc/self/fd")) <= before


def test_release_keeping_fds_brings_the_same_bytes_back(lc, workload):
    """release with keep: each allocation's memory outlives the release through an fd the shim
    keeps (the tool copies it out from a dup while the driver checkpoints); recreate maps that
    memory again, bytes and all, and says so (`intact`); drop-kept lets it go."""
    a = workload()
    a.do(f"cumem buf {SIZE}")
    write(a, "buf", 7)
    control.quiesce(a.pid)
    reply, _ = control.request(a.pid, "release", keep="fds")
    assert (reply["allocations"], reply["kept"]) == (1, 1)
    alloc = control.status(a.pid)["allocations"][0]
    assert alloc["dropped"] and alloc["kept"] and not alloc["intact"]
    _, fds = control.request(a.pid, "export", id=alloc["id"])  # a dup of the kept fd
    os.close(fds[0])
    assert control.request(a.pid, "recreate")[0]["recreated"] == 1
    alloc = control.status(a.pid)["allocations"][0]
    assert alloc["intact"] and not alloc["fresh"] and not alloc["kept"] and not alloc["dropped"]
    control.resume(a.pid)
    assert values(a, "buf") == [7] * 4  # nothing was loaded: the kept memory itself came back


def test_drop_kept_closes_the_kept_fds_and_recreate_then_gives_new_memory(workload):
    a = workload()
    a.do(f"cumem buf {SIZE}")
    write(a, "buf", 5)
    control.quiesce(a.pid)
    control.request(a.pid, "release", keep="fds")
    open_fds = len(os.listdir(f"/proc/{a.pid}/fd"))
    assert control.request(a.pid, "drop-kept")[0]["closed"] == 1
    assert len(os.listdir(f"/proc/{a.pid}/fd")) == open_fds - 1  # the kept fd, closed
    assert control.request(a.pid, "drop-kept")[0]["closed"] == 0  # idempotent
    alloc = control.status(a.pid)["allocations"][0]
    with pytest.raises(ShimError, match="export gone: gone: allocation .* is released"):
        control.request(a.pid, "export", id=alloc["id"])
    assert control.request(a.pid, "recreate")[0]["recreated"] == 1
    alloc = control.status(a.pid)["allocations"][0]
    assert alloc["fresh"] and not alloc["intact"]  # new memory: the tool loads it
    control.resume(a.pid)


def test_release_refuses_an_unknown_keep(workload):
    a = workload()
    a.do(f"cumem buf {SIZE}")
    control.quiesce(a.pid)
    for keep in ("memory", 1):
        with pytest.raises(ShimError, match="release bad-request: release: \"keep\" can only be"):
            control.request(a.pid, "release", keep=keep)
    assert not control.status(a.pid)["allocations"][0]["dropped"]
    control.resume(a.pid)
    with pytest.raises(ShimError, match="drop-kept not-quiesced"):
        control.request(a.pid, "drop-kept")
