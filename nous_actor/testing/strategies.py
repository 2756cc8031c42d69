"""Hypothesis strategies for messages, events, log programs and logs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import strategies as st

from nous_actor.core.event import BOOKKEEPING_TYPES, SURFACE_TYPES, EventType
from nous_actor.core.log import Log
from nous_actor.core.message import Message, Role

__all__ = [
    "LogOp",
    "event_data",
    "json_values",
    "log_programs",
    "logs",
    "messages",
    "run_program",
    "times",
]

_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

_text = st.text(max_size=12)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
)


def json_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Any JSON value (finite floats, str keys), nested up to ``max_leaves`` leaves."""
    return st.recursive(
        _scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
        max_leaves=max_leaves,
    )


def times() -> st.SearchStrategy[datetime]:
    """Timezone-aware datetimes (UTC) with microseconds."""
    return st.integers(0, 10**12).map(lambda us: _EPOCH + timedelta(microseconds=us))


_content = (
    st.none()
    | _text
    | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _text}), max_size=2)
)
_metadata = st.dictionaries(_text, json_values(4), max_size=2)
_names = st.none() | _text
_tool_calls = st.lists(
    st.fixed_dictionaries({"id": _text, "name": _text, "arguments": st.just("{}") | _text}),
    max_size=2,
)


def messages(roles: Sequence[Role | str] = tuple(Role)) -> st.SearchStrategy[Message]:
    """Messages whose fields suit their role (what `Log.seed` keeps losslessly)."""

    def build(role: Role) -> st.SearchStrategy[Message]:
        common = {
            "content": _content,
            "name": _names,
            "metadata": _metadata,
            "created_at": times(),
        }
        if role is Role.ASSISTANT:
            common.update(tool_calls=_tool_calls, reasoning_content=st.none() | _text)
        elif role is Role.TOOL:
            common.update(tool_call_id=st.none() | _text)
        return st.builds(Message, st.just(role), **common)

    return st.sampled_from([Role(r) for r in roles]).flatmap(build)


def event_data(etype: EventType | str) -> st.SearchStrategy[dict[str, Any]]:
    """A plausible ``data`` dict for an event of ``etype`` (no ``surface_op``)."""
    etype = EventType(etype)
    if etype in BOOKKEEPING_TYPES:
        return st.dictionaries(
            _text.filter(lambda k: k != "surface_op"), json_values(4), max_size=2
        )
    fields: dict[str, st.SearchStrategy[Any]] = {"content": _content}
    optional: dict[str, st.SearchStrategy[Any]] = {"name": _names, "metadata": _metadata}
    if etype is EventType.ASSISTANT_MESSAGE:
        optional.update(tool_calls=_tool_calls, reasoning_content=st.none() | _text)
    if etype is EventType.TOOL_RESULT:
        optional["tool_call_id"] = st.none() | _text
    return st.fixed_dictionaries(fields, optional=optional)


@dataclass(frozen=True)
class LogOp:
    """One step of a log program.

    ``kind`` is ``append`` (``etype``, ``data``), ``replace`` (a surface event
    with ``surface_op = ("replace", start, stop)``), ``append_at`` (an append
    ``gap`` seqs past the head), ``materialize`` or ``snapshot``.
    """

    kind: str
    etype: EventType = EventType.USER_MESSAGE
    data: Any = None
    start: int = 0
    stop: int = 0
    gap: int = 0
    time: datetime = _EPOCH

    def apply(self, log: Log) -> Log:
        """Run this step on ``log``; return the new log."""
        if self.kind == "materialize":
            return log.materialize()[1]
        if self.kind == "snapshot":
            return log.snapshot()
        data = self.data
        if self.kind == "replace":
            data = {**data, "surface_op": ("replace", self.start, self.stop)}
        if self.kind == "append_at":
            return log.append_at(log.count() + self.gap, self.etype, data, self.time)
        return log.append(self.etype, data, self.time)


_surface_types = st.sampled_from(sorted(SURFACE_TYPES))
_all_types = st.sampled_from(list(EventType))


@st.composite
def _op(draw: st.DrawFn, max_pos: int) -> LogOp:
    kind = draw(
        st.sampled_from(
            ["append"] * 6 + ["replace"] * 3 + ["append_at", "materialize", "snapshot"]
        )
    )
    if kind in ("materialize", "snapshot"):
        return LogOp(kind)
    etype = draw(_surface_types if kind == "replace" else _all_types)
    data = draw(event_data(etype))
    t = draw(times())
    if kind == "replace":
        start = draw(st.integers(0, max_pos))
        stop = start + draw(st.integers(0, max_pos) | st.just(10**6))
        return LogOp(kind, etype, data, start=start, stop=stop, time=t)
    gap = draw(st.integers(0, 3)) if kind == "append_at" else 0
    return LogOp(kind, etype, data, gap=gap, time=t)


def log_programs(max_ops: int = 40, max_pos: int = 50) -> st.SearchStrategy[list[LogOp]]:
    """Programs of appends, replaces (ranges may start past the head and run far
    beyond it), ``append_at`` with gaps, ``materialize`` and ``snapshot``."""
    return st.lists(_op(max_pos), max_size=max_ops)


def run_program(program: Sequence[LogOp], log: Log | None = None) -> Log:
    """Apply every step of ``program`` to ``log`` (an empty log by default)."""
    log = Log() if log is None else log
    for op in program:
        log = op.apply(log)
    return log


def logs(max_ops: int = 40, max_pos: int = 50) -> st.SearchStrategy[Log]:
    """Whole logs built by `log_programs`."""
    return log_programs(max_ops, max_pos).map(run_program)
