"""The chunk store: open or create one, put and get chunks, keep it durable.

Typical use (a dump; many threads may call `put` at once, and other processes or nodes may write
the same store):

    store = Store.open(path, create=True)
    with store.begin_write("ckpt-42") as session:     # a lease: gc keeps what we touch
        results = [session.put(view) for view in chunks_of(allocation)]
        manifest = Manifest([ProcessEntry(pid, [Allocation.from_puts("va", results)])])
        session.commit("ckpt-42", manifest)             # sync, manifest, then ref

and a restore: `store.check_chunks(manifest)` (stat only) before anything changes, then
`store.get(chunk_id, pinned_view)` for each chunk of its manifest (re-hashed unless verify=False).
"""
import json
import os

from ..errors import StoreError
from . import catalog, docs, fsutil, holds, memfs
from .base import ChunkStore
from .chunkdir import ChunkDir, ChunkMissing, open_root
from .leases import WriteSession
from .results import PutResult, PutStatus
from .layout import CHUNK_SIZE_MAX, HASH_NAME, STORE_FILE, STORE_FORMAT, STORE_VERSION


_UNKNOWN = object()


class Store(ChunkStore):
    """An open chunk store in a directory. Thread-safe; several processes may open the same
    directory. (An s3:// store is an S3Store, store/s3store.py; backend.open_store picks.)"""

    def __init__(self, path, root_fd, create, cache=None):
        super().__init__(path, cache)
        self.root_fd = root_fd
        self.chunks = ChunkDir(root_fd, path, create)
        self._dir_fds = {}
        self._create = create
        self._pages = _UNKNOWN  # chunk_pages(), asked once

    @classmethod
    def open(cls, path, create=False, cache=None, direct_io=True):
        """Open the store at `path`; with create=True make it (and its parents) when missing.

        direct_io=False never tries O_DIRECT (it is tried by default, with a buffered fallback).

        Refuses a store directory that is not ours or root's, or that group or others may write;
        refuses a store of a newer format version.
        """
        path = os.path.abspath(path)
        if not create and not os.path.lexists(path):
            raise StoreError(f"{path}: no store here (no such directory); the first dump creates "
                             f"it, or name another with --store or CRIU_GPUSHARE_STORE")

        def build(root_fd):
            _check_or_write_store_file(root_fd, path, create)
            store = cls(path, root_fd, create, cache)
            store.chunks.direct_refused = not direct_io
            return store

        return open_root(path, create, "store", build)

    def close(self):
        self.chunks.close()
        for fd in self._dir_fds.values():
            os.close(fd)
        self._dir_fds.clear()
        if self.root_fd >= 0:
            os.close(self.root_fd)
            self.root_fd = -1
        super().close()

    def dir_fd(self, name, create=None):
        """fd of a top-level directory (manifests, refs, leases, gc); None if absent (reading)."""
        create = self._create if create is None else create
        return fsutil.open_dir_once(self._dir_fds, self._lock, self.root_fd, self.path, name,
                                    create)

    # -- chunks ---------------------------------------------------------------------------------

    def put(self, data, cid=None):
        """Store one chunk (a bytes-like object of 1..64 MiB, e.g. a view of pinned memory).

        Returns a PutResult: ZERO (all zero bytes, not stored), PRESENT (already stored: nothing is
        written, its mtime is refreshed so gc's grace period counts from now) or NEW (written:
        temp file, data, fdatasync, rename). Hashing and writing release the GIL. cid: the chunk's
        id, already computed where the bytes came from (the copy engine's GPU hash), taken as it
        is: the bytes are not hashed again (FORMAT.md section 13 says what the caller owes).
        """
        view, cid, n = self._hash_put(data, cid)
        if isinstance(cid, PutResult):
            return cid  # all zero
        with self._writing(cid):
            present = self.claim_present(cid, n)
            if present is not None:
                return present
            # A present file of the wrong size is damaged (e.g. truncated by hand): replace it.
            st = self.chunks.stat(cid)
            damaged = st is not None and st.st_size != n
            if self.chunks.write(cid, view, self.path, replace=damaged):
                return PutResult(cid, n, PutStatus.NEW)
            return PutResult(cid, n, PutStatus.PRESENT)  # another process wrote it meanwhile

    def claim_present(self, cid, length):
        """A PRESENT PutResult when chunk `cid` is stored with `length` bytes, its mtime refreshed
        as put does (gc's grace counts from now); None when it must be written. For callers that
        know a chunk's id without its bytes (the copy engine's GPU hash)."""
        st = self.chunks.stat(cid)
        if st is not None and st.st_size == length and self.chunks.touch(cid):
            return PutResult(cid, length, PutStatus.PRESENT)
        return None

    def read_chunk(self, cid, view, verify=True):
        """Read from the store itself (no cache), re-hashed unless verify=False.

        A missing chunk is a ChunkMissing, a damaged one (wrong size, wrong hash, not a regular
        file) a ChunkDamaged; both name the chunk id and its file (attributes .chunk, .path).
        """
        try:
            self.chunks.read(cid, view)
        except FileNotFoundError:
            raise self._missing(cid) from None
        if verify:
            self.chunks.check(cid, view)

    def _missing(self, cid):
        path = self.chunks.chunk_path(cid)
        return ChunkMissing(f"{path}: chunk {cid} missing", cid, path)

    def chunk_pages(self):
        """"huge" or "small" where the chunk files are in memory (tmpfs, ramfs: store/memfs.py)
        and reads do not go through a node cache; else None (base.ChunkStore.chunk_pages)."""
        if self.cache is not None:
            return None
        if self._pages is _UNKNOWN:
            self._pages = memfs.pages_of(self.chunks.path)
        return self._pages

    def open_chunk(self, cid, length):
        """An fd open for reading on chunk `cid`'s file, checked to be a regular file of `length`
        bytes: ChunkMissing, ChunkDamaged as read_chunk raises. The caller closes it."""
        try:
            return self.chunks.open_chunk(cid, length)[0]
        except FileNotFoundError:
            raise self._missing(cid) from None

    def check_chunk(self, cid, view):
        """Raise ChunkDamaged (kind "corrupt", naming the chunk's file) unless `view`, the chunk's
        bytes had without read_chunk (its file's pages mapped), hashes to `cid`."""
        self.chunks.check(cid, view)

    def chunk_path(self, cid):
        """Where chunk `cid` is (or would be), for messages."""
        return self.chunks.chunk_path(cid)

    def scan_chunks(self):
        """Every chunk and temp file (chunkdir.ChunkFile), for verify, du and gc."""
        return self.chunks.scan()

    def chunk_size(self, cid):
        """Size of a stored chunk, or None when absent."""
        st = self.chunks.stat(cid)
        return None if st is None else st.st_size

    def has_chunk(self, cid):
        return self.chunks.stat(cid) is not None

    def sync(self):
        """Make everything written so far durable (syncfs of the store's file system)."""
        fsutil.syncfs(self.root_fd, self.path)

    def synced_device(self):
        return os.fstat(self.root_fd).st_dev

    # -- manifests, refs and write sessions (see catalog.py and leases.py) ----------------------

    def write_manifest(self, manifest):
        return catalog.write_manifest(self, manifest)

    def read_manifest(self, mid):
        return catalog.read_manifest(self, mid)

    def set_ref(self, name, mid, meta=None):
        catalog.set_ref(self, name, mid, meta)

    def read_ref(self, name):
        return catalog.read_ref(self, name)

    def list_refs(self):
        return catalog.list_refs(self)

    def remove_ref(self, name, force=False):
        """Delete checkpoint `name`. A live hold (a running suspension or dump) makes it a RefHeld
        error naming each holder, unless force: then the ref and its hold files go, and the live
        holds overridden are returned (a list of HoldInfo) for the caller to warn about."""
        return holds.remove_ref(self, name, force)

    # -- holds: what keeps a checkpoint from rm (see holds.py) ----------------------------------

    def hold(self, ref, kind, pid=None, meta=None):
        """Hold checkpoint `ref` for process `pid` (default: this process) as a "suspension" or a
        "dump": `store rm` refuses it while the holder lives. Returns a Hold; call .release()
        (or use it as a context manager) when done. May be taken before the ref is committed."""
        return holds.take(self, ref, kind, pid, meta)

    def holds(self, ref):
        """The holders of `ref`: a HoldInfo each (.alive, .kind, .pid, .host, .describe())."""
        return holds.list_holds(self, ref)

    def release_hold(self, info):
        """Remove the hold a HoldInfo (from holds()) describes."""
        holds.Hold(self, info).release()

    def held_refs(self):
        """Names of the refs with hold files (cheap: none is read)."""
        return holds.held_refs(self)

    def presence_problem(self, cid, length):
        """A verify.Problem when chunk `cid` could not be read as `length` bytes (stat only, with
        the ownership rules of FORMAT.md "Trust model"), else None."""
        from .verify import presence_problem
        return presence_problem(self, cid, length)

    def list_manifest_files(self):
        """(id, size, mtime_ns, is_temp, name) of every file in manifests/ that is ours."""
        return catalog.list_manifests(self)

    def live_writers(self):
        """How many write sessions (dumps) hold a lease now."""
        from .leases import scan_leases
        return sum(1 for lease in scan_leases(self, 0, 0) if lease.locked)

    def collect_garbage(self, grace_s, dry_run=False):
        from .gc import collect_garbage
        return collect_garbage(self, grace_s, dry_run)

    def begin_write(self, purpose=""):
        """A WriteSession: holds a lease so that gc keeps every chunk it puts until it commits."""
        return WriteSession(self, purpose)


