"""gc of an S3 store, and the wait a commit makes for it (store/FORMAT.md section 14).

Objects cannot be renamed, locked or touched, so gc and writers meet through objects alone:

  gc      1. writes its marker gc/<run>; "now" is the marker's LastModified (the server's clock),
             renewed by a thread; another live marker: busy
          2. reads the leases (stale ones removed) and every live lease's claims
             cutoff = min(now - grace, start of the oldest live lease)
          3. holds (stale removed; live ones' manifests are roots), then refs (marks)
          4. deletes chunks and manifests that are not marked, not claimed and older than the
             cutoff, and multipart uploads begun before it; never later than GC_TTL_S after its
             marker's last renewal
          5. removes its marker
  writer  claims a chunk (durably) before trusting that it is present, and at commit waits until
          no gc marker is live, then checks every claimed chunk is still there
A gc that read the leases after a claim keeps the chunk. One that read them before was running
when the claim was made, so the commit waits for it to end and then sees what it removed.
"""
import json
import os
import threading
import time
from dataclasses import dataclass, field

from ..errors import BusyError, StoreError
from .gc import GcReport
from .layout import is_chunk_id

#: A lease not renewed for this long is stale (its writer died or lost the server); a writer
#: renews every RENEW_S and MUST commit within LEASE_TTL_S of its last renewal's start.
LEASE_TTL_S = 600.0
#: The same for a gc's marker (gc/<run>): renewed every GC_TTL_S / 4; a gc MUST NOT delete
#: anything later than GC_TTL_S after its last renewal's start, and writers wait for a marker
#: until it is gone or has not changed for GC_TTL_S.
GC_TTL_S = 120.0
#: A commit waits at most this long for running gcs to end.
COMMIT_WAIT_S = 1800.0
POLL_S = 0.5


@dataclass
class S3Lease:
    name: str
    start_ns: int
    last_ns: int          # the newest LastModified of its objects (its last renewal)
    live: bool
    keys: list = field(default_factory=list)
    claims: set = field(default_factory=set)


def read_leases(store, now_ns, read_claims=True):
    """Every lease under leases/, judged at `now_ns` (server clock); with read_claims, the chunk
    ids each live one claimed."""
    by_name = {}
    for o in store.client.list("leases/"):
        name = o.key.split("/")[1]
        by_name.setdefault(name, []).append(o)
    out = []
    for name, objs in sorted(by_name.items()):
        ttl = LEASE_TTL_S
        start = [o for o in objs if o.key.endswith("/start")]
        if start:
            try:
                ttl = float(json.loads(store.client.get_small(start[0].key)).get("ttl_s", ttl))
            except (FileNotFoundError, ValueError, AttributeError, TypeError):
                pass  # being removed, or unreadable: the default TTL
        last = max(o.mtime_ns for o in objs)
        lease = S3Lease(name, min(o.mtime_ns for o in objs), last,
                        last + int(ttl * 1e9) >= now_ns, [o.key for o in objs])
        if lease.live and read_claims:
            for o in objs:
                if "/claims/" in o.key:
                    try:
                        ids = json.loads(store.client.get_small(o.key))
                    except FileNotFoundError:
                        continue  # its session ended meanwhile: its ref protects what it used
                    except ValueError as e:
                        raise StoreError(f"{store.client.where(o.key)}: unreadable claims; gc "
                                         f"stopped before removing anything") from e
                    lease.claims.update(c for c in ids if is_chunk_id(c))
        out.append(lease)
    return out


class _Marker:
    """This gc's gc/<run> object, renewed by a thread; deadline() says until when (local
    monotonic clock) this gc may still delete."""

    def __init__(self, store):
        self.client = store.client
        self.rel = f"gc/run-{os.urandom(8).hex()}"
        self._renewed = time.monotonic()
        self.client.put(self.rel, json.dumps({"pid": os.getpid()}).encode() + b"\n")
        info = self.client.head(self.rel)
        if info is None:
            raise StoreError(f"{self.client.where(self.rel)}: gc marker vanished")
        self.now_ns = info.mtime_ns
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="s3-gc-marker", daemon=True)
        self._thread.start()

    def _loop(self):
        while not self._stop.wait(GC_TTL_S / 4):
            began = time.monotonic()
            try:
                self.client.put(self.rel, b"{}\n")
                self._renewed = began
            except StoreError:
                pass  # check() stops the deletions once the marker may have lapsed

    def check(self):
        if time.monotonic() - self._renewed > GC_TTL_S - 10:
            raise StoreError(f"{self.client.where(self.rel)}: gc's marker was not renewed for "
                             f"{GC_TTL_S:.0f}s; gc stopped (writers no longer wait for it)")

    def close(self):
        self._stop.set()
        self._thread.join()
        self.client.delete([self.rel])


