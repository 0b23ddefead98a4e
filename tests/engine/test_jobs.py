"""engine/jobs.py and engine/settings.py: one order for every setting, whichever door loads it (flag,
environment, config file, default; a restore's store from the dump's record last); run options kept whole and read back
from older journals; the engine never exits the process itself."""
import os
import re

import pytest

from criu_gpushare.engine import jobs
from criu_gpushare.engine.inthread import InThread
from criu_gpushare.engine.settings import load_settings
from criu_gpushare.engine.steps import Options
from criu_gpushare.errors import ProcessError

GPU_A = "GPU-00000000-0000-0000-0000-00000000000a"
GPU_B = "GPU-00000000-0000-0000-0000-00000000000b"
GPU_C = "GPU-00000000-0000-0000-0000-00000000000c"


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('[store]\npath = "/from/file"\nverify = false\n[cache]\npath = "/cache/file"\n')
    return {"CRIU_GPUSHARE_CONFIG": str(path)}


def test_a_flag_comes_before_the_environment_before_the_file_before_the_default(config):
    env = dict(config, CRIU_GPUSHARE_STORE="/from/env", CRIU_GPUSHARE_GPU_MAP=f"{GPU_A}={GPU_B}")
    s = load_settings({"store": "/from/flag", "gpu_map": {GPU_A: GPU_C}, "timeout_s": 5.0}, env)
    assert (s.store, s.gpu_map, s.timeout_s) == ("/from/flag", {GPU_A: GPU_C}, 5.0)
    assert s.origin["store"] == s.origin["gpu_map"] == s.origin["timeout_s"] == "flag"

    s = load_settings({"store": None, "gpu_map": None}, env)  # flags not given
    assert (s.store, s.gpu_map) == ("/from/env", {GPU_A: GPU_B})
    assert s.origin["store"] == "env CRIU_GPUSHARE_STORE" and s.origin["gpu_map"] == "env CRIU_GPUSHARE_GPU_MAP"

    s = load_settings({}, config)
    assert (s.store, s.verify, s.cache) == ("/from/file", False, "/cache/file")
    assert s.origin["store"].endswith("[store] path")

    s = load_settings({}, {"CRIU_GPUSHARE_CONFIG": os.devnull})
    assert (s.store, s.verify, s.cache, s.timeout_s, s.gpu_map) == \
        ("/var/lib/criu-gpushare/store", True, None, 60.0, {})
    assert set(s.origin.values()) == {"default"}


def test_a_bad_gpu_map_in_the_environment_is_named():
    with pytest.raises(ProcessError, match="CRIU_GPUSHARE_GPU_MAP"):
        load_settings({}, {"CRIU_GPUSHARE_CONFIG": os.devnull, "CRIU_GPUSHARE_GPU_MAP": "nonsense"})


@pytest.mark.parametrize("given, expected", [
    ({"flags": {"store": "/flag"}}, "/flag"),
    ({"env": {"CRIU_GPUSHARE_STORE": "/env"}}, "/env"),
    ({"file": True}, "/from/file"),
    ({}, None),  # the dump's record decides
])
def test_a_restore_reads_the_dumps_store_only_when_no_setting_names_one(given, expected, config):
    env = dict(config if given.get("file") else {"CRIU_GPUSHARE_CONFIG": os.devnull}, **given.get("env", {}))
    job = jobs.Restore("/images", load_settings(given.get("flags"), env))
    assert job.store == expected
    job.record = {"store": "/recorded", "ref": "dump-1-x"}
    assert job.options().store == (expected or "/recorded")


def test_options_are_kept_whole_and_read_back_from_older_journals():
    opts = Options(store="/s", ref="r", timeout_s=5.0, verify=False, cache="/c", cache_limit=10,
                   gpu_map={GPU_A: GPU_B})
    assert Options.from_stored({"options": opts.stored()}) == opts
    older = {"store": "/s", "ref": "r", "verify": False, "cache": "/c", "cache_limit": 10}
    assert Options.from_stored(older, gpu_map={GPU_A: GPU_B}) == Options(
        store="/s", ref="r", verify=False, cache="/c", cache_limit=10, gpu_map={GPU_A: GPU_B})


def test_nothing_under_engine_exits_the_process():
    """Errors carry their exit codes up to the entry point (cli/__init__.py, hook/main.py), which
    catches once: no module of the engine ends the process on its own. A module's own `__main__`
    block (dumpwatch.py, a program of its own) is an entry point."""
    engine = os.path.join(os.path.dirname(jobs.__file__))
    found = []
    for name in sorted(os.listdir(engine)):
        if name.endswith(".py"):
            text = open(os.path.join(engine, name)).read().split('\nif __name__ == "__main__":')[0]
            found += [f"{name}: {m.group(0)}" for m in re.finditer(r"\bsys\.exit\b|\bexit\(", text)]
    assert not found, found


