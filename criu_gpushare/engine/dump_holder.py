"""The holder of one CRIU dump run by the hook: made by `pre-dump` without the engine.

CRIU waits for `pre-dump` before it seizes anything, and everything the GPU side of the dump needs
is on that path: the engine's imports, CUDA's start (its bindings and cuInit, about 0.2 s on the
H200), then the steps. The wrapper (`criu-gpushare dump`) hides the first two behind CRIU's own
start; here nothing runs beside them unless we make it. So `pre-dump` only finds the tree's CUDA
processes and forks this holder, which starts CUDA in a thread of its own (cuInit runs outside
Python's lock) while it imports the engine, then runs the dump's steps (engine/dump.py, by
engine/jobs.py Dump), and then watches CRIU: post-dump asks it to make the dump durable, and once
CRIU exits it gives tasks still alive their GPU state back.

Apart from engine/jobs.py on purpose: the hook's process imports this module, not the jobs.
"""
from ..errors import Error, ProcessError
from ..shimctl.processes import process_tree
from . import holder


class DumpHolder(holder.CriuWork):
    """The work of the holder of the CRIU dump of root's tree run by criu_pid (the module says what
    it does)."""

    def __init__(self, root, images_dir, settings, criu_pid):
        super().__init__(criu_pid)
        self.root, self.images_dir, self.settings = root, images_dir, settings
        # before the fork: the journal's key names the holder's socket (`resume PID` of any
        # process of the tree finds this holder), and the job is given the same pids
        self.pids = sorted(process_tree(root))
        self.key = self.pids[0]
        self.job = None  # engine/dump.py DumpJob, made in the holder

    def begin(self, report):
        from ..gpu import driver as drv
        self.watch_criu()
        drv.start_in_background()  # beside the imports below
        from . import results
        from .jobs import Dump
        self.job = Dump(self.root, self.images_dir, self.settings, report=report, pids=self.pids).job
        if not self.job.begin():
            return {"gpu_state": False}, False
        group = self.job.group
        return {"gpu_state": True, "ref": self.job.ref, "phases": results.rounded_phases(group),
                "overlapped": {k: round(v, 3) for k, v in group.overlapped.items()}}, True

    def on_event(self, report):
        self.job.set_report(report)
        try:
            self.job.after_criu()
        except Error as e:
            report(f"after the dump: {e}")
        return False

    def handle(self, cmd, fields, report):
        if cmd == "post-dump":
            self.job.set_report(report)
            self.job.complete()
            return {"completed": True}, True
        raise ProcessError(self.key, f"unknown holder command {cmd!r}")
