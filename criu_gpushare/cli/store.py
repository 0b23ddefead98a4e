"""`criu-gpushare store ls|verify|gc|prefetch|du|rm`: look after a chunk store.

Human tables by default, JSON with --json. The store and cache come from the flags, else the
environment, else the config file, else the default (criu_gpushare.config).
"""
import json
import time

import click

from ..config import load_settings, parse_duration
from ..errors import ConfigError, StoreError
from ..store import NodeCache, disk_usage, open_from_settings, prefetch, verify_store


def human(n):
    """Bytes as a short human string (powers of 1024)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def table(rows, headers, right=()):
    """A plain text table: columns padded to their widest cell; columns in `right` (indexes:
    counts and sizes) right-aligned."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    right = [i in right for i in range(len(headers))]

    def line(row):
        return "  ".join(c.rjust(w) if r else c.ljust(w)
                         for c, w, r in zip(row, widths, right)).rstrip()
    return "\n".join([line(headers)] + [line(r) for r in cells])


def emit(as_json, doc, text):
    click.echo(json.dumps(doc, indent=1, sort_keys=True) if as_json else text)


def open_store(ctx, with_cache=False):
    if with_cache and ctx.obj.cache is None:
        raise ConfigError("no node cache configured: pass --cache DIR, set "
                          "CRIU_GPUSHARE_CACHE or [cache] path in the config file")
    return open_from_settings(ctx.obj, use_cache=with_cache)


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


@click.group()
@click.option("--store", "store_path", metavar="DIR|s3://BUCKET/PREFIX",
              help="Store directory or S3 URL [env CRIU_GPUSHARE_STORE; default "
                   "/var/lib/criu-gpushare/store].")
@click.option("--cache", metavar="DIR", help="Node cache directory [env CRIU_GPUSHARE_CACHE].")
@click.option("--cache-limit", metavar="SIZE",
              help="Node cache size limit, e.g. 200G [env CRIU_GPUSHARE_CACHE_LIMIT].")
@click.pass_context
def store(ctx, store_path, cache, cache_limit):
    """Inspect and maintain the chunk store that holds checkpointed GPU memory.

    The store and cache come from these flags, else the CRIU_GPUSHARE_* environment variables,
    else the config file ($CRIU_GPUSHARE_CONFIG or /etc/criu-gpushare/config.toml), else the
    default. The format is store/FORMAT.md.
    """
    ctx.obj = load_settings({"store": store_path, "cache": cache, "cache_limit": cache_limit})


@store.command("ls")
@json_option
@click.pass_context
def ls(ctx, as_json):
    """List the checkpoints (refs) in the store; an unreadable one is listed with its error."""
    rows, broken = [], []
    with open_store(ctx) as st:
        held = st.held_refs()
        for name in st.list_refs():
            try:
                ref = st.read_ref(name)
                m = st.read_manifest(ref.manifest)
            except StoreError as e:
                broken.append({"name": name, "error": str(e.args[0])})
                continue
            allocs = [a for p in m.processes for a in p.allocations]
            stored = {cid: n for cid, n in m.chunk_ids()}  # each distinct chunk once
            rows.append({"name": name, "created": ref.created, "manifest": ref.manifest,
                         "processes": len(m.processes), "allocations": len(allocs),
                         "bytes": sum(a.size for a in allocs),
                         "stored_bytes": sum(stored.values()), "meta": ref.meta,
                         "held_by": [], "held_short": "-"})
            if name in held:  # only refs with hold files cost a read of them
                live = [h for h in st.holds(name) if h.alive]
                rows[-1]["held_by"] = [f"{h.kind} by pid {h.pid} on {h.host}" for h in live]
                rows[-1]["held_short"] = ", ".join(f"{h.kind} (pid {h.pid})" for h in live) or "-"
    text = table([[r["name"], r["created"], r["processes"], r["allocations"], human(r["bytes"]),
                   human(r["stored_bytes"]), r.pop("held_short")] for r in rows],
                 ["NAME", "CREATED", "PROCS", "ALLOCS", "SIZE", "STORED", "HELD"],
                 right={2, 3, 4, 5})
    text += "".join(f"\n{b['name']}: unreadable: {b['error']}" for b in broken)
    emit(as_json, {"store": st.path, "checkpoints": rows, "unreadable": broken}, text)
    if broken:
        raise StoreError(f"{st.path}: {len(broken)} checkpoint(s) unreadable")


