"""Ready scenarios of the races the runtime must win, for a simulation or real threads.

Each ``*_scenario(...)`` returns a scenario: ``scenario(env)`` builds a
registry on a store inside ``env`` (a `nous_actor.testing.simulation.Simulation`
or `RealThreads`), starts callers, runs them and checks what must hold,
raising ``AssertionError`` when it does not:

* `registry_scenario`: callers append to many sessions while sessions crash,
  stop and commits fail or stall. Every append is acknowledged only once the
  store holds it; a read after an acknowledgement sees it; at the end the store
  holds every acknowledged event.
* `subscription_scenario`: a session is stopped while appends are in flight;
  its subscriber receives every acknowledged event before its feed ends.
* `stop_race_scenario`: calls race a stop; every call is answered (a result
  or `SessionStopped`), none is left waiting.
* `compaction_scenario`: a compaction with a slow summariser is retried under
  the same id while appends go on; it is applied once. The compactions are
  asked for by asyncio callers (coroutines) with a coroutine summariser, which
  runs on their event loop (the simulation's, or one per caller on threads).
* `registry_scenario(async_callers=n)`: besides the generator callers, ``n``
  coroutines do the same through ``await sessions.aopen(...)`` and ``await``
  on each call.
* `restart_scenario`: a session crashes with appends in flight; once one is
  acknowledged, a read of the restarted session sees it.
* `index_race_scenario`: a race planted in user code (an agent keeps indexes into
  ``derive_messages()`` while an asyncio caller's compaction lands), which only a
  long interleaving shows.

`MUTATIONS` plants known defects (one per scenario and more) with `mutate`,
to check that a simulation finds them.
"""

from __future__ import annotations
import __future__

import asyncio
import contextlib
import importlib
import inspect
import shutil
import tempfile
import textwrap
import threading
from collections.abc import Callable, Coroutine, Generator, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from nous_actor.core.compaction import CompactionError, Compactor
from nous_actor.errors import CallTimeout, SessionStopped, StoreError, TooManySessions
from nous_actor.sessions.handle import Session
from nous_actor.sessions.registry import Sessions
from nous_actor.store.base import Store
from nous_actor.store.memory import MemoryStore
from nous_actor.supervision import Supervisor
from nous_actor.testing.simulation import SimulatedCrash

__all__ = [
    "MUTATIONS",
    "Mutation",
    "RealThreads",
    "compaction_scenario",
    "crash_session",
    "index_race_scenario",
    "mutate",
    "registry_scenario",
    "restart_scenario",
    "stop_race_scenario",
    "subscription_scenario",
]

Env = Any  # a Simulation or RealThreads: go(caller, name), run(), sleep(seconds), end_faults()
Scenario = Callable[[Env], None]
Caller = Generator[Any, Any, None]

TOLERATED = (SessionStopped, StoreError, TooManySessions)
"""What a call may fail with while sessions crash and commits fail (never `CallTimeout`)."""


