"""gc running while writers add chunks: nothing a ref reaches is ever lost (FORMAT.md section 8).

Writer processes dump checkpoints whose chunks mostly deduplicate against old, unreferenced chunks
(exactly what gc wants to remove) and drop their older refs, while a gc process collects with a
zero grace period in a loop. At the end every remaining checkpoint must verify completely.
"""
import os
import subprocess
import sys

from criu_gpushare.store import Store, collect_garbage, verify_store

from store_helpers import age, age_store, chunk_bytes, chunk_path

POOL = 40
WRITER = """
import random, sys
from criu_gpushare.store import Store
from store_helpers import chunk_bytes, commit_checkpoint
store_dir, k, rounds, pool = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(k)
with Store.open(store_dir) as s:
    for i in range(rounds):
        seeds = rng.sample(range(pool), 6) + [100000 + 1000 * k + i]
        commit_checkpoint(s, f"w{k}-{i}", [chunk_bytes(seed, 2048) for seed in seeds], pid=k)
        if i >= 2:
            s.remove_ref(f"w{k}-{i - 2}")
"""
GC = """
import os, sys
from criu_gpushare.store import Store, collect_garbage
store_dir, stop = sys.argv[1], sys.argv[2]
runs = removed = 0
with Store.open(store_dir) as s:
    while not os.path.exists(stop) or runs < 3:
        r = collect_garbage(s, grace_s=0)
        runs, removed = runs + 1, removed + r.chunks_removed
print(runs, removed)
"""


def test_gc_concurrent_with_writers_loses_nothing_referenced(store_dir, tmp_path):
    with Store.open(store_dir, create=True) as st:
        for seed in range(POOL):  # old, unreferenced: gc's prey, and the writers' dedup targets
            age(chunk_path(st, st.put(chunk_bytes(seed, 2048)).chunk_id), 7200)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    stop = tmp_path / "stop"
    gc = subprocess.Popen([sys.executable, "-c", GC, store_dir, str(stop)], env=env,
                          stdout=subprocess.PIPE, text=True)
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, store_dir, str(k), "40", str(POOL)],
                                env=env) for k in range(3)]
    try:
        assert [w.wait(timeout=120) for w in writers] == [0, 0, 0]
    finally:
        stop.touch()
        out, _ = gc.communicate(timeout=60)
    assert gc.returncode == 0
    runs, removed = map(int, out.split())
    assert runs >= 3 and removed > 0, "gc never removed anything: the test raced nothing"

    with Store.open(store_dir) as st:
        assert len(st.list_refs()) == 3 * 2
        report = verify_store(st)
        assert report.problems == [] and report.refs == 6
        # And once the writers are gone, a final gc keeps exactly what the refs reach.
        age_store(store_dir)
        collect_garbage(st, grace_s=0)
        report = verify_store(st, all_chunks=True)
        assert report.problems == []
        files = [f for _, _, fs in os.walk(os.path.join(store_dir, "chunks")) for f in fs]
        referenced = {cid for name in st.list_refs()
                      for cid, _ in st.read_manifest(st.read_ref(name).manifest).chunk_ids()}
        assert set(files) == referenced
