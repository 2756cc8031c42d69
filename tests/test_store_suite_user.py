"""The shipped store contract suite as a user meets it: a store of one's own, written
on the documented base (`DelegatingStore`), with one rule broken at a time. The suite
must fail each such store, in the test of that rule, with a message naming the rule
and saying how to keep it; and a store that keeps every rule, peers included, passes.

The rules between two store objects on one backend (`StoreContract.make_peer`) are
checked here on a small shared-backend store, and on `PostgresStore` (two objects on one
schema); `SQLiteStore` on a file runs them in test_store_contract.py."""

from __future__ import annotations

import ast
import contextlib
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from nous_actor.core.event import Event
from nous_actor.errors import ConflictError, StoreError
from nous_actor.runtime.unique import unique_hex
from nous_actor.store import MemoryStore, Store, shared
from nous_actor.store.subscription import Subscription
from nous_actor.testing.store_contract import StoreContract
from nous_actor.testing.store_suite import _contract as _contract_module
from nous_actor.testing.stores import DelegatingStore

# -- a store with peers: objects that share one backend, as processes share a database ------


class _Backend:
    """What a shared database holds: the events (in a `MemoryStore`, never closed by a
    handle) and who holds each session's claim, as ``(handle id, token)``."""

    def __init__(self) -> None:
        self.events = MemoryStore()
        self.lock = threading.Lock()
        self.claims: dict[str, tuple[int, str]] = {}


class _Handle(DelegatingStore):
    """One store object on a `_Backend` (what one process opens): every rule kept."""

    def __init__(self, backend: _Backend) -> None:
        super().__init__(backend.events)
        self.backend = backend
        self.closed = False

    def _open(self) -> None:
        if self.closed:
            raise StoreError("the store is closed; open a new one")

    def _not_held_elsewhere(self, session_id: str) -> None:
        """Call under the backend's lock."""
        holder = self.backend.claims.get(session_id)
        if holder is not None and holder[0] != id(self):
            raise ConflictError("another store object holds it", session_id=session_id)

    def load(self, session_id: str) -> list[Event]:
        self._open()
        return super().load(session_id)

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        self._open()
        return super().write(appends)

    def sessions(self) -> list[str]:
        self._open()
        return super().sessions()

    def drop(self, session_id: str, seqs: Sequence[int]) -> None:
        self._open()
        with self.backend.lock:
            self._not_held_elsewhere(session_id)
            super().drop(session_id, seqs)

    def delete(self, session_id: str) -> None:
        self._open()
        with self.backend.lock:
            self._not_held_elsewhere(session_id)
            self.backend.claims.pop(session_id, None)
            super().delete(session_id)

    def claim(self, session_id: str) -> str:
        self._open()
        with self.backend.lock:
            if session_id in self.backend.claims:
                raise ConflictError("already has a live writer", session_id=session_id)
            token = unique_hex()
            self.backend.claims[session_id] = (id(self), token)
            return token

    def release(self, session_id: str, token: str) -> None:
        with self.backend.lock:
            holder = self.backend.claims.get(session_id)
            if holder is not None and holder[1] == token:
                del self.backend.claims[session_id]

    def close(self) -> None:
        self.closed = True


class TestAStoreWithPeersKeepsEveryRule(StoreContract):
    """A user's store whose objects share one backend passes the whole suite, the peer
    tests included (they run: `make_peer` gives a second object)."""

    def make_store(self) -> Store:
        return _Handle(_Backend())

    def make_peer(self, store: Store) -> Store | None:
        assert isinstance(store, _Handle)
        return _Handle(store.backend)


# -- stores that break one rule each ------------------------------------------------------


class _ClaimsPerObject(_Handle):
    """Keeps its claims in the object: a second object of the backend never sees them."""

    def claim(self, session_id: str) -> str:
        self._open()
        mine = self.__dict__.setdefault("mine", {})
        if session_id in mine:
            raise ConflictError("already has a live writer", session_id=session_id)
        mine[session_id] = token = unique_hex()
        return token

    def release(self, session_id: str, token: str) -> None:
        mine = self.__dict__.setdefault("mine", {})
        if mine.get(session_id) == token:
            del mine[session_id]


class _DeleteUnderTheHolder(_Handle):
    """Deletes a session another object holds."""

    def delete(self, session_id: str) -> None:
        self._open()
        with self.backend.lock:
            self.backend.claims.pop(session_id, None)
            self.inner.delete(session_id)


class _DropUnderTheHolder(_Handle):
    """Drops events of a session another object holds."""

    def drop(self, session_id: str, seqs: Sequence[int]) -> None:
        self._open()
        self.inner.drop(session_id, seqs)


