"""criu_gpushare/store/leases.py: a write session's lease (FORMAT.md section 7).

What a dump relies on: while its session is open its lease is locked (gc sees it live, whatever its
age), the lease is renewed while chunks go in, and it is gone once the session ends; a lease left
by a writer that died counts only until it is older than the grace period, then gc removes it."""
import json
import os
import time

from criu_gpushare.store import leases
from criu_gpushare.store.layout import temp_name
from criu_gpushare.store.leases import scan_leases

from store_helpers import age, chunk_bytes

HOUR_NS = 3600 * 10**9


def lease_path(store, session):
    return os.path.join(store.path, "leases", session.name)


def test_a_live_session_is_locked_and_live_however_old(store):
    with store.begin_write("ck") as session:
        path = lease_path(store, session)
        info = json.loads(open(path).read())
        assert info["pid"] == os.getpid() and info["purpose"] == "ck"
        (lease,) = scan_leases(store, time.time_ns(), HOUR_NS)
        assert lease.started_ns == session.started_ns  # gc's cutoff: the start of the dump
        age(path, 10 * 3600)
        (lease,) = scan_leases(store, time.time_ns(), HOUR_NS, remove_stale=True)
        assert (lease.name, lease.locked, lease.live) == (session.name, True, True)
    assert not os.path.exists(path)  # the session ended: its lease went with it
    assert scan_leases(store, time.time_ns(), HOUR_NS) == []


def dead_writers_lease(store, name, age_s):
    d = os.path.join(store.path, "leases")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, name)
    with open(path, "w") as f:  # nobody holds its flock
        json.dump({"version": 1, "started_ns": time.time_ns() - int(age_s * 1e9)}, f)
    age(path, age_s)
    return path


def test_a_dead_writers_lease_counts_until_it_is_older_than_grace(store):
    young = dead_writers_lease(store, "young.lease", 60)
    old = dead_writers_lease(store, "old.lease", 2 * 3600)
    found = {lease.name: lease for lease in scan_leases(store, time.time_ns(), HOUR_NS,
                                                        remove_stale=True)}
    assert (found["young.lease"].locked, found["young.lease"].live) == (False, True)
    assert found["old.lease"].live is False
    assert os.path.exists(young) and not os.path.exists(old)


def test_a_lease_being_created_is_removed_only_once_old(store):
    fresh = dead_writers_lease(store, temp_name("x.lease"), 60)
    stale = dead_writers_lease(store, temp_name("y.lease"), 2 * 3600)
    assert scan_leases(store, time.time_ns(), 0, remove_stale=True) == []  # not leases yet
    assert os.path.exists(fresh) and not os.path.exists(stale)


def test_a_session_renews_its_lease_while_it_puts(store, monkeypatch):
    monkeypatch.setattr(leases, "RENEW_S", 0.0)
    with store.begin_write("ck") as session:
        path = lease_path(store, session)
        age(path, 3600)
        before = os.stat(path).st_mtime
        session.put(chunk_bytes(1))
        assert os.stat(path).st_mtime > before


def test_a_session_does_not_renew_on_every_put(store):
    with store.begin_write("ck") as session:
        path = lease_path(store, session)
        age(path, 5)
        before = os.stat(path).st_mtime_ns
        session.put(chunk_bytes(2))
        assert os.stat(path).st_mtime_ns == before  # RENEW_S (30 s) has not passed

