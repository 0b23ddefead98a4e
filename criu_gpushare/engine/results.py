"""What a group's run reports: time per step and per phase, bytes moved, and the final line the
commands print (the summary is also the result the journal and the image record keep)."""


def phases(times, parts):
    """Step times as phases that never overlap: a step's timed parts (parts: step -> {part:
    seconds}) taken out of it; the "total" is left out."""
    out = {}
    for name, secs in times.items():
        if name == "total":
            continue
        mine = parts.get(name, {})
        out[name] = max(0.0, secs - sum(mine.values()))
        out.update(mine)
    return out


def rounded_phases(group):
    """group's phases (see phases) to the millisecond, as every report gives them."""
    return {k: round(v, 3) for k, v in phases(group.times, group.parts).items()}


def summary(group, what):
    """The result of a suspend, resume or dump of `group`, `what` naming its state after."""
    s = group.stats
    return {"state": what, "pids": group.pids, "ref": group.options.ref,
            "seconds": {k: round(v, 3) for k, v in group.times.items()},
            "phases": rounded_phases(group),
            "bytes": {"copied": s.copied, "written": s.written, "deduplicated": s.deduplicated,
                      "zero": s.zero, "unchanged": s.unchanged, "loaded_ahead": s.ahead,
                      "loaded_in_place": s.in_place},
            "units": len(group.units), "attachments": len(group.attachments),
            # work that ran beside the phases (the driver's checkpoint beside the save)
            "overlapped": {k: round(v, 3) for k, v in group.overlapped.items()}}


def nothing_moved(state, pids, note):
    """The result of a run that moved nothing, and why (`note`): the line format_summary prints."""
    return {"state": state, "pids": pids, "seconds": {}, "bytes": {}, "note": note}


def format_summary(summary):
    """The final line: time per phase, bytes copied, written, deduplicated, zero, and skipped as
    unchanged (never crossed the link); for a run that moved nothing (nothing_moved), its note."""
    if summary.get("note") and not summary.get("bytes"):
        return f"{summary['state']} {len(summary['pids'])} process(es): {summary['note']}"
    secs = summary["seconds"]
    b = summary["bytes"]
    phases = ", ".join(f"{k} {v:.2f}s" for k, v in secs.items())
    moved = "copied" if summary["state"] != "resumed" else "loaded"
    return (f"{summary['state']} {len(summary['pids'])} process(es): {phases}; "
            f"{size(b['copied'])} {moved}, {size(b['written'])} written, "
            f"{size(b['deduplicated'])} deduplicated, {size(b['zero'])} zero, "
            f"{size(b.get('unchanged', 0))} skipped as unchanged")


def size(n):
    """n bytes, as the progress and summary lines show them."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n / 2 ** 20:.2f} MiB" if n else "0 B"
