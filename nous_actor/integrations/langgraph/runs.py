"""Runs and their turns: how concurrent runs of one thread take turns (double texting).

A checkpointer sees reads and writes, not runs. Here a **run** is one LangGraph
invocation (``invoke``, ``ainvoke``, ``stream`` ...): the calls whose config
carries that invocation's runtime (LangGraph puts it in every config it hands
its checkpointer, its subgraphs' included). A run's **turn** of its thread's
session (DESIGN.md §11):

* **opens** at the run's first read of the thread (its root namespace), before
  anything is read, per its ``multitask_strategy`` (the run config's
  ``configurable.multitask_strategy``, else the saver's): ``reject`` (refused
  at once with `nous_actor.TurnBusy` while another run holds the thread),
  ``enqueue`` (waits, first come first served, then reads what the runs before
  it left), ``interrupt`` (the running run's turn ends; its next write fails
  with `nous_actor.TurnInterrupted`, its checkpoints stay; this run reads
  from them) or ``rollback`` (as ``interrupt``, and the stopped run's
  checkpoints are hidden: the thread is back where it was before it);
* **ends** when the invocation does, however it ends: it returns (done, paused
  by ``interrupt()``, ``interrupt_before``/``interrupt_after``, nothing to
  run), raises (a node's error, input a reducer refuses, the recursion limit,
  an unknown ``checkpoint_id``), is cancelled (``asyncio`` cancellation, a
  timeout), or its ``stream()`` is closed (a ``for`` loop left with ``break``
  closes it) -- and sooner, when it has stored a root checkpoint with no task
  left to run, or the checkpoint a root interrupt or error write belongs to,
  once none of its calls is in flight. A ``Command(resume=...)`` is a new run.

How the saver learns that an invocation ended: at the run's first read it
finds the invocation's own callback manager (the ``run_manager`` of the
``Pregel.stream`` / ``Pregel.astream`` frame that is running it, the one whose
config carries the run's runtime) and adds a handler of its own there
(`RunEnd`): LangGraph calls ``on_chain_end`` or ``on_chain_error`` on it once
the invocation is over, after every write it made is stored (its background
writes are waited for when its loop exits), on every path out. Should it not
be found (a caller other than LangGraph's ``Pregel``), the run's turn ends as
before: at a final, interrupt or error checkpoint, else when its lease runs
out (`RunTurn`, ``saver.run``, holds a thread explicitly in any case).

Every write of a run goes through its turn; a write of a run whose turn ended
(a late write of a task, kept for the checkpoint it belongs to) goes through
the turn of this saver's run that holds the thread, if any.
"""

from __future__ import annotations

import itertools
import sys
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import Any, Final, Literal

from nous_actor.errors import TurnInterrupted
from nous_actor.integrations.langgraph.effects import aclose_quietly, close_quietly
from nous_actor.integrations.langgraph.framework import (
    AsyncCallbackHandler,
    BaseCallbackHandler,
    Pregel,
)
from nous_actor.integrations.langgraph.registries import Registry
from nous_actor.sessions.future import SessionFuture
from nous_actor.sessions.turn_handle import Turn

__all__ = [
    "STRATEGIES",
    "Run",
    "RunEnd",
    "RunTurn",
    "Runs",
    "Strategy",
    "has_next",
    "strategy_of",
]

Strategy = Literal["reject", "enqueue", "interrupt", "rollback"]

STRATEGIES: Final[tuple[Strategy, ...]] = ("reject", "enqueue", "interrupt", "rollback")
"""The values of ``multitask_strategy``, as LangGraph's server names them."""

CONFIG_KEY: Final = "multitask_strategy"
"""The key of a run config's ``configurable`` that chooses the run's strategy."""

_RUNTIME_KEY: Final = "__pregel_runtime"
"""Where LangGraph keeps an invocation's runtime in the configs it passes its
checkpointer (a private key of LangGraph's, read here alone; its ``control`` is one
object per invocation, shared by the invocation's subgraphs). Tested against the
LangGraph release of the ``langgraph`` extra."""