def _check_or_write_store_file(root_fd, path, create):
    """Read store.json (refusing a newer version); write it when creating a new store."""
    file_path = os.path.join(path, STORE_FILE)
    try:
        data = _read_store_file(root_fd, path)
    except FileNotFoundError:
        if not create:
            raise StoreError(f"{path}: not a criu-gpushare store (no {STORE_FILE}); "
                             f"it is created by the first dump") from None
        # Another process creating the store at the same time may have a temp file here; a
        # freshly made file system mounted here has lost+found.
        if any(not e.name.startswith(f".{STORE_FILE}.") and e.name != "lost+found"
               for e in os.scandir(root_fd)):
            # A store's creator writes store.json before anything else: one that did so since
            # the read above has made this a store.
            try:
                data = _read_store_file(root_fd, path)
            except FileNotFoundError:
                raise StoreError(f"{path}: not empty and not a criu-gpushare store (no "
                                 f"{STORE_FILE}); refusing to turn it into one") from None
        else:
            doc = {"format": STORE_FORMAT, "version": STORE_VERSION, "hash": HASH_NAME,
                   "chunk_size_max": CHUNK_SIZE_MAX}
            fsutil.write_file_atomic(root_fd, path, STORE_FILE,
                                     json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n")
            return
    check_store_doc(data, file_path)


def _read_store_file(root_fd, path):
    return fsutil.read_small_file(root_fd, path, STORE_FILE, limit=1 << 20)


def check_store_doc(data, file_path):
    """Refuse store.json bytes that are not a store file this tool reads (naming `file_path`)."""
    doc = docs.load(data, STORE_FORMAT)
    if doc is None:
        raise StoreError(f"{file_path}: not a criu-gpushare store file")
    docs.check_version(doc, STORE_VERSION, file_path, "store")
    if doc.get("hash") != HASH_NAME:
        raise StoreError(f"{file_path}: chunks hashed with {doc.get('hash')!r}, this tool knows "
                         f"only {HASH_NAME}")
