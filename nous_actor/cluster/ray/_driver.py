"""The driver: `RaySessions` starts (or reaches) the shard actors and opens handles
to the sessions they host."""

from __future__ import annotations

import asyncio
import itertools
import pickle
import time
from collections.abc import Callable, Mapping
from typing import Any

import ray
import ray.exceptions

from nous_actor._version import __version__
from nous_actor.cluster.ray._connect import _connect, _where
from nous_actor.cluster.ray._link import _Link
from nous_actor.cluster.ray._placement import _kill, _shard_options
from nous_actor.cluster.ray._protocol import (
    DEFAULT_IN_FLIGHT,
    MAX_SHARDS,
    OPEN,
    PROTOCOL,
    RESTARTS,
    _disconnected,
    _gone,
    shard_of,
)
from nous_actor.cluster.ray._session import RaySession
from nous_actor.cluster.ray._shard import _Shard
from nous_actor.core._frozen import short_repr
from nous_actor.core.ids import check_session_id
from nous_actor.errors import CallTimeout, ClusterError, SessionStopped
from nous_actor.sessions.future import DEFAULT_TIMEOUT
from nous_actor.sessions.handle import _check_handle_args
from nous_actor.sessions.registry import check_capacity
from nous_actor.sessions.turns import DEFAULT_DANGLING_TURNS, DanglingTurns, check_dangling_turns
from nous_actor.store.base import Store