RUNS_KEPT: Final = 4096
"""How many ended runs a saver remembers (so that their late writes find a turn)."""

_FRAMES: Final = 64
"""How many frames up from the saver a run's first read looks for the ``Pregel.stream`` /
``Pregel.astream`` frame running it (a few dozen: LangGraph's loop, the saver's own)."""

_SYNC_STREAM: Final = Pregel.stream.__code__
_ASYNC_STREAM: Final = Pregel.astream.__code__

_NAMES: Final = itertools.count(1)
_PROCESS: Final = uuid.uuid4().hex[:8]


def _run_name() -> str:
    """A run's owner name: unique in this process and across processes (no random draw
    per run: ``os.urandom`` lets go of the GIL, and the event loop waits to get it back)."""
    return f"langgraph run {_PROCESS}-{next(_NAMES)}"


_EXPLICIT: ContextVar[tuple[tuple[str, Turn], ...]] = ContextVar(
    "nous_actor_langgraph_runs", default=()
)


def check_strategy(value: object, what: str = "multitask_strategy") -> Strategy:
    """``value`` if it is one of `STRATEGIES`, else a ValueError naming them."""
    if not isinstance(value, str) or value not in STRATEGIES:
        raise ValueError(
            f"{what} must be one of {', '.join(map(repr, STRATEGIES))} (as LangGraph's "
            f"server names them), got {value!r}"
        )
    return value


def strategy_of(config: Mapping[str, Any], default: Strategy) -> Strategy:
    """The strategy a run config asks for (``configurable.multitask_strategy``), else
    ``default``."""
    conf = config.get("configurable") or {}
    chosen = conf.get(CONFIG_KEY)
    return default if chosen is None else check_strategy(chosen)


def control_of(config: Mapping[str, Any]) -> object | None:
    """The object that is one LangGraph invocation in ``config`` (None outside a run)."""
    conf = config.get("configurable")
    runtime = conf.get(_RUNTIME_KEY) if isinstance(conf, Mapping) else None
    return None if runtime is None else getattr(runtime, "control", runtime)


def _triggered(channel: str) -> bool:
    return channel == "__start__" or channel.startswith("branch:to:")


def has_next(checkpoint: Mapping[str, Any]) -> bool:
    """Whether a checkpoint leaves a task to run: a trigger channel (``__start__``,
    ``branch:to:<node>``, a complete ``join:<a>+<b>:<node>``) holding a value no node
    has seen, or a ``Send`` waiting."""
    values: Mapping[str, Any] = checkpoint.get("channel_values") or {}
    versions: Mapping[str, Any] = checkpoint.get("channel_versions") or {}
    seen: Mapping[str, Mapping[str, Any]] = checkpoint.get("versions_seen") or {}
    for ch, value in values.items():
        if ch == "__pregel_tasks":
            if value:
                return True
            continue
        if ch.startswith("join:"):
            parts = ch.split(":")
            starts = set(parts[1].split("+")) if len(parts) >= 3 else set()
            try:
                complete = bool(starts) and starts <= set(value)
            except TypeError:
                complete = False
            if not complete:
                continue
        elif not _triggered(ch):
            continue
        version = versions.get(ch)
        if version is None or not any(v.get(ch) == version for v in seen.values()):
            return True
    return False


@dataclass(eq=False)
class Run:
    """One LangGraph invocation on one thread, as the saver follows it."""

    key: str
    control: object  # held, so that its id names this run while it is remembered
    owner: str
    turn: Turn | None = None
    opening: bool = False
    closed: bool = False
    inflight: int = 0
    end_at: str | None = None  # the root checkpoint whose storing ends the run
    stored: set[str] = field(default_factory=set)  # root checkpoints it stored
    reopening: SessionFuture[None] | None = None  # its turn being opened again, if it is
    finished: bool = False  # its invocation is over (LangGraph said so: `RunEnd`)
    watched: bool = False  # a `RunEnd` of it was added to its invocation's callbacks


