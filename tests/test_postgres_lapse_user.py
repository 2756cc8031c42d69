"""PostgresStore as a user meets it when its leases cannot be renewed for a moment (the
server unreachable, then back): the session is failed closed before its lease can run
out, and its writes resume once a renewal finds the lease still its own; a writer that
took the session over meanwhile keeps it, and the old holder stays fenced.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from bounds import BOUND, wait_until

if TYPE_CHECKING:
    from postgres_server import Stores

# Under CI a missing driver fails the run; elsewhere these tests skip, saying why.
psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")
from nous_actor.core.event import Event  # noqa: E402
from nous_actor.errors import FencedError, StoreError  # noqa: E402
from nous_actor.store.postgres import PostgresStore  # noqa: E402

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

LEASE = 3.0
"""The lease of these tests: a store fails closed 2 s after its last renewal began and its
lease runs out 1 s later, while its failed renewals are retried every 0.25 s."""


def ev(seq: int) -> Event:
    return Event(seq, "user_message", T0, {"content": f"event {seq}"})


class _Outage:
    """The server unreachable for the store's lease renewals, until `end`."""

    def __init__(self, store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.store = store
        self.failed = threading.Event()
        self.monkeypatch = monkeypatch
        monkeypatch.setattr(store._leases, "_renew", self._refuse)

    def _refuse(self, *args: Any) -> Any:
        self.failed.set()
        raise StoreError("the server cannot be reached (test)")

    def lapse(self, session_id: str) -> None:
        """Wait until the store failed ``session_id`` closed: renewals failed until its
        deadline passed."""
        assert self.failed.wait(BOUND), "no renewal was tried"
        claim = self.store._leases.get(session_id)
        assert claim is not None
        wait_until(lambda: time.monotonic() >= claim.deadline, BOUND, "the claim's deadline")

    def end(self) -> int:
        """The server answers again; returns how many renewals succeeded before."""
        renewals = self.store._leases.renewals
        self.monkeypatch.undo()
        return renewals


def _lease_live(pg_stores: Stores) -> bool:
    (live,) = pg_stores.server.sql(
        f'SELECT lease_until > clock_timestamp() FROM "{pg_stores.schema}".claims'
    )[0]
    return bool(live)


def test_writes_resume_once_a_renewal_finds_the_lease_unchanged(
    pg_stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write refused while the renewals failed (failed closed) is not the end of the
    claim: once the server answers and a renewal finds the same epoch with a live lease
    (nobody took the session over), the session's writes are stored again."""
    store = pg_stores(lease=LEASE)
    store.claim("s")
    assert store.write({"s": [ev(0)]}) == {}
    outage = _Outage(store, monkeypatch)
    outage.lapse("s")
    assert _lease_live(pg_stores), "failed closed only after the lease ran out"
    refused = store.write({"s": [ev(1)]})
    assert type(refused["s"]) is StoreError
    assert "failed closed before the lease ran out" in str(refused["s"])
    epoch = store._leases.epoch_of("s")
    before = outage.end()
    wait_until(lambda: store._leases.renewals > before, BOUND, "a renewal once the server answers")
    assert store.write({"s": [ev(1)]}) == {}
    assert store.write({"s": [ev(2)]}) == {}
    assert [e.seq for e in store.load("s")] == [0, 1, 2]
    assert store._leases.epoch_of("s") == epoch
    assert store.holder_of("s") is not None


def test_a_holder_taken_over_during_the_lapse_stays_fenced(
    pg_stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If another store took the session over while the holder's renewals failed (its
    lease ran out), the old holder's renewals find the new epoch once the server answers:
    its writes stay refused with FencedError, and only the new holder's are stored."""
    a = pg_stores(lease=LEASE, holder="old")
    b = pg_stores(lease=LEASE, holder="new")
    a.claim("s")
    assert a.write({"s": [ev(0)]}) == {}
    outage = _Outage(a, monkeypatch)
    outage.lapse("s")
    assert type(a.write({"s": [ev(1)]})["s"]) is StoreError
    wait_until(lambda: not _lease_live(pg_stores), BOUND, "the old holder's lease to run out")
    b.claim("s")
    assert b.write({"s": [ev(1)]}) == {}
    before = outage.end()
    wait_until(lambda: a._leases.renewals > before, BOUND, "a renewal once the server answers")
    for seq in (1, 2):
        refused = a.write({"s": [ev(seq)]})
        assert isinstance(refused["s"], FencedError)
        assert "new" in str(refused["s"])
    assert b.write({"s": [ev(2)]}) == {}
    assert [e.seq for e in b.load("s")] == [0, 1, 2]
    assert not a._leases.holds("s")
    assert b._leases.holds("s")


def test_a_lease_that_ran_out_unrenewed_stays_lost(
    pg_stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renewals that fail until the lease ran out (by the database's clock) lose the
    claim even if nobody took the session over: the next renewal finds it expired, and
    the holder's writes are refused with FencedError until the session is claimed
    again."""
    store = pg_stores(lease=LEASE)
    store.claim("s")
    assert store.write({"s": [ev(0)]}) == {}
    outage = _Outage(store, monkeypatch)
    outage.lapse("s")
    wait_until(lambda: not _lease_live(pg_stores), BOUND, "the lease to run out")
    before = outage.end()
    wait_until(lambda: store._leases.renewals > before, BOUND, "a renewal once the server answers")
    assert isinstance(store.write({"s": [ev(1)]})["s"], FencedError)
    assert not store._leases.holds("s")
    assert [e.seq for e in store.load("s")] == [0]
