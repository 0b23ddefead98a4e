"""GPUs by UUID: the tool's own device ordinals, and a workload's.

A workload may see other GPUs, or the same ones in another order, than the tool
(CUDA_VISIBLE_DEVICES): an ordinal means nothing across processes, a UUID does. The shim reports
each allocation's GPU by UUID and its process's `devices` (ordinal -> UUID); the tool opens memory
on its own ordinal of that UUID; after a restore onto other GPUs (--gpu-map OLD=NEW, by UUID) each
workload gets a devices map in its own ordinals (shim/protocol.md, "Devices maps").
"""
from ..errors import DriverError


def parse_uuid(text):
    """'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx' (as nvidia-smi prints it) -> 16 bytes."""
    try:
        raw = bytes.fromhex(text.removeprefix("GPU-").replace("-", ""))
    except ValueError:
        raw = b""
    if not text.startswith("GPU-") or len(raw) != 16:
        raise DriverError(f"not a GPU UUID: {text!r} (expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
    return raw


def parse_gpu_map(items):
    """["OLD=NEW", ...] (each a GPU UUID) -> {OLD: NEW}; ValueError saying what is malformed:
    not OLD=NEW, not a UUID, a GPU mapped twice, two GPUs mapped onto one."""
    mapping = {}
    for item in items:
        old, sep, new = (part.strip() for part in item.partition("="))
        if not sep:
            raise ValueError(f"{item!r} is not OLD=NEW")
        for uuid in (old, new):
            try:
                parse_uuid(uuid)
            except DriverError as e:
                raise ValueError(str(e)) from None
        if old in mapping:
            raise ValueError(f"{old} is mapped twice")
        mapping[old] = new
    if len(set(mapping.values())) != len(mapping):
        raise ValueError("two GPUs are mapped onto one")
    return mapping


class DeviceMap:
    """This process's GPUs: UUID <-> ordinal."""

    def __init__(self, uuids):
        self.uuids = list(uuids)  # index = this process's ordinal

    @classmethod
    def here(cls):
        from .driver import gpus
        return cls(uuid for _, _, uuid in gpus())

    def ordinal(self, uuid, fallback=None):
        """This process's ordinal of GPU uuid; fallback when uuid is None (a shim that did not
        name it); DriverError when the GPU is not visible here."""
        if uuid is None:
            return fallback
        try:
            return self.uuids.index(uuid)
        except ValueError:
            raise DriverError(f"GPU {uuid} is not visible to this process "
                              f"(it sees {', '.join(self.uuids) or 'none'})") from None


def workload_devices_map(devices, gpu_map):
    """The shim's devices map ("OLD:NEW,...", its own ordinals) that follows gpu_map ({old uuid:
    new uuid}) for a workload whose status listed devices ({ordinal: uuid}); "" when nothing
    moves. DriverError when a new GPU is not one the workload sees."""
    by_uuid = {uuid: ordinal for ordinal, uuid in devices.items()}
    pairs = []
    for ordinal, uuid in sorted(devices.items()):
        new = (gpu_map or {}).get(uuid)
        if new is None or new == uuid:
            continue
        if new not in by_uuid:
            raise DriverError(f"GPU {new} (for {uuid}) is not one the workload sees "
                              f"({', '.join(sorted(by_uuid)) or 'none'})")
        pairs.append(f"{ordinal}:{by_uuid[new]}")
    return ",".join(pairs)