def invocation_of(control: object, skip: int = 1) -> tuple[Any, bool] | None:
    """The callback manager of the LangGraph invocation running this call, whose runtime's
    control is ``control``, and whether it is async: the ``run_manager`` of the innermost
    ``Pregel.stream`` / ``Pregel.astream`` frame on this call's stack whose config
    carries ``control`` (None if there is none: a caller other than ``Pregel``)."""
    frame: FrameType | None = sys._getframe(skip)
    for _ in range(_FRAMES):
        if frame is None:
            return None
        code = frame.f_code
        if code is _SYNC_STREAM or code is _ASYNC_STREAM:
            local = frame.f_locals
            manager = local.get("run_manager")
            conf = local.get("config")
            if (
                manager is not None
                and isinstance(getattr(manager, "handlers", None), list)
                and isinstance(conf, Mapping)
                and control_of(conf) is control
            ):
                return manager, code is _ASYNC_STREAM
        frame = frame.f_back
    return None


class RunEnd(BaseCallbackHandler):
    """Added to one LangGraph invocation's callback manager: its end (``on_chain_end``,
    ``on_chain_error``, on every path out of the invocation) ends the run's turn."""

    run_inline = True
    raise_error = False

    def __init__(self, runs: Runs, run: Run) -> None:
        self._runs = runs
        self._run = run

    def on_chain_end(self, outputs: Any, **kwargs: Any) -> None:
        turn = self._runs.finish(self._run)
        if turn is not None:
            close_quietly(turn)

    def on_chain_error(self, error: BaseException, **kwargs: Any) -> None:
        turn = self._runs.finish(self._run)
        if turn is not None:
            close_quietly(turn)


class AsyncRunEnd(AsyncCallbackHandler):
    """`RunEnd` of an async invocation (``ainvoke``, ``astream``): the turn is closed
    without blocking the loop."""

    run_inline = True
    raise_error = False

    def __init__(self, runs: Runs, run: Run) -> None:
        self._runs = runs
        self._run = run

    async def on_chain_end(self, outputs: Any, **kwargs: Any) -> None:
        turn = self._runs.finish(self._run)
        if turn is not None:
            await aclose_quietly(turn)

    async def on_chain_error(self, error: BaseException, **kwargs: Any) -> None:
        turn = self._runs.finish(self._run)
        if turn is not None:
            await aclose_quietly(turn)


