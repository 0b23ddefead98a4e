"""The CPU freezer: frozen threads stop, spared threads run on, no signal is lost."""
import mmap
import os
import signal
import struct
import subprocess
import time

import pytest

from criu_gpushare.errors import ProcessError
from criu_gpushare.engine.freezer import Freezer, thread_ids, thread_name

# Three counting threads: main, a worker, and one named like the shim's threads. SIGUSR1 is counted.
# Counters live in a shared file so the test reads them without the process's help.
PROGRAM = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>
static volatile uint64_t *c;
static void *spin(void *arg) {
    int i = (int)(intptr_t)arg;
    if (i == 2) prctl(PR_SET_NAME, "criu-gpushare");
    if (i == 2) { sigset_t all; sigfillset(&all); pthread_sigmask(SIG_BLOCK, &all, 0); }
    for (;;) { c[i]++; usleep(100); }
}
static void on_usr1(int s) { (void)s; c[3]++; }
int main(int argc, char **argv) {
    (void)argc;
    int fd = open(argv[1], O_RDWR);
    c = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    signal(SIGUSR1, on_usr1);
    pthread_t t;
    pthread_create(&t, 0, spin, (void *)1);
    pthread_create(&t, 0, spin, (void *)2);
    spin((void *)0);
}
"""


@pytest.fixture
def counting_process(tmp_path):
    src, exe, counters = tmp_path / "count.c", tmp_path / "count", tmp_path / "counters"
    src.write_text(PROGRAM)
    subprocess.run(["gcc", "-O1", "-pthread", "-o", str(exe), str(src)], check=True)
    counters.write_bytes(bytes(4096))
    proc = subprocess.Popen([str(exe), str(counters)])
    f = open(counters, "r+b")
    view = mmap.mmap(f.fileno(), 4096)

    def read():
        return struct.unpack_from("4Q", view)

    deadline = time.time() + 10
    while len(thread_ids(proc.pid)) < 3 or 0 in read()[:3]:
        assert time.time() < deadline, "counting process did not start"
        time.sleep(0.01)
    yield proc, read
    proc.kill()
    proc.wait()
    view.close()
    f.close()


def advanced(read, seconds=0.3):
    before = read()
    time.sleep(seconds)
    after = read()
    return [a > b for a, b in zip(after, before)]


def test_frozen_threads_stop_and_the_shims_thread_runs_on(counting_process):
    proc, read = counting_process
    fz = Freezer()
    fz.freeze(proc.pid)
    try:
        main, worker, shim, _ = advanced(read)
        assert (main, worker, shim) == (False, False, True)
        spared = [t for t in thread_ids(proc.pid) if thread_name(proc.pid, t) == "criu-gpushare"]
        assert fz.frozen_threads(proc.pid) == sorted(set(thread_ids(proc.pid)) - set(spared))
    finally:
        fz.thaw(proc.pid)
    assert advanced(read)[:3] == [True, True, True]


def test_spared_tids_keep_running(counting_process):
    proc, read = counting_process
    fz = Freezer()
    fz.freeze(proc.pid, spare_tids={proc.pid})  # the main thread plays the driver's restore thread
    try:
        assert advanced(read)[:3] == [True, False, True]
    finally:
        fz.thaw()


def test_signals_sent_while_frozen_are_delivered_after_thaw(counting_process):
    proc, read = counting_process
    fz = Freezer()
    fz.freeze(proc.pid)
    try:
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(0.2)
        assert read()[3] == 0, "the handler ran while frozen"
    finally:
        fz.thaw(proc.pid)
    deadline = time.time() + 5
    while read()[3] == 0:
        assert time.time() < deadline, "SIGUSR1 sent while frozen was lost"
        time.sleep(0.01)
    assert read()[3] == 1


def test_unknown_pid_is_a_clear_error():
    gone = subprocess.Popen(["true"])
    gone.wait()
    with pytest.raises(ProcessError, match=f"process {gone.pid}: no such process"):
        Freezer().freeze(gone.pid)