class RealThreads:
    """The same scenarios on real threads: each caller is a thread; ``yield future``
    waits for it (bounded), ``yield`` and ``yield seconds`` go on at once."""

    real = True

    def __init__(self, timeout: float = 10.0) -> None:
        self.timeout = timeout
        self.call_timeout = timeout
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []

    def go(self, caller: Caller | Coroutine[Any, Any, None], name: str = "caller") -> None:
        """Run a generator caller on a thread, or a coroutine on an event loop of its own
        (on a thread)."""
        drive = self._drive_async if inspect.iscoroutine(caller) else self._drive
        t = threading.Thread(target=drive, args=(caller,), name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def _drive_async(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            asyncio.run(coro)
        except BaseException as exc:
            self._errors.append(exc)

    def _drive(self, caller: Caller) -> None:
        try:
            for yielded in caller:
                if yielded is not None and hasattr(yielded, "get"):
                    with contextlib.suppress(Exception):
                        yielded.get(timeout=self.timeout)
        except BaseException as exc:
            self._errors.append(exc)

    def sleep(self, seconds: float) -> None:
        """Nothing: real threads need no virtual time to pass."""

    def end_faults(self) -> None:
        """Nothing: no faults are injected on real threads."""

    def note(self, text: str) -> None:
        pass

    def run(self) -> None:
        for t in self._threads:
            t.join(self.timeout * 3)
            if t.is_alive():
                raise AssertionError(f"{t.name} did not finish within {self.timeout * 3:g} s")
        self._threads.clear()
        if self._errors:
            raise self._errors[0]


def run_real(scenario: Scenario, timeout: float = 10.0) -> BaseException | None:
    """Run ``scenario`` once on real threads; what broke, or ``None``."""
    try:
        scenario(RealThreads(timeout))
    except Exception as exc:
        return exc
    return None


def settle(fut: Any) -> tuple[bool, Any]:
    """``(True, value)``, or ``(False, error)`` for a tolerated failure of the call.

    Raises:
        AssertionError: the call was never answered (`CallTimeout`).
    """
    try:
        return True, fut.get()
    except CallTimeout as exc:
        raise AssertionError(f"a call was never answered: {exc}") from exc
    except TOLERATED as exc:
        return False, exc


async def asettle(aw: Any) -> tuple[bool, Any]:
    """`settle` for asyncio callers: ``await aw``.

    Raises:
        AssertionError: the call was never answered (`CallTimeout`).
    """
    try:
        return True, await aw
    except CallTimeout as exc:
        raise AssertionError(f"a call was never answered: {exc}") from exc
    except TOLERATED as exc:
        return False, exc


def _crash(actor: Any) -> None:
    raise SimulatedCrash("crashed by a caller (a fault of the scenario)")


def crash_session(session: Session) -> Any:
    """Crash ``session``'s actor (as a ``BaseException`` in a handler would); the
    future of the crashing call fails with `nous_actor.SessionCrashed`."""
    return session._call(_crash)


def _stored(store: Store, session_id: str, seq: int, content: str) -> bool:
    return any(
        ev.seq == seq and ev.data.get("content") == content for ev in store.load(session_id)
    )


@contextlib.contextmanager
def _store_of(kind: str) -> Iterator[Store]:
    if kind == "memory":
        yield MemoryStore()
        return
    if kind != "sqlite":
        raise ValueError(f"store is 'memory' or 'sqlite', got {kind!r}")
    from nous_actor.store.sqlite import SQLiteStore

    folder = tempfile.mkdtemp(prefix="nous-sim-")
    store = SQLiteStore(str(Path(folder) / "sim.db"), durability="normal")
    try:
        yield store
    finally:
        store.close()
        shutil.rmtree(folder, ignore_errors=True)


def _retry(env: Env, fn: Callable[[], Any], tries: int = 10) -> Any:
    """``fn()``, tried again while it fails as a crash or a failed commit may make it
    (with a pause between tries, in which the registry restarts what crashed)."""
    for k in range(tries - 1):
        try:
            return fn()
        except TOLERATED:
            env.sleep(0.05 * (k + 1))
    return fn()


def _append_get(registry: Sessions, session_id: str, text: str) -> Any:
    # Through open(): a session the registry gave up on (too many crashes) is retried.
    return registry.open(session_id).append("user_message", {"content": text}).get()


def _timeout(env: Env) -> float:
    """The bound of every call: virtual seconds in a simulation, the env's own on threads."""
    return float(getattr(env, "call_timeout", 30.0))


def _close(registry: Sessions) -> None:
    with contextlib.suppress(Exception):
        registry.close()


# -- the scenarios ------------------------------------------------------------------------


def registry_scenario(
    sessions: int = 10,
    callers: int = 3,
    appends: int = 8,
    store: str = "memory",
    idle_timeout: float | None = None,
    async_callers: int = 0,
    pipeline: int = 1,
) -> Scenario:
    """Callers append to ``sessions`` sessions of one registry (under a `Supervisor`, so
    that it restarts when it crashes); acknowledged means stored. With ``idle_timeout``
    the registry passivates idle sessions, and each caller pauses (virtual seconds, in a
    simulation) after every other append, so that passivations race the calls. With
    ``async_callers``, that many coroutines do the same with ``await``. With
    ``pipeline`` > 1, each (thread) caller sends that many appends to a session before
    it waits for the first answer (they reach the session together: a run)."""

    def scenario(env: Env) -> None:
        with _store_of(store) as st:
            # Under a supervisor, so that a crash of the registry is restarted too.
            reg = Sessions(st, timeout=_timeout(env), start=False, idle_timeout=idle_timeout)
            sup = Supervisor.start([reg.child_spec()])
            acked: dict[str, dict[int, str]] = {}

            def caller(c: int) -> Caller:
                for i in range(appends):
                    sid = f"s{(c * 7 + i * 3) % sessions}"
                    content = f"c{c}-{i}"
                    try:
                        h = reg.open(sid)
                    except TOLERATED:
                        continue
                    texts = [content] + [f"{content}.{k}" for k in range(1, pipeline)]
                    sent = [(text, h.append("user_message", {"content": text})) for text in texts]
                    ev = None
                    for text, f in sent:
                        yield f
                        ok, got = settle(f)
                        if not ok:
                            continue
                        assert _stored(st, sid, got.seq, text), (
                            f"{sid}: seq {got.seq} was acknowledged before the store held it"
                        )
                        acked.setdefault(sid, {})[got.seq] = text
                        ev = got
                    if ev is None:
                        continue
                    r = h.count()
                    yield r
                    ok, n = settle(r)
                    assert not ok or n > ev.seq, (
                        f"{sid}: a read saw {n} events after seq {ev.seq} was acknowledged"
                    )
                    if idle_timeout is not None and i % 2:
                        yield idle_timeout * (0.5 + (c + i) % 3 / 2)

            async def acaller(c: int) -> None:
                for i in range(appends):
                    sid = f"s{(c * 5 + i * 3 + 1) % sessions}"
                    content = f"a{c}-{i}"
                    ok, h = await asettle(reg.aopen(sid))
                    if not ok:
                        continue
                    ok, ev = await asettle(h.append("user_message", {"content": content}))
                    if not ok:
                        continue
                    assert _stored(st, sid, ev.seq, content), (
                        f"{sid}: seq {ev.seq} was acknowledged before the store held it"
                    )
                    acked.setdefault(sid, {})[ev.seq] = content
                    ok, n = await asettle(h.count())
                    assert not ok or n > ev.seq, (
                        f"{sid}: a read saw {n} events after seq {ev.seq} was acknowledged"
                    )
                    if idle_timeout is not None and i % 2:
                        await asyncio.sleep(idle_timeout * (0.5 + (c + i) % 3 / 2))

            for c in range(callers):
                env.go(caller(c), f"caller{c}")
            for c in range(async_callers):
                env.go(acaller(c), f"async{c}")
            env.run()
            env.end_faults()  # the checks below see no more faults
            for sid, events in sorted(acked.items()):
                stored = {ev.seq: ev.data.get("content") for ev in st.load(sid)}
                lost = sorted(seq for seq, text in events.items() if stored.get(seq) != text)
                assert not lost, f"{sid}: acknowledged seqs {lost} are not in the store"
            sup.stop()

    return scenario


def subscription_scenario(appends: int = 5, store: str = "memory") -> Scenario:
    """A session stops with appends in flight: its subscriber gets every acknowledged one."""

    def scenario(env: Env) -> None:
        with _store_of(store) as st:
            reg = Sessions(st, timeout=_timeout(env))
            h = _retry(env, lambda: reg.open("feed"))
            sub = _retry(env, h.subscribe)
            acked: list[int] = []

            subscribed = h._ref  # the actor that feeds ``sub``
            # Its actor, held: what it applied is read at the end. (A stop of the
            # schedule queued before the writer's appends sends them on to the session's
            # next actor, whose events this subscription, ended by the stop, rightly
            # never gets.)
            feeding = _retry(env, lambda: h._call(lambda actor: actor).get())
            if feeding.actor_ref is not subscribed:  # a fault came between: count none
                feeding = None

            def writer() -> Caller:
                # The appends go to one actor at once; the stop races their commits.
                futs = [h.append("user_message", {"content": str(i)}) for i in range(appends)]
                if h._ref is not subscribed:  # a fault stopped it first: another actor's
                    return
                yield
                h.stop()
                for f in futs:
                    yield f
                    ok, ev = settle(f)
                    if ok:
                        acked.append(ev.seq)

            def reader() -> Caller:
                for _ in range(appends):
                    yield
                    sub.pending()

            env.go(writer(), "writer")
            env.go(reader(), "reader")
            env.run()
            env.end_faults()  # the checks below see no more faults
            got: list[int] = []
            with contextlib.suppress(SessionStopped):
                while (ev := sub.get_nowait()) is not None:
                    got.append(ev.seq)
            applied = 0 if feeding is None else feeding.next_seq  # seqs it applied: below
            missing = sorted(seq for seq in set(acked) - set(got) if seq < applied)
            assert not missing, f"the subscription ended without acknowledged seqs {missing}"
            _close(reg)

    return scenario


def stop_race_scenario(calls: int = 6, store: str = "memory") -> Scenario:
    """Calls race a stop of their session: every one of them is answered."""

    def scenario(env: Env) -> None:
        with _store_of(store) as st:
            reg = Sessions(st, timeout=_timeout(env))
            h = _retry(env, lambda: reg.open("race"))

            def caller() -> Caller:
                futs: list[Any] = []
                for i in range(calls):
                    futs.append(h.append("user_message", {"content": str(i)}))
                    futs.append(h.count())
                    yield
                for f in futs:
                    yield f
                    settle(f)

            def stopper() -> Caller:
                yield
                yield
                h.stop()

            env.go(caller(), "caller")
            env.go(stopper(), "stopper")
            env.run()
            env.end_faults()  # the checks below see no more faults
            _close(reg)

    return scenario


def compaction_scenario(messages: int = 10, store: str = "memory") -> Scenario:
    """A compaction whose summariser is slow is retried under the same id while appends
    go on: one record of it in the log. Both compactions are asked for by coroutines, and
    the summariser is a coroutine too (on their event loop)."""

    def scenario(env: Env) -> None:
        with _store_of(store) as st:
            reg = Sessions(st, timeout=_timeout(env))
            h = _retry(env, lambda: reg.open("compact"))
            for i in range(messages):
                _retry(env, partial(_append_get, reg, "compact", f"m{i} " * 20), tries=40)

            real = getattr(env, "real", False)

            async def summarise(ms: Any) -> str:
                await asyncio.sleep(0.0 if real else 1.0)  # a model call: virtual seconds
                return f"summary of {len(ms)}"

            comp = Compactor(budget=1, summarise=summarise, keep_recent=2)
            applied: list[bool] = []

            async def compact(delay: int) -> None:
                for _ in range(delay):
                    await asyncio.sleep(0)
                with contextlib.suppress(CompactionError):
                    ok, _ = await asettle(h.compact(comp, compaction_id="c1", force=True))
                    applied.append(ok)

            def writer() -> Caller:
                for i in range(3):
                    f = h.append("user_message", {"content": f"late {i}"})
                    yield f
                    settle(f)

            env.go(compact(0), "compact")
            env.go(compact(2), "retry")
            env.go(writer(), "writer")
            env.run()
            env.end_faults()  # the checks below see no more faults
            events = _retry(env, lambda: reg.open("compact").events().get())
            records = [
                ev.seq
                for ev in events
                if ev.data.get("step") == "compaction" and ev.data.get("compaction_id") == "c1"
            ]
            # Once, if a call said so; never twice (at most once if every call failed).
            assert len(records) <= 1, f"compaction c1 was applied {len(records)} times: {records}"
            assert records or not any(applied), "compaction c1 was answered but is not in the log"
            _close(reg)

    return scenario


def restart_scenario(appends: int = 4, store: str = "memory") -> Scenario:
    """A session crashes with appends in flight; a read after an acknowledgement sees it."""

    def scenario(env: Env) -> None:
        with _store_of(store) as st:
            reg = Sessions(st, timeout=_timeout(env))
            h = _retry(env, lambda: reg.open("restart"))

            def writer() -> Caller:
                futs = [h.append("user_message", {"content": str(i)}) for i in range(appends)]
                yield
                for f in futs:
                    yield f
                    ok, ev = settle(f)
                    if not ok:
                        continue
                    r = h.count()
                    yield r
                    ok, n = settle(r)
                    assert not ok or n > ev.seq, (
                        f"a read of the restarted session saw {n} events after seq "
                        f"{ev.seq} was acknowledged"
                    )

            def crasher() -> Caller:
                yield
                f = crash_session(h)
                yield f
                with contextlib.suppress(SessionStopped):
                    f.get()

            env.go(writer(), "writer")
            env.go(crasher(), "crasher")
            env.run()
            env.end_faults()  # the checks below see no more faults
            _close(reg)

    return scenario


def index_race_scenario(
    messages: int = 8, work: int = 25, delay: int = 20, fixed: bool = False
) -> Scenario:
    """A race planted in *user* code: an agent keeps an index into ``derive_messages()``
    across ``work`` reads of the session while an asyncio caller compacts it with a
    coroutine summariser (after ``delay`` loop turns of its own). When the compaction
    lands between the agent's two reads, the index points at another message (the
    summary shifted the list) and the agent's check fails. The race needs a long
    interleaving: the agent's first read before the compaction starts, and the
    compaction's every step before the agent's last read. ``fixed``: the agent finds
    its message again by its content (what a correct agent does)."""

    def scenario(env: Env) -> None:
        with _store_of("memory") as st:
            reg = Sessions(st, timeout=_timeout(env))
            h = _retry(env, lambda: reg.open("agent"))
            for i in range(messages):
                _retry(env, partial(_append_get, reg, "agent", f"m{i} " * 20))

            async def summarise(ms: Any) -> str:
                await asyncio.sleep(0)  # a model call (no virtual time: it races the agent)
                return f"summary of {len(ms)}"

            comp = Compactor(budget=1, summarise=summarise, keep_recent=3)

            async def summariser() -> None:
                for _ in range(delay):
                    await asyncio.sleep(0)
                with contextlib.suppress(CompactionError):
                    await asettle(h.compact(comp, force=True))

            def agent() -> Caller:
                ms = yield h.derive_messages()
                if ms is None:
                    return
                index = len(ms) - 2
                kept = ms[index].content
                for _ in range(work):  # the agent's own work (it never waits meanwhile)
                    yield
                now = yield h.derive_messages()
                if now is None:
                    return
                if fixed:
                    assert any(m.content == kept for m in now), "the agent's message is lost"
                else:
                    assert now[index].content == kept, (
                        f"message {index} changed under the agent (a compaction landed "
                        "while it kept indexes into derive_messages())"
                    )

            env.go(agent(), "agent")
            env.go(summariser(), "summariser")
            env.run()
            env.end_faults()  # the checks below see no more faults
            _close(reg)

    return scenario


# -- planted defects ------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutation:
    """A defect planted in one function by replacing ``old`` with ``new`` in its source."""

    name: str
    owner: str  # "module:Class"
    function: str
    old: str
    new: str
    scenario: Callable[[], Scenario]


@contextlib.contextmanager
def mutate(m: Mutation) -> Iterator[None]:
    """Run with ``m`` planted (the function replaced by its mutant), then restore it.

    Raises:
        LookupError: ``m.old`` is not in the function's source exactly once (the code
            changed: update the mutation).
    """
    module_name, _, cls_name = m.owner.partition(":")
    owner: Any = importlib.import_module(module_name)
    if cls_name:
        owner = getattr(owner, cls_name)
    original = owner.__dict__[m.function]
    source = textwrap.dedent(inspect.getsource(original))
    if source.count(m.old) != 1:
        raise LookupError(f"mutation {m.name!r}: {m.old!r} is not in {m.function} exactly once")
    code = compile(
        source.replace(m.old, m.new),
        f"<mutant {m.name}>",
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    namespace: dict[str, Any] = {}
    exec(code, original.__globals__, namespace)  # our own source, mutated
    setattr(owner, m.function, namespace[m.function])
    try:
        yield
    finally:
        setattr(owner, m.function, original)


# Where the mutated methods are defined: `SessionActor`, and two of its collaborators.
_ACTOR = "nous_actor.sessions.actor._session_actor:SessionActor"
_LEDGER = "nous_actor.sessions.actor._ledger:CommitLedger"
_COMPACTIONS = "nous_actor.sessions.actor._compactions:Compactions"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "subscription ended before acknowledged events reach it",
        _LEDGER,
        "_shut",
        "if not idle:",
        "if False:",
        subscription_scenario,
    ),
    Mutation(
        "ask left unanswered in a stop race",
        _ACTOR,
        "_answer_stopped",
        "msg[2]._fail(err)",
        "pass",
        stop_race_scenario,
    ),
    Mutation(
        "compaction applied twice after a retry",
        _COMPACTIONS,
        "applied",
        "_index(ids, ev)",
        "pass",
        compaction_scenario,
    ),
    Mutation(
        "append acknowledged before its commit",
        _ACTOR,
        "_submit",
        "return _DEFER",
        "return result",
        registry_scenario,
    ),
    Mutation(
        "append of a run acknowledged before its commit",
        _ACTOR,
        "_append_run",
        "ledger.begin()",
        "ledger.begin(); [f._resolve(e) for f, e in zip(futs[lo:hi], events[lo:hi]) if f]",
        lambda: registry_scenario(sessions=2, callers=2, appends=3, pipeline=3),
    ),
    Mutation(
        "restart loses the last committed batch",
        _LEDGER,
        "_shut",
        "idle = self.ops == 0",
        "idle = True",
        restart_scenario,
    ),
)
"""The planted defects of the issue, each with the scenario that must catch it."""