class Runs:
    """The runs of a saver, by (thread session, invocation), and the explicit turns
    (`RunTurn`) open in this context. Thread-safe: one lock, never held while waiting."""

    def __init__(self, strategy: Strategy, lease: float, wait: float) -> None:
        self.strategy = strategy
        self.lease = lease
        self.wait = wait
        self._lock = threading.Lock()
        self._runs: OrderedDict[tuple[str, int], Run] = OrderedDict()
        self._open: dict[str, list[Turn]] = {}  # thread session -> its turns open here

    def explicit(self, key: str) -> Turn | None:
        """The turn of the `RunTurn` block this context is in for thread ``key``."""
        for k, turn in reversed(_EXPLICIT.get()):
            if k == key:
                return turn
        return None

    def enter(self, key: str, config: Mapping[str, Any]) -> Run | None:
        """The run ``config`` belongs to (None outside one, or inside a `RunTurn` block of
        the thread), its call counted in flight until `leave`."""
        control = control_of(config)
        if control is None or self.explicit(key) is not None:
            return None
        with self._lock:
            run = self._runs.get((key, id(control)))
            if run is None or run.control is not control:
                run = Run(key, control, _run_name())
                self._runs[(key, id(control))] = run
                self._forget()
            run.inflight += 1
            return run

    def to_open(self, run: Run | None) -> bool:
        """Whether this call opens ``run``'s turn (its first read; marks it opening)."""
        if run is None:
            return False
        with self._lock:
            if run.turn is not None or run.opening or run.closed:
                return False
            run.opening = True
            return True

    def watch(self, run: Run) -> bool:
        """Have ``run``'s invocation tell this saver when it ends (`RunEnd`, added to its
        callback manager, found on this call's stack); whether it was found. Called by
        the run's first read, in the thread (or task) running the invocation."""
        found = invocation_of(run.control, 2)
        if found is None:
            return False
        manager, is_async = found
        handler = AsyncRunEnd(self, run) if is_async else RunEnd(self, run)
        # A list of the manager's own (its list may be shared with the manager it came from).
        manager.handlers = [*manager.handlers, handler]
        with self._lock:
            run.watched = True
        return True

    def finish(self, run: Run) -> Turn | None:
        """``run``'s invocation is over: the turn to close now (None: none is open, or a
        call of the run is in flight, whose `leave` closes it)."""
        with self._lock:
            run.finished = True
            if run.turn is None or run.closed or run.inflight > 0:
                return None
            turn = run.turn
            self._release(run)
            return turn

    def opened(self, run: Run, turn: Turn | None) -> None:
        """``run``'s turn is open (``turn``), or was refused (None: the run is over)."""
        with self._lock:
            run.opening = False
            if turn is None:
                run.closed = True
                return
            run.turn = turn
            self._open.setdefault(run.key, []).append(turn)

    def claim_reopen(self, run: Run, ended: Turn, bound: float) -> SessionFuture[None] | None:
        """The future that says when ``run``'s turn ``ended`` is open again: a new one if
        this caller is to open it (then it is ``run.reopening``, and this caller must
        call `reopened`), else None (another call of the run opens it, or has)."""
        with self._lock:
            if run.reopening is not None or run.turn is not ended:
                return None
            run.reopening = SessionFuture(run.key, bound)
            return run.reopening

    def reopened(self, run: Run, turn: Turn | None, error: BaseException | None = None) -> None:
        """``run``'s turn, ended by a restart of its session, is open again as ``turn``
        (None: it could not be, ``error`` says why); the calls waiting for it go on."""
        with self._lock:
            waiting, run.reopening = run.reopening, None
            if turn is not None:
                held = self._open.get(run.key)
                if held is not None and run.turn in held:
                    held.remove(run.turn)
                run.turn = turn
                self._open.setdefault(run.key, []).append(turn)
        if waiting is not None:
            if error is None:
                waiting.set(None)
            else:
                waiting.set_exception((type(error), error, error.__traceback__))

    def writer(self, key: str, run: Run | None) -> Turn | None:
        """The turn a write of ``run`` to thread ``key`` goes through (None: the plain
        handle): an explicit turn, the run's own, or, for a run whose turn ended, the
        turn of this saver that holds the thread."""
        explicit = self.explicit(key)
        if explicit is not None:
            return explicit
        if run is None:
            return None
        with self._lock:
            if run.turn is not None and not run.closed:
                return run.turn
            if run.closed:
                held = self._open.get(key)
                return held[-1] if held else None
            return None

    def stored(self, run: Run | None, checkpoint_id: str, done: bool) -> None:
        """``run`` stored root checkpoint ``checkpoint_id`` (``done``: no task left)."""
        if run is None:
            return
        with self._lock:
            run.stored.add(checkpoint_id)
            if done:
                run.end_at = checkpoint_id

    def stopped(self, run: Run | None, checkpoint_id: str) -> None:
        """``run`` wrote an interrupt or error for root checkpoint ``checkpoint_id``."""
        if run is not None:
            with self._lock:
                run.end_at = checkpoint_id

    def lost(self, run: Run | None, exc: TurnInterrupted) -> None:
        """``run``'s turn ended under it (taken by another run, expired)."""
        if run is None:
            return
        with self._lock:
            self._release(run)

    def leave(self, run: Run | None, known: bool = False) -> Turn | None:
        """The call of ``run`` is over; the turn to close now if the run is (``known``:
        the checkpoint it ends at is stored, as the thread's fold says)."""
        if run is None:
            return None
        with self._lock:
            run.inflight -= 1
            if run.turn is None or run.closed or run.inflight > 0:
                return None
            if not run.finished and (
                run.end_at is None or not (known or run.end_at in run.stored)
            ):
                return None
            turn = run.turn
            self._release(run)
            return turn

    def _release(self, run: Run) -> None:
        run.closed = True
        turns = self._open.get(run.key)
        if turns is not None and run.turn in turns:
            turns.remove(run.turn)
            if not turns:
                del self._open[run.key]

    def _forget(self) -> None:
        """Past `RUNS_KEPT` runs, let go of a quarter: the ended first, then the oldest with
        no call in flight (a run whose turn its lease ended long ago; were it still going,
        its next write would go through the plain handle and be refused after its bound,
        saying why)."""
        if len(self._runs) <= RUNS_KEPT:
            return
        keep = RUNS_KEPT * 3 // 4  # one pass lets go of a quarter: amortised O(1) a run
        excess = len(self._runs) - keep
        ended = [k for k, r in self._runs.items() if r.closed and r.inflight == 0][:excess]
        for k in ended:
            del self._runs[k]
        idle = [k for k, r in self._runs.items() if r.inflight == 0 and not r.opening]
        for k in idle[: max(0, len(self._runs) - keep)]:
            del self._runs[k]

    # -- explicit turns ------------------------------------------------------------------

    def push(self, key: str, turn: Turn) -> Token[tuple[tuple[str, Turn], ...]]:
        with self._lock:
            self._open.setdefault(key, []).append(turn)
        return _EXPLICIT.set((*_EXPLICIT.get(), (key, turn)))

    def pop(self, key: str, turn: Turn, token: Token[tuple[tuple[str, Turn], ...]]) -> None:
        with self._lock:
            turns = self._open.get(key)
            if turns is not None and turn in turns:
                turns.remove(turn)
                if not turns:
                    del self._open[key]
        try:
            _EXPLICIT.reset(token)
        except ValueError:  # left in another context than it was entered in
            _EXPLICIT.set(tuple(e for e in _EXPLICIT.get() if e[1] is not turn))