def _other_markers(store, own, now_ns):
    """(live, dead) marker keys other than `own`."""
    live, dead = [], []
    for o in store.client.list("gc/"):
        if o.key == own:
            continue
        (live if o.mtime_ns + int(GC_TTL_S * 1e9) >= now_ns else dead).append(o.key)
    return live, dead


def wait_for_gcs(store, max_wait_s):
    """Return once no gc marker is live: each is gone, or has not changed for GC_TTL_S (its gc
    stopped deleting by then). Times are measured here, never compared with the server's."""
    seen = {}  # key -> (LastModified, when first seen with it)
    deadline = time.monotonic() + max_wait_s
    while True:
        now = time.monotonic()
        live = []
        for o in store.client.list("gc/"):
            mtime, since = seen.get(o.key, (None, now))
            if mtime != o.mtime_ns:
                seen[o.key] = (o.mtime_ns, now)
                since = now
            if now - since <= GC_TTL_S:
                live.append(o.key)
        if not live:
            return
        if now > deadline:
            raise BusyError(f"{store.client.where(live[0])}: a gc has run for over "
                            f"{max_wait_s:.0f}s; nothing was committed: dump again later")
        time.sleep(POLL_S)


def collect_garbage(store, grace_s, dry_run=False):
    """gc of an S3 store; a GcReport as the directory gc's."""
    if grace_s < 0:
        raise StoreError(f"{store.path}: gc grace period must not be negative ({grace_s})")
    report = GcReport(dry_run, grace_s)
    marker = _Marker(store)
    try:
        now = marker.now_ns
        live_markers, dead_markers = _other_markers(store, marker.rel, now)
        if live_markers:
            raise BusyError(f"{store.client.where(live_markers[0])}: another gc of this store is "
                            f"running")
        if dead_markers and not dry_run:
            store.client.delete(dead_markers)
        grace_ns = int(grace_s * 1e9)
        leases = read_leases(store, now)
        live = [lease for lease in leases if lease.live]
        report.live_leases = len(live)
        stale = [lease for lease in leases if not lease.live]
        if not dry_run:
            store.client.delete(k for lease in stale for k in lease.keys)
            report.stale_leases_removed = len(stale)
        cutoff = now - grace_ns
        if live:
            cutoff = min(cutoff, min(lease.start_ns for lease in live))
        report.cutoff_ns = cutoff
        claimed = set().union(*(lease.claims for lease in live))

        live_chunks, live_manifests = _mark(store, report, now, dry_run)
        doomed = []
        for f in store.scan_chunks():
            if f.name in live_chunks:
                report.chunks_kept += 1
            elif f.name in claimed or f.mtime_ns >= cutoff:
                report.chunks_kept_young += 1
            else:
                report.chunks_removed += 1
                report.bytes_removed += f.size
                doomed.append(f"chunks/{f.fanout}/{f.name}")
        for mid, _size, mtime, _temp, name in store.list_manifest_files():
            if mid not in live_manifests and mtime < cutoff:
                report.manifests_removed += 1
                doomed.append(f"manifests/{name}")
        uploads = [(k, u) for k, u, began in store.client.multipart_uploads() if began < cutoff]
        report.temps_removed = len(uploads)
        if not dry_run:
            for i in range(0, len(doomed), 1000):
                marker.check()
                store.client.delete(doomed[i:i + 1000])
            for key, upload in uploads:
                marker.check()
                store.client.abort_upload(key, upload)
    finally:
        marker.close()
    return report


def _mark(store, report, now_ns, dry_run):
    """Holds (stale ones removed) and refs: the chunks and manifests they reach. Any unreadable
    ref or manifest stops the gc before it removes anything."""
    from .catalog import RefMissing
    from .holds import this_host
    here = this_host()
    roots = []
    for ref in sorted(store.held_refs()):
        for h in store._holds_of(ref, here):
            if h.alive:
                report.live_holds += 1
                if h.manifest:
                    roots.append((h.manifest, "a hold"))
            else:
                report.stale_holds_removed += 1
                if not dry_run:
                    store.client.delete([f"holds/{ref}/{h.name}"])
    for name in store.list_refs():
        try:
            roots.append((store.read_ref(name).manifest, name))
        except RefMissing:
            continue  # removed since the listing: it protects nothing any more
        except StoreError as e:
            raise StoreError(f"gc stopped before removing anything: {e}; fix or remove that "
                             f"checkpoint (criu-gpushare store rm {name})") from e
        report.refs += 1
    chunks, manifests = set(), set()
    for mid, why in roots:
        if mid in manifests:
            continue
        try:
            manifest = store.read_manifest(mid)
        except StoreError as e:
            if why == "a hold" and "manifest missing" in str(e):
                continue
            raise StoreError(f"gc stopped before removing anything: {e} (named by {why})") from e
        manifests.add(mid)
        chunks.update(cid for cid, _ in manifest.chunk_ids())
    return chunks, manifests
