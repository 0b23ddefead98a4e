"""criu_gpushare.criu.images on real dumps, and on real images edited with pycriu the way a dump
of a GPU process would have written them."""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

import pytest

from criu_gpushare.criu import images, rpc
from criu_gpushare.errors import ImageError
from criu_gpushare.store import memfs
from criutest import shared_library, sleeper, start_daemon


@pytest.fixture
def plain_dump(criu, tmp_path, processes):
    """The image directory of a process that uses no GPU, and its pid."""
    proc = sleeper(tmp_path, processes)
    out = tmp_path / "plain"
    out.mkdir()
    rpc.dump(str(out), proc.pid, rpc.CriuOptions(leave_running=True))
    return str(out), proc.pid


@pytest.fixture
def libcuda_dump(criu, tmp_path, processes):
    """The image directory of a process that loaded a library named libcuda.so.1 (what a CUDA
    process maps, dumped without our hook)."""
    lib = shared_library(tmp_path, "libcuda.so.1", "int cuInit(unsigned flags) { return 0; }\n")
    proc = start_daemon(tmp_path, f"import ctypes, time\nctypes.CDLL({lib!r})\n"
                                  "while True: time.sleep(0.05)", processes)
    out = tmp_path / "libcuda"
    out.mkdir()
    rpc.dump(str(out), proc.pid, rpc.CriuOptions(leave_running=True))
    return str(out)


def rewrite(images_dir: str, name: str, edit) -> None:
    """Decode an image file with pycriu, edit its entries, encode it back."""
    from pycriu import images as pycriu_images

    path = os.path.join(images_dir, name)
    with open(path, "rb") as f:
        img = pycriu_images.load(f)
    edit(img["entries"])
    with open(path, "wb") as f:
        pycriu_images.dump(img, f)


def test_a_plain_dump_has_no_gpu_traces(plain_dump):
    images_dir, pid = plain_dump
    assert images.pids(images_dir) == [pid]
    assert images.inventory_plugins(images_dir) == []
    assert images.device_files(images_dir) == []
    assert images.maps_libcuda(images_dir) is False


def test_a_dumped_libcuda_mapping_is_seen(libcuda_dump):
    assert images.maps_libcuda(libcuda_dump) is True
    assert images.device_files(libcuda_dump) == []  # mapped, but no device opened


def test_plugins_recorded_in_the_inventory_are_listed(plain_dump):
    images_dir, _ = plain_dump
    rewrite(images_dir, "inventory.img",
            lambda entries: entries[0].update(plugins_entry={"plugins": ["cuda_plugin"]}))
    assert images.inventory_plugins(images_dir) == ["cuda_plugin"]


def test_gpu_device_files_are_listed_sorted_once(plain_dump):
    images_dir, _ = plain_dump

    def add_devices(entries):
        template = next(e for e in entries if e["type"] == "REG")
        next_id = max(e["id"] for e in entries) + 1
        for offset, name in enumerate(["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidiactl", "/dev/null"]):
            reg = dict(template["reg"], id=next_id + offset, name=name)
            entries.append(dict(template, id=next_id + offset, reg=reg))

    rewrite(images_dir, "files.img", add_devices)
    assert images.device_files(images_dir) == ["/dev/nvidia0", "/dev/nvidiactl"]


def test_a_missing_image_file_is_named(plain_dump, tmp_path):
    images_dir, _ = plain_dump
    os.unlink(os.path.join(images_dir, "pstree.img"))
    with pytest.raises(ImageError, match="pstree.img: No such file"):
        images.pids(images_dir)
    broken = tmp_path / "no-files"
    shutil.copytree(images_dir, broken)
    os.unlink(broken / "files.img")
    with pytest.raises(ImageError, match="files.img: missing"):
        images.device_files(str(broken))


def test_an_undecodable_image_file_is_named(plain_dump):
    images_dir, _ = plain_dump
    with open(os.path.join(images_dir, "inventory.img"), "wb") as f:
        f.write(b"not an image")
    with pytest.raises(ImageError, match="inventory.img: cannot be decoded") as failure:
        images.inventory_plugins(images_dir)
    assert failure.value.exit_code == 12


def test_a_directory_without_memory_images_is_refused(plain_dump):
    images_dir, _ = plain_dump
    for name in os.listdir(images_dir):
        if name.startswith("mm-"):
            os.unlink(os.path.join(images_dir, name))
    with pytest.raises(ImageError, match="no memory image"):
        images.maps_libcuda(images_dir)


def test_the_image_s_memory_is_told_by_what_it_belongs_to(criu, tmp_path, processes):
    """pages_by_mapping: 32 MiB written in a private anonymous mapping, 16 MiB in a shared one and
    1 MiB of a file mapped private and written are each found as what they are, and the private
    mapping leads the largest; the kinds add up to the pages CRIU wrote."""
    data = tmp_path / "data.bin"
    data.write_bytes(b"\0" * (4 << 20))
    code = ("import mmap, time\n"
            "anon = mmap.mmap(-1, 32 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)\n"
            "anon[:] = b'a' * (32 << 20)\n"
            "shared = mmap.mmap(-1, 16 << 20)\n"
            "shared[:] = b's' * (16 << 20)\n"
            f"f = open({str(data)!r}, 'rb')\n"
            "mapped = mmap.mmap(f.fileno(), 4 << 20, access=mmap.ACCESS_COPY)\n"
            "mapped[:1 << 20] = b'f' * (1 << 20)\n"
            f"open({str(tmp_path / 'written')!r}, 'w').close()\n"
            "while True: time.sleep(0.05)")
    proc = start_daemon(tmp_path, code, processes)  # ready once started: the writes may still run
    for _ in range(200):
        if (tmp_path / "written").exists():
            break
        time.sleep(0.05)
    out = tmp_path / "parts"
    out.mkdir()
    rpc.dump(str(out), proc.pid, rpc.CriuOptions(leave_running=True))

    found = images.pages_by_mapping(str(out), largest=3)
    kinds = found["kinds"]
    assert kinds["anonymous private"] >= 32 << 20
    assert kinds["shared memory"] == 16 << 20
    assert kinds["file data.bin (private)"] == 1 << 20
    assert list(kinds.values()) == sorted(kinds.values(), reverse=True)
    assert found["largest"][0]["kind"] == "anonymous private"
    # at least the 32 MiB: the kernel may merge the mapping with an anonymous neighbour it touches
    assert found["largest"][0]["bytes"] >= 32 << 20 and found["largest"][0]["pid"] == proc.pid
    written = sum(os.path.getsize(p) for p in out.glob("pages-*.img"))
    assert sum(kinds.values()) == written