class _ReleaseFreesAnyToken(_Handle):
    """Releases a session for any token, a stale one too."""

    def release(self, session_id: str, token: str) -> None:
        with self.backend.lock:
            self.backend.claims.pop(session_id, None)


class _ReleaseKeepsTheClaim(_Handle):
    """Forgets a released claim in the object but leaves it in the backend for others."""

    def claim(self, session_id: str) -> str:
        self._open()
        with self.backend.lock:
            holder = self.backend.claims.get(session_id)
            if holder is not None and holder[0] != id(self):
                raise ConflictError("already has a live writer", session_id=session_id)
            mine = self.__dict__.setdefault("mine", set())
            if session_id in mine:
                raise ConflictError("already has a live writer", session_id=session_id)
            token = unique_hex()
            self.backend.claims[session_id] = (id(self), token)
            mine.add(session_id)
            return token

    def release(self, session_id: str, token: str) -> None:
        self.__dict__.setdefault("mine", set()).discard(session_id)


class _CheckThenTakeAcrossObjects(_Handle):
    """Looks at the backend's claims, then takes one, in two steps: each object takes
    its own claims one at a time, but two objects may both look before either takes.
    (The window is held open on purpose: the first claims of two objects to find a
    session free meet at a barrier before taking it.)"""

    def claim(self, session_id: str) -> str:
        self._open()
        with self.__dict__.setdefault("own_lock", threading.Lock()):
            with self.backend.lock:
                free = session_id not in self.backend.claims
            if not free:
                raise ConflictError("already has a live writer", session_id=session_id)
            meet = self.backend.__dict__.setdefault("meet", threading.Barrier(2))
            with contextlib.suppress(threading.BrokenBarrierError):
                meet.wait(5)
            token = unique_hex()
            with self.backend.lock:
                self.backend.claims[session_id] = (id(self), token)
            return token


class _OwnWritesOnly(_Handle):
    """Reads through a cache of this object's own writes (a peer never sees them)."""

    def __init__(self, backend: _Backend) -> None:
        super().__init__(backend)
        self.cache = MemoryStore()

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        refused = super().write(appends)
        self.cache.write({s: e for s, e in appends.items() if s not in refused})
        return refused

    def load(self, session_id: str) -> list[Event]:
        self._open()
        return self.cache.load(session_id)

    def sessions(self) -> list[str]:
        self._open()
        return self.cache.sessions()


class _SinceSkipsOne(_Handle):
    """``load_since`` reads from the seq after ``from_seq`` (an off-by-one)."""

    def load_since(self, session_id: str, from_seq: int) -> list[Event]:
        return [e for e in self.load(session_id) if e.seq > from_seq]


class _SinceByPosition(_Handle):
    """``load_since`` cuts the list at position ``from_seq`` (wrong once seqs have gaps)."""

    def load_since(self, session_id: str, from_seq: int) -> list[Event]:
        return self.load(session_id)[from_seq:]


class _NextSeqIsACount(_Handle):
    """``next_seq`` counts the stored events (wrong once seqs have gaps)."""

    def next_seq(self, session_id: str) -> int:
        return len(self.load(session_id))


class _DuplicateOverwrites(_Handle):
    """Stores a seq already stored by replacing it."""

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        self._open()
        for sid, events in appends.items():
            stored = {e.seq for e in self.inner.load(sid)}
            self.inner.drop(sid, [e.seq for e in events if e.seq in stored])
        last = {sid: list({e.seq: e for e in evs}.values()) for sid, evs in appends.items()}
        return self.inner.write(last)


def _contract(handle: type[_Handle], peer: type[_Handle] | None = None) -> StoreContract:
    """The suite bound to stores of class ``handle`` (their peers of class ``peer``,
    ``handle`` by default)."""

    class Bound(StoreContract):
        def make_store(self) -> Store:
            return handle(_Backend())

        def make_peer(self, store: Store) -> Store | None:
            assert isinstance(store, _Handle)
            return (peer or handle)(store.backend)

    return Bound()


def _run(contract: StoreContract, test: str, *, with_peer: bool = False) -> None:
    """Run one test of ``contract`` as pytest would: its store (and peer) made, then closed."""
    store = contract.make_store()
    args: list[Store] = [store]
    if with_peer:
        made = contract.make_peer(store)
        assert made is not None
        args.append(made)
    try:
        getattr(contract, test)(*args)
    finally:
        for s in reversed(args):
            s.close()


def _fails(contract: StoreContract, test: str, match: str, *, with_peer: bool = False) -> None:
    """``test`` of ``contract`` fails, its message matching ``match``."""
    with pytest.raises(AssertionError, match=match):
        _run(contract, test, with_peer=with_peer)