@store.command()
@click.argument("names", nargs=-1)
@click.option("--all", "all_chunks", is_flag=True,
              help="Also re-hash chunks no checkpoint references.")
@click.option("--quick", is_flag=True, help="Check presence and sizes only; do not re-hash.")
@click.option("--threads", default=4, show_default=True, help="Hashing threads.")
@json_option
@click.pass_context
def verify(ctx, names, all_chunks, quick, threads, as_json):
    """Re-hash the chunks of checkpoints NAMES (default: all); name every bad or missing chunk."""
    t0 = time.monotonic()
    with open_store(ctx) as st:
        report = verify_store(st, list(names) or None, all_chunks, threads, quick)
    doc = {"store": st.path, "ok": report.ok, "refs": report.refs,
           "chunks_checked": report.chunks_checked, "bytes_hashed": report.bytes_hashed,
           "problems": [p.as_dict() for p in report.problems]}
    lines = [f"{p.kind:<10} {p.path}: {p.detail}" + (f" (used by {', '.join(p.refs)})"
                                                      if p.refs else "")
             for p in report.problems]
    lines.append(f"checked {report.chunks_checked} chunk(s) of {report.refs} checkpoint(s), "
                 f"{human(report.bytes_hashed)} hashed in {time.monotonic() - t0:.1f}s: "
                 f"{len(report.problems)} problem(s)")
    emit(as_json, doc, "\n".join(lines))
    if not report.ok:
        raise StoreError(f"{st.path}: verify found {len(report.problems)} problem(s)")


@store.command()
@click.option("--grace", metavar="DURATION",
              help="Keep unreferenced data younger than this, e.g. 30m [env "
                   "CRIU_GPUSHARE_GC_GRACE; default 1h].")
@click.option("--dry-run", is_flag=True, help="Report what would be removed; remove nothing.")
@json_option
@click.pass_context
def gc(ctx, grace, dry_run, as_json):
    """Remove chunks and manifests that no checkpoint references and no grace period or running
    dump protects."""
    grace_s = parse_duration(grace, "--grace") if grace is not None else ctx.obj.gc_grace_s
    with open_store(ctx) as st:
        r = st.collect_garbage(grace_s, dry_run)
    doc = {"store": st.path, "dry_run": dry_run, "grace_s": grace_s, "refs": r.refs,
           "live_leases": r.live_leases, "chunks_kept": r.chunks_kept,
           "chunks_kept_in_grace": r.chunks_kept_young, "chunks_removed": r.chunks_removed,
           "bytes_removed": r.bytes_removed, "manifests_removed": r.manifests_removed,
           "temp_files_removed": r.temps_removed, "stale_leases_removed": r.stale_leases_removed,
           "live_holds": r.live_holds, "stale_holds_removed": r.stale_holds_removed,
           "ignored": r.ignored}
    verb = "would remove" if dry_run else "removed"
    text = (f"{verb} {r.chunks_removed} chunk(s) ({human(r.bytes_removed)}), "
            f"{r.manifests_removed} manifest(s), {r.temps_removed} temp file(s); kept "
            f"{r.chunks_kept} referenced chunk(s) of {r.refs} checkpoint(s) and "
            f"{r.chunks_kept_young} in the grace period; {r.live_leases} dump(s) in progress; "
            f"{r.live_holds} live hold(s), {r.stale_holds_removed} stale hold(s) "
            f"{'to remove' if dry_run else 'removed'}")
    text += "".join(f"\nignored (not a regular file): {p}" for p in r.ignored)
    emit(as_json, doc, text)


