"""Opens in batches: a store with ``claim_many``/``load_many`` is claimed and read once
per batch of opens, not once per session; every failure stays with its own session.

Work is counted (batch calls, sessions per call), never timed.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from bounds import BOUND
from spies import spy

from nous_actor import ConflictError, Event, Session, Sessions, SQLiteStore, StoreError
from nous_actor.core.log import new_event
from nous_actor.sessions import recovery
from nous_actor.testing import DelegatingStore


class CountingBatches(DelegatingStore):
    """A SQLite store that counts its batch calls and the sessions in each, and can be
    told to fail ``load_many`` once."""

    def __init__(self, inner: SQLiteStore) -> None:
        super().__init__(inner)
        self.sqlite = inner
        self.claims: list[int] = []
        self.loads: list[int] = []
        self.single_claims = 0
        self.fail_load: BaseException | None = None
        self._lock = threading.Lock()

    def claim(self, session_id: str) -> str:
        with self._lock:
            self.single_claims += 1
        return super().claim(session_id)

    def claim_many(self, session_ids: Sequence[str]) -> list[str | ConflictError]:
        with self._lock:
            self.claims.append(len(session_ids))
        return self.sqlite.claim_many(session_ids)

    def load_many(self, session_ids: Sequence[str]) -> dict[str, list[Event] | StoreError]:
        with self._lock:
            self.loads.append(len(session_ids))
            fail, self.fail_load = self.fail_load, None
        if fail is not None:
            raise fail
        return self.sqlite.load_many(session_ids)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "s.db"


@pytest.fixture
def sqlite(path: Path) -> Iterator[SQLiteStore]:
    store = SQLiteStore(path)
    yield store
    store.close()


def _seed(store: SQLiteStore, count: int, events: int = 3) -> list[str]:
    ids = [f"s-{i}" for i in range(count)]
    evs = [new_event(k, "user_message", {"content": f"m{k}"}, None) for k in range(events)]
    assert store.write(dict.fromkeys(ids, evs)) == {}
    return ids


def _open_all(registry: Sessions, ids: list[str]) -> list[object]:
    async def main() -> list[object]:
        return await asyncio.wait_for(
            asyncio.gather(*(registry.aopen(i) for i in ids), return_exceptions=True), BOUND
        )

    return asyncio.run(main())


def test_opening_many_stored_sessions_at_once_claims_and_reads_them_in_batches(
    sqlite: SQLiteStore,
) -> None:
    """600 opens at once: every session opens with its events, through a handful of
    claim transactions and reads (never one per session), each within the batch bound."""
    ids = _seed(sqlite, 600)
    store = CountingBatches(sqlite)
    registry = Sessions(store, max_sessions=1_000, timeout=BOUND)
    try:
        handles = _open_all(registry, ids)
        assert all(isinstance(h, Session) for h in handles), handles[:3]
        counts = [h.count().get(timeout=BOUND) for h in handles]  # type: ignore[attr-defined]
        assert counts == [3] * len(ids)
    finally:
        registry.close(timeout=BOUND)
    assert sum(store.claims) == len(ids)
    assert store.single_claims == 0
    assert max(store.claims) <= recovery.BATCH
    assert len(store.claims) <= len(ids) // 10  # batches, not one transaction per session
    # One read per batch, of what the batch claimed (the drains run side by side, so
    # the two lists may come in different orders).
    assert sorted(store.loads) == sorted(store.claims)


def test_a_session_held_elsewhere_fails_its_own_open_and_no_other(
    sqlite: SQLiteStore, path: Path
) -> None:
    """In one batch, the session another writer holds is refused with ConflictError; the
    rest open."""
    ids = _seed(sqlite, 40)
    other = SQLiteStore(path)
    holder = Session.start("s-7", store=other, timeout=BOUND)
    store = CountingBatches(sqlite)
    registry = Sessions(store, max_sessions=100, timeout=BOUND)
    try:
        got = _open_all(registry, ids)
        assert isinstance(got[7], ConflictError)
        assert "live writer" in str(got[7])
        assert all(isinstance(h, Session) for k, h in enumerate(got) if k != 7)
        assert holder.count().get(timeout=BOUND) == 3  # the holder is untouched
    finally:
        registry.close(timeout=BOUND)
        holder.stop(timeout=BOUND)
        other.close()


def test_a_malformed_row_fails_only_its_own_session_and_releases_its_claim(
    sqlite: SQLiteStore, path: Path
) -> None:
    """A damaged row fails that session's open with StoreError naming it (at recovery,
    not at first read); the others open, and the damaged one's claim is given up."""
    ids = _seed(sqlite, 30)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE events SET data = '{not json' WHERE session_id = 's-4' AND seq = 1")
    conn.close()
    store = CountingBatches(sqlite)
    registry = Sessions(store, max_sessions=100, timeout=BOUND)
    try:
        got = _open_all(registry, ids)
        assert isinstance(got[4], StoreError)
        assert "malformed" in str(got[4])
        assert all(isinstance(h, Session) for k, h in enumerate(got) if k != 4)
    finally:
        registry.close(timeout=BOUND)
    sqlite.release("s-4", sqlite.claim("s-4"))  # not held: the failed open let it go


