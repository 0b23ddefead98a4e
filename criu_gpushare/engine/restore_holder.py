"""The holder of one CRIU restore run by the hook: made by `pre-restore` without the engine.

CRIU waits for each action script before it goes on, and for `pre-restore` before it restores
anything: every second spent there is a second of the restore. So `pre-restore` only reads the
image's record, forks this holder and returns once it listens. The holder then imports the engine
and checks the image and the store, fills the node cache and checks the GPUs (CUDA starts here,
never in the hook's process), all in a thread while CRIU restores the processes; `post-restore`
waits for that verdict, and a refusal there makes CRIU kill what it restored, so nothing of the
tree runs. At `post-restore` it also puts the restored group under a journal, before any GPU step;
`post-resume` then has it bring the GPU state back (engine/jobs.py Restore). It ends with that, or
when CRIU ends first (a restore that failed in between).

Apart from engine/jobs.py on purpose: the hook's process imports this module, not the jobs.
"""
from ..errors import ProcessError
from . import holder
from .faults import fault_point
from .inthread import InThread


def has_gpu_state(images_dir):
    """Without CUDA or the engine: whether the image may hold GPU state to bring back. An image
    with libcuda mappings but no record counts (the holder's check refuses it)."""
    from . import record as image_record
    try:
        return bool(image_record.read(images_dir)["gpu_state"])
    except image_record.RecordMissing:
        from ..criu import images
        return images.maps_libcuda(images_dir)


class RestoreHolder(holder.CriuWork):
    """The work of the holder of the CRIU restore run by criu_pid (the module says what it does)."""

    def __init__(self, images_dir, settings, criu_pid):
        super().__init__(criu_pid)
        self.images_dir, self.settings = images_dir, settings
        self.key = holder.criu_restore_key(criu_pid)
        self._checked = None  # InThread: the checks while CRIU restores; -> the job, or None
        self._lines = []  # what the checks said, for CRIU's log at post-restore

    def begin(self, report):
        self.watch_criu()
        self._checked = InThread(self._check, "restore-checks")
        return {"gpu_state": True}, True

    def _check(self):
        from .jobs import Restore
        job = Restore(self.images_dir, self.settings)
        return job if job.check_ahead(self._say) else None

    def _say(self, message):
        print(message, flush=True)  # the holder's log
        self._lines.append(message)

    def _job(self, report):
        """The checks' verdict, waited for (a refusal raised); the lines they wrote go to report."""
        try:
            return self._checked.result()
        finally:
            lines, self._lines = self._lines, []  # the checks' thread may still add to it
            for line in lines:
                report(line)

    def on_event(self, report):
        job = self._checked.outcome(report) if self._checked.done() else None
        if job is not None and job.drop_journal(unless_alive=True):
            report("CRIU ended before its post-resume, and the processes it restored run: "
                   "`criu-gpushare resume PID` (any of them) brings their GPU state back")
        else:
            report("CRIU ended before its post-resume: no GPU state to bring back")
        return False

    def handle(self, cmd, fields, report):
        job = self._job(report)
        if job is None:  # the record says no GPU state after all
            return {"gpu_state": False}, False
        if cmd == "post-restore":
            pinned = job.gpus_checked()
            # The journal before any GPU step: a holder that dies from now on loses nothing, and
            # post-resume finishes its work (Restore.finish_without_holder).
            job.journal(fields["root"])
            fault_point("post-restore")
            return {"ring_pinned_ahead": pinned}, True
        if cmd == "post-resume":
            job.report = report
            job.gpus_checked()  # its verdict, should post-restore not have asked for it
            return job.run(fields["root"]), False
        raise ProcessError(self.key, f"unknown holder command {cmd!r}")

    def stays_after_failure(self, error):
        # A failed restore is in its journal, which `resume` works from; staying would hold this
        # context and ring for as long as CRIU runs (without -d, the life of the restored tree).
        return False