@pytest.mark.parametrize("refused", [False, True])
def test_a_restore_that_fails_before_its_gpu_steps_stops_what_it_loads_ahead(monkeypatch, refused):
    """Restore.stop_loading_ahead (CRIU's restore failed, or the GPU check refused): it waits for
    the GPU check's thread, which may still start a load ahead, then closes what it started; a
    refusal there was already reported where it was asked and is not raised again."""
    from criu_gpushare.errors import ImageError

    class LoadingAhead:
        closed = 0

        def close(self):
            self.closed += 1

    job = jobs.Restore("/images", load_settings({}, {"CRIU_GPUSHARE_CONFIG": os.devnull}))
    job.record = {"store": "/recorded", "ref": "dump-1-x", "group": {"units": []}}
    started = LoadingAhead()

    def check_gpus(images_dir, rec, gpu_map):
        if refused:
            raise ImageError(images_dir, "no room")
        return {0: 64 << 30}

    monkeypatch.setattr(jobs.restore, "check_gpus", check_gpus)
    monkeypatch.setattr(jobs.restore, "pin_ring_ahead", lambda room, total: True)
    monkeypatch.setattr(jobs.restore, "load_ahead", lambda rec, options, manifest, report: started)
    job.check_gpus_ahead()
    job.stop_loading_ahead()
    assert started.closed == (0 if refused else 1)
    job.stop_loading_ahead()  # once only
    assert started.closed == (0 if refused else 1)


@pytest.mark.parametrize("store_where", ["same device", "another device", "s3"])
def test_the_store_is_read_ahead_after_criu_s_page_images_where_they_share_its_device(
        monkeypatch, tmp_path, store_where):
    """CRIU reads its page images in small pieces: beside the store's many large reads from the
    same disk they came slowly, and CRIU's restore waited for them. So the store's reading ahead
    starts once the page images are read where both are on one device, and at once elsewhere."""
    import threading
    images_dir, store = tmp_path / "images", tmp_path / "store"
    images_dir.mkdir()
    store.mkdir()
    location = {"same device": str(store), "another device": "/proc", "s3": "s3://bucket/store"}[store_where]
    pages_read, order = threading.Event(), []

    def read_pages():
        pages_read.wait(30)
        order.append("pages read")
    pages = threading.Thread(target=read_pages)
    pages.start()
    job = jobs.Restore(str(images_dir), load_settings({}, {"CRIU_GPUSHARE_CONFIG": os.devnull}))
    job.record = {"store": location, "ref": "dump-1-x", "group": {"units": []}}
    job._pages_ahead = pages
    monkeypatch.setattr(jobs.restore, "check_gpus", lambda images_dir, rec, gpu_map: {0: 64 << 30})
    monkeypatch.setattr(jobs.restore, "pin_ring_ahead", lambda room, total: True)
    monkeypatch.setattr(jobs.restore, "load_ahead",
                        lambda rec, options, manifest, report: order.append("store read ahead"))
    try:
        job.check_gpus_ahead()
        if store_where != "same device":
            job.gpus_checked()
            assert order == ["store read ahead"]
        pages_read.set()
        job.gpus_checked()
        pages.join(30)
        assert order == (["pages read", "store read ahead"] if store_where == "same device"
                         else ["store read ahead", "pages read"])
    finally:
        pages_read.set()


def test_work_in_a_thread_is_handed_over_once_and_never_lost():
    """engine/inthread.py InThread, on which `criu-gpushare dump` runs its GPU steps while CRIU
    starts: its value or its exception reaches the caller; a wait broken off (a Ctrl-C) leaves it
    undelivered, so the caller's cleanup still takes it (and undoes what it did)."""
    import threading
    done = InThread(lambda: 7, "t")
    assert done.result() == 7 and done.delivered

    def fails():
        raise ProcessError(1, "failed in its thread")
    failed = InThread(fails, "t")
    with pytest.raises(ProcessError, match="failed in its thread"):
        failed.result()
    assert failed.delivered
    said = []
    assert InThread(fails, "t").outcome(said.append) is None
    assert said and "failed in its thread" in said[0]

    release = threading.Event()
    slow = InThread(lambda: release.wait(30) and "undone later", "t")
    slow._future.result = lambda *a: (_ for _ in ()).throw(KeyboardInterrupt())  # the Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        slow.result()
    assert not slow.delivered
    del slow._future.result
    release.set()
    assert slow.outcome(said.append) == "undone later" and slow.delivered


def test_a_criu_request_gets_a_plugin_directory_without_cuda_that_is_gone_after(tmp_path, monkeypatch):
    """Where CRIU's plugins include NVIDIA's cuda_plugin.so, each request of the wrapper points
    CRIU at a private directory of the others, removed once the request ended, failed or not."""
    libs = tmp_path / "libs"
    libs.mkdir()
    for name in ("cuda_plugin.so", "amdgpu_plugin.so"):
        (libs / name).write_bytes(b"")
    monkeypatch.setenv("CRIU_LIBS_DIR", str(libs))
    with jobs._criu_request({}) as options:
        private = options.libdir
        assert sorted(os.listdir(private)) == ["amdgpu_plugin.so"]
    assert not os.path.exists(private)
    with pytest.raises(RuntimeError):
        with jobs._criu_request({}) as options:
            private = options.libdir
            raise RuntimeError("CRIU failed")
    assert not os.path.exists(private) and sorted(os.listdir(libs)) == ["amdgpu_plugin.so", "cuda_plugin.so"]
    (libs / "cuda_plugin.so").unlink()
    with jobs._criu_request({}) as options:
        assert options.libdir is None  # CRIU's own directory is right as it is