# -- the peer rules: each broken store fails the test of its rule, saying so ------------------


@pytest.mark.parametrize(
    ("handle", "test", "match"),
    [
        (
            _ClaimsPerObject,
            "test_a_claim_held_by_one_object_is_refused_to_the_other",
            "one live writer per session across store objects.*keep claims in the backend",
        ),
        (
            _ClaimsPerObject,
            "test_claims_of_one_session_through_both_objects_at_once_give_it_one_writer",
            "one live writer per session across store objects",
        ),
        (
            _CheckThenTakeAcrossObjects,
            "test_claims_of_one_session_through_both_objects_at_once_give_it_one_writer",
            "in one step of the backend",
        ),
        (
            _DeleteUnderTheHolder,
            "test_delete_is_refused_while_the_other_object_holds_the_session",
            "delete of a session another store object holds must raise ConflictError",
        ),
        (
            _DropUnderTheHolder,
            "test_drop_is_refused_while_the_other_object_holds_the_session",
            "drop of a session another store object holds must raise ConflictError",
        ),
        (
            _ReleaseFreesAnyToken,
            "test_a_stale_token_releases_nothing_the_other_object_holds",
            "release with a stale token is a no-op",
        ),
        (
            _ReleaseKeepsTheClaim,
            "test_a_claim_released_by_one_object_can_be_taken_by_the_other",
            "release must remove the claim from the backend",
        ),
        (
            _OwnWritesOnly,
            "test_a_peer_reads_what_the_store_wrote",
            r"make_peer\(store\) must return a second store object on the same backend",
        ),
        (
            _OwnWritesOnly,
            "test_a_watch_of_one_object_follows_the_other_objects_commits",
            "whichever store object committed it",
        ),
    ],
)
def test_a_store_breaking_a_rule_between_objects_fails_saying_which(
    handle: type[_Handle], test: str, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the suite had no test with two store objects on one backend: each of these
    stores passed it."""
    monkeypatch.setattr(_contract_module, "_FEED_WAIT_SECONDS", 1.0)  # an event never comes
    _fails(_contract(handle), test, match, with_peer=True)


def _pytest(folder: Path, *args: str, optimize: bool = False) -> str:
    """Run pytest in a new process in ``folder`` (no ini file: its defaults); its output."""
    command = [sys.executable, *(["-O"] if optimize else []), "-m", "pytest"]
    done = subprocess.run(
        [*command, "-p", "no:cacheprovider", "-q", "-rs", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout + done.stderr


_USER_MODULE = """
from nous_actor.store import MemoryStore
from nous_actor.testing.store_contract import StoreContract
from nous_actor.testing.store_suite import _contract as _contract_module
from nous_actor.testing.stores import DelegatingStore

class Unsorted(DelegatingStore):
    def sessions(self):
        return sorted(self.inner.sessions(), reverse=True)

class TestMine(StoreContract):
    def make_store(self):
        return Unsorted(MemoryStore())
"""


def test_under_python_O_a_broken_store_still_fails_and_peer_tests_skip_saying_why(
    tmp_path: Path,
) -> None:
    """The suite's checks were bare asserts in an installed module: under ``python -O``
    they vanished and a store that lists its sessions unsorted passed (and without -O
    it failed with a bare AssertionError). A store without `make_peer` skips the peer
    tests, saying how to run them."""
    (tmp_path / "test_mine.py").write_text(_USER_MODULE)
    selected = " or ".join([*_PEER_TESTS, "test_sessions_lists_every_id_sorted"])
    out = _pytest(tmp_path, "-k", selected, optimize=True)
    assert f"1 failed, {len(_PEER_TESTS)} skipped" in out, out
    assert "the rule of test_sessions_lists_every_id_sorted" in out, out
    assert "override make_peer(store) to return one" in out, out


def test_no_assert_statement_checks_a_users_code() -> None:
    """The installed modules users' tests run keep no ``assert`` for what they check
    (it vanishes under ``python -O``): only a type checker's narrowing, marked so."""
    import nous_actor.testing as testing

    root = Path(testing.__file__).parent
    modules = [
        *sorted((root / "store_suite").glob("*.py")),
        *(root / name for name in ("store_contract.py", "store_machine.py", "machines.py")),
        *(root / name for name in ("stores.py", "strategies.py", "reference.py")),
    ]
    found = []
    for path in modules:
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if (
                isinstance(node, ast.Assert)
                and "for the type checker" not in lines[node.lineno - 1]
            ):
                found.append(f"{path.name}:{node.lineno}")
    assert not found, found


# -- PostgreSQL: two PostgresStore objects on one schema keep the peer rules ----------------

_PEER_TESTS = sorted(
    name
    for name in dir(StoreContract)
    if name.startswith("test_") and "peer" in getattr(StoreContract, name).__code__.co_varnames
)


def test_the_peer_tests_are_the_ones_listed() -> None:
    """The tests run on PostgreSQL below, and skipped without a peer, are found by their
    ``peer`` argument."""
    assert len(_PEER_TESTS) == 10, _PEER_TESTS


@pytest.mark.parametrize("test", _PEER_TESTS)
def test_two_postgres_stores_on_one_schema_keep_the_peer_rules(
    pg_stores: object, test: str
) -> None:
    """`PostgresStore` objects on one schema are peers (two processes' stores)."""
    make: Callable[[], Store] = pg_stores  # type: ignore[assignment]
    store, peer = make(), make()
    getattr(_Alone(), test)(store, peer)


# -- one store object breaking one rule: the suite fails it in that rule's test -------------


class _ReleaseByToken(_Handle):
    """Frees whichever session the token holds, whatever session it is given with."""

    def release(self, session_id: str, token: str) -> None:
        with self.backend.lock:
            for sid, (_, held) in list(self.backend.claims.items()):
                if held == token:
                    del self.backend.claims[sid]


class _WatchFromTheHead(_Handle):
    """A watch of its own that starts at the head when asked to start past it."""

    def watch(
        self, session_id: str, from_seq: int = 0, *, buffer: int = 1000, timeout: float = 30.0
    ) -> Subscription:
        start = min(from_seq, shared.next_seq(self, session_id))
        return shared.watch(DelegatingStore(self), session_id, start, timeout=timeout)


class _ListsRefusedSessions(_Handle):
    """Adds a session to its list of sessions before its write is checked (a refused
    write of a new session leaves it listed, without events)."""

    def write(self, appends: Mapping[str, Sequence[Event]]) -> dict[str, StoreError]:
        self.__dict__.setdefault("listed", set()).update(s for s, e in appends.items() if e)
        return super().write(appends)

    def sessions(self) -> list[str]:
        return sorted(self.__dict__.get("listed", set()) | set(super().sessions()))


class _Unsorted(_Handle):
    """Lists its sessions newest first."""

    def sessions(self) -> list[str]:
        return sorted(super().sessions(), reverse=True)


@pytest.mark.parametrize(
    ("handle", "test", "match"),
    [
        (
            _Unsorted,
            "test_sessions_lists_every_id_sorted",
            r"the rule of test_sessions_lists_every_id_sorted \(sessions\(\) lists each id",
        ),
        (
            _ReleaseByToken,
            "test_a_token_releases_its_own_session_only",
            r"release\('b', token of 'a'\) must release nothing",
        ),
        (
            _WatchFromTheHead,
            "test_a_watch_from_past_the_head_gives_nothing_below_its_seq",
            "a watch gives the committed events with seq >= its from_seq",
        ),
        (
            _ListsRefusedSessions,
            "test_a_seq_twice_in_one_write_is_refused",
            "a refused write of a new session stores nothing, so it must not list it",
        ),
        (
            _DuplicateOverwrites,
            "test_a_seq_already_stored_is_refused_with_conflict_error",
            "the rule of test_a_seq_already_stored_is_refused_with_conflict_error",
        ),
        (
            _SinceSkipsOne,
            "test_load_since_reads_a_suffix_without_a_claim",
            "seqs differ",
        ),
        (
            _SinceSkipsOne,
            "test_a_watch_catches_up_then_follows_exactly_once_in_order",
            "a watch from seq 1 .* gave no event within .*did it skip or lose one",
        ),
        (
            _SinceByPosition,
            "test_load_since_and_next_seq_go_by_seq_across_gaps",
            "load_since",
        ),
        (
            _NextSeqIsACount,
            "test_load_since_and_next_seq_go_by_seq_across_gaps",
            "next_seq",
        ),
    ],
)
def test_a_store_breaking_a_rule_fails_in_its_test_saying_which(
    handle: type[_Handle], test: str, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each failure names the rule (the test and what it checks): before, most checks
    were bare asserts, failing with an empty AssertionError."""
    monkeypatch.setattr(_contract_module, "_FEED_WAIT_SECONDS", 1.0)  # an event never comes
    _fails(_contract(handle), test, match)


class _Alone(StoreContract):
    """A test class that gives no peer (the default `make_peer`): its tests are called
    with a store and a peer made by the test."""

    def make_store(self) -> Store:
        return MemoryStore()