def test_the_page_images_are_read_ahead_of_criu_and_nothing_else(plain_dump, tmp_path, monkeypatch):
    """A restore from a disk reads CRIU's page images whole into the page cache before CRIU reads
    them. Other image files are left alone, and a page image it cannot open (here a symbolic link,
    which it does not follow) is skipped without stopping the rest."""
    images_dir = tmp_path / "copy"
    shutil.copytree(plain_dump[0], images_dir)
    if memfs.file_system_type(str(images_dir)) in memfs.MEMORY_FILE_SYSTEMS:
        pytest.skip(f"{tmp_path} is on tmpfs here: the read-ahead is for images on a disk")
    pages = {p.name: p.stat().st_size for p in images_dir.glob("pages-*.img")}
    assert pages, "CRIU wrote no page image"
    (tmp_path / "elsewhere").write_bytes(b"x" * 4096)
    os.symlink(tmp_path / "elsewhere", images_dir / "pages-999.img")
    read = {}
    real = os.readv

    def counted(fd, buffers):
        n = real(fd, buffers)
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        read[name] = read.get(name, 0) + n
        return n

    monkeypatch.setattr(os, "readv", counted)
    images.read_pages_ahead(str(images_dir)).join(30)
    assert read == pages


def test_page_images_in_memory_or_too_large_for_it_are_not_read_ahead(plain_dump, tmp_path, monkeypatch):
    """On tmpfs the page images are in memory already; where they would take more than half the
    memory available, reading them ahead would push them out again before CRIU reads them."""
    on_tmpfs = tempfile.mkdtemp(dir="/dev/shm")
    try:
        shutil.copytree(plain_dump[0], on_tmpfs, dirs_exist_ok=True)
        assert images.read_pages_ahead(on_tmpfs) is None
    finally:
        shutil.rmtree(on_tmpfs)
    monkeypatch.setattr(memfs, "file_system_type", lambda path: 0xEF53)  # ext4's
    monkeypatch.setattr(images, "_available_memory", lambda: 4096)
    assert images.read_pages_ahead(plain_dump[0]) is None


def test_the_page_images_go_to_the_disk_while_criu_writes_them(tmp_path, monkeypatch):
    """WriteBack: each page image, those made after it started included, gets its dirty pages
    queued for writing (sync_file_range, SYNC_FILE_RANGE_WRITE) whenever it has grown, until
    stop(); no descriptor stays open; the other image files and symbolic links are left alone;
    again, stop() does nothing."""
    if memfs.file_system_type(str(tmp_path)) in memfs.MEMORY_FILE_SYSTEMS:
        pytest.skip(f"{tmp_path} is on tmpfs here: nothing to write back")
    queued, lock = [], threading.Lock()

    def sync_file_range(fd, offset, nbytes, flags):
        assert (offset, nbytes, flags) == (0, 0, images._SYNC_FILE_RANGE_WRITE)
        with lock:
            queued.append((os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), os.fstat(fd).st_size))
        return 0
    monkeypatch.setattr(images, "_sync_file_range", sync_file_range)
    (tmp_path / "inventory.img").write_bytes(b"x" * 4096)
    os.symlink(tmp_path / "inventory.img", tmp_path / "pages-9.img")
    pages = tmp_path / "pages-1.img"

    def wait_for(entry):
        deadline = time.monotonic() + 10
        while entry not in queued:
            assert time.monotonic() < deadline, queued
            time.sleep(0.01)
    wb = images.WriteBack(str(tmp_path)).start()
    assert wb.running
    # CRIU writes on (a new file, whole at once: a stat mid-write could see it half grown)
    (tmp_path / "new.tmp").write_bytes(b"y" * 65536)
    os.rename(tmp_path / "new.tmp", pages)
    wait_for(("pages-1.img", 65536))
    time.sleep(5 * images.WRITE_BACK_EVERY_S)
    assert queued == [("pages-1.img", 65536)], "queued again without having grown"
    with open(pages, "ab") as f:
        f.write(b"z" * 4096)
    wait_for(("pages-1.img", 69632))
    wb.stop()
    opened = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
              if os.path.exists(f"/proc/self/fd/{fd}")]
    assert not [p for p in opened if p.startswith(str(tmp_path))], opened
    assert {name for name, _ in queued} == {"pages-1.img"}
    wb.stop()
    assert not wb.running


def test_an_image_in_memory_is_not_written_back():
    on_tmpfs = tempfile.mkdtemp(dir="/dev/shm")
    try:
        wb = images.WriteBack(on_tmpfs).start()
        assert not wb.running
        wb.stop()
    finally:
        shutil.rmtree(on_tmpfs)
