"""Planning a group: each piece of GPU memory saved once, by the right owner; refusals up front."""
import json

import pytest

from criu_gpushare.engine import plan as grp
from criu_gpushare.errors import ProcessError

MIB = 1 << 20


def member(pid, allocations=(), imports=(), mappings=(), cuda=True, shim=True, untracked=()):
    status = None if not shim else {
        "allocations": [dict(id=i, size=s, device=d, exports=e) for i, s, d, e in allocations],
        "imports": [dict(id=i, size=s, exporter=None if ep is None else {"pid": ep, "id": eid})
                    for i, s, ep, eid in imports],
        "mappings": list(mappings), "untracked": list(untracked)}
    return grp.Member(pid, cuda, shim, status)


def test_shared_memory_is_saved_once_by_its_exporter_and_attached_by_importers():
    exporter = member(10, allocations=[(1, 64 * MIB, 0, 1), (2, 2 * MIB, 0, 0)])
    importer = member(20, imports=[(7, 64 * MIB, 10, 1)])
    units, attachments = grp.make_plan([importer, exporter])
    assert [(u.owner, u.kind, u.id) for u in units] == [(10, "allocation", 1), (10, "allocation", 2)]
    assert [(a.importer, a.import_id, a.unit.id) for a in attachments] == [(20, 7, 1)]


def test_memory_the_exporter_freed_is_adopted_by_the_lowest_importer():
    exporter = member(10)  # freed allocation 1, which 20 and 30 still map
    mappings = [{"object": "import", "id": 5, "access": [{"location": 1, "prot": "rw"}]}]
    a = member(20, imports=[(5, 8 * MIB, 10, 1)], mappings=mappings)
    b = member(30, imports=[(9, 8 * MIB, 10, 1)])
    units, attachments = grp.make_plan([b, a, exporter])
    assert [(u.owner, u.kind, u.id, u.device) for u in units] == [(20, "import", 5, 1)]
    assert [(x.importer, x.import_id, x.unit.owner) for x in attachments] == [(30, 9, 20)]


def test_a_cuda_process_without_the_shim_is_refused_when_the_group_shares():
    sharing = member(10, allocations=[(1, MIB, 0, 1)])
    plain = member(11, cuda=True, shim=False)
    with pytest.raises(ProcessError, match="process 11: uses CUDA without the criu-gpushare shim"):
        grp.check([sharing, plain])
    grp.check([member(10, allocations=[(1, MIB, 0, 0)]), plain])  # nothing shared: fine


def test_an_import_from_outside_the_group_is_refused(monkeypatch):
    monkeypatch.setattr(grp, "_alive", lambda pid: True)
    with pytest.raises(ProcessError, match="from process 99, which is not in the group"):
        grp.check([member(20, imports=[(5, MIB, 99, 1)])])


def test_what_the_shim_cannot_track_is_refused_with_its_reason():
    with pytest.raises(ProcessError, match="process 20: cannot be checkpointed: 1 CUDA IPC import"):
        grp.check([member(20, untracked=["1 CUDA IPC import of memory not allocated through the shim"])])


def _claims_import_from(pid):
    return ("--reply", json.dumps({"v": 2, "ok": True, "imports": [
        {"id": 1, "kind": "posix-fd", "exporter": {"pid": pid, "id": 1}}]}))


def test_an_outside_importer_of_the_same_user_is_refused(sleeper, fake_server):
    importer = fake_server("reply", *_claims_import_from(sleeper.pid))
    with pytest.raises(ProcessError, match=f"process {importer}: imports GPU memory from process "
                                           f"{sleeper.pid} of the group"):
        grp._check_outside_importers({sleeper.pid})


def test_another_users_claim_to_import_from_the_group_is_not_believed(sleeper, fake_server):
    """uid nobody's server says it maps memory of root's member: the member's shim never answers
    her, so the claim is false and must not stop the suspend."""
    fake_server("reply", "--uid", 65534, *_claims_import_from(sleeper.pid))
    grp._check_outside_importers({sleeper.pid})


def test_a_full_backlog_does_not_stop_the_check(sleeper, fake_server):
    fake_server("squat")
    grp._check_outside_importers({sleeper.pid})
