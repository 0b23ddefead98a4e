"""criu_gpushare/engine/steps.py on its own: the step lists and the undo table (what a resume, a
restore and a rollback run, in which order), the group's durable form, the pre-load check of the
store, and the summary line a user reads. The steps' effects on workloads are test_cycles.py,
test_rollback.py and test_recovery.py."""
import os
import random
import re

import pytest

from criu_gpushare.engine import steps
from criu_gpushare.engine.steps import CRIU_PRE_DUMP, IN_PLACE, UNDO, Group, Options
from criu_gpushare.errors import StoreError
from criu_gpushare.store import Allocation, Manifest, NodeCache, ProcessEntry, Store


@pytest.fixture
def store(tmp_path):
    with Store.open(str(tmp_path / "store"), create=True) as s:
        yield s


def chunk_bytes(seed):
    return random.Random(seed).randbytes(4096)


def checkpoint(store, datas):
    """A checkpoint "ck" of `datas` (one chunk each): its manifest and chunk files."""
    with store.begin_write("ck") as session:
        puts = [session.put(d) for d in datas]
        session.commit("ck", Manifest([ProcessEntry(1, [Allocation.from_puts("a", puts)])]))
    return (store.read_manifest(store.read_ref("ck").manifest),
            [store.chunk_path(p.chunk_id) for p in puts], [p.chunk_id for p in puts])


def documented(part):
    """The step names the module's docstring lists under "Out" or "Back", in order."""
    text = steps.__doc__.split("Back (")[0 if part == "out" else 1]
    return re.findall(r"^  (\w+) ", text, flags=re.M)


def test_the_docstring_lists_the_steps_in_the_order_they_run():
    assert documented("out") == list(CRIU_PRE_DUMP)
    assert documented("back") == [undo for _, undo in UNDO]


def test_in_place_is_the_criu_list_without_its_criu_steps():
    assert CRIU_PRE_DUMP[:len(IN_PLACE)] == IN_PLACE
    assert CRIU_PRE_DUMP[len(IN_PLACE):] == ("vacate", "stop")


def test_what_each_step_changes_is_undone_and_nothing_else():
    undone = {step for step, _ in UNDO}
    # save only writes the store; void cannot be undone (fds the program kept stay /dev/null), nor
    # unkeep (the memory kept for the save is freed once the store holds it); vacate only checks;
    # stop is undone by restore (it takes stopped processes back)
    assert undone == set(IN_PLACE) - {"save", "void", "unkeep"}
    back = [undo for _, undo in UNDO]
    assert back.index("restore") < back.index("unlock") < back.index("thaw")  # no process runs
    assert back.index("recreate") < back.index("load") < back.index("attach")  # before its peers
    assert back[-1] == "reopen"  # GPU work runs again only once every byte is back


def test_every_listed_step_has_a_function(tmp_path):
    group = Group([1], Options(store=str(tmp_path)))
    for name in set(CRIU_PRE_DUMP) | {undo for _, undo in UNDO}:
        assert callable(group.step(name)), name
    with pytest.raises(KeyError):
        group.step("no-such-step")


def test_a_group_comes_back_whole_from_its_durable_form(tmp_path):
    group = Group([12, 10, 12], Options(store=str(tmp_path)))
    group.gpus, group.done = ["GPU-a"], ["quiesce", "save"]
    group.handover.restore_tids = {10: 3}
    state = group.state()
    assert state["pids"] == [10, 12]
    back = Group.from_state(state, Options(store=str(tmp_path)))
    assert back.state() == state and back.handover.restore_tids == {10: 3}


def test_the_store_check_names_each_unreadable_chunk_and_what_it_means(store):
    manifest, paths, _ = checkpoint(store, [chunk_bytes(1), chunk_bytes(2)])
    steps.check_readable(store, manifest, "ck", "nothing was changed")  # all there
    os.unlink(paths[1])
    with pytest.raises(StoreError) as e:
        steps.check_readable(store, manifest, "ck", "nothing was changed")
    assert f"1 chunk(s) of ck cannot be read: missing {paths[1]}" in str(e.value)
    assert str(e.value).endswith("nothing was changed")


def test_a_chunk_the_node_cache_holds_is_readable(store, tmp_path):
    manifest, paths, ids = checkpoint(store, [chunk_bytes(3)])
    with NodeCache.open(str(tmp_path / "cache")) as cache:
        cache.insert(ids[0], memoryview(chunk_bytes(3)))
        os.unlink(paths[0])
        with Store.open(store.path, cache=cache) as cached:
            steps.check_readable(cached, manifest, "ck", "-")
        with pytest.raises(StoreError):
            steps.check_readable(store, manifest, "ck", "-")  # the same, without the cache
