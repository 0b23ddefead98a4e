"""The benchmarks' CPU-side logic (bench/checkpoint_bench.py, bench/allocator_bench.py, benchlib):
self-tests, the workload control protocol, the table and its ratios, the disk rate, bounded tool
calls. The GPU runs themselves happen in scripts/gpu-tests.sh (GPU_BENCH=1)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import benchlib as bl  # noqa: E402


@pytest.mark.parametrize("script", ["checkpoint_bench.py", "allocator_bench.py"])
def test_self_test_prints_a_table_and_writes_json(script, tmp_path):
    out = tmp_path / "out.json"
    r = subprocess.run([sys.executable, str(BENCH / script), "--self-test", "--json-out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "self-test: ok" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["rows"] and all("out_gbps" in row for row in doc["rows"])


def test_startup_bench_times_every_case():
    """bench/startup_bench.py runs each entry point it names to a clean exit (it stops at the
    first that fails), the hook's pre-restore, post-restore and post-resume included."""
    r = subprocess.run([sys.executable, str(BENCH / "startup_bench.py"), "--runs", "1", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    results = json.loads(r.stdout)
    assert set(results) == {"python", "cli-help", "hook-skip", "hook-skip-python", "pre-restore", "post-restore", "post-resume",
                            "suspend-imports", "status", "resume"}
    assert all(case["median_ms"] > 0 for case in results.values()), results


def test_write_paths_bench_measures_each_way_of_writing_a_chunk(tmp_path):
    """bench/write_paths_bench.py: every way and the read back, at 1 and N threads, in each
    directory given, and the host's copy floors; it leaves nothing behind."""
    r = subprocess.run([sys.executable, str(BENCH / "write_paths_bench.py"), "--dir", str(tmp_path),
                        "--size", "128M", "--threads", "2", "--repeat", "1", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    rows = out["rows"]
    assert [(row["dir"], row["threads"]) for row in rows] == [(str(tmp_path), 1), (str(tmp_path), 2)]
    assert all(row[w] > 0 for row in rows
               for w in ("write", "hash, write", "hash as written", "read back")), rows
    assert out["floor_threads"] == 2
    assert sorted(out["floors"]) == sorted(["copy, memory in place",
                                            "new memory, small pages: made, copied into",
                                            "new memory, MADV_HUGEPAGE: made, copied into"])
    assert all(rate > 0 for rate in out["floors"].values()), out["floors"]
    assert list(tmp_path.iterdir()) == []


def test_write_paths_bench_on_a_disk_measures_the_stores_ways_against_one_file(tmp_path):
    """bench/write_paths_bench.py --disk: each durable O_DIRECT way (the store's own put among
    them) and the read back, at 1 thread and each count of the list, and nothing left behind;
    without a directory it refuses to guess one."""
    r = subprocess.run([sys.executable, str(BENCH / "write_paths_bench.py"), "--disk", "--dir", str(tmp_path),
                        "--size", "128M", "--threads", "2,3", "--repeat", "1", "--json"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode == 2 and "O_DIRECT refused" in r.stderr:
        pytest.skip(f"the test directory's file system refuses O_DIRECT: {r.stderr.strip()}")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["mode"] == "disk" and "floors" not in out
    assert [row["threads"] for row in out["rows"]] == [1, 2, 3]
    ways = ("one file", "file each, fdatasync each", "file each, syncfs once", "store put, syncfs", "read back")
    assert all(row[w] > 0 for row in out["rows"] for w in ways), out["rows"]
    assert list(tmp_path.iterdir()) == []
    r = subprocess.run([sys.executable, str(BENCH / "write_paths_bench.py"), "--disk"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--disk needs --dir" in r.stderr, r.stderr


def test_save_stages_bench_times_each_stage_and_leaves_no_store(fake_env, tmp_path):
    """bench/save_stages_bench.py on the fake driver (no kernels: no GPU-id row): a row per stage
    taken out, the table, and its store removed."""
    from criu_gpushare.store import memfs
    in_memory = not memfs.on_disk("/dev/shm")  # where chunk files can be registered ahead
    stores = Path(tempfile.mkdtemp(dir="/dev/shm")) if in_memory else tmp_path / "stores"
    stores.mkdir(exist_ok=True)
    try:
        r = subprocess.run([sys.executable, str(BENCH / "save_stages_bench.py"), "--gib", "0.125",
                            "--dir", str(stores)], env=fake_env, capture_output=True, text=True, timeout=120)
        assert list(stores.iterdir()) == []
    finally:
        shutil.rmtree(stores, ignore_errors=True)
    assert r.returncode == 0, r.stdout + r.stderr
    table = r.stdout[r.stdout.index("stage "):]
    in_place = ("chunk files registered ahead", "load, from the registered chunk files",
                "load ahead, from the registered chunk files", "the registered chunk files released")
    for stage in in_place:
        assert (f"\n{stage} " in table) == in_memory, table
    if not in_memory:
        assert f"chunk files registered ahead: not run: {stores} is not in memory" in r.stdout
    for stage in ("pin 1 GiB, cuMemHostAlloc", "pin 1 GiB, the tool's buffers",
                  "pin 1 GiB on 16 threads: first 64 MiB ready", "pin 1 GiB on 2 threads: last 64 MiB ready",
                  "pin 1 GiB: pages faulted in", "pin 1 GiB: pages faulted in first, registered",
                  "import and map, alone", "import and map, beside pinning 1 GiB",
                  "import and map, beside faulting 1 GiB in", "import and map, beside registering 1 GiB",
                  "save unchanged, one allocation, GPU idle first",
                  "save unchanged, 1 GiB allocations, GPU idle first",
                  "load, reads only, chunks never read before", "save, first", "save",
                  "save, every chunk hashed on the host too", "save, no host hash at all",
                  "save, copies only", "load", "load, no check", "load, copies only", "load, reads only",
                  "load, no check, 32 slots and workers", "load ahead (buffer made, read, checked)",
                  "load ahead's buffers made, 1 GiB each", "device to device",
                  "DMA from the page cache", "DMA into the page cache"):
        assert f"\n{stage} " in table, table
    assert "no usable GPU hasher here" in r.stdout


def test_mapping_bench_opens_every_allocation_each_way_and_checks_it(fake_env):
    """bench/mapping_bench.py on the fake driver: every way opens and closes all allocations and
    reads each one's mark back through its own mapping."""
    r = subprocess.run([sys.executable, str(BENCH / "mapping_bench.py"), "--count", "40", "--mib", "2",
                        "--threads", "4", "--group", "16", "--repeat", "1"],
                       env=fake_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    table = r.stdout[r.stdout.index("way "):]
    for way in ("one at a time (the tool now)", "4 threads", "one reservation per 16"):
        line = next(l for l in table.splitlines() if l.startswith(way))
        assert line.endswith("  ok"), table


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_checkpoint_bench_mounts_a_huge_page_tmpfs_store_for_its_run_and_unmounts_it(tmp_path):
    """--huge-tmpfs: a store target on a tmpfs mounted with huge=always, gone after the run."""
    probe = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(BENCH)!r})
        import checkpoint_bench as cb
        bench = cb.Bench(cb.parse_args(["--huge-tmpfs", "--no-disk", "--tmpfs", {str(tmp_path)!r}]))
        (label, path), = [t for t in bench.targets if t[0] == "tmpfs-huge"]
        mounts = [line.split() for line in open("/proc/mounts")]
        print([m[3] for m in mounts if m[1] == path])
        bench.close()
        print(any(m.split()[1] == path for m in open("/proc/mounts")), os.path.exists(path))
    """)
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    opts, after = r.stdout.splitlines()
    assert "huge=always" in opts, opts
    assert after == "False False", r.stdout


def test_no_tmpfs_gives_rows_to_the_other_stores_only_and_refuses_to_leave_none(tmp_path):
    """--no-tmpfs: the disk store alone gets rows (the tmpfs one stays the workspace); with the
    disk left out too, the run stops saying why and leaves no directory behind."""
    import checkpoint_bench as cb
    disk = tmp_path / "disk"
    bench = cb.Bench(cb.parse_args(["--no-tmpfs", "--tmpfs", str(tmp_path), "--disk", str(disk)]))
    try:
        assert [t for t, _ in bench.targets] == ["tmpfs", "disk"]
        assert [t for t, _ in bench.row_targets] == ["disk"]
    finally:
        bench.close()
    with pytest.raises(SystemExit, match="--no-tmpfs leaves no store for the rows"):
        cb.Bench(cb.parse_args(["--no-tmpfs", "--no-disk", "--tmpfs", str(tmp_path)]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk"]
    assert list(disk.iterdir()) == []


def test_a_checkpoint_bench_whose_set_up_fails_leaves_no_mount_and_no_directory(tmp_path):
    """--thp that cannot be set (here: refused as without root) after the huge-page tmpfs was
    mounted: the run stops saying why, with the mount and its working directory gone."""
    probe = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(BENCH)!r})
        import checkpoint_bench as cb
        def refused(mode):
            raise SystemExit("cannot set transparent huge pages (root is needed)")
        cb.bl.set_thp_mode = refused
        mounts_before = open("/proc/mounts").read().count("bench-huge-tmpfs.")
        try:
            cb.Bench(cb.parse_args(["--huge-tmpfs", "--no-disk", "--thp", "always", "--tmpfs", {str(tmp_path)!r}]))
        except SystemExit as e:
            print(e)
        print(open("/proc/mounts").read().count("bench-huge-tmpfs.") - mounts_before)
    """)
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    said, mounts_left = r.stdout.splitlines()
    assert said == "cannot set transparent huge pages (root is needed)" and mounts_left == "0", r.stdout
    assert list(tmp_path.iterdir()) == []


WORKLOADS = sorted(p.name for p in (BENCH / "workloads").glob("*.py") if p.name != "wlcommon.py")


@pytest.mark.parametrize("script", WORKLOADS)
def test_every_workload_loads_and_parses_its_options_without_a_gpu(script):
    """The workloads the bench and the GPU tests share (bench/workloads/) load on a machine without
    a GPU or torch, so a broken import shows here and not first on the GPU machine."""
    r = subprocess.run([sys.executable, str(BENCH / "workloads" / script), "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("usage:"), r.stdout + r.stderr


def test_the_pair_workload_offers_what_the_gpu_tests_use():
    r = subprocess.run([sys.executable, str(BENCH / "workloads" / "pair.py"), "--help"],
                       capture_output=True, text=True, timeout=60)
    assert "--busy" in r.stdout and "--shared-gib" in r.stdout, r.stdout


def test_criu_rows_say_not_available_when_the_tool_lacks_dump(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH / "checkpoint_bench.py"), "--self-test"],
                       capture_output=True, text=True, timeout=120)
    has_dump = bl.tool_has("dump")
    line = next(x for x in r.stdout.splitlines() if x.startswith("criu rows:"))
    assert ("not available" in line) == (not has_dump), line


def test_ratios_and_table_with_a_failed_driver_restore():
    rows = [bl.Row("pair", "tool", "tmpfs", 4 * 10**9, out_s=2.0, back_s=1.0, check="ok"),
            bl.Row("pair", "driver", "-", 4 * 10**9, out_s=8.0, status="fails: restore pid 7 X")]
    rat = bl.ratios(rows)
    assert rat[("pair", "tool", "tmpfs")] == (4.0, None)
    text = bl.format_table(rows)
    assert "4.0x" in text and "fails: restore pid 7 X" in text
    assert rows[0].gbps(rows[0].out_s) == 2.0


def test_repeated_cycles_show_the_median_one_and_count_warm_resumes_slower_than_cold():
    """checkpoint_bench --cycles: the row of median back time stands for its path, every cycle is
    listed, and a cycle whose warm resume took longer than its cold one is counted, not hidden;
    a failed or wrong cycle stands for its path instead."""
    def rows(path, figures):
        return [bl.Row("single", path, "tmpfs", 4 * 10**9, out_s=o, back_s=b, check="ok",
                       back_phases={"tool start": 0.07, "restore": b - 0.5, "load": 0.43, "total": b})
                for o, b in figures]
    cold = bl.median_cycle(rows("tool", [(3.0, 1.7), (3.1, 1.6), (2.9, 1.9)]))
    warm = bl.median_cycle(rows("tool-warm", [(1.0, 1.5), (1.1, 1.8), (1.2, 1.6)]))
    assert (cold.out_s, cold.back_s) == (3.0, 1.7) and (warm.out_s, warm.back_s) == (1.2, 1.6)
    text = bl.cycle_lines([cold, warm])
    assert "single/tool/tmpfs: out 3.00 3.10 2.90 (median 3.00), back 1.70 1.60 1.90 (median 1.70)" in text
    assert ("warm back slower than cold in 1 of 3 cycles (warm - cold: median -0.20 s, -0.30 to +0.20; "
            "the cold ones 0.30 s apart)") in text, text
    # the slower cycle (the second: 1.8 against 1.6) names the phase that grew, and only that one
    assert "      cycle 2: +0.20 s; grown: restore +0.20\n" in text + "\n", text
    assert "cycle 1:" not in text and "cycle 3:" not in text
    wrong = rows("tool", [(3.0, 1.7), (3.1, 1.6)])
    wrong[1].check = "WRONG: digest differs"
    assert bl.median_cycle(wrong) is wrong[1]
    single = rows("tool", [(3.0, 1.7)])
    assert bl.median_cycle(single) is single[0] and "cycles" not in single[0].extra
    assert bl.cycle_lines(single) == ""


@pytest.mark.parametrize("target", ["tmpfs", "tmpfs-huge", "disk"])
def test_criu_rows_take_turns_with_the_hook_each_cycle_on_tmpfs_and_run_once_on_disk(target, capsys):
    """checkpoint_bench --criu --cycles 3: on a tmpfs store the wrapper (criu, criu-warm) and the
    hook (criu-hook) take turns, three cycles, each path then standing as its median cycle; on disk
    the wrapper once, then criu-cold."""
    import argparse
    import checkpoint_bench as cb
    bench = object.__new__(cb.Bench)
    bench.args, bench.rows = argparse.Namespace(cycles=3), []
    ran, back = [], iter([1.7, 1.6, 1.9, 2.0, 2.1, 1.8, 1.5, 1.4, 1.3, 1.2])

    def row(path):
        ran.append(path)
        return bl.Row("single", path, target, 4 * 10**9, out_s=1.0, back_s=next(back), check="ok")

    def criu_row(wl, name, spec, target_, tdir, path, measured):
        for p in [path] + (["criu-warm"] if path == "criu" and target.startswith("tmpfs") else []):
            bench.measured(measured, row(p))
        return wl

    def hook_row(wl, name, spec, tdir, target_, measured):
        bench.measured(measured, row("criu-hook"))
        return wl
    bench.criu_row, bench.hook_row = criu_row, hook_row
    assert bench.criu_rows("wl", "single", None, target, "/nowhere") == "wl"
    if target == "disk":
        assert ran == ["criu", "criu-cold"]
        assert [(r.path, r.back_s) for r in bench.rows] == [("criu", 1.7), ("criu-cold", 1.6)]
        return
    assert ran == ["criu", "criu-warm", "criu-hook"] * 3
    assert [(r.path, r.back_s, len(r.extra["cycles"])) for r in bench.rows] == [
        ("criu", 1.7, 3), ("criu-warm", 1.6, 3), ("criu-hook", 1.8, 3)]
    assert f"single/criu-hook/{target} cycle 3: out 1.0 s, back 1.3 s, ok" in capsys.readouterr().out


def test_rows_are_set_against_the_store_device_s_own_rate():
    rows = [bl.Row("single", "criu", "disk", 4 * 10**9, out_s=2.0, back_s=4.0, check="ok"),
            bl.Row("single", "driver", "-", 4 * 10**9, out_s=8.0, back_s=8.0, check="ok")]
    text = bl.device_shares(rows, {"disk": {"write_gbps": 2.5, "read_gbps": 2.0, "direct": True}})
    assert "single/criu/disk: out 2.00 GB/s = 80% of its write 2.50; back 1.00 GB/s = 50% of its read 2.00" in text
    assert rows[0].extra == {"out_pct_of_device": 80.0, "back_pct_of_device": 50.0}
    assert "driver" not in text  # no store device behind it


def test_disk_rows_are_also_set_against_the_rate_measured_after_them():
    rows = [bl.Row("single", "criu", "disk", 4 * 10**9, out_s=2.0, back_s=4.0, check="ok"),
            bl.Row("single", "criu", "tmpfs", 4 * 10**9, out_s=1.0, back_s=1.0, check="ok")]
    rates = {"disk": {"write_gbps": 2.5, "read_gbps": 2.0, "direct": True},
             "tmpfs": {"write_gbps": 8.0, "read_gbps": 8.0, "direct": True}}
    text = bl.device_shares(rows, rates, {"disk": {"write_gbps": 2.0, "read_gbps": 1.25, "direct": True}})
    assert ("single/criu/disk: out 2.00 GB/s = 80% of its write 2.50 before the rows, 100% of 2.00 after "
            "them; back 1.00 GB/s = 50% of its read 2.00 before the rows, 80% of 1.25 after them") in text, text
    assert rows[0].extra == {"out_pct_of_device": 80.0, "back_pct_of_device": 50.0,
                             "out_pct_of_device_after": 100.0, "back_pct_of_device_after": 80.0}
    assert "single/criu/tmpfs: out 4.00 GB/s = 50% of its write 8.00; back" in text, text


def test_disk_rows_are_also_set_against_the_rate_measured_just_before_each():
    row = bl.Row("single", "criu", "disk", 4 * 10**9, out_s=2.0, back_s=4.0, check="ok")
    row.extra["rate_beside"] = {"write_gbps": 2.5, "read_gbps": 1.0, "direct": True}
    text = bl.device_shares([row], {"disk": {"write_gbps": 2.0, "read_gbps": 2.0, "direct": True}},
                            {"disk": {"write_gbps": 1.6, "read_gbps": 1.6, "direct": True}})
    assert ("single/criu/disk: out 2.00 GB/s = 100% of its write 2.00 before the rows, 125% of 1.60 after "
            "them, 80% of 2.50 just before the row; back 1.00 GB/s = 50% of its read 2.00 before the rows, "
            "62% of 1.60 after them, 100% of 1.00 just before the row") in text, text
    assert row.extra["out_pct_of_device_beside"] == 80.0 and row.extra["back_pct_of_device_beside"] == 100.0


@pytest.mark.parametrize("store", ["disk", "s3", "tmpfs", "tmpfs-huge"])
def test_a_disk_row_gets_its_store_s_rate_measured_just_before_it(store, tmp_path, monkeypatch):
    """checkpoint_bench: the rate beside a row is measured on a disk (or the disk under s3's
    server), scaled, and never on a memory store; --disk-rate-beside-gib 0 turns it off."""
    import argparse
    import checkpoint_bench as cb
    sizes = []
    monkeypatch.setattr(bl, "disk_rate", lambda d, size: sizes.append((d, size)) or {"write_gbps": 1.0})
    bench = object.__new__(cb.Bench)
    bench.args = argparse.Namespace(disk_rate_beside_gib=2.0, scale=0.1)
    row = bl.Row("single", "criu", store, 1)
    bench.rate_beside(row, str(tmp_path))
    if store.startswith("tmpfs"):
        assert sizes == [] and "rate_beside" not in row.extra
    else:
        assert sizes == [(str(tmp_path), bl.GIB // 2)] and row.extra["rate_beside"] == {"write_gbps": 1.0}
    bench.args.disk_rate_beside_gib, sizes[:] = 0, []
    bench.rate_beside(bl.Row("single", "criu", store, 1), str(tmp_path))
    assert sizes == []


def test_a_tool_call_that_overruns_is_bounded():
    res = bl.run_tool([], os.environ.copy(), 0.5, argv=[sys.executable, "-c", "import time; time.sleep(30)"])
    assert res.rc == 124 and not res.ok and res.why().startswith("timed out")


def criu_memory_bench(criu, tmp_path, *args):
    """bench/criu_memory_bench.py, 64 MiB, one run, in the huge page mode already in force (the
    machine is left as it was), its images under tmp_path: (the mode, {row: its figures})."""
    mode = bl.thp_mode()
    if mode is None:
        pytest.skip("no transparent huge page mode to read on this kernel")
    # each of its commands bounded well inside the test's own bound: a hang is then the bench's
    # error, with what the process that did not answer was doing, not a bare timeout
    r = subprocess.run([sys.executable, str(BENCH / "criu_memory_bench.py"), "--gib", "0.0625", "--runs", "1",
                        "--modes", mode, "--dir", str(tmp_path), "--criu", criu, "--json",
                        "--timeout", "60", *args],
                       capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout + r.stderr
    return mode, json.loads(r.stdout)["modes"]


def test_criu_memory_bench_dumps_and_restores_a_process_and_checks_its_memory(criu, tmp_path):
    """bench/criu_memory_bench.py on this machine's CRIU, in the mode already in force (the machine
    is left as it was), with and without the memory collapsed first: a dump and a restore of its
    workload, the memory checked after, CRIU's own account of both, the image's size and the mode
    put back."""
    mode, modes = criu_memory_bench(criu, tmp_path, "--collapse")
    assert set(modes) == {mode, f"{mode}+collapse"}, modes
    for got in modes.values():
        assert got["check"] == "ok" and got["dump_s"] > 0 and got["restore_s"] > 0, got
        assert got["dump.pages_written"] >= 16384, got
        assert got["restore.pages_restored"] == got["dump.pages_written"], got
        assert got["image_bytes"] >= 64 << 20, got
    assert "collapse_s" in modes[f"{mode}+collapse"] and "collapse_s" not in modes[mode]
    assert bl.thp_mode() == mode and list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping the page cache needs root")
def test_criu_memory_bench_restores_from_a_cold_cache_beside_a_store_s_reading(criu, tmp_path):
    """--cold --beside-store: every kind of cold restore, its memory checked, the store read whole
    beside it where asked (its end and the end of both timed), nothing left in --dir."""
    from criu_gpushare.store import memfs
    if memfs.file_system_type(str(tmp_path)) in memfs.MEMORY_FILE_SYSTEMS:
        pytest.skip(f"{tmp_path} is on tmpfs here: a cold restore needs its images on a disk")
    mode, modes = criu_memory_bench(criu, tmp_path, "--cold", "--beside-store", "0.125")
    kinds = ["cold", "cold+ahead", "cold+store", "cold+ahead+store", "cold+pages-first+store",
             "cold+ahead+idle-store", "cold+criu-first+store"]
    assert list(modes) == [f"{mode}+{k}" for k in kinds], modes
    for name, got in modes.items():
        assert got["check"] == "ok" and got["restore_s"] > 0, got
        assert got["restore.pages_restored"] == got["dump.pages_written"] >= 16384, got
        if name.endswith("store"):
            assert got["store_s"] > 0 and got["both_s"] == max(got["restore_s"], got["store_s"]), got
        else:
            assert "store_s" not in got, got
    assert list(tmp_path.iterdir()) == []


def test_criu_memory_bench_times_the_sync_a_durable_dump_adds(criu, tmp_path):
    """--durable: a dump, then the image's file system synced, timed, with and without the image
    sent to the disk during the dump; the memory checked after each restore, nothing left."""
    mode, modes = criu_memory_bench(criu, tmp_path, "--durable")
    assert list(modes) == [f"{mode}+sync", f"{mode}+writeback+sync"], modes
    for got in modes.values():
        assert got["check"] == "ok" and got["sync_s"] > 0, got
        assert got["durable_s"] == pytest.approx(got["dump_s"] + got["sync_s"], abs=0.002), got
    assert list(tmp_path.iterdir()) == []
    r = subprocess.run([sys.executable, str(BENCH / "criu_memory_bench.py"), "--durable", "--cold"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "one question at a time" in r.stderr, r.stderr


def test_criu_memory_bench_says_what_a_workload_that_does_not_answer_is_doing():
    """A restored workload that never writes its check: the error says where it waits and which
    signals it has pending and blocked, or that it is gone."""
    import criu_memory_bench as cmb
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                             "signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1]); time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while "SigBlk: 0000000000000200" not in cmb.process_state(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGUSR1)
        said = cmb.process_state(proc.pid)
        assert f"pid {proc.pid}: State: S (sleeping)" in said, said
        assert "ShdPnd: 0000000000000200" in said and "SigBlk: 0000000000000200" in said, said
        assert "wchan: " in said and "syscall: " in said, said
    finally:
        proc.kill()
        proc.wait()
    assert cmb.process_state(proc.pid) == f"pid {proc.pid}: No such file or directory"


@pytest.mark.skipif(os.geteuid() != 0, reason="setting the huge page mode needs root")
def test_criu_memory_bench_says_why_when_criu_fails_and_leaves_nothing(tmp_path):
    mode = bl.thp_mode()
    if mode is None:
        pytest.skip("no transparent huge page mode to read on this kernel")
    r = subprocess.run([sys.executable, str(BENCH / "criu_memory_bench.py"), "--gib", "0.0625", "--runs", "1",
                        "--modes", mode, "--dir", str(tmp_path), "--criu", "/bin/false"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip() == "criu_memory_bench: criu dump exit 1:", r.stderr
    assert bl.thp_mode() == mode and list(tmp_path.iterdir()) == []


def test_the_transparent_huge_page_mode_is_read_set_and_given_back(tmp_path):
    """--thp: the mode in force is the bracketed word; setting it returns the one before (what
    the run's end puts back); a mode that cannot be set stops the run before it starts."""
    sysfs = tmp_path / "enabled"
    sysfs.write_text("always [madvise] never\n")
    assert bl.thp_mode(str(sysfs)) == "madvise"
    assert bl.set_thp_mode("always", str(sysfs)) == "madvise" and sysfs.read_text() == "always"
    with pytest.raises(SystemExit, match="cannot set transparent huge pages to 'never'.*root is needed"):
        bl.set_thp_mode("never", str(tmp_path))  # a directory: not writable as a file
    assert bl.thp_mode(str(tmp_path / "missing")) is None
    assert bl.thp_mode() in ("always", "madvise", "never", None)


def test_disk_rate_measures_write_and_read(tmp_path):
    r = bl.disk_rate(str(tmp_path), 64 << 20, chunk=16 << 20)
    assert r["bytes"] == 64 << 20 and r["write_gbps"] > 0 and r["read_gbps"] > 0
    assert not list(tmp_path.iterdir()), "the rate file is removed"


def test_memory_is_touched_before_the_rows_and_nothing_is_left(tmp_path, capsys, monkeypatch):
    """checkpoint_bench's pretouch: each tmpfs store's filesystem written the largest workload's
    size, then emptied; a disk store is left alone."""
    import checkpoint_bench as cb
    args = cb.parse_args(["--scale", "0.001", "--no-disk"])
    size = max(cb.workload_bytes(args, n) for n in cb.WORKLOADS)
    assert size == cb.workload_bytes(args, "pair") == int(41 * 0.001 * bl.GIB)
    disk = tmp_path / "disk"
    disk.mkdir()
    seen = []
    real = bl.touch_memory
    monkeypatch.setattr(cb.bl, "touch_memory", lambda d, n: seen.append((d, n)) or real(d, n, chunk=1 << 20))
    cb.pretouch([("tmpfs", str(tmp_path)), ("disk", str(disk))], size)
    assert seen == [(str(tmp_path), size)]
    assert "tmpfs: memory touched first (0.0 GiB written and removed in" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk"], "the touch files are removed"


def test_workload_file_protocol_end_to_end(tmp_path):
    """A stand-in workload (no GPU) through the same channel the bench workloads use."""
    stub = tmp_path / "stub.py"
    stub.write_text(textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(BENCH / 'workloads')!r})
        import wlcommon
        ctl = sys.argv[sys.argv.index("--ctl") + 1]
        state = {{"sha": "abc"}}
        def corrupt(args):
            state["sha"] = "bad"
            return {{}}
        wlcommon.serve(wlcommon.FileChannel(ctl), {{"pids": [os.getpid()], "bytes": 1 << 20}},
                       {{"check": lambda a: dict(state), "corrupt": corrupt}})
    """))
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    wl = bl.Workload("stub", str(stub), [], str(tmp_path), str(run_dir), shim=False)
    try:
        wl.start(60)
        assert wl.pids == [wl.proc.pid] and wl.bytes == 1 << 20 and wl.sha == "abc"
        assert wl.verify() == "ok"
        with pytest.raises(bl.WorkloadError, match="unknown command"):
            wl.ask("nonsense", 30)
        wl.ask("corrupt", 30)
        assert wl.verify() == "WRONG"
        assert wl.ask("quit", 30) == {"quit": True}
        wl.reap(30)
        assert not wl.alive()
        assert wl.verify(5).startswith("WRONG (")
    finally:
        wl.kill()


class _StandIns:
    """A driver, CRIU's RPC module and a workload that record what the bench asks of them."""

    class CriuError(Exception):
        pass

    def __init__(self, fail=None):
        self.calls, self.fail = [], fail
        self.pids = [4242]

    def CriuOptions(self, **kw):  # noqa: N802 (stands in for rpc.CriuOptions)
        return kw

    def call(self, op, pids, timeout_s):
        self.calls.append(f"driver {op}")
        return 0.25, {p: ("CUDA_ERROR_UNKNOWN" if self.fail == op else "CUDA_SUCCESS") for p in pids}

    def dump(self, images, pid, options):
        self.calls.append("criu dump")
        assert options["link_remap"] and pid == 4242
        if self.fail == "criu dump":
            raise self.CriuError("dump of pid 4242 failed")
        Path(images, "pages-1.img").write_bytes(b"x" * 1000)

    def restore(self, images, options):
        self.calls.append("criu restore")
        return 4242

    def reap(self):
        self.calls.append("reap")

    def verify(self):
        return "ok"


def test_the_driver_path_through_plain_criu_times_each_stage(tmp_path):
    s = _StandIns()
    row = bl.Row("single", "drv+criu", "tmpfs", 10 ** 9)
    assert bl.driver_criu_cycle(s, row, s, str(tmp_path), 60, criu=s)
    assert s.calls == ["driver lock", "driver checkpoint", "criu dump", "reap", "criu restore",
                       "driver restore", "driver unlock"]
    assert list(row.out_phases) == ["lock", "checkpoint", "criu dump"]
    assert list(row.back_phases) == ["criu restore", "restore", "unlock"]
    assert row.out_s == round(sum(row.out_phases.values()), 3) and row.back_s == round(sum(row.back_phases.values()), 3)
    assert row.extra["image_bytes"] == 1000 and row.check == "ok" and row.status == "ok"


@pytest.mark.parametrize("fail", ["checkpoint", "criu dump", "restore"])
def test_the_driver_path_through_plain_criu_names_the_stage_that_failed(tmp_path, fail):
    s = _StandIns(fail)
    row = bl.Row("single", "drv+criu", "tmpfs", 10 ** 9)
    assert not bl.driver_criu_cycle(s, row, s, str(tmp_path), 60, criu=s)
    assert row.status.startswith("fails: ") and fail.split()[-1] in row.status, row.status
    assert "criu restore" not in s.calls or fail == "restore"
    assert row.check == "-"


def test_hook_phases_split_a_hooked_criu_run_into_the_hooks_share_and_criu_s():
    log = ("(00.01) pre-dump\ncriu-gpushare-hook: pre-dump: took 0.265 s (program start 0.115 s)\n"
           "criu-gpushare-hook: post-dump: took 0.165 s (program start 0.112 s)\n"
           "criu-gpushare-hook: post-dump: took 0.010 s (program start 0.010 s)\n")
    phases = bl.hook_phases(log, 1.0)
    assert phases == {"hook pre-dump": 0.265, "hook post-dump": 0.175, "criu": 0.56}
    # a hook that does not say when its actions began: the same, whatever the bench's clock said
    assert bl.hook_phases(log, 1.0, began=100.0) == phases


def test_what_ran_beside_a_hooked_dump_s_steps_is_read_apart_from_its_phases():
    log = ("criu-gpushare-hook: pre-dump: GPU state of 1 process(es) out: discover 0.050 save 1.800\n"
           "criu-gpushare-hook: pre-dump: beside those steps: CUDA start (bindings, cuInit) 0.180 "
           "checkpoint (beside the save) 0.450\n"
           "criu-gpushare-hook: pre-dump: took 2.100 s (program start 0.100 s, began 100.050 s after boot)\n")
    assert bl.hook_overlapped(log) == {"CUDA start (bindings, cuInit)": 0.18, "checkpoint (beside the save)": 0.45}
    phases = bl.hook_phases(log, 2.2, began=100.0)
    assert "pre-dump: CUDA start (bindings, cuInit)" not in phases and phases["pre-dump: save"] == 1.8, phases
    assert bl.hook_overlapped("criu-gpushare-hook: pre-dump: took 1.0 s\n") == {}


def test_hook_phases_lay_a_hooked_restore_out_in_order_with_the_steps_of_post_resume():
    """The restore's timeline from the hook's lines (CRIU started at 100.0 s on the boot clock):
    CRIU's time between the actions, each action's start, its steps and the rest, adding up to the
    whole restore; steps under 5 ms are left out (they go to "other")."""
    log = ("criu-gpushare-hook: pre-restore: took 0.500 s (program start 0.100 s, began 100.200 s after boot)\n"
           "(00.9) restoring tasks\n"
           "criu-gpushare-hook: post-restore: took 0.200 s (program start 0.100 s, began 101.500 s after boot)\n"
           "criu-gpushare-hook: post-resume: GPU state of 2 process(es) is back: check (pids, journal) 0.00 "
           "restore 0.25 unlock 0.00 load 1.40 holder or journal (start, ask, reply) 0.02\n"
           "criu-gpushare-hook: post-resume: took 2.000 s (program start 0.150 s, began 101.900 s after boot)\n")
    phases = bl.hook_phases(log, 4.0, began=100.0)
    assert phases == {
        "criu before pre-restore": 0.2, "pre-restore: start": 0.1, "pre-restore: other": 0.4,
        "criu before post-restore": 0.8, "post-restore: start": 0.1, "post-restore: other": 0.1,
        "criu before post-resume": 0.2, "post-resume: start": 0.15, "post-resume: restore": 0.25,
        "post-resume: load": 1.4, "post-resume: holder or journal (start, ask, reply)": 0.02,
        "post-resume: other": 0.18, "criu after post-resume": 0.1}
    assert abs(sum(phases.values()) - 4.0) < 1e-6


class _PlainWorkload:
    """A process without CUDA, as bench workloads are driven: pids, reap, verify."""

    def __init__(self, tmp_path):
        ready = tmp_path / "ready"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"open({str(ready)!r}, 'w').close()\nimport time\nwhile True: time.sleep(0.1)"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        for _ in range(200):
            if ready.exists():
                break
            time.sleep(0.05)
        self.pids = [self.proc.pid]

    def reap(self):
        self.proc.wait(10)

    def verify(self):
        return "ok" if os.path.exists(f"/proc/{self.pids[0]}") else "WRONG (gone)"

    def kill(self):
        try:
            os.kill(self.pids[0], 9)
        except ProcessLookupError:
            pass


def _assert_criu_accounted(row):
    """CRIU's own account of both ways, from the image, as the table's last lines print it."""
    stats = row.extra["criu_stats"]
    assert stats["dump"]["pages_written"] > 0 and stats["dump"]["frozen"] > 0, stats
    assert stats["restore"]["pages_restored"] == stats["dump"]["pages_written"], stats
    assert f"plain/{row.path}/tmpfs: " in bl.criu_lines([row])


def test_hook_cycle_dumps_and_restores_through_criu_and_the_hook(criu, tmp_path):
    """The bench's criu-hook path, on this machine's CRIU with a process the hook leaves alone: the
    commands it runs work, each way is timed and split into the hook's actions and CRIU's rest."""
    import shutil as sh
    if sh.which("criu-gpushare-hook") is None:
        pytest.skip("criu-gpushare-hook is not on PATH (package not installed)")
    wl = _PlainWorkload(tmp_path)
    images = tmp_path / "images"
    images.mkdir()
    row = bl.Row("plain", "criu-hook", "tmpfs", 0)
    try:
        env = dict(os.environ, CRIU_GPUSHARE_RUN_DIR=str(tmp_path / "run"),
                   CRIU_GPUSHARE_STORE=str(tmp_path / "store"))
        ok = bl.hook_cycle(row, wl, str(images), env, 120)
        assert ok, row.status
        assert row.check == "ok" and row.out_s > 0 and row.back_s > 0
        # Each way in order: CRIU's time before and after each action, each action's own parts.
        for phases, actions in ((row.out_phases, ["pre-dump", "post-dump"]),
                                (row.back_phases, ["pre-restore", "post-restore", "post-resume"])):
            assert [k.split(": ")[0] for k in phases if k.endswith(": start")] == actions, phases
            assert list(phases)[0] == f"criu before {actions[0]}", phases
            assert list(phases)[-1] == f"criu after {actions[-1]}", phases
            # within the boot clock's tick (10 ms) at each action's start
            wall = row.out_s if phases is row.out_phases else row.back_s
            assert abs(sum(phases.values()) - wall) < 0.01 * (len(actions) + 1), (phases, wall)
        _assert_criu_accounted(row)
    finally:
        wl.kill()
        bl.reap_children()


def test_the_driver_path_through_plain_criu_runs_on_this_machines_criu(criu, tmp_path):
    """drv+criu's CRIU half for real (the driver calls stood in for: a process without CUDA): the
    dump and the restore it asks of CRIU work, and the image's size is recorded."""
    wl = _PlainWorkload(tmp_path)
    driver = _StandIns()
    driver.pids = wl.pids
    images = tmp_path / "images"
    images.mkdir()
    row = bl.Row("plain", "drv+criu", "tmpfs", 0)
    try:
        assert bl.driver_criu_cycle(driver, row, wl, str(images), 120), row.status
        assert [c for c in driver.calls if c.startswith("driver")] == [
            "driver lock", "driver checkpoint", "driver restore", "driver unlock"]
        assert row.check == "ok" and row.extra["image_bytes"] > 0
        assert "criu dump" in row.out_phases and "criu restore" in row.back_phases
        _assert_criu_accounted(row)
    finally:
        wl.kill()
        bl.reap_children()


def test_image_content_lines_name_the_memory_of_each_image():
    """What pages_by_mapping found, per row: the biggest kinds (the rest summed), the largest
    mapping; an image that could not be read says why."""
    row = bl.Row("pair", "criu", "tmpfs", 10**9, extra={"image_pages": {
        "kinds": {"anonymous private": 900 << 20, "heap": 64 << 20, "file libc.so.6 (private)": 1 << 20,
                  "stack": 1 << 20, "shared memory": 1 << 20, "other": 1 << 20},
        "largest": [{"pid": 7, "start": 0x1000, "end": 0x2000, "kind": "anonymous private",
                     "bytes": 512 << 20}]}})
    bad = bl.Row("pair", "criu-hook", "tmpfs", 10**9, extra={"image_pages": {"error": "mm-7.img: missing"}})
    text = bl.image_content_lines([row, bad], shown=3)
    assert ("pair/criu/tmpfs: anonymous private 900.0, heap 64.0, file libc.so.6 (private) 1.0, "
            "the rest 3.0; largest: pid 7 0x1000-0x2000 anonymous private 512.0") in text, text
    assert "pair/criu-hook/tmpfs: not read (mm-7.img: missing)" in text
    assert bl.image_content_lines([bl.Row("x", "tool", "tmpfs", 1)]) == ""


def test_host_memory_bench_reads_smaps_and_names_the_mappings_a_checkpoint_grew():
    """bench/host_memory_bench.py: each mapping's anonymous bytes from smaps, and per process the
    mappings that changed most from one moment to the next, the one that appeared included."""
    import host_memory_bench as hm
    running = hm.parse_smaps(textwrap.dedent("""\
        55d0c0000000-55d0c2000000 rw-p 00000000 00:00 0                          [heap]
        Rss:               32768 kB
        Anonymous:         32768 kB
        7f0000000000-7f0010000000 rw-p 00000000 00:00 0 
        Anonymous:          1024 kB
        7f1000000000-7f1000200000 r-xp 00000000 08:01 1234                       /usr/lib/libcuda.so.1
        Anonymous:             0 kB
        """))
    assert [(m["name"], m["anon"]) for m in running] == [
        ("[heap]", 32 << 20), ("", 1 << 20), ("/usr/lib/libcuda.so.1", 0)]
    checkpointed = [dict(m) for m in running] + [
        {"start": 0x7f2000000000, "end": 0x7f2030000000, "perms": "rw-p", "name": "", "anon": 620 << 20}]
    checkpointed[1]["anon"] = 2 << 20
    rows = hm.changes(running, checkpointed)
    assert rows[0] == ("anonymous", "0x7f2000000000-0x7f2030000000", "rw-p", 0, 620 << 20)
    assert rows[1][3:] == (1 << 20, 2 << 20) and len(rows) == 2  # the unchanged ones are not listed
    text = hm.report([("tool running", {7: running}), ("tool suspended", {7: checkpointed})])
    assert "tool suspended         pid 7        anonymous     654.0 MiB; largest anonymous 0x7f2000000000 620.0 MiB" in text
    assert "    +620.0 MiB       0.0 ->    620.0  rw-p 0x7f2000000000-0x7f2030000000 anonymous" in text
    own = hm.snapshot([os.getpid()])[os.getpid()]  # this process's own smaps parse
    assert own and sum(m["anon"] for m in own) > 0
