"""`criu-gpushare status [PID] [--json]`: what the shim of a running process tracks.

With PID: that process's allocations, mappings, imports (with their exporter), exports, page-locked
host buffers, peer access, multicast objects, gates, and anything a checkpoint would refuse.
Without PID: one line per process with a shim socket in this network namespace (or why it cannot
be reached: no reply, a full backlog, a server that is not that process's shim), then one per
group criu-gpushare holds (its journal: kind, state, pids, steps begun, last error).
"""
import json
from concurrent.futures import ThreadPoolExecutor

import click

from ..engine import journal as jn
from ..engine.freezer import group_stopped
from ..shimctl import client as control
from ..errors import Error


def _mib(n):
    return f"{n / (1 << 20):.1f} MiB"


def _summary_line(pid, st):
    allocs = st.get("allocations", [])
    size = sum(a["size"] for a in allocs)
    gates = st.get("gates", {})
    closed = [g for g in ("launch", "memory") if gates.get(g, {}).get("closed")]
    return (f"{pid:>8}  {_state(pid, st):<9}  {len(allocs):>5} alloc ({_mib(size):>11})  "
            f"{len(st.get('imports', [])):>3} import  {len(st.get('exports', [])):>3} export  {len(st.get('host_buffers', [])):>3} "
            f"host  gates {'held: ' + '+'.join(closed) if closed else 'open'}"
            + ("  UNTRACKED" if st.get("untracked") else ""))


def _dropped(obj):
    return "  [released for suspend]" if obj.get("dropped") else ""


def _journal(pid):
    try:
        return jn.owner_of(pid)
    except Error:
        return None


def _state(pid, st):
    """running, quiesced (gates closed), released (GPU memory dropped), or the state of the
    criu-gpushare journal that claims it (suspended, held, dumping, restoring ...)."""
    journal = _journal(pid)
    return journal.state if journal else st.get("state", "unknown")


def _show(pid, st):
    out = click.echo
    out(f"pid {pid}: shim {st.get('version')} (protocol {st.get('protocol')})")
    out(f"  state: {st.get('state', 'unknown')}")
    try:
        journal = jn.owner_of(pid)
    except Error as e:
        journal = None
        out(f"  journal: {e}")
    if journal is not None:
        out(f"  {journal.state} by criu-gpushare ({journal.kind} of group {journal.key}, steps "
            f"begun: {', '.join(journal.done) or 'none'}): `criu-gpushare resume {pid}`")
        if journal.data.get("error"):
            out(f"  last error: {journal.data['error']}")
    gates = st.get("gates", {})
    for g in ("launch", "memory"):
        info = gates.get(g, {})
        out(f"  {g} gate: {'closed' if info.get('closed') else 'open'}, "
            f"{info.get('inflight', 0)} call(s) inside")
    out(f"  allocations: {len(st['allocations'])}")
    for a in st["allocations"]:
        out(f"    #{a['id']:<4} {a['origin']:<11} device {a['device']}  {_mib(a['size']):>11}  "
            f"exports {a['exports']}" + ("  (released by the app)" if a["app_released"] else "")
            + _dropped(a))
    out(f"  mappings: {len(st['mappings'])}")
    for m in st["mappings"]:
        acc = ",".join(f"{x['location']}:{x['prot']}" for x in m["access"]) or "-"
        out(f"    0x{m['va']:x} +{_mib(m['size'])}  {m['object']} #{m['id']}  access {acc}" + _dropped(m))
    out(f"  imports: {len(st['imports'])}")
    for i in st["imports"]:
        exp = i["exporter"]
        src = f"pid {exp['pid']} allocation #{exp['id']}" if exp else "exporter unknown"
        out(f"    #{i['id']:<4} {i['kind']:<8} from {src}" + _dropped(i))
    out(f"  exports: {len(st['exports'])}")
    out(f"  host buffers: {len(st['host_buffers'])}")
    for h in st["host_buffers"]:
        out(f"    0x{h['ptr']:x} {_mib(h['size'])}" + ("  (shim-allocated)" if h["owned"] else "")
            + _dropped(h))
    if st.get("peer_access"):
        out("  peer access: " + ", ".join(f"{p['accessor']}->{p['owner']}" for p in st["peer_access"]))
    if st.get("multicast"):
        out(f"  multicast objects: {len(st['multicast'])}, binds: {len(st.get('multicast_binds', []))}")
    for u in st.get("untracked", []):
        out(f"  cannot checkpoint: {u}")
    for n in st.get("notes", []):
        out(f"  note: {n}")


def _show_stopped(pid, journal, as_json):
    """A process criu-gpushare left stopped (SIGSTOP) because its GPU state is not back yet."""
    info = {"pid": pid, "stopped": True, "kind": journal.kind, "state": journal.state,
            "group": journal.key, "done": journal.done, "error": journal.data.get("error")}
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"pid {pid}: stopped by criu-gpushare: its GPU state is not back yet, and none of "
               f"its threads runs until it is")
    click.echo(f"  {journal.state} ({journal.kind} of group {journal.key}, steps begun: "
               f"{', '.join(journal.done) or 'none'}): `criu-gpushare resume {pid}` brings it back")
    if info["error"]:
        click.echo(f"  last error: {info['error']}")


LIST_TIMEOUT_S = 5.0  # per process when listing: `status` makes no driver call, a shim answers at once


def _reach_all(pids):
    """{pid: status, or {"error": why it cannot be reached}}, asked in parallel so that names
    nobody answers on (a full backlog, a server that never replies) hold the listing once, not once
    each."""
    def one(pid):
        try:
            return control.status(pid, timeout=LIST_TIMEOUT_S)
        except Error as e:
            return {"error": str(e)}

    if not pids:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(pids))) as pool:
        return dict(zip(pids, pool.map(one, pids)))


@click.command()
@click.argument("pid", type=int, required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the shim's status reply as JSON.")
def status(pid, as_json):
    """Show what the shim tracks in process PID (all shim processes if PID is left out)."""
    if pid is not None:
        journal = _journal(pid)
        if journal is not None and group_stopped(pid):
            _show_stopped(pid, journal, as_json)  # its shim's thread is stopped too: no answer
            return
        st = control.status(pid)
        if as_json:
            click.echo(json.dumps(st, indent=2))
        else:
            _show(pid, st)
        return
    result = _reach_all(control.shim_pids())
    if as_json:
        click.echo(json.dumps({str(p): st for p, st in result.items()}, indent=2))
        return
    if not result:
        click.echo("no process with the shim in this network namespace")
    for p, st in result.items():
        click.echo(f"{p:>8}  {st['error']}" if "error" in st else _summary_line(p, st))
    try:
        journals, problems = jn.all_journals()
    except Error as e:
        click.echo(f"journals: {e}")
        return
    for e in problems:
        click.echo(f"journal: {e}")
    for j in journals:  # what criu-gpushare holds, even where no shim answers
        click.echo(f"group {j.key}: {j.kind} {j.state}, pids {' '.join(map(str, j.pids))}, steps begun: "
                   f"{', '.join(j.done) or 'none'}" + (f"; last error: {j.data['error']}" if j.data.get("error") else ""))
