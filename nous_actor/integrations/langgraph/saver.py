"""`NousCheckpointSaver`: LangGraph's checkpointer, kept in nous_actor sessions."""

from __future__ import annotations

import builtins
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from datetime import datetime
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, Final, cast

from nous_actor.core.event import EventType, InvalidEvent
from nous_actor.core.limits import max_event_bytes
from nous_actor.errors import (
    CallOutcomeUnknown,
    ConflictError,
    SessionCrashed,
    TurnBusy,
    TurnInterrupted,
)
from nous_actor.integrations.langgraph.codec import decode, encode
from nous_actor.integrations.langgraph.effects import (
    CloseTurn,
    Listing,
    Op,
    Open,
    OpenTurn,
    Stored,
    run_async,
    run_sync,
)
from nous_actor.integrations.langgraph.framework import (
    ERROR,
    INTERRUPT,
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    RunnableConfig,
    SerializerProtocol,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from nous_actor.integrations.langgraph.ids import PREFIX, thread_key, thread_of
from nous_actor.integrations.langgraph.records import (
    CHECKPOINT_V,
    RECORD_KEY,
    State,
    checkpoint_record,
    joined,
    split_record,
    time_of,
    writes_record,
)
from nous_actor.integrations.langgraph.registries import Journal, Registry
from nous_actor.integrations.langgraph.runs import (
    Run,
    Runs,
    RunTurn,
    Strategy,
    check_strategy,
    has_next,
    strategy_of,
)
from nous_actor.integrations.langgraph.threads import Cp, ThreadLog
from nous_actor.sessions.handle import SessionHandle
from nous_actor.sessions.registry import Sessions
from nous_actor.sessions.turn_handle import Turn, check_turn_args
from nous_actor.store import SQLiteStore

__all__ = ["NousCheckpointSaver"]

THREADS_KEPT: Final = 1024
"""How many threads' folds a saver keeps (the least recently used let go first)."""

REOPENS: Final = 5
"""How often a run's turn that restarts of its session ended is opened again, at most,
for one write."""

STRATEGIES: Final = ("keep_latest", "delete")
"""The strategies of `NousCheckpointSaver.prune`."""


def _configurable(config: object, what: str = "config") -> Mapping[str, Any]:
    if not isinstance(config, Mapping):
        raise TypeError(
            f"{what} must be a RunnableConfig (a dict such as "
            f"{{'configurable': {{'thread_id': 't-1'}}}}), got {type(config).__name__}"
        )
    conf = config.get("configurable")
    if not isinstance(conf, Mapping):
        raise ValueError(
            f"{what} has no 'configurable' mapping; pass {{'configurable': {{'thread_id': ...}}}}"
        )
    return conf


def _where(config: object, what: str = "config") -> tuple[Any, str, str, str | None]:
    """(thread id as given, its session key, namespace, checkpoint id or None)."""
    conf = _configurable(config, what)
    if "thread_id" not in conf:
        raise ValueError(
            f"{what}['configurable'] has no 'thread_id'; every checkpoint belongs to a "
            "thread: pass {'configurable': {'thread_id': ...}}"
        )
    tid = conf["thread_id"]
    ns = conf.get("checkpoint_ns") or ""
    if not isinstance(ns, str):
        raise TypeError(f"checkpoint_ns must be a str, got {type(ns).__name__}")
    cid = conf.get("checkpoint_id")
    return tid, thread_key(tid), ns, None if cid is None else str(cid)


def _own(value: Any) -> Any:
    t = type(value)
    return t(value) if t is list or t is dict else value


def _busy(exc: TurnBusy, key: str, what: str) -> TurnBusy:
    """``exc`` (a turn of thread ``key`` held ``what`` off) told in LangGraph's terms: what
    holds the thread, and what a LangGraph user can do about it."""
    holder = exc.holder or "another run"
    if exc.lease_until is not None:
        until = (
            f" (its lease, renewed by each of its calls, runs out at "
            f"{exc.lease_until:%H:%M:%S} UTC)"
        )
    else:
        until = ""
    busy = TurnBusy(
        f"thread {thread_of(key)!r} is held by {holder!r}{until}: a run of it that is still "
        f"going (in this process or another) or a saver.run(config) block; {what} could "
        "not have it, and nothing was applied. Try again once that run has ended; to run "
        "and update a thread with nothing in between, hold it yourself around both "
        "(with saver.run(config): graph.invoke(...); graph.update_state(...)); for a run "
        "that may take the thread over, pass configurable.multitask_strategy "
        "'interrupt' or 'rollback' (or 'enqueue' to wait for it, at most the saver's "
        f"wait). (Turn {exc.turn_id!r} of session {key!r}.)",
        session_id=exc.session_id,
        holder=exc.holder,
        lease_until=exc.lease_until,
        turn_id=exc.turn_id,
    )
    return busy


class NousCheckpointSaver(BaseCheckpointSaver[str]):
    """LangGraph's checkpointer (`BaseCheckpointSaver`, sync and async), over the sessions
    of a `nous_actor.Sessions` registry on any store, or of a ``RaySessions`` (of
    `nous_actor.cluster.ray`) on a store every process reaches.

    Swap ``SqliteSaver.from_conn_string("x.db")`` (or ``InMemorySaver()``,
    ``PostgresSaver``) for ``NousCheckpointSaver(sessions)``, or for
    ``NousCheckpointSaver.from_conn_string("x.db")`` (a SQLite file under a
    registry opened for it; `close` closes both).

    **Where things are kept.** A thread is one session (``langgraph/<thread
    id>``, see `nous_actor.integrations.langgraph.thread_key`); a checkpoint
    namespace (a subgraph's) is a key inside it. Each checkpoint and each
    task's pending writes is one event of that session, durably committed
    before `put` / `put_writes` returns. A checkpoint keeps only what changed
    since its parent: a channel whose value is the parent's is not kept again,
    a list that extends the parent's (the ``messages`` channel) keeps its new
    tail, a list that keeps some of the parent's elements otherwise (a message
    removed or replaced by id) an edit of the parent's list, anything else is
    kept whole; so a thread's storage grows with what was said, not with its
    square. A record larger than one event (a channel value over 16 MiB) is
    kept in parts, appended in one batch. Reads fold the records back (memoised per
    thread: the latest checkpoint of a long thread is read in what a short
    one costs).

    **Nothing is erased.** `delete_thread`, `prune` and `delete_for_runs`
    append records that hide checkpoints from LangGraph; the events stay in the
    log (audit, fork, the viewer show them). `copy_thread` is a fork of the
    thread's session (every event, seqs kept).

    **One writer per thread.** Every write of a thread goes through its
    session's actor, from any number of coroutines, threads or processes (a
    process that does not hold a thread's session calls the one that does).
    Checkpoints are never lost to a race between writers; runs that must not
    interleave take turns (see `run`).

    Values are compared, for the delta, by identity and then by what would be
    stored (equal values of one type whose stored forms are the same): a
    value changed in place after it was checkpointed is not seen as changed
    (LangGraph's reducers return new values; so must yours). A read returns
    what the stored form reads back as, in every process (a tuple stored
    through the serializer reads back as a list, in the process that put it
    too). Returned values are shared with the saver's memo down to the
    elements of lists and dicts: read them, do not change them in place.

    **Double texting.** Concurrent runs of one thread take turns of its
    session, per their ``multitask_strategy`` (``reject``, ``enqueue``,
    ``interrupt``, ``rollback``, as LangGraph's server defines them), chosen
    per saver and per run (``configurable.multitask_strategy`` of the run's
    config): see `nous_actor.integrations.langgraph.runs` for when a run's turn
    opens and ends (when its invocation ends, however it ends: a run that has
    stopped holds nothing), and `run` to hold one explicitly.

    **Over Ray.** Given a ``RaySessions``, each thread's session runs in its shard
    and every call of the saver goes there; which threads are stored is read from
    a store the saver makes with the registry's ``store_factory`` (so it must be
    one every process reaches, e.g. ``functools.partial(PostgresStore, dsn)``,
    not a ``MemoryStore``); `close` closes that store.

    Args:
        sessions: the registry whose sessions keep the threads: a
            `nous_actor.Sessions`, a ``RaySessions``, or any `Registry` (``open``
            and ``aopen``, and a ``store`` or a ``store_factory``).
        serde: the serializer of values that are not plain JSON (LangGraph's
            ``JsonPlusSerializer`` by default).
        multitask_strategy: what a run does when another run holds its thread,
            unless its config says otherwise (default ``enqueue``).
        lease: seconds a run may go without a call to the saver before its turn
            expires (a run whose process died frees its thread then; a run that
            ended frees it at once).
        wait: seconds an ``enqueue`` run waits for its thread before
            `nous_actor.TurnBusy`.

    Raises:
        TypeError: ``sessions`` is not a registry (it lacks ``open`` or ``aopen``,
            or has neither a ``store`` nor a ``store_factory``; the message names
            what is missing).
        ValueError: ``multitask_strategy``, ``lease`` or ``wait`` is not one the
            saver takes (the message names the values it takes); the registry's
            ``store_factory`` makes a `nous_actor.MemoryStore`, which no other
            process reads.
        StoreError: the store of the registry's ``store_factory`` cannot be
            opened in this process.
    """

    def __init__(
        self,
        sessions: Registry,
        *,
        serde: SerializerProtocol | None = None,
        multitask_strategy: Strategy = "enqueue",
        lease: float = 300.0,
        wait: float = 300.0,
    ) -> None:
        strategy = check_strategy(multitask_strategy)
        check_turn_args(strategy, None, lease, wait, None)
        self._journal = Journal(sessions)
        super().__init__(serde=serde)
        self._runs = Runs(strategy, float(lease), float(wait))
        self.sessions: Registry = sessions
        self._owned: SQLiteStore | None = None
        self._lock = threading.Lock()
        self._threads: OrderedDict[str, ThreadLog] = OrderedDict()
        self._handles: OrderedDict[str, SessionHandle] = OrderedDict()

    # -- construction and closing ------------------------------------------------------------

    @classmethod
    def from_conn_string(
        cls, path: str | Path, *, serde: SerializerProtocol | None = None
    ) -> NousCheckpointSaver:
        """A saver on the SQLite file at ``path`` (made if missing), under a registry opened
        for it; `close` (or leaving ``with`` / ``async with``) closes both.

        Raises:
            TypeError: ``path`` is not a str or a path.
            ValueError: ``path`` is empty.
            StoreError: the file cannot be opened as a store.
        """
        if not isinstance(path, (str, Path)):
            raise TypeError(f"path must be a str or a pathlib.Path, got {type(path).__name__}")
        if not str(path):
            raise ValueError("path is empty; give the SQLite file, e.g. 'checkpoints.db'")
        store = SQLiteStore(path)
        saver = cls(Sessions(store), serde=serde)
        saver._owned = store
        return saver

    def close(self) -> None:
        """Close the registry and store opened by `from_conn_string`, and the store made
        by a registry's ``store_factory`` (a registry passed in is yours to close)."""
        self._journal.close()
        store, self._owned = self._owned, None
        if store is not None:
            cast(Sessions, self.sessions).close()
            store.close()

    async def aclose(self) -> None:
        """`close` for asyncio code."""
        self._journal.close()
        store, self._owned = self._owned, None
        if store is not None:
            await cast(Sessions, self.sessions).aclose()
            store.close()

    def __enter__(self) -> NousCheckpointSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> NousCheckpointSaver:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def run(
        self,
        config: RunnableConfig,
        multitask_strategy: Strategy | None = None,
        *,
        lease: float | None = None,
        wait: float | None = None,
    ) -> RunTurn:
        """Hold ``config``'s thread for a block: ``with saver.run(config):`` or ``async
        with``. Entering opens a turn of the thread per ``multitask_strategy`` (the
        saver's when None); every run of the thread inside the block writes through it
        (none opens a turn of its own), and runs elsewhere wait for the block or are
        refused, per theirs. Leaving closes it.

        Raises:
            TypeError, ValueError: ``config`` names no thread, or a bad strategy,
                ``lease`` or ``wait`` (raised here).
            TurnBusy: (on entering) another run holds the thread (``reject``), or
                held it for all of ``wait`` (``enqueue``).
            TurnInterrupted: (on leaving) another run took the thread meanwhile
                (``interrupt``, ``rollback``) or the lease ran out.
        """
        _, key, _, _ = _where(config)
        strategy = self._runs.strategy if multitask_strategy is None else multitask_strategy
        strategy = check_strategy(strategy)
        lease = self._runs.lease if lease is None else lease
        wait = self._runs.wait if wait is None else wait
        check_turn_args(strategy, None, lease, wait, None)
        return RunTurn(self.sessions, self._runs, key, strategy, float(lease), float(wait))

    # -- LangGraph's API, sync ------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its thread, namespace and ``checkpoint_id``;
        the latest of the namespace without one), with its pending writes; ``None`` if
        there is none (or it was deleted).

        Raises:
            TypeError, ValueError: ``config`` has no ``configurable.thread_id``.
        """
        return run_sync(self._journal, self._get_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """The checkpoints of ``config``'s thread (of every thread when None), newest
        first (by checkpoint id, across threads too, as LangGraph's SqliteSaver
        orders them): of its ``checkpoint_ns`` when given (else of every namespace), only
        ``checkpoint_id`` when given, only those whose metadata has every item of
        ``filter``, only those older than ``before``'s checkpoint, at most ``limit``."""
        return iter(run_sync(self._journal, self._list(config, filter, before, limit)))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store ``checkpoint`` in ``config``'s thread and namespace, as a child of
        ``config``'s ``checkpoint_id``; returns the config that names it. Committed when
        this returns.

        Raises:
            TypeError, ValueError: ``config`` has no ``configurable.thread_id``.
        """
        return run_sync(self._journal, self._put(config, checkpoint, metadata))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store the pending ``writes`` of task ``task_id`` for ``config``'s checkpoint (a
        write of a task and index stored already is not stored again; an error, interrupt,
        scheduled or resume write replaces the one before). Committed when this returns.

        Raises:
            TypeError, ValueError: ``config`` names no thread or no checkpoint.
        """
        run_sync(self._journal, self._put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread for LangGraph: every checkpoint and write of it is gone from
        `get_tuple` and `list`; its session keeps them (a deletion record is appended).
        Deleting a thread that has nothing does nothing."""
        run_sync(self._journal, self._delete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete, for LangGraph, the checkpoints (and their writes) whose metadata
        ``run_id`` is one of ``run_ids``, in every thread (each thread's session keeps
        them). Reads every stored thread of the registry's store."""
        run_sync(self._journal, self._delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread to another: the target's session
        is a fork of the source's (every event, the deleted ones too, seqs kept), or, when
        the target has events already, the source's visible checkpoints (each kept as
        what changed since its parent when that is copied too, else whole) and their
        writes are appended to it. A source with nothing copies nothing."""
        run_sync(self._journal, self._copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune the threads for LangGraph: ``keep_latest`` keeps the latest checkpoint of
        each namespace (with its writes, and its state whole: a ``DeltaChannel``'s value
        is still rebuilt from the writes before it), ``delete`` keeps none. The
        sessions keep all.

        Raises:
            ValueError: ``strategy`` is neither.
        """
        run_sync(self._journal, self._prune(thread_ids, strategy))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """For each channel, the writes of the checkpoints before ``config``'s (on its
        parent chain, oldest first, hidden ones too: pruned, or of deleted runs) back
        to the nearest holding a value of the channel, that value as ``seed`` (see
        LangGraph's `BaseCheckpointSaver`); read from the records, so it costs what
        those writes hold, not what the checkpoints do."""
        return run_sync(self._journal, self._delta_history(config, channels))

    def get_next_version(self, current: Any, channel: None = None) -> Any:
        """The version of a channel after ``current``: an int one more (1 for None); after
        a str version (LangGraph's own savers number them so, ``"<32 digits>.<hash>"``:
        a thread copied from one of them) the next such str, so that every version of
        a thread stays of one type and keeps growing.

        Raises:
            TypeError: ``current`` is neither None, an int nor a str.
            ValueError: a str ``current`` does not start with an integer.
        """
        if current is None:
            return 1
        if isinstance(current, int) and not isinstance(current, bool):
            return current + 1
        if isinstance(current, str):
            head = current.split(".", 1)[0]
            try:
                number = int(head)
            except ValueError:
                raise ValueError(
                    f"channel version {current!r} does not start with an integer; versions "
                    "are ints, or strs such as LangGraph's savers write "
                    "('00000000000000000000000000000001.0.5')"
                ) from None
            return f"{number + 1:032}.{0:016}"
        raise TypeError(f"a channel version must be an int or a str, got {type(current).__name__}")

    # -- LangGraph's API, async -----------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """`get_tuple`, awaited without blocking the loop."""
        return await run_async(self._journal, self._get_tuple(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """`list`, awaited without blocking the loop."""
        found = await run_async(self._journal, self._list(config, filter, before, limit))
        for tup in found:
            yield tup

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """`put`, awaited without blocking the loop."""
        return await run_async(self._journal, self._put(config, checkpoint, metadata))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """`put_writes`, awaited without blocking the loop."""
        await run_async(self._journal, self._put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        """`delete_thread`, awaited without blocking the loop."""
        await run_async(self._journal, self._delete_thread(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """`delete_for_runs`, awaited without blocking the loop."""
        await run_async(self._journal, self._delete_for_runs(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """`copy_thread`, awaited without blocking the loop."""
        await run_async(self._journal, self._copy_thread(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`prune`, awaited without blocking the loop."""
        await run_async(self._journal, self._prune(thread_ids, strategy))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """`get_delta_channel_history`, awaited without blocking the loop."""
        return await run_async(self._journal, self._delta_history(config, channels))

    # -- the folds and handles of threads ---------------------------------------------------

    def _handle(self, key: str) -> Op[SessionHandle]:
        with self._lock:
            known = self._handles.get(key)
            if known is not None:
                self._handles.move_to_end(key)
                return known
        handle: SessionHandle = yield Open(key)
        with self._lock:
            self._handles[key] = handle
            if len(self._handles) > 4 * THREADS_KEPT:
                self._handles.popitem(last=False)
        return handle

    def _log(self, key: str) -> ThreadLog:
        with self._lock:
            thread = self._threads.get(key)
            if thread is None:
                thread = self._threads[key] = ThreadLog(key)
                if len(self._threads) > THREADS_KEPT:
                    self._threads.popitem(last=False)
            else:
                self._threads.move_to_end(key)
            return thread

    def _catch_up(self, thread: ThreadLog, handle: SessionHandle) -> Op[None]:
        """Fold the events of ``thread`` past those folded; a read the session's holder
        did not answer (it went away: the session moves) is made again, at most
        `REOPENS` times."""
        for attempt in range(REOPENS + 1):
            try:
                events = yield handle.since(thread.next)
            except SessionCrashed:
                if attempt == REOPENS:
                    raise
                continue
            with thread.lock:
                thread.ingest(events)
            return

    def _read(self, key: str) -> Op[ThreadLog | None]:
        """The fold of thread ``key``, caught up with its session; None if it has no events
        (the session is not opened then)."""
        with self._lock:
            known = key in self._handles
        if not known and not (yield Stored(key)):
            return None
        handle = yield from self._handle(key)
        thread = self._log(key)
        yield from self._catch_up(thread, handle)
        return thread

    def _append(
        self,
        key: str,
        handle: SessionHandle,
        records: builtins.list[dict[str, Any]],
        run: Run | None = None,
        times: builtins.list[datetime | None] | None = None,
        thread: ThreadLog | None = None,
    ) -> Op[builtins.list[Any]]:
        """Append ``records`` as one batch (at ``times``, each None for now): through the
        turn ``run`` writes through (see `Runs.writer`), else through the plain handle
        (waiting for an open turn).

        A batch whose session's holder process died before answering is looked up by its
        call's id (`CallOutcomeUnknown`; the holder recorded it with its events): applied,
        its events are returned; else it is sent again. A batch whose session crashed
        before answering (the session moves; it may or may not have been applied) is
        looked for in the session's log (``thread``'s fold caught up): found, it is done
        (no events are returned); else it is appended again. Records other than
        checkpoints are appended again in any case (a write, a deletion or a prune
        applied twice changes nothing).

        A run's turn that a restart of the session ended (nothing of the write was
        applied) is opened again, refusing to wait (a run that took the thread
        meanwhile wins: this one fails with `TurnInterrupted`), and the write is made
        through it."""
        when = times or [None] * len(records)
        items = _items(records, when)
        split = False
        for attempt in range(REOPENS + 1):
            turn = self._runs.writer(key, run)
            own = run is not None and turn is not None and turn is run.turn
            try:
                events = yield (handle if turn is None else turn).append_many(items)
                return cast(builtins.list[Any], events)
            except InvalidEvent:
                # A record too large for one event (a channel value over the limit) is
                # stored as parts, in the same batch; refused for another reason, or
                # refused as parts, it is the caller's error.
                if split:
                    raise
                split = True
                limit = max_event_bytes()
                parted: builtins.list[dict[str, Any]] = []
                parted_when: builtins.list[datetime | None] = []
                for r, t in zip(records, when, strict=True):
                    parts = split_record(r, limit)
                    parted.extend([r] if parts is None else parts)
                    parted_when.extend([t] * (1 if parts is None else len(parts)))
                if len(parted) == len(records):
                    raise
                records, when = parted, parted_when
                items = _items(records, when)
                continue
            except TurnBusy as exc:
                if turn is not None:
                    raise
                what = "this write (a put, update_state, delete_thread ...)"
                raise _busy(exc, key, what) from None
            except CallOutcomeUnknown as lost:
                # The holder recorded the batch's call with its events: ask whether it
                # was applied (then it is done), else send it again.
                seqs = yield handle.applied(lost.call_id)
                if seqs is not None:
                    stored = yield handle.since(seqs[0])
                    return cast(builtins.list[Any], stored[: len(seqs)])
                if attempt == REOPENS:
                    raise
                continue
            except SessionCrashed:
                if attempt == REOPENS:
                    raise
                if thread is not None:
                    yield from self._catch_up(thread, handle)
                    cps = [(str(r["ns"]), str(r["id"])) for r in records if r[RECORD_KEY] == "cp"]
                    cps += [
                        (str(whole["ns"]), str(whole["id"]))
                        for whole in _whole(records)
                        if whole.get(RECORD_KEY) == "cp"
                    ]
                    with thread.lock:
                        if cps and all(thread.has(ns, cid) for ns, cid in cps):
                            return []
                continue
            except TurnInterrupted as exc:
                if not own or attempt == REOPENS:
                    self._runs.lost(run, exc)
                    raise
                assert run is not None
                assert turn is not None
                pending = run.reopening
                if pending is not None:  # another call of this run is opening it again
                    try:
                        yield pending
                    except Exception:
                        self._runs.lost(run, exc)
                        raise exc from None
                    continue
                if run.turn is not turn:
                    continue  # another call of this run opened it again already
                restarted = yield from self._ended_by_restart(handle, exc)
                if not restarted:
                    self._runs.lost(run, exc)
                    raise
                claimed = self._runs.claim_reopen(run, turn, self._runs.wait + handle.timeout)
                if claimed is None:
                    continue  # another call of this run claimed it meanwhile
                again = handle.turn(
                    "reject", owner=run.owner, lease=self._runs.lease, timeout=self._runs.wait
                )
                try:
                    yield OpenTurn(again)
                except Exception as refused:
                    self._runs.reopened(run, None, refused)
                    self._runs.lost(run, exc)
                    raise exc from None
                self._runs.reopened(run, again)
        raise AssertionError("unreachable")  # pragma: no cover

    def _ended_by_restart(self, handle: SessionHandle, exc: TurnInterrupted) -> Op[bool]:
        """Whether the turn ``exc`` names ended because its session restarted (not because
        another run took it, or its lease ran out)."""
        if exc.how is None:
            return True  # the session does not know the turn: it restarted
        count: int = yield handle.count()
        events = yield handle.since(max(0, count - 4096))
        for ev in reversed(events):
            if ev.type is EventType.TURN_END and ev.data.get("turn_id") == exc.turn_id:
                return bool(ev.data.get("reason") == "restart")
        return False

    def _open_run(self, key: str, run: Run | None, config: RunnableConfig) -> Op[None]:
        """Open ``run``'s turn of thread ``key`` if this call is its first read."""
        if not self._runs.to_open(run):
            return
        assert run is not None
        turn: Turn | None = None
        try:
            self._runs.watch(run)
            handle = yield from self._handle(key)
            turn = handle.turn(
                strategy_of(config, self._runs.strategy),
                owner=run.owner,
                lease=self._runs.lease,
                timeout=self._runs.wait,
            )
            yield OpenTurn(turn)
        except TurnBusy as exc:
            self._runs.opened(run, None)
            raise _busy(exc, key, "this run") from None
        except BaseException:
            self._runs.opened(run, None)
            raise
        self._runs.opened(run, turn)

    def _leave(self, run: Run | None, thread: ThreadLog | None) -> Op[None]:
        """A call of ``run`` is over: close its turn if the run is."""
        if run is None:
            return
        known = False
        end = run.end_at
        if end is not None and thread is not None:
            with thread.lock:
                known = thread.has("", end)
        turn = self._runs.leave(run, known)
        if turn is not None:
            yield CloseTurn(turn)

    # -- the operations ---------------------------------------------------------------------

    def _tuple(
        self, thread: ThreadLog, cp: Cp, thread_id: Any, state: State | None = None
    ) -> CheckpointTuple:
        """The `CheckpointTuple` of ``cp`` (called under the thread's lock), of its
        ``state`` when resolved already."""
        serde = self.serde
        rec = cp.rec
        if state is None:
            state = thread.state(serde, cp)
        checkpoint: dict[str, Any] = {}
        if "x" in rec:
            checkpoint.update(decode(serde, rec["x"]))
        upd = rec.get("upd")
        checkpoint.update(
            v=rec.get("v", CHECKPOINT_V),
            id=cp.id,
            ts=rec["ts"] if "ts" in rec else cp.time.isoformat(),
            channel_values={k: _own(v) for k, v in state.values.items()},
            channel_versions=dict(state.versions),
            versions_seen={n: dict(vs) for n, vs in state.seen.items()},
            updated_channels=None if upd is None else list(upd),
        )
        config: RunnableConfig = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": cp.ns,
                "checkpoint_id": cp.id,
            }
        }
        parent: RunnableConfig | None = None
        if cp.parent is not None:
            parent = {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": cp.ns,
                    "checkpoint_id": cp.parent,
                }
            }
        return CheckpointTuple(
            config=config,
            checkpoint=cast(Checkpoint, checkpoint),
            metadata=cast(CheckpointMetadata, thread.metadata(serde, cp)),
            parent_config=parent,
            pending_writes=thread.writes(serde, cp),
        )

    def _get_tuple(self, config: RunnableConfig) -> Op[CheckpointTuple | None]:
        tid, key, ns, cid = _where(config)
        run = self._runs.enter(key, config)
        thread: ThreadLog | None = None
        try:
            if ns == "":
                yield from self._open_run(key, run, config)
            thread = yield from self._read(key)
            if thread is None:
                return None
            with thread.lock:
                cp = thread.find(ns, cid)
                return None if cp is None else self._tuple(thread, cp, tid)
        finally:
            yield from self._leave(run, thread)

    def _list(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Op[builtins.list[CheckpointTuple]]:
        if filter is not None and not isinstance(filter, Mapping):
            raise TypeError(
                f"filter must be a dict of metadata items, got {type(filter).__name__}"
            )
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise TypeError(f"limit must be an int or None, got {type(limit).__name__}")
        before_id = None if before is None else get_checkpoint_id(before)
        ns: str | None = None
        cid: str | None = None
        if config is None:
            keys: builtins.list[str] = yield Listing(PREFIX)
            threads = [(thread_of(k), k) for k in keys]
        else:
            tid, key, _, cid = _where(config)
            conf = _configurable(config)
            ns = conf.get("checkpoint_ns")
            threads = [(tid, key)]
        out: builtins.list[CheckpointTuple] = []
        if limit is not None and limit <= 0:
            return out
        # Each thread's matches, newest first (at most ``limit`` of each); then merged,
        # newest first across threads (by checkpoint id, as LangGraph's SqliteSaver
        # orders them: ids grow with time).
        found: builtins.list[tuple[str, str, Any, ThreadLog, Cp]] = []
        for tid, key in threads:
            thread = yield from self._read(key)
            if thread is None:
                continue
            mine = 0
            with thread.lock:
                for cp in thread.listed(ns):
                    if cid is not None and cp.id != cid:
                        continue
                    if before_id is not None and cp.id >= before_id:
                        continue
                    if filter:
                        meta = thread.metadata(self.serde, cp)
                        if not all(meta.get(k) == v for k, v in filter.items()):
                            continue
                    found.append((cp.id, cp.ns, tid, thread, cp))
                    mine += 1
                    if limit is not None and mine >= limit:
                        break
        if len(threads) > 1:
            found.sort(key=lambda f: (f[0], f[1]), reverse=True)
        found = found[:limit]
        # Each thread's states resolved together, oldest first, each onto its parent's:
        # one by one, newest first, each would be folded again from the thread's start.
        states: dict[Cp, State] = {}
        for thread in {id(f[3]): f[3] for f in found}.values():
            with thread.lock:
                states.update(thread.states(self.serde, [f[4] for f in found if f[3] is thread]))
        for _, _, tid, thread, cp in found:
            with thread.lock:
                out.append(self._tuple(thread, cp, tid, states[cp]))
        return out

    def _put(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> Op[RunnableConfig]:
        tid, key, ns, parent = _where(config)
        if not isinstance(checkpoint, Mapping) or "id" not in checkpoint:
            raise TypeError("checkpoint must be a LangGraph Checkpoint (a dict with an 'id')")
        run = self._runs.enter(key, config)
        thread = self._log(key)
        try:
            stored = yield from self._put_in(
                key, thread, ns, parent, config, checkpoint, metadata, run
            )
        finally:
            yield from self._leave(run, thread)
        return {"configurable": {"thread_id": tid, "checkpoint_ns": ns, "checkpoint_id": stored}}

    def _put_in(
        self,
        key: str,
        thread: ThreadLog,
        ns: str,
        parent: str | None,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        run: Run | None,
    ) -> Op[str]:
        handle = yield from self._handle(key)
        with thread.lock:
            known = parent is None or thread.has(ns, parent)
        if not known:
            yield from self._catch_up(thread, handle)
        meta = dict(get_checkpoint_metadata(config, metadata))
        run_id = meta.get("run_id")
        with thread.lock:
            base_cp = None if parent is None else thread.cps.get((ns, parent))
            base = None if base_cp is None else thread.state(self.serde, base_cp)
            record, state = checkpoint_record(
                self.serde,
                ns,
                checkpoint,
                encode(self.serde, meta),
                parent,
                base,
                run_id if isinstance(run_id, str) else None,
                None if parent is None else partial(thread.written, ns, parent),
            )
        events = yield from self._append(
            key, handle, [record], run, [time_of(checkpoint["ts"])], thread
        )
        cid = str(checkpoint["id"])
        with thread.lock:
            thread.remember(ns, cid, state)
            thread.caught_up_with(events)
        if ns == "":
            self._runs.stored(run, cid, not has_next(checkpoint))
        return cid

    def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> Op[None]:
        _, key, ns, cid = _where(config)
        if cid is None:
            raise ValueError(
                "put_writes needs the checkpoint the writes belong to: config['configurable'] "
                "has no 'checkpoint_id' (pass the config put returned)"
            )
        indexed = [(WRITES_IDX_MAP.get(ch, i), ch, v) for i, (ch, v) in enumerate(writes)]
        if not indexed:
            return
        run = self._runs.enter(key, config)
        thread = self._log(key)
        try:
            handle = yield from self._handle(key)
            record = writes_record(self.serde, ns, cid, str(task_id), str(task_path), indexed)
            events = yield from self._append(key, handle, [record], run, None, thread)
            with thread.lock:
                thread.caught_up_with(events)
            if ns == "" and any(ch in (ERROR, INTERRUPT) for _, ch, _ in indexed):
                self._runs.stopped(run, cid)
        finally:
            yield from self._leave(run, thread)

    def _delete_thread(self, thread_id: str) -> Op[None]:
        key = thread_key(thread_id)
        thread = yield from self._read(key)
        if thread is None:
            return
        with thread.lock:
            if not thread.namespaces():
                return
        handle = yield from self._handle(key)
        yield from self._append(key, handle, [{RECORD_KEY: "del"}])
        yield from self._catch_up(thread, handle)

    def _prune(self, thread_ids: Sequence[str], strategy: str) -> Op[None]:
        if strategy not in STRATEGIES:
            raise ValueError(
                f"strategy must be 'keep_latest' (keep each namespace's latest checkpoint) "
                f"or 'delete' (keep none), got {strategy!r}"
            )
        for thread_id in _many(thread_ids, "thread_ids"):
            key = thread_key(thread_id)
            thread = yield from self._read(key)
            if thread is None:
                continue
            with thread.lock:
                latest = thread.latest_per_ns()
            if not latest:
                continue
            record: dict[str, Any] = {RECORD_KEY: "del"}
            if strategy == "keep_latest":
                record = {RECORD_KEY: "prune", "keep": [list(k) for k in latest]}
            handle = yield from self._handle(key)
            yield from self._append(key, handle, [record])
            yield from self._catch_up(thread, handle)

    def _delete_for_runs(self, run_ids: Sequence[str]) -> Op[None]:
        runs = {str(r) for r in _many(run_ids, "run_ids")}
        if not runs:
            return
        keys: builtins.list[str] = yield Listing(PREFIX)
        for key in keys:
            thread = yield from self._read(key)
            if thread is None:
                continue
            with thread.lock:
                hit = sorted(thread.run_ids() & runs)
            if hit:
                handle = yield from self._handle(key)
                yield from self._append(key, handle, [{RECORD_KEY: "runs", "runs": hit}])
                yield from self._catch_up(thread, handle)

    def _copy_thread(self, source: str, target: str) -> Op[None]:
        src, dst = thread_key(source), thread_key(target)
        if src == dst:
            raise ValueError("copy_thread copies a thread to another: give two thread ids")
        thread = yield from self._read(src)
        if thread is None:
            return
        handle = yield from self._handle(src)
        try:
            yield handle.fork(thread.next - 1, dst)
            return
        except (ConflictError, ValueError):
            pass  # the target has events (or a run of the source is half written)
        records: builtins.list[dict[str, Any]] = []
        with thread.lock:
            cps = sorted(thread.listed(None), key=lambda c: (c.seq, c.ns))
            copied = {(c.ns, c.id) for c in cps}
            for cp in cps:
                rec = dict(cp.rec)
                rec.setdefault("ts", cp.time.isoformat())
                if not rec.get("full") and (cp.ns, cp.parent) in copied:
                    # What changed since its parent, which is copied too (with the
                    # writes a reference of the record may name): kept as it is.
                    records.append(rec)
                    records.extend(self._writes_records(thread, cp))
                    continue
                state = thread.state(self.serde, cp)
                rec.update(
                    full=True,
                    vals={ch: ["w", encode(self.serde, v)] for ch, v in state.values.items()},
                    vers=dict(state.versions),
                    seen={n: dict(vs) for n, vs in state.seen.items()},
                    drop=[],
                    vers_drop=[],
                    seen_drop=[],
                )
                records.append(rec)
                records.extend(self._writes_records(thread, cp))
        if records:
            target_handle = yield from self._handle(dst)
            yield from self._append(dst, target_handle, records)

    @staticmethod
    def _writes_records(thread: ThreadLog, cp: Cp) -> builtins.list[dict[str, Any]]:
        """The records of ``cp``'s pending writes, one per task, as kept."""
        by_task: dict[tuple[str, str], builtins.list[builtins.list[Any]]] = {}
        for task, idx, ch, kept, path in thread.raw_writes(cp):
            by_task.setdefault((task, path), []).append([idx, ch, kept])
        return [
            {RECORD_KEY: "w", "ns": cp.ns, "cp": cp.id, "task": task, "path": path, "w": ws}
            for (task, path), ws in by_task.items()
        ]

    def _delta_history(
        self, config: RunnableConfig, channels: Sequence[str]
    ) -> Op[Mapping[str, DeltaChannelHistory]]:
        wanted = list(channels)
        if not wanted:
            return {}
        result: dict[str, DeltaChannelHistory] = {ch: {"writes": []} for ch in wanted}
        _, key, ns, cid = _where(config)
        thread = yield from self._read(key)
        if thread is None:
            return result
        with thread.lock:
            target = thread.find(ns, cid)
            if target is None or target.parent is None:
                return result
            start = thread.cps.get((ns, target.parent))
            if start is None:
                return result
            # The walk goes through ancestors hidden from LangGraph too (pruned, or of
            # deleted runs): the fold keeps them, and the checkpoint's values are built
            # on theirs (a pruned thread's latest checkpoint reads back as it was).
            chain, found = thread.ancestry(start, set(wanted))
            for ch in wanted:
                holder = found.get(ch)
                last = len(chain) - 1 if holder is None else holder[0]
                writes: builtins.list[PendingWrite] = []
                for cp in reversed(chain[: last + 1]):
                    writes.extend(thread.writes(self.serde, cp, ch))
                result[ch]["writes"] = writes
                if holder is not None:
                    result[ch]["seed"] = _own(thread.value_set(self.serde, chain[holder[1]], ch))
        return result


def _items(
    records: list[dict[str, Any]], when: list[datetime | None]
) -> list[tuple[EventType, dict[str, Any]] | tuple[EventType, dict[str, Any], datetime]]:
    return [
        (EventType.REQUEST_HEADER, r) if t is None else (EventType.REQUEST_HEADER, r, t)
        for r, t in zip(records, when, strict=True)
    ]


def _whole(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records that ``part`` records among ``records`` hold."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.get(RECORD_KEY) == "part":
            by.setdefault(str(r["of"]), []).append(r)
    return [joined(parts) for parts in by.values()]


def _many(values: object, what: str) -> list[Any]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence | set | frozenset):
        raise TypeError(
            f"{what} must be a list of ids, got {type(values).__name__}"
            + (f" (wrap a single id: [{values!r}])" if isinstance(values, str) else "")
        )
    return list(values)
