"""The CRIU jobs: dump and restore, each built once here from one Settings, whichever door calls
it: the commands (cli/checkpoint.py) or the CRIU action script (hook/main.py). The in-place job,
suspend, is engine/suspension.py's and resume engine/resuming.py's: neither imports CRIU's side. A
door parses what it is given, loads the settings, calls a job and prints what it returns; an error
goes up to the door's one catch, which exits with its code (errors.py).

The settings come from engine/settings.py, one order for every door; a restore's store, where no
setting names one, is the one its dump recorded in the image. A run's options are made from the
settings by engine/steps.py Options.from_settings only, and kept whole in its journal and, for a
dump, in the image's record.
"""
import contextlib
import os
import shutil

from ..criu import images, libdir, rpc
from ..errors import Cancelled, Interrupted, ProcessError
from ..store.s3client import is_s3_url
from . import cancel, dump, dumpwatch, record as image_record, restore, results, resuming
from .faults import fault_point
from .inthread import InThread
from .settings import load_settings
from .steps import Options, new_ref


# -- dump ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _criu_request(criu):
    """CRIU's options for one request (rpc.CriuOptions), with a plugin directory made for it and
    removed once the request ended: CRIU's CUDA plugin must not touch our tasks."""
    plugins = libdir.plugin_dir_without_cuda()
    try:
        yield rpc.CriuOptions(libdir=plugins, **criu)
    finally:
        if plugins:
            shutil.rmtree(plugins, ignore_errors=True)


class Dump:
    """A dump of pid's tree into images_dir: by CRIU's RPC in this process (run), or the GPU side
    only, in the holder of CRIU that runs the hook (engine/dump_holder.py uses .job)."""

    def __init__(self, pid, images_dir, settings, report=print, cancel_=None, pids=None):
        """pids: the tree's, where the caller has them already (dump.DumpJob)."""
        self.pid, self.images_dir, self.settings, self.report = pid, images_dir, settings, report
        # A dump reads no chunk: the node cache is left alone.
        options = Options.from_settings(settings, new_ref("dump", pid), hold_kind="dump", cache=None,
                                        cache_limit=None)
        self.job = dump.DumpJob(pid, images_dir, options, report=report, cancel=cancel_, pids=pids)

    @classmethod
    def of_command(cls, pid, images_dir, settings, report=print):
        """`criu-gpushare dump PID DIR`: DIR made, and named by its real path."""
        if not os.path.exists(f"/proc/{pid}"):
            raise ProcessError(pid, "no such process")
        os.makedirs(images_dir, exist_ok=True)
        return cls(pid, os.path.realpath(images_dir), settings, report, cancel.Cancel())

    def run(self, criu, clock):
        """CRIU's dump, the GPU steps while CRIU starts (its pre-dump waits for them); -> the
        summary. criu: CRIU's options (rpc.CriuOptions fields); clock: marks the phases
        (cli/phases.py PhaseClock)."""
        pid, images_dir, job, interrupt = self.pid, self.images_dir, self.job, self.job.cancel
        state = {"gpu": False}
        gpu_out = None

        def on_notify(action, _pid):
            if action == "pre-dump":
                state["gpu"] = gpu_out.result()
                clock.absorb(results.phases(job.group.times, job.group.parts) if state["gpu"] else {},
                             "criu start; gpu out: other")
            elif action == "post-dump":
                if interrupt.requested():  # CRIU then fails the dump and lets the tree run on
                    raise Cancelled(f"dump of {pid} cancelled by an interrupt at CRIU's post-dump: the "
                                    "tree runs on as before")
                if state["gpu"]:
                    clock.mark("criu dump (freeze, memory, images)")
                    job.complete()
                    clock.mark("sync: store and image (post-dump)")

        def first_interrupt():
            interrupt.request()
            self.report("interrupt: cancelling the dump at its next step (or at CRIU's post-dump), "
                        "then rolling back (Ctrl-C again interrupts the step at once)")

        # Should this process die mid-dump, the watch gives the tree its GPU state back
        # (engine/dumpwatch.py); every path below that this process controls stands it down.
        watch = dumpwatch.DumpWatch.start(job.key, self.report)
        try:
            with cancel.on_interrupt(first_interrupt):
                criu_ok = False
                # The GPU steps need nothing of CRIU's before its pre-dump (which comes before it
                # seizes any task): they run while CRIU starts, and pre-dump waits for them.
                gpu_out = InThread(job.begin, "gpu-out")
                try:
                    with _criu_request(criu) as options:
                        rpc.dump(images_dir, pid, options, on_notify, on_worker=watch.criu_started)
                    criu_ok = True
                    clock.mark("criu finish")
                finally:
                    if not gpu_out.delivered:  # CRIU failed before its pre-dump (or a Ctrl-C came
                        state["gpu"] = gpu_out.outcome(self.report)  # in it): undo what ran meanwhile
                    if state["gpu"]:
                        job.after_criu(criu_ok)
                        clock.mark("gpu back (tasks run on)")
        except KeyboardInterrupt:  # the second Ctrl-C, in CRIU's dump: CRIU was stopped, the tree let go
            raise Cancelled(f"dump of {pid} interrupted: CRIU was stopped, the tree runs on as "
                            "before") from None
        finally:
            watch.stand_down()
        clock.mark("dump watch stand-down")  # it waits for the watch to end, which may still be starting
        if interrupt.requested():
            raise Interrupted(f"the interrupt came once the dump was done: {images_dir} holds it"
                              + ("" if options.leave_running else " and the tree has ended"))
        summary = (results.summary(job.group, "dumped") if state["gpu"]
                   else {"state": "dumped", "pids": [], "seconds": {}})
        summary.update(phases=clock.result(), criu_stats=images.stats(images_dir, "dump"))
        summary.update(images_dir=images_dir, image_bytes=images.image_bytes(images_dir),
                       gpu_state=state["gpu"], left_running=options.leave_running)
        if state["gpu"]:
            summary.update(store=self.settings.store, ref=job.ref)
        return summary


