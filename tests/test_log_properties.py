"""Properties of the Log that hold for every log: snapshot, seed, derive, materialize, threads."""

from __future__ import annotations

import pickle
import sys
import threading
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from nous_actor import Log, Message
from nous_actor.testing import (
    log_programs,
    logs,
    messages,
    reference_derive_indexed,
    run_program,
)
from nous_actor.testing.strategies import LogOp

TIMEOUT = 30.0
THREADS = 6


# -- snapshot ---------------------------------------------------------------------------


@given(log_programs(), log_programs())
def test_snapshot_preserves_later_derives(prefix: list[LogOp], suffix: list[LogOp]) -> None:
    """Any program run after a snapshot derives what it derives on the original."""
    log = run_program(prefix)
    snap = log.snapshot()
    assert snap.derive_indexed() == log.derive_indexed()
    assert run_program(suffix, snap).derive_indexed() == run_program(suffix, log).derive_indexed()


@given(log_programs(), log_programs())
def test_snapshot_preserves_count(prefix: list[LogOp], suffix: list[LogOp]) -> None:
    """``count()`` after a snapshot, and after any later program, is the original's."""
    log = run_program(prefix)
    snap = log.snapshot()
    assert snap.count() == log.count()
    assert run_program(suffix, snap).count() == run_program(suffix, log).count()


@given(log_programs(), log_programs())
def test_snapshot_preserves_later_events(prefix: list[LogOp], suffix: list[LogOp]) -> None:
    """Events appended after a snapshot are retained exactly as on the original."""
    log = run_program(prefix)
    after_snap = run_program(suffix, log.snapshot())
    after_log = run_program(suffix, log)
    assert after_snap.since(log.count()) == after_log.since(log.count())
    kept = {e.seq for e in after_snap.events()}
    assert kept <= {e.seq for e in after_log.events()}


@given(logs())
def test_snapshot_is_idempotent(log: Log) -> None:
    """A snapshot of a snapshot drops nothing more."""
    snap = log.snapshot()
    assert snap.snapshot() == snap


@given(logs())
def test_snapshot_keeps_every_surface_event(log: Log) -> None:
    """Every surface event survives a snapshot."""
    kept = {e.seq for e in log.snapshot().events()}
    assert {e.seq for e in log.surface()} <= kept


# -- seed -------------------------------------------------------------------------------


@given(st.lists(messages(), max_size=12))
def test_seed_is_lossless(ms: list[Message]) -> None:
    """``Log.seed(ms).derive_messages() == ms``."""
    assert Log.seed(ms).derive_messages() == ms


@given(st.lists(messages(), max_size=12))
def test_seed_pairs_messages_with_seqs_in_order(ms: list[Message]) -> None:
    """A seeded log's ``derive_indexed`` is ``enumerate(ms)``."""
    assert Log.seed(ms).derive_indexed() == list(enumerate(ms))


# -- derive and materialize -------------------------------------------------------------


@given(logs())
def test_derive_messages_is_derive_indexed_without_seqs(log: Log) -> None:
    """``derive_messages() == [m for _, m in derive_indexed()]``."""
    assert log.derive_messages() == [m for _, m in log.derive_indexed()]


@given(logs())
def test_derive_indexed_seqs_are_the_surface(log: Log) -> None:
    """The seqs of ``derive_indexed`` are the seqs of ``surface()``, in order."""
    assert [seq for seq, _ in log.derive_indexed()] == [e.seq for e in log.surface()]


@given(logs())
def test_materialize_is_idempotent(log: Log) -> None:
    """Materializing a materialized log returns the same messages and an equal log."""
    msgs, once = log.materialize()
    again, twice = once.materialize()
    assert again == msgs == log.derive_messages()
    assert twice == once == log
    assert twice.derive_indexed() == log.derive_indexed()


@given(logs(), st.integers(-2, 60))
def test_since_is_the_filtered_events(log: Log, seq: int) -> None:
    """``since(seq)`` is ``[e for e in events() if e.seq >= seq]``."""
    assert log.since(seq) == [e for e in log.events() if e.seq >= seq]