class RaySessions:
    """Sessions hosted in shard actors on a Ray cluster, journaled in a shared store.

    Args:
        store_factory: makes the store of one shard, called in that shard's
            worker process (again after each restart); it must be picklable,
            e.g. ``functools.partial(PostgresStore, dsn)``. Every shard must
            reach the same journal: a `nous_actor.PostgresStore` for more than
            one machine.
        shards: how many shard actors host the sessions, at most `MAX_SHARDS`.
        name: name the shard actors ``"{name}.{i}"`` (in ``namespace``), so
            that another driver with the same name reaches the same shards: a
            shard of that name that runs already is reached, not started again
            (and `close` leaves it running). Running shards write to the store
            they were started with, so they are reached only if ``store_factory``
            makes that store (checked in a shard, which makes one and closes it).
        namespace: the Ray namespace of named shards (default: the driver's).
        detached: keep the shards running when this driver exits (needs
            ``name``); `close` then leaves them serving and `shutdown` stops them.
        address: where the cluster is, when this process is not connected to Ray
            yet (passed to ``ray.init``; ``None``: Ray's default).
        timeout: the handles' default bound on every wait.
        start_timeout: how long the shards may take to start: to be created (or
            reached by name), then to answer.
        max_sessions, idle_timeout, dangling_turns: for each shard's
            `nous_actor.Sessions` (``dangling_turns``: what a session does, when
            it starts, with the half run of a turn whose holder is gone).
        max_in_flight: batches this process may have in flight to one shard (a
            session's calls are applied in order whatever it is). One makes the
            largest batches, the cheapest when CPUs are busy; more hide network
            latency between nodes.
        actor_options: more Ray options for the shard actors (resources,
            ``scheduling_strategy``; default ``num_cpus=0``, 1 MiB of ``memory``,
            spread over nodes); not ``name``, ``namespace``, ``lifetime`` or
            ``get_if_exists``, which the arguments above set.

    Use it as a context manager (``with``, or ``async with``): leaving the
    block calls `close` (``aclose``).

    Every argument is checked before anything starts (or connects to Ray).

    Attributes:
        store_factory: the ``store_factory`` given, for code of this process that
            reads the shared journal itself (the LangGraph saver lists its
            threads from a store made with it).

    Raises:
        ClusterError: Ray cannot be reached (within ``start_timeout``, at most 5 s,
            whatever listens at ``address``), the address cannot be read, or the
            cluster this process is connected to no longer answers; the shards did
            not start in time, or shards of that ``name`` run with another number
            of shards or on another store than ``store_factory`` makes. The shards
            this call created are stopped.
        StoreError: a shard could not open its store (the shards this call created
            are stopped).
        TypeError: ``store_factory``, ``name``, ``namespace``, ``detached``,
            ``address`` or ``actor_options`` of the wrong type (nothing is
            started); ``store_factory`` cannot be pickled, or makes no store.
        ValueError: a count or a number of seconds that is not one (``shards="4"``)
            or out of range, an empty ``name``, a ``dangling_turns`` that is not one
            of its three names, an ``actor_options`` key that an argument sets or
            that Ray refuses (nothing is started).
    """

    def __init__(
        self,
        store_factory: Callable[[], Store],
        *,
        shards: int = 4,
        name: str | None = None,
        namespace: str | None = None,
        detached: bool = False,
        address: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        start_timeout: float = 60.0,
        max_sessions: int = 10_000,
        idle_timeout: float | None = None,
        max_in_flight: int = DEFAULT_IN_FLIGHT,
        actor_options: Mapping[str, Any] | None = None,
        dangling_turns: DanglingTurns = DEFAULT_DANGLING_TURNS,
    ) -> None:
        if not callable(store_factory):
            raise TypeError(
                "store_factory must be a callable that makes a store in each shard, "
                f"e.g. functools.partial(PostgresStore, dsn); got {type(store_factory).__name__}"
            )
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards must be an int >= 1, got {short_repr(shards)}")
        if shards > MAX_SHARDS:
            raise ValueError(
                f"shards must be an int >= 1, at most {MAX_SHARDS} (MAX_SHARDS), got "
                f"{short_repr(shards)}"
            )
        for arg, value in (("name", name), ("namespace", namespace)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{arg} must be a str or None, got {type(value).__name__}")
            if value is not None and not value.strip():
                raise ValueError(f"{arg} must be a non-empty str or None, got {value!r}")
        if not isinstance(detached, bool):
            raise TypeError(f"detached must be True or False, got {detached!r}")
        if detached and name is None:
            raise ValueError("detached shards need a name= (to be found again by later drivers)")
        if address is not None and not isinstance(address, str):
            raise TypeError(
                "address must be a str ('host:port', 'ray://host:port' or 'auto') or None, "
                f"got {type(address).__name__}"
            )
        _where(address)
        _check_handle_args("shards", timeout)
        if (
            isinstance(start_timeout, bool)
            or not isinstance(start_timeout, (int, float))
            or not 0 < start_timeout < float("inf")
        ):
            raise ValueError(
                f"start_timeout must be a finite number of seconds > 0, got {start_timeout!r}"
            )
        check_capacity(max_sessions, idle_timeout)
        if (
            isinstance(max_in_flight, bool)
            or not isinstance(max_in_flight, int)
            or not 1 <= max_in_flight <= 64
        ):
            raise ValueError(f"max_in_flight must be an int in [1, 64], got {max_in_flight!r}")
        check_dangling_turns(dangling_turns)
        remote = ray.remote(_Shard)
        base = _shard_options(remote, actor_options)
        self.store_factory = store_factory
        self.shards = shards
        self.name = name
        self.namespace = namespace
        self.detached = detached
        self.timeout = float(timeout)
        self._closed = False
        options = {
            "max_sessions": max_sessions,
            "idle_timeout": idle_timeout,
            "timeout": timeout,
            "dangling_turns": dangling_turns,
        }
        _connect(address, min(start_timeout, 5.0))
        self._actors, self._created = self._start_shards(
            remote, base, store_factory, options, start_timeout
        )
        self._links = [_Link(a, i, max_in_flight) for i, a in enumerate(self._actors)]

    def _get_or_create(
        self, remote: Any, opts: dict[str, Any], args: tuple[Any, ...]
    ) -> tuple[Any, bool]:
        """The shard actor for ``opts``, and whether this call created it: a named shard
        that runs already is reached, not created (what Ray's ``get_if_exists`` does, but
        knowing which of the two happened)."""
        name = opts.get("name")
        if name is None:
            return remote.options(**opts).remote(*args), True
        try:
            return ray.get_actor(name, namespace=self.namespace), False
        except ValueError:  # no live actor of that name: create it
            pass
        try:
            return remote.options(**opts).remote(*args), True
        except ray.exceptions.ActorAlreadyExistsError:  # another driver was faster
            return ray.get_actor(name, namespace=self.namespace), False

    def _start_shards(
        self,
        remote: Any,
        base: dict[str, Any],
        store_factory: Callable[[], Store],
        options: dict[str, Any],
        start_timeout: float,
    ) -> tuple[list[Any], list[bool]]:
        """Create the shards, or reach those of ``name`` that run already, and wait until
        each answers, all within ``start_timeout``: each shard, and whether this object
        created it. If start-up fails, the shards created here are killed, and only those.

        The deadline bounds the creation too, not only the wait for the answers: creating
        an actor costs Ray a round trip to its control store, so many shards on a slow or
        loaded cluster would otherwise take unbounded time before the wait even began."""
        deadline = time.monotonic() + start_timeout
        actors: list[Any] = []
        created: list[bool] = []

        def late(started: int) -> ClusterError:
            return ClusterError(
                f"only {started} of {self.shards} shards were created within "
                f"{start_timeout:g} s: check `ray status` for the cluster's health and load, "
                "or give a larger start_timeout"
            )

        def fail(error: Exception) -> Exception:
            _kill([a for a, new in zip(actors, created, strict=True) if new])
            return error

        try:
            for i in range(self.shards):
                if time.monotonic() >= deadline:
                    raise fail(late(i))
                opts = dict(base)
                if self.name is not None:
                    opts["name"] = f"{self.name}.{i}"
                    if self.namespace is not None:
                        opts["namespace"] = self.namespace
                if self.detached:
                    opts["lifetime"] = "detached"
                actor, new = self._get_or_create(
                    remote, opts, (store_factory, i, self.shards, options)
                )
                actors.append(actor)
                created.append(new)
        except ClusterError:
            raise
        except Exception as exc:
            if isinstance(exc, (TypeError, pickle.PicklingError)):
                raise fail(
                    TypeError(f"store_factory must be picklable (it runs in each shard): {exc}")
                ) from None
            raise fail(ClusterError(f"could not start the shards on Ray: {exc}")) from None
        refs = [a.ready.remote() for a in actors]
        left = max(deadline - time.monotonic(), 0.0)
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=left)
        if pending:
            raise fail(
                ClusterError(
                    f"{len(pending)} of {self.shards} shards did not start within "
                    f"{start_timeout:g} s: check `ray status` for free resources, and that "
                    "nous_actor (with the extras its store needs) is installed wherever "
                    "Ray runs workers"
                )
            )
        infos: list[dict[str, Any]] = []
        for i, ref in enumerate(refs):
            try:
                infos.append(ray.get(ref))
            except Exception as exc:
                raise fail(ClusterError(f"shard {i} failed to start: {short_repr(exc)}")) from None
        for info in infos:
            if info.get("protocol") != PROTOCOL:
                raise fail(
                    ClusterError(
                        f"the shards named {self.name!r} run nous_actor "
                        f"{info.get('version', 'of another protocol')}, this driver "
                        f"{__version__}: run one version of nous_actor on every node"
                    )
                )
            if info["shards"] != self.shards:
                raise fail(
                    ClusterError(
                        f"the shards named {self.name!r} run as {info['shards']} shards, not "
                        f"{self.shards}: open them with shards={info['shards']}, or use "
                        "another name"
                    )
                )
        for info in infos:
            if info["error"] is not None:
                raise fail(info["error"])
        reached = [a for a, new in zip(actors, created, strict=True) if not new]
        if reached:
            self._check_store(reached[0], store_factory, deadline, start_timeout, fail)
        return actors, created

    def _check_store(
        self,
        actor: Any,
        store_factory: Callable[[], Store],
        deadline: float,
        start_timeout: float,
        fail: Callable[[Exception], Exception],
    ) -> None:
        """Check that ``store_factory`` makes the store that the running shard ``actor``
        (reached by name) writes to, by the deadline of the start-up: its sessions would
        go to the shard's store whatever this driver's factory says.

        Raises (through ``fail``, which stops the shards this object created):
            ClusterError: it makes another store (both named), or the check failed.
        """
        try:
            ref = actor.same_store.remote(store_factory)
        except (TypeError, pickle.PicklingError) as exc:
            raise fail(
                TypeError(f"store_factory must be picklable (it runs in each shard): {exc}")
            ) from None
        try:
            theirs, mine = ray.get(ref, timeout=max(deadline - time.monotonic(), 0.001))
        except ray.exceptions.GetTimeoutError:
            raise fail(
                ClusterError(
                    f"the shards named {self.name!r} did not check the store of this "
                    f"store_factory within {start_timeout:g} s: give a larger start_timeout"
                )
            ) from None
        except Exception as exc:
            cause = getattr(exc, "cause", None) or exc
            raise fail(
                ClusterError(
                    f"the shards named {self.name!r} could not make a store with this "
                    f"store_factory, to check that it is theirs: {short_repr(cause)}"
                )
            ) from None
        if theirs != mine:
            raise fail(
                ClusterError(
                    f"the shards named {self.name!r} run on the store {theirs}, and this "
                    f"store_factory makes another store ({mine}): the sessions of this "
                    f"RaySessions would be written to {theirs}. Pass the store_factory they "
                    "were started with, or use another name"
                )
            )

    # -- the user's side -------------------------------------------------------------------

    def shard_of(self, session_id: str) -> int:
        """The shard that hosts ``session_id`` (see `nous_actor.cluster.ray.shard_of`)."""
        return shard_of(check_session_id(session_id), self.shards)

    def _check_open(self, session_id: str) -> _Link:
        session_id = check_session_id(session_id)
        if self._closed:
            raise SessionStopped(session_id, "the registry is closed")
        return self._links[shard_of(session_id, self.shards)]

    def _handle(self, session_id: str, link: _Link) -> RaySession:
        return RaySession(session_id, link, timeout=self.timeout)

    def open(self, session_id: str) -> RaySession:
        """Start or find ``session_id`` in its shard (recovering it from the store) and
        return a handle that survives restarts of the session and of the shard.

        Raises:
            ValueError, TypeError: ``session_id`` is not a valid id.
            ConflictError: another live writer holds the session in the store.
            StoreError: the store failed while recovering the session.
            TooManySessions: the shard is at its ``max_sessions``.
            SessionStopped: this registry is closed, or the shard was lost meanwhile.
        """
        link = self._check_open(session_id)
        h = self._handle(session_id, link)
        h._send(OPEN).get()
        return h

    async def aopen(self, session_id: str) -> RaySession:
        """`open` for asyncio code: awaited without blocking the loop. Raises as `open`."""
        link = self._check_open(session_id)
        h = self._handle(session_id, link)
        await h._send(OPEN)
        return h

    def restart_count(self, session_id: str) -> int:
        """How many times ``session_id`` was restarted after a crash in its current shard
        process (a restarted shard counts from 0)."""
        link = self._check_open(session_id)
        return int(self._handle(session_id, link)._send(RESTARTS).get())

    def live(self) -> list[str]:
        """Ids of the sessions running now in every shard, sorted."""
        if self._closed:
            return []
        found = self._ask_all("live")
        return sorted(itertools.chain.from_iterable(found))

    def shard_info(self) -> list[dict[str, Any]]:
        """Each shard's ``index``, worker ``pid``, ``node_id``, ``started`` time and
        ``store`` (how messages name its store) (an answer from each shard, so also a
        health check)."""
        infos = self._ask_all("ready")
        return [{k: v for k, v in info.items() if k != "error"} for info in infos]

    def _ask_all(self, method: str) -> list[Any]:
        """One answer from every shard, within the handles' bound."""
        why = _disconnected()
        if why is not None:
            raise SessionStopped("*", why)
        try:
            return list(
                ray.get([getattr(a, method).remote() for a in self._actors], timeout=self.timeout)
            )
        except ray.exceptions.GetTimeoutError:
            raise CallTimeout("*", f"not every shard answered within {self.timeout:g} s") from None
        except ray.exceptions.RayActorError as exc:
            why = _gone(exc)
            if why is not None:
                raise SessionStopped(
                    "*",
                    f"a shard is dead and Ray will not restart it ({why}): make a new "
                    "RaySessions to start it again",
                ) from None
            raise SessionStopped(
                "*", f"a shard is being restarted by Ray ({type(exc).__name__}); try again"
            ) from None

    def shard_actor(self, index: int) -> Any:
        """The Ray actor handle of shard ``index`` (e.g. to ``ray.kill`` it in a fault drill)."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.shards:
            raise ValueError(f"index must be an int in [0, {self.shards}), got {index!r}")
        return self._actors[index]

    def stats(self) -> dict[str, int]:
        """``calls``: Ray calls made to the shards for session calls; ``sent``: the
        session calls they carried (so ``sent / calls`` is the mean batch)."""
        return {
            "calls": sum(link.calls for link in self._links),
            "sent": sum(link.sent for link in self._links),
        }

    def close(self, timeout: float = 10.0) -> None:
        """Stop using the shards: the handles' calls fail with `nous_actor.SessionStopped`.

        Shards this object created, without ``detached``, are stopped too (every
        session first, each within ``timeout``), and only those: shards of ``name``
        that ran already when it was made (another driver's, or another
        `RaySessions` object's) keep serving, as do detached shards; `shutdown`
        stops them.
        """
        if self._closed:
            return
        self._closed = True
        self._unlink("the registry is closed")
        if not self.detached:
            self._stop_shards(
                timeout, [a for a, new in zip(self._actors, self._created, strict=True) if new]
            )

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop every session and every shard actor, detached or not, created by this object
        or reached by name: for every driver (their calls then fail with
        `nous_actor.SessionCrashed`, saying that Ray will not restart the shard).

        Raises:
            ClusterError: this process is no longer connected to Ray (``ray.shutdown()``)
                and some shards outlive it (detached, or another driver's).
        """
        self._closed = True
        self._unlink("the registry was shut down")
        why = _disconnected()
        if why is not None and (self.detached or not all(self._created)):
            raise ClusterError(f"cannot stop the shards that outlive this process: {why}")
        self._stop_shards(timeout, self._actors)

    async def aclose(self, timeout: float = 10.0) -> None:
        """`close` for asyncio code: awaited without blocking the loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.close, timeout)

    def _unlink(self, why: str) -> None:
        """Fail this registry's later calls with `SessionStopped` (``why``) and end its
        subscriptions."""
        for link in self._links:
            link.close(why)

    def _stop_shards(self, timeout: float, actors: list[Any]) -> None:
        if not actors:
            return
        if _disconnected() is not None:
            return  # those this process created without ``detached`` ended with it
        refs = [a.close.remote(timeout) for a in actors]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=timeout + self.timeout)
        finally:
            _kill(actors)

    def __enter__(self) -> RaySessions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> RaySessions:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        named = "" if self.name is None else f" name={self.name!r}"
        return f"<RaySessions shards={self.shards}{named}>"