class RunTurn:
    """A turn of one thread held for a block of code: ``with saver.run(config):`` (or
    ``async with``). Every run of the thread inside the block (in this thread or task,
    and the tasks and threads it starts) writes through it and opens no turn of its
    own; another run of the thread waits for the block, or is refused, per its own
    strategy. Leaving the block ends the turn (as failed when the block raised).

    Attributes:
        turn: the `nous_actor.Turn` (None until entered).
    """

    def __init__(
        self,
        sessions: Registry,
        runs: Runs,
        key: str,
        strategy: Strategy,
        lease: float,
        wait: float,
    ) -> None:
        self._sessions = sessions
        self._runs = runs
        self._key = key
        self._strategy = strategy
        self._lease = lease
        self._wait = wait
        self.turn: Turn | None = None
        self._token: Token[tuple[tuple[str, Turn], ...]] | None = None

    def _make(self) -> Turn:
        if self.turn is not None:
            raise RuntimeError("a RunTurn is entered once: call saver.run(...) again")
        handle = self._sessions.open(self._key)
        self.turn = handle.turn(
            self._strategy,
            owner=_run_name(),
            lease=self._lease,
            timeout=self._wait,
        )
        return self.turn

    def __enter__(self) -> RunTurn:
        turn = self._make()
        turn.open()
        self._token = self._runs.push(self._key, turn)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        turn, token = self.turn, self._token
        if turn is None or token is None:
            return
        self._runs.pop(self._key, turn, token)
        if exc_type is None:
            turn.close()
        else:
            turn.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> RunTurn:
        handle = await self._sessions.aopen(self._key)
        if self.turn is not None:
            raise RuntimeError("a RunTurn is entered once: call saver.run(...) again")
        self.turn = handle.turn(
            self._strategy,
            owner=_run_name(),
            lease=self._lease,
            timeout=self._wait,
        )
        await self.turn.aopen()
        self._token = self._runs.push(self._key, self.turn)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        turn, token = self.turn, self._token
        if turn is None or token is None:
            return
        self._runs.pop(self._key, turn, token)
        if exc_type is None:
            await turn.aclose()
        else:
            await turn.__aexit__(exc_type, exc, tb)