# -- restore -------------------------------------------------------------------------------------


#: The longest the store's reading ahead waits for CRIU's page images (Restore._pages_first): on a
#: disk that reads 1 GB/s, ten times the 1 GiB a torch process leaves in CRIU's image.
PAGES_FIRST_S = 10.0


def _same_device(path, store):
    """Whether the file system of path is that of the store (a directory; an s3:// store is not)."""
    if is_s3_url(store):
        return False
    try:
        return os.stat(path).st_dev == os.stat(store).st_dev
    except OSError:
        return False


class Restore:
    """The restore of images_dir: by CRIU's RPC in this process (run_criu), or the GPU side only
    for CRIU that runs the hook (in the holder its pre-restore starts, engine/restore_holder.py;
    finish_without_holder where none answers)."""

    def __init__(self, images_dir, settings, report=print):
        self.images_dir, self.settings, self.report = images_dir, settings, report
        # The dump's recorded store unless a flag, the environment or the config file names one.
        self.store = settings.store if settings.origin.get("store") != "default" else None
        self.record = self.manifest = None
        self._gpus = None  # the GPU check, in its thread (check_gpus_ahead)
        self._loading_ahead = None  # what the GPU check started reading (restore.load_ahead)
        self._journaled = None  # (group, journal) once CRIU restored the processes (journal())
        self._pages_ahead = None  # the thread reading CRIU's page images ahead (check_image)

    def check_image(self):
        """Before CRIU restores anything: the image and the store (engine/restore.py), without
        CUDA, while CRIU's page images are read into the page cache for it; -> whether there is
        GPU state to bring back."""
        self._pages_ahead = images.read_pages_ahead(self.images_dir)
        self.record, self.manifest = restore.check_image(self.images_dir, self.store,
                                                         lambda: images.maps_libcuda(self.images_dir))
        return self.record is not None

    def check_gpus_ahead(self):
        """The GPUs checked, then the load's ring pinned and the store read into spare GPU memory
        where every GPU has room, in threads started now: CRIU restores the processes meanwhile,
        and its post-restore waits for the verdict (gpus_checked), not for the reading."""
        def check_and_prepare():
            room = restore.check_gpus(self.images_dir, self.record, self.settings.gpu_map)
            pinned = restore.pin_ring_ahead(room, sum(u["size"] for u in self.record["group"]["units"]))
            if pinned:
                self._pages_first()
                self._loading_ahead = restore.load_ahead(self.record, self.options(), self.manifest,
                                                         self.report)
            return pinned
        self._gpus = InThread(check_and_prepare, "gpu-check")

    def _pages_first(self):
        """Before the store is read ahead: CRIU's page images read, where they share the store's
        device. CRIU needs them before the processes can run and reads them in small pieces, which
        the store's many large reads hold up: a cold restore of 1 GiB beside 6 GiB of the store
        read from one disk ended 19-26% sooner so (bench/criu_memory_bench.py --cold
        --beside-store, bench/RESULTS.md)."""
        if self._pages_ahead is None or not _same_device(self.images_dir, self.options().store):
            return
        self._pages_ahead.join(PAGES_FIRST_S)

    def gpus_checked(self):
        """At CRIU's post-restore: the GPU check's verdict, waited for. A refusal (ImageError) is
        raised, so CRIU kills what it restored; -> whether the load's ring is pinned ahead."""
        return self._gpus.result()

    def read_record(self):
        """The image's record, read without check_image() (the hook's post-resume where no holder
        listens: CRIU has restored the tree by then); -> whether there is GPU state to bring back."""
        try:
            rec = image_record.read(self.images_dir)
        except image_record.RecordMissing:
            return False  # pre-restore let it through: nothing of ours in the tree
        self.record = rec if rec["gpu_state"] else None
        return self.record is not None

    def options(self):
        rec = self.record
        return Options.from_settings(self.settings, rec["ref"], store=self.store or rec["store"],
                                     gpu_map=self.settings.gpu_map or None)

    def journal(self, root):
        """CRIU restored the tree of root: its group under a restore journal (restore.journal_group),
        made once; -> (group, journal)."""
        if self._journaled is None:
            self._journaled = restore.journal_group(self.record, root, self.options(), self.report,
                                                    self.manifest)
        return self._journaled

    def run(self, root):
        """The tree of root runs (CRIU restored it): its GPU state back; -> the summary."""
        group, journal = self.journal(root)
        group.report = self.report  # the holder's reporter of this request, not of the one before
        loading_ahead, self._loading_ahead = self._loading_ahead, None  # the run frees it
        return restore.run(group, journal, loading_ahead)

    def drop_journal(self, unless_alive=False):
        """The restore failed after the journal was made, and CRIU killed the tree it restored:
        the journal goes too. unless_alive (CRIU ended, how is unknown): only where none of its
        processes lives; -> whether one stays (processes that run keep it: `criu-gpushare
        resume` brings their GPU state back)."""
        if self._journaled is None:
            return False
        _, journal = self._journaled
        if unless_alive and journal.processes_alive():
            return True
        journal.close()
        return False

    def stop_loading_ahead(self):
        """A restore that failed before run(): the reading ahead stopped, its GPU memory freed."""
        if self._gpus is not None:
            try:
                self._gpus.result()  # it may still start one
            except Exception:  # noqa: BLE001 - its refusal was reported where it was asked
                pass
        if self._loading_ahead is not None:
            self._loading_ahead.close()
            self._loading_ahead = None

    def run_criu(self, criu, clock):
        """`criu-gpushare restore DIR`: check, CRIU's restore, the GPU state; -> the summary."""
        images_dir = self.images_dir
        try:
            self.check_image()
        except KeyboardInterrupt:
            raise Cancelled(f"restore of {images_dir} interrupted before CRIU began: nothing was "
                            "restored") from None
        gpu_state = self.record is not None

        tree_runs = []  # CRIU's pre-resume came: what follows, the tree runs on whatever fails

        def on_notify(action, pid):
            if action == "post-restore":
                clock.mark("criu restore (processes, host memory)")
                self.gpus_checked()  # a refusal: CRIU kills what it restored
                clock.mark("check (GPUs, while CRIU restored)")
                # The journal before any GPU step: should this process die from now on, `resume`
                # finishes the work (before pre-resume CRIU kills the tree, and the journal,
                # abandoned, goes when next read).
                if pid:  # CRIU names the root here (else the journal is made once it returns)
                    self.journal(pid)
                fault_point("post-restore")
                clock.mark("journal (the restored pids)")
            elif action == "pre-resume":
                tree_runs.append(True)
                fault_point("pre-resume")

        if gpu_state:
            self.check_gpus_ahead()
        clock.mark("check (image, store)")
        # Once CRIU restores, nothing takes it back: an interrupt says so and the restore goes on.
        with cancel.on_interrupt(lambda: self.report(cancel.GOES_ON.format("restore"))):
            try:
                with _criu_request(criu) as options:
                    root = rpc.restore(images_dir, options, on_notify if gpu_state else None)
                clock.mark("criu resume (tasks run)" if gpu_state else "criu restore (processes, host memory)")
            except BaseException:
                self.stop_loading_ahead()
                if not tree_runs:
                    self.drop_journal()  # CRIU killed the tree it restored
                raise
            summary = {"state": "restored", "pid": root, "pids": [], "seconds": {},
                       "gpu_state": gpu_state, "ring_pinned_ahead": gpu_state and self.gpus_checked()}
            if gpu_state:
                summary.update(self.run(root))
                summary["pid"] = root
                clock.absorb(summary.get("phases", {}), "gpu back: other")
        summary.update(phases=clock.result(), criu_stats=images.stats(images_dir, "restore"))
        return summary

    def check_ahead(self, report):
        """The hook's restore holder, while CRIU restores the processes: the image and the store
        checked (check_image), the node cache filled, then the GPU check started (check_gpus_ahead);
        -> whether there is GPU state to bring back. report: where the lines for CRIU's log go."""
        self.report = report
        if not self.check_image():
            return False
        fetched = self.warm_cache()
        if fetched is not None:
            report(f"node cache {self.settings.cache}: {fetched} chunk(s) fetched")
        rec = self.record
        report(f"image {self.images_dir}: GPU state of {len(rec['processes'])} process(es) in "
               f"{self.store or rec['store']} ({rec['ref']}), every chunk present")
        self.check_gpus_ahead()
        return True

    def warm_cache(self):
        """The hook's restore holder, while CRIU restores: the node cache filled with what the
        restore will read; -> the number of chunks fetched, or None without a cache."""
        if not self.settings.cache:
            return None
        return restore.warm_cache(self.record, self.store, self.settings.cache,
                                  self.settings.cache_limit).fetched

    @staticmethod
    def finish_without_holder(state, report, dead_holder=None):
        """The hook's post-resume where no holder answers; state: what post-restore kept,
        {"images_dir": the image's real path (CRIU has closed its own by post-resume), "root":
        the restored root}; dead_holder: the key of a holder that closed the connection without
        an answer (it died with the request), else None. Where the holder made the restored
        group's journal (at post-restore) and was then killed or crashed, before or during this
        request, the work is finished from the journal, as `criu-gpushare resume` would. One that
        died with the request and left no journal had closed it, its work done. Where no holder
        made one (a CRIU whose pre-restore ran another program), the GPU state comes back from
        the image here. -> the summary, or None when the image holds no GPU state."""
        journal = restore.journal_of_tree(state["root"])
        if journal is not None:
            return resuming.take_over(journal, load_settings(), report, dead_holder)["result"]
        if dead_holder is not None:
            return resuming.closed_without_reply(dead_holder, [state["root"]])["result"]
        job = Restore(state["images_dir"], load_settings(), report)
        if not job.read_record():
            return None
        return job.run(state["root"])