def test_a_read_that_fails_fails_its_batch_and_releases_every_claim(
    sqlite: SQLiteStore,
) -> None:
    """load_many failing as a whole fails the opens it served (StoreError), releases
    their claims, and the next opens of the same sessions succeed."""
    ids = _seed(sqlite, 20)
    store = CountingBatches(sqlite)
    store.fail_load = StoreError("the disk went away")
    registry = Sessions(store, max_sessions=100, timeout=BOUND)
    try:
        got = _open_all(registry, ids)
        failed = [g for g in got if isinstance(g, StoreError)]
        assert failed
        assert all("the disk went away" in str(g) for g in failed)
        assert all(isinstance(g, Session | StoreError) for g in got)
        again = _open_all(registry, ids)  # every claim was released: all open now
        assert all(isinstance(h, Session) for h in again)
        assert [h.count().get(timeout=BOUND) for h in again] == [3] * len(ids)  # type: ignore[attr-defined]
    finally:
        registry.close(timeout=BOUND)


def test_claim_many_claims_in_order_and_refuses_an_id_given_twice(
    sqlite: SQLiteStore, path: Path
) -> None:
    """claim_many answers per id, in order: a token, or the ConflictError of an id
    given twice or held by a live writer; the tokens release as claim's do."""
    other = SQLiteStore(path)
    held = other.claim("b")
    try:
        got = sqlite.claim_many(["a", "b", "c", "a"])
        assert isinstance(got[0], str)
        assert isinstance(got[2], str)
        assert isinstance(got[1], ConflictError)
        assert got[1].session_id == "b"
        assert isinstance(got[3], ConflictError)
        assert got[3].session_id == "a"
        with pytest.raises(ConflictError):
            other.claim("a")
        sqlite.release("a", got[0])
        other.release("a", other.claim("a"))
        assert sqlite.claim_many([]) == []
        with pytest.raises(StoreError, match="session id"):
            sqlite.claim_many(["ok", ""])  # nothing is claimed
        other.release("ok", other.claim("ok"))
    finally:
        other.release("b", held)
        other.close()


def test_load_many_equals_load_for_each_session(sqlite: SQLiteStore) -> None:
    """load_many gives each id what load gives it (an unknown id: no events)."""
    ids = _seed(sqlite, 5, events=4)
    got = sqlite.load_many([*ids, "nobody", ids[0]])
    assert set(got) == {*ids, "nobody"}
    for sid in ids:
        assert got[sid] == sqlite.load(sid)
    assert got["nobody"] == []


@pytest.mark.parametrize("events", [recovery.EAGER_FOLD, recovery.EAGER_FOLD + 1])
def test_a_short_log_is_folded_by_its_first_read_and_a_long_one_at_recovery(
    sqlite: SQLiteStore, monkeypatch: pytest.MonkeyPatch, events: int
) -> None:
    """Opening sessions of a short log folds none of them (a session opened and never
    read keeps no fold); a long log is folded once, at recovery, so its first derive
    folds nothing. Either way each session is folded once, and derives the same."""
    import nous_actor.core.log._log as log_module

    calls = spy(monkeypatch, log_module, "_full_fold")
    ids = _seed(sqlite, 5, events)
    registry = Sessions(sqlite, timeout=BOUND)
    try:
        handles = _open_all(registry, ids)
        long = events > recovery.EAGER_FOLD
        assert [n for _, n in calls] == ([events] * 5 if long else [])
        for h in handles:
            msgs = h.derive_messages().get(timeout=BOUND)  # type: ignore[attr-defined]
            assert [m.content for m in msgs] == [f"m{k}" for k in range(events)]
        assert [n for _, n in calls] == [events] * 5  # once each, whenever it came
    finally:
        registry.close(timeout=BOUND)


@pytest.mark.parametrize("bad", ["abc", b"abc", 5, None])
def test_the_batch_methods_refuse_one_id_or_a_non_list_and_claim_nothing(
    sqlite: SQLiteStore, path: Path, bad: object
) -> None:
    """claim_many and load_many take a list of ids: one str (which would be taken as its
    letters) or a non-iterable is a StoreError that says to pass a list; nothing changes."""
    for method in (sqlite.claim_many, sqlite.load_many):
        with pytest.raises(
            StoreError, match=r"expected a list of session ids.*pass \[session_id\]"
        ):
            method(bad)  # type: ignore[arg-type]
    other = SQLiteStore(path)
    try:
        for sid in ("a", "b", "c", "abc"):
            other.release(sid, other.claim(sid))  # none of them was claimed
    finally:
        other.close()