@store.command("prefetch")
@click.argument("names", nargs=-1)
@click.option("--threads", default=8, show_default=True, help="Copy threads.")
@json_option
@click.pass_context
def prefetch_cmd(ctx, names, threads, as_json):
    """Copy the chunks of checkpoints NAMES (default: all) into the node cache, verified."""
    with open_store(ctx, with_cache=True) as st:
        r = prefetch(st, st.cache, list(names) or None, threads)
    doc = {"store": st.path, "cache": ctx.obj.cache, "refs": r.refs, "chunks": r.chunks,
           "already_cached": r.already_cached, "fetched": r.fetched,
           "bytes_fetched": r.bytes_fetched, "skipped_for_limit": r.skipped_for_limit,
           "evicted": r.evicted, "bytes_evicted": r.bytes_evicted, "failed": r.failed,
           "seconds": round(r.seconds, 3)}
    rate = r.bytes_fetched / r.seconds / 1e9 if r.seconds > 0 else 0.0
    text = "\n".join(r.failed + [
        f"fetched {r.fetched} chunk(s) ({human(r.bytes_fetched)}, {rate:.2f} GB/s), "
        f"{r.already_cached} already cached, {r.skipped_for_limit} skipped (cache limit), "
        f"{r.evicted} evicted, {len(r.failed)} failed"])
    emit(as_json, doc, text)
    if r.failed:
        raise StoreError(f"{st.path}: prefetch failed for {len(r.failed)} chunk(s)")


@store.command()
@json_option
@click.pass_context
def du(ctx, as_json):
    """Show what the store holds, what its checkpoints reference, and what gc could reclaim."""
    with open_store(ctx) as st:
        u = disk_usage(st)
    doc = {"store": st.path, **u.as_dict()}
    cache_rows = []
    if ctx.obj.cache is not None:
        with NodeCache.open(ctx.obj.cache, ctx.obj.cache_limit, create=False) as cache:
            count, size = cache.usage()
        limit = ctx.obj.cache_limit
        doc["cache"] = {"path": ctx.obj.cache, "chunks": count, "bytes": size, "limit": limit}
        cache_rows = [["node cache", count, human(size) + (f" of {human(limit)}"
                                                            if limit is not None else "")]]
    rows = [
        ["checkpoints", u.refs, ""],
        ["chunks stored", u.chunks, human(u.chunk_bytes)],
        ["  referenced", u.referenced_chunks, human(u.referenced_bytes)],
        ["  unreferenced (gc)", u.unreferenced_chunks, human(u.unreferenced_bytes)],
        ["  missing", u.missing_chunks, ""],
        ["checkpointed bytes", "", human(u.logical_bytes)],
        ["  zero (not stored)", "", human(u.zero_bytes)],
        ["manifests", u.manifests, human(u.manifest_bytes)],
        ["temp files", u.temp_files, human(u.temp_bytes)],
        ["dumps in progress", u.leases, ""],
        ["held checkpoints", u.held_refs, ""],
    ] + cache_rows
    emit(as_json, doc, table(rows, ["WHAT", "COUNT", "BYTES"], right={1, 2})
         + f"\ndedup ratio {u.dedup_ratio:.2f} (checkpointed bytes per stored byte)")


@store.command()
@click.argument("names", nargs=-1, required=True)
@click.option("--force", is_flag=True,
              help="Remove even a checkpoint a live suspension or dump holds (its resume will "
                   "then fail once gc has run); warns naming each holder.")
@click.pass_context
def rm(ctx, names, force):
    """Delete checkpoints NAMES from the store; their data goes at a later gc.

    A checkpoint that a live suspension or dump holds (store/FORMAT.md, "Holds") is refused,
    naming each holder, unless --force.
    """
    with open_store(ctx) as st:
        for name in names:
            for h in st.remove_ref(name, force=force):
                click.echo(f"warning: {name} was held: {h.describe()}; removed anyway (--force)",
                           err=True)
            click.echo(f"removed {name}")