@given(logs())
def test_pickle_roundtrip_preserves_the_log(log: Log) -> None:
    """An unpickled log is equal and folds the same."""
    copy = pickle.loads(pickle.dumps(log))
    assert copy == log
    assert copy.count() == log.count()
    assert copy.derive_indexed() == log.derive_indexed()


# -- threads sharing versions -----------------------------------------------------------


def run_threads(work: list[Callable[[], Any]]) -> list[Any]:
    """Run each callable in its own thread, started together; return results in order."""
    barrier = threading.Barrier(len(work), timeout=TIMEOUT)
    results: list[Any] = [None] * len(work)
    errors: list[BaseException] = []

    def runner(i: int) -> None:
        try:
            barrier.wait()
            results[i] = work[i]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=runner, args=(i,), daemon=True) for i in range(len(work))]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch as often as possible so interleavings happen
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=TIMEOUT)
    finally:
        sys.setswitchinterval(old)
    assert not any(t.is_alive() for t in threads), "a worker thread did not finish"
    if errors:
        raise errors[0]
    return results


_thread_settings = settings(max_examples=max(10, settings.default.max_examples // 4))


def _base(program: list[LogOp], memoised: bool) -> Log:
    log = run_program(program)
    return log.materialize()[1] if memoised else log


@_thread_settings
@given(log_programs(), st.booleans())
def test_concurrent_derives_of_one_version_agree(program: list[LogOp], memoised: bool) -> None:
    """Threads deriving the same log value at once all get the reference fold."""
    log = _base(program, memoised)
    expected = reference_derive_indexed(log.events())

    def derive() -> list[Any]:
        return [log.derive_indexed() for _ in range(5)]

    for got in run_threads([derive] * THREADS):
        assert got == [expected] * 5


@_thread_settings
@given(log_programs(), st.lists(log_programs(max_ops=8), min_size=THREADS, max_size=THREADS))
def test_concurrent_appends_to_one_version_agree(
    program: list[LogOp], branches: list[list[LogOp]]
) -> None:
    """Threads each running their own program on one shared log all get the reference fold."""
    log = _base(program, memoised=True)
    before = log.events()

    def branch(ops: list[LogOp]) -> Callable[[], list[tuple[Log, list[Any]]]]:
        def work() -> list[tuple[Log, list[Any]]]:
            out = []
            lg = log
            for op in ops:
                lg = op.apply(lg)
                out.append((lg, lg.derive_indexed()))
            return out

        return work

    results = run_threads([branch(ops) for ops in branches])
    for steps in results:
        for lg, got in steps:
            assert got == reference_derive_indexed(lg.events())
    assert log.events() == before
    assert log.derive_indexed() == reference_derive_indexed(before)


@_thread_settings
@given(log_programs(), st.lists(log_programs(max_ops=8), min_size=THREADS, max_size=THREADS))
def test_concurrent_branches_keep_their_own_events(
    program: list[LogOp], branches: list[list[LogOp]]
) -> None:
    """A thread's branch of a shared log holds the shared events plus exactly its own."""
    log = _base(program, memoised=True)
    expected = [run_program(ops, run_program(program)) for ops in branches]

    def branch(ops: list[LogOp]) -> Callable[[], Log]:
        return lambda: run_program(ops, log)

    for got, want in zip(run_threads([branch(ops) for ops in branches]), expected, strict=True):
        assert got == want
        assert got.count() == want.count()


@_thread_settings
@given(log_programs(), log_programs(max_ops=8))
def test_concurrent_readers_and_writers_of_one_version_agree(
    program: list[LogOp], suffix: list[LogOp]
) -> None:
    """Readers of a log and writers deriving from it at the same time all see the reference."""
    log = _base(program, memoised=True)
    expected_base = reference_derive_indexed(log.events())
    grown = run_program(suffix, run_program(program))
    expected_grown = reference_derive_indexed(grown.events())

    def read() -> bool:
        return all(log.derive_indexed() == expected_base for _ in range(5))

    def write() -> bool:
        lg = log
        for op in suffix:
            lg = op.apply(lg)
            lg.derive_indexed()
        return lg.derive_indexed() == expected_grown and lg.snapshot().derive_indexed() == (
            expected_grown
        )

    assert run_threads([read, write] * (THREADS // 2)) == [True] * THREADS
