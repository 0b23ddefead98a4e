"""What a set of checkpoints references: the walk from refs to manifests to chunks.

verify, du and prefetch all start from it.
"""
import sys
from dataclasses import dataclass, field

from ..errors import StoreError
from .catalog import RefMissing


@dataclass
class Referenced:
    """Chunks reached from some refs: id -> (length, names of the refs using it), in first-use
    order; `logical_bytes` counts every allocation byte (zero chunks and repeats included)."""
    chunks: dict = field(default_factory=dict)
    refs: list = field(default_factory=list)
    manifests: set = field(default_factory=set)
    logical_bytes: int = 0
    zero_bytes: int = 0
    problems: list = field(default_factory=list)  # (ref name, StoreError) of unreadable refs

    @property
    def unique_bytes(self):
        return sum(length for length, _ in self.chunks.values())


def walk_refs(store, names=None, strict=False):
    """Collect what the named refs (all refs by default) reference.

    An unreadable ref or manifest is recorded in `problems`, or raised when strict.
    """
    out = Referenced()
    for name in (store.list_refs() if names is None else names):
        try:
            ref = store.read_ref(name)
            manifest = store.read_manifest(ref.manifest)
        except RefMissing:
            if names is None:
                continue  # removed since the listing
            if strict:
                raise
            out.problems.append((name, sys.exc_info()[1]))
            continue
        except StoreError as e:
            if strict:
                raise
            out.problems.append((name, e))
            continue
        out.refs.append(name)
        out.manifests.add(ref.manifest)
        for p in manifest.processes:
            for a in p.allocations:
                out.logical_bytes += a.size
                for c in a.chunks:
                    if c.id is None:
                        out.zero_bytes += c.length
                        continue
                    entry = out.chunks.get(c.id)
                    if entry is None:
                        out.chunks[c.id] = (c.length, [name])
                    elif name not in entry[1]:
                        entry[1].append(name)
    return out
