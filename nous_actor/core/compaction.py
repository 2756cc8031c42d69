"""Compaction that keeps the originals: prune and summarise by appending replaces.

A `Compactor` never deletes. When the surface's estimated size is over
budget it appends, in order:

1. for each oversized tool result outside the recent tail, a ``tool_result``
   that replaces it in place (``Replace(p, p)``), keeping ``tool_call_id``
   and ``name``;
2. if still over budget, one ``system_message`` holding a summary (from your
   summariser) that replaces everything but the last ``keep_recent``
   messages, after the leading system messages (an earlier summary is not
   one of those: it is summarised again with what followed it), without
   ever separating an assistant message with tool calls from its tool results
   (inside an open turn, only what that turn wrote: see `Compactor.plan`);
3. a ``step_end`` bookkeeping event recording what it did (kind
   ``"compaction"``, the ranges, the estimates before and after),

and optionally a `nous_actor.Log.snapshot`. The replaced events stay in
the log (until a snapshot), so audit, fork and rewind still see them.

>>> from nous_actor import Log
>>> log = Log()
>>> for role, text in [("system", "be brief"), ("user", "Q1"), ("assistant", "A1"),
...                    ("user", "Q2"), ("assistant", "A2"), ("user", "Q3"),
...                    ("assistant", "A3")]:
...     log = log.append(f"{role}_message", {"content": text})
>>> c = Compactor(budget=1, keep_recent=2,
...               summarise=lambda ms: "summary of " + ",".join(m.content for m in ms))
>>> result = c.compact(log)
>>> [m.content for m in result.log.derive_messages()]
['be brief', 'summary of Q1,A1,Q2,A2', 'Q3', 'A3']
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from bisect import bisect_right
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from operator import attrgetter
from typing import Any

from nous_actor._log import get_logger
from nous_actor.core._frozen import short_repr
from nous_actor.core.event import Event, EventType
from nous_actor.core.log import Log
from nous_actor.core.message import Message, Role, tool_call_parts
from nous_actor.errors import NousActorError

__all__ = [
    "CompactionError",
    "CompactionResult",
    "Compactor",
    "Plan",
    "estimate_tokens",
    "new_compaction_id",
]

logger = get_logger(__name__)

_position = attrgetter("position")


class CompactionError(NousActorError):
    """The compaction could not be done; the log is unchanged."""


def _text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def estimate_tokens(messages: Sequence[Message]) -> int:
    """A rough token estimate: characters / 4 of contents, tool calls and reasoning, plus 4
    per message for the framing."""
    chars = 0
    for m in messages:
        chars += len(_text_of(m.content)) + len(m.reasoning_content or "")
        for call in m.tool_calls:
            _, name, arguments = tool_call_parts(call)
            chars += len(str(name or "")) + len(str(arguments or ""))
    return chars // 4 + 4 * len(messages)


def _check_count(value: object, what: str, wanted: str) -> None:
    """Refuse a setting that is not an int >= 0 (`wanted` says what to pass).

    Raises:
        TypeError: not an int (a bool is refused too).
        ValueError: negative.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be {wanted}, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{what} must be {wanted}, got {value!r}")


def _default_pruned(message: Message, tokens: int) -> str:
    return f"[tool result pruned by compaction: about {tokens} tokens]"


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction did. ``log`` is the new log (the same object if nothing was done).

    ``within_budget`` says whether the surface ended at or under the budget: a
    compaction that could not get there (a huge recent tail, nothing left to
    summarise) still does what it can, says so here and logs a warning.
    """

    log: Log
    estimate_before: int
    estimate_after: int
    pruned: tuple[int, ...] = ()
    summarised: tuple[int, int] | None = None
    summary_seq: int | None = None
    record_seq: int | None = None
    compaction_id: str | None = None
    budget: int | None = None

    @property
    def changed(self) -> bool:
        """Whether anything was appended."""
        return self.record_seq is not None

    @property
    def within_budget(self) -> bool:
        """Whether the surface's estimate is at or under the budget afterwards."""
        return self.budget is None or self.estimate_after <= self.budget


Summariser = Callable[[Sequence[Message]], "str | Awaitable[str]"]
"""Turns the messages to summarise into the summary text: a plain callable, or a
coroutine function (``async def summarise(messages) -> str``)."""


@dataclass(frozen=True)
class Plan:
    """A compaction worked out from one consistent surface, before any summary exists.

    Made by `Compactor.plan` (cheap: no summariser call); turned into
    events by `Compactor.events` once the summary text is known (or at
    once if ``summary_input`` is empty). Positions do not move as a log grows,
    so a plan stays valid whatever is appended after ``count`` — unless a replace
    appended meanwhile overlaps `ranges` (see `overlaps`).
    """

    count: int
    """``count()`` of the log the plan was made from."""
    before: int
    prunes: tuple[tuple[int, int, dict[str, Any], Message], ...]
    """``(seq, position, data, pruned message)`` for each tool result to prune."""
    summary_input: tuple[Message, ...]
    """The messages the summariser must turn into text (empty: no summary)."""
    summary_range: tuple[int, int] | None
    summary_seqs: tuple[int | None, ...]
    """The seqs of the summarised surface entries (``None`` for a pruned entry,
    whose replacement's seq is known only when the plan is appended)."""
    head: tuple[Message, ...]
    tail: tuple[Message, ...]
    """The messages kept before and after the summarised range (pruned ones as pruned)."""

    @property
    def needs_summary(self) -> bool:
        """Whether a summary must be written before the plan can be appended."""
        return bool(self.summary_input)

    @property
    def empty(self) -> bool:
        """Nothing to do: under budget, or nothing that can be pruned or summarised."""
        return not self.prunes and not self.summary_input

    @property
    def ranges(self) -> list[tuple[int, int]]:
        """Every position range the plan replaces."""
        out = [(p, p) for _, p, _, _ in self.prunes]
        if self.summary_range is not None:
            out.append(self.summary_range)
        return out

    def overlaps(self, appended: Sequence[Event]) -> Event | None:
        """The first of ``appended`` (events added after the plan was made) that would
        make the plan wrong: a replace overlapping one of its ranges, or any event
        standing inside them. ``None`` if the plan can still be applied as it is."""
        ranges = self.ranges
        for ev in appended:
            op = ev.surface_op
            lo, hi = (op.start, op.stop) if op is not None else (ev.position, ev.position)
            for s, e in ranges:
                if lo <= e and s <= hi:
                    return ev
        return None


@dataclass(frozen=True)
class Compactor:
    """Keeps a log's surface under a token budget by appending replaces.

    Args:
        budget: compact when the estimate of the surface exceeds this.
        summarise: turns the messages to summarise into the summary text: a
            plain callable or a coroutine function (the library makes no
            network calls). On a session it runs off the session's actor.
        keep_recent: how many of the newest surface messages are never
            pruned or summarised (more, if the boundary would split a tool call
            from its results, other messages between them or not, or two messages
            standing at one position).
        prune_over: a tool result estimated above this many tokens is pruned
            first (``None``: never prune).
        estimate: the token estimator (default `estimate_tokens`).
        pruned_text: the content of a pruned tool result.
        snapshot: drop the shadowed events afterwards.

    Raises:
        TypeError: a setting has the wrong type (see `__post_init__`).
        ValueError: ``budget``, ``keep_recent`` or ``prune_over`` is negative.
    """

    budget: int
    summarise: Summariser | None = None
    keep_recent: int = 6
    prune_over: int | None = 1000
    estimate: Callable[[Sequence[Message]], int] = estimate_tokens
    pruned_text: Callable[[Message, int], str] = _default_pruned
    snapshot: bool = False

    def __post_init__(self) -> None:
        """Check every setting when the compactor is made.

        Raises:
            TypeError: ``budget`` or ``keep_recent`` is not an int, ``prune_over``
                not ``None`` or an int (a bool is refused for each); ``summarise``
                is not ``None`` or a callable; ``estimate`` or ``pruned_text`` is
                not callable; ``snapshot`` is not a bool.
            ValueError: ``budget``, ``keep_recent`` or ``prune_over`` is negative.
        """
        _check_count(self.budget, "budget", "an int >= 0 (tokens)")
        _check_count(self.keep_recent, "keep_recent", "an int >= 0 (messages)")
        if self.prune_over is not None:
            _check_count(self.prune_over, "prune_over", "None or an int >= 0 (tokens)")
        if self.summarise is not None and not callable(self.summarise):
            raise TypeError(
                "summarise must be None, a callable or a coroutine function taking the "
                f"messages and returning the summary text, got {short_repr(self.summarise)}"
            )
        if not callable(self.estimate):
            raise TypeError(
                "estimate must be a callable taking messages and returning their size in "
                f"tokens (e.g. estimate_tokens), got {short_repr(self.estimate)}"
            )
        if not callable(self.pruned_text):
            raise TypeError(
                "pruned_text must be a callable taking the pruned message and its size in "
                "tokens and returning the text put in its place, got "
                f"{short_repr(self.pruned_text)}"
            )
        if not isinstance(self.snapshot, bool):
            raise TypeError(f"snapshot must be True or False, got {type(self.snapshot).__name__}")

    # -- the three steps -------------------------------------------------------------

    def plan(
        self,
        surface: Sequence[Event],
        count: int,
        *,
        force: bool = False,
        turn_start: int | None = None,
    ) -> Plan:
        """Work out what to prune and what to summarise from ``surface`` (a log's
        ``surface()`` at ``count``); see `Plan.empty` for nothing to do.

        ``turn_start``: the seq of the ``turn_start`` of a turn still open (a
        session passes its open turn's). Then the plan replaces only what that
        turn wrote (positions after it): the ``turn_start`` is never shadowed, so
        a snapshot keeps it and a restart still finds the turn open and ends it;
        and a rollback of the turn, whose one replace covers the turn's range,
        hides the summary with the rest of the turn, leaving what came before the
        turn as it was. A tool call the turn made and has not answered yet is
        never summarised (its result, still to come, would answer nothing).

        Cheap (no summariser call, O(surface)): a session does this on its actor.

        Raises:
            CompactionError: a summary is needed and no summariser was given.
        """
        messages = [_message(ev) for ev in surface]
        before = self.estimate(messages)
        if before <= self.budget and not force:
            return Plan(count, before, (), (), None, (), tuple(messages), ())
        first = 0  # the first surface entry the plan may replace
        keep_from = len(surface)  # and the first it must keep, whatever keep_recent says
        if turn_start is not None:  # (the surface is in position order)
            first = bisect_right(surface, turn_start, key=_position)
            keep_from = _first_open_call(messages, first)
        tail_start = max(first, _tail_start(surface, messages, self.keep_recent, keep_from))
        current = list(messages)
        pruned_at: dict[int, int] = {}  # surface index -> prune number
        prunes: list[tuple[int, int, dict[str, Any], Message]] = []
        if self.prune_over is not None:
            for i in range(first, tail_start):
                ev, m = surface[i], messages[i]
                if ev.type is not EventType.TOOL_RESULT:
                    continue
                size = self.estimate([m])
                if size <= self.prune_over:
                    continue
                p = ev.position
                text = self.pruned_text(m, size)
                meta = {"pruned": {"seq": ev.seq, "estimate": size}}
                data: dict[str, Any] = {
                    "content": text,
                    "tool_call_id": m.tool_call_id,
                    "name": m.name,
                    "metadata": meta,
                    "surface_op": ("replace", p, p),
                }
                short = Message.tool(
                    text,
                    tool_call_id=m.tool_call_id,
                    name=m.name,
                    metadata=meta,
                    created_at=m.created_at,
                )
                pruned_at[i] = len(prunes)
                prunes.append((ev.seq, p, data, short))
                current[i] = short
        summary_input: tuple[Message, ...] = ()
        summary_range: tuple[int, int] | None = None
        summary_seqs: tuple[int | None, ...] = ()
        head_end, tail_begin = len(current), len(current)
        if self.estimate(current) > self.budget or force:
            # Leading system messages stay, except earlier summaries: a new
            # summary takes in the previous one with what followed it.
            head = first
            while (
                head < len(surface)
                and surface[head].type is EventType.SYSTEM_MESSAGE
                and not _is_summary(surface[head])
            ):
                head += 1
            while 0 < head < tail_start and surface[head].position == surface[head - 1].position:
                head += 1  # one position kept and summarised at once cannot be (see _tail_start)
            lone_summary = tail_start - head == 1 and _is_summary(surface[head])
            if head < tail_start and not lone_summary:  # a summary of one summary gains nothing
                if self.summarise is None:
                    raise CompactionError(
                        "over budget after pruning and no summariser was given; "
                        "pass summarise=callable(messages) -> str"
                    )
                # Start the range right after the last message kept before it, so
                # the bookkeeping that opened the summarised turns (turn_start,
                # step_start) goes with them: no turn is left open by a summary.
                range_start = surface[head - 1].position + 1 if head else 0
                if turn_start is not None:  # the open turn's start stays unshadowed
                    range_start = max(range_start, turn_start + 1)
                lo, last = surface[head], surface[tail_start - 1]
                summary_range = (min(range_start, lo.position), last.position)
                summary_input = tuple(current[head:tail_start])
                summary_seqs = tuple(
                    None if i in pruned_at else surface[i].seq for i in range(head, tail_start)
                )
                head_end, tail_begin = head, tail_start
        return Plan(
            count=count,
            before=before,
            prunes=tuple(prunes),
            summary_input=summary_input,
            summary_range=summary_range,
            summary_seqs=summary_seqs,
            head=tuple(current[:head_end]),
            tail=tuple(current[tail_begin:]),
        )

    def events(
        self, plan: Plan, summary: str | None, first_seq: int, compaction_id: str
    ) -> tuple[list[tuple[str, dict[str, Any]]], CompactionResult]:
        """The ``(type, data)`` of each event to append for ``plan``, in order, when the
        first of them gets ``first_seq``; and the result (its ``log`` is a placeholder
        until the events are appended).

        Raises:
            CompactionError: the plan needs a summary and ``summary`` is not a str
                (the error names what it is) or is empty; or the surface would end
                larger than it was by this compactor's own estimate.
        """
        if plan.needs_summary:
            _check_summary(summary)
        out: list[tuple[str, dict[str, Any]]] = [("tool_result", d) for _, _, d, _ in plan.prunes]
        pruned = tuple(seq for seq, _, _, _ in plan.prunes)
        seq = first_seq + len(out)
        summarised: tuple[int, int] | None = None
        summary_seq: int | None = None
        surface_after = list(plan.head)
        if plan.needs_summary and plan.summary_range is not None:
            assert summary is not None
            # Every pruned entry lies in the summarised range (only system messages
            # stand before it), in surface order: each takes its replacement's seq.
            prune_seq = iter(range(first_seq, first_seq + len(plan.prunes)))
            seqs = [s if s is not None else next(prune_seq) for s in plan.summary_seqs]
            start, stop = plan.summary_range
            meta = {"summary": {"seqs": seqs, "range": [start, stop]}}
            out.append(
                (
                    "system_message",
                    {"content": summary, "metadata": meta, "surface_op": ("replace", start, stop)},
                )
            )
            surface_after.append(Message.system(summary, metadata=meta))
            summarised, summary_seq = (start, stop), seq
            seq += 1
        surface_after.extend(plan.tail)
        after = self.estimate(surface_after)
        if after > plan.before:
            raise CompactionError(
                f"the compaction would make the surface larger: estimate {plan.before} "
                f"before, {after} after (the summary is larger than what it replaces); "
                "log unchanged; make the summariser return a shorter summary, or compact "
                "more messages at once (a smaller keep_recent)"
            )
        out.append(
            (
                "step_end",
                {
                    "step": "compaction",
                    "compaction_id": compaction_id,
                    "estimate_before": plan.before,
                    "estimate_after": after,
                    "budget": self.budget,
                    "keep_recent": self.keep_recent,
                    "prune_over": self.prune_over,
                    "pruned": list(pruned),
                    "summarised": list(summarised) if summarised else None,
                    "summary_seq": summary_seq,
                },
            )
        )
        result = CompactionResult(
            Log(),
            plan.before,
            after,
            pruned,
            summarised,
            summary_seq,
            seq,
            compaction_id,
            self.budget,
        )
        return out, result

    # -- on a plain log ----------------------------------------------------------------

    def compact(
        self,
        log: Log,
        *,
        time: datetime | None = None,
        force: bool = False,
        compaction_id: str | None = None,
    ) -> CompactionResult:
        """Compact ``log`` if its surface is over budget (always, with ``force``).

        The summariser is called here, in this thread; a coroutine summariser is
        run to completion with ``asyncio.run`` (from inside a running event loop,
        use ``await compactor.acompact(log)`` instead).

        Raises:
            CompactionError: the summariser failed, returned something other than a
                str, or an empty summary; or the summary would make the surface
                larger (``estimate_after > estimate_before``): ``log`` is unchanged
                (it is a value: nothing was appended to it).
        """
        plan, summary = self._plan_and_summarise(log, force)
        if plan.empty:
            return CompactionResult(log, plan.before, plan.before, budget=self.budget)
        if inspect.isawaitable(summary):
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                summary = _await_in_new_loop(summary)
            else:
                _close(summary)
                raise CompactionError(
                    "a coroutine summariser cannot be run by compact() inside a "
                    "running event loop; use 'await compactor.acompact(log)', or "
                    "Session.compact, which runs it on the loop"
                )
        return self.apply(log, plan, summary, time=time, compaction_id=compaction_id)

    async def acompact(
        self,
        log: Log,
        *,
        time: datetime | None = None,
        force: bool = False,
        compaction_id: str | None = None,
    ) -> CompactionResult:
        """`compact` for asyncio code: a coroutine summariser is awaited."""
        plan, summary = self._plan_and_summarise(log, force)
        if plan.empty:
            return CompactionResult(log, plan.before, plan.before, budget=self.budget)
        if inspect.isawaitable(summary):
            try:
                summary = await summary
            except Exception as exc:
                raise _summariser_failed(exc) from exc
        return self.apply(log, plan, summary, time=time, compaction_id=compaction_id)

    def _plan_and_summarise(self, log: Log, force: bool) -> tuple[Plan, Any]:
        """The plan for ``log`` and, if it needs one, the summariser's answer (which
        may be an awaitable)."""
        plan = self.plan(log.surface(), log.count(), force=force)
        if plan.empty or not plan.needs_summary:
            return plan, None
        return plan, run_summariser(self, plan.summary_input)

    def apply(
        self,
        log: Log,
        plan: Plan,
        summary: Any,
        *,
        time: datetime | None = None,
        compaction_id: str | None = None,
    ) -> CompactionResult:
        """Append ``plan`` (with its ``summary``) to ``log``.

        Raises:
            CompactionError: the summary is not a str or is empty, it would make the
                surface larger, or a replace appended since the plan was made
                overlaps it.
        """
        clash = plan.overlaps(log.since(plan.count))
        if clash is not None:
            raise CompactionError(
                f"the log changed under the compaction: event {clash.seq} overlaps its "
                "range; compact again"
            )
        cid = compaction_id or new_compaction_id()
        specs, result = self.events(plan, summary, log.count(), cid)
        new = log
        for etype, data in specs:
            new = new.append(etype, data, time)
        if self.snapshot:
            new = new.snapshot()
        result = replace(result, log=new)
        log_compacted(result)
        return result


def new_compaction_id() -> str:
    """A fresh compaction id."""
    return uuid.uuid4().hex


def run_summariser(compactor: Compactor, messages: Sequence[Message]) -> Any:
    """Call the summariser (its result may be an awaitable).

    Raises:
        CompactionError: the summariser raised.
    """
    assert compactor.summarise is not None
    try:
        return compactor.summarise(list(messages))
    except Exception as exc:
        raise _summariser_failed(exc) from exc


def _check_summary(summary: object) -> None:
    """Refuse a summary that is not a non-blank str, saying what was wrong.

    Raises:
        CompactionError: ``summary`` is not a str (named with its type) or is blank.
    """
    if not isinstance(summary, str):
        raise CompactionError(
            f"the summariser returned {type(summary).__name__} ({short_repr(summary)}), "
            "not a str: return the summary text as a str; log unchanged"
        )
    if not summary.strip():
        raise CompactionError(
            f"the summariser returned an empty summary ({short_repr(summary)}); log unchanged"
        )


def _summariser_failed(exc: BaseException) -> CompactionError:
    return CompactionError(f"the summariser failed: {type(exc).__name__}: {exc}; log unchanged")


def _await_in_new_loop(aw: Any) -> Any:
    async def wait() -> Any:
        return await aw

    try:
        return asyncio.run(wait())
    except Exception as exc:
        raise _summariser_failed(exc) from exc


def _close(aw: Any) -> None:
    close = getattr(aw, "close", None)
    if close is not None:
        close()  # a coroutine never awaited: close it, no warning


def log_compacted(result: CompactionResult, **context: Any) -> None:
    """Emit ``log.compacted`` (and a warning when the budget was not reached)."""
    logger.info(
        "log.compacted",
        **context,
        compaction_id=result.compaction_id,
        estimate_before=result.estimate_before,
        estimate_after=result.estimate_after,
        pruned=len(result.pruned),
        summarised=result.summarised,
    )
    if not result.within_budget:
        logger.warning(
            "log.compaction_over_budget",
            **context,
            compaction_id=result.compaction_id,
            estimate_after=result.estimate_after,
            budget=result.budget,
            reason="budget_not_reached",
        )


def _is_summary(ev: Event) -> bool:
    meta = ev.data.get("metadata")
    return isinstance(meta, dict) and "summary" in meta


def _message(ev: Event) -> Message:
    m = ev.to_message()
    assert m is not None
    return m


def _first_open_call(messages: Sequence[Message], start: int) -> int:
    """Index of the first of ``messages[start:]`` making a tool call that no later one
    answers (``len(messages)`` if none does): an open turn's call still waiting for
    its result."""
    answered = {m.tool_call_id for m in messages[start:] if m.role is Role.TOOL}
    for i in range(start, len(messages)):
        m = messages[i]
        if m.role is Role.ASSISTANT:
            for call in m.tool_calls:
                cid, _, _ = tool_call_parts(call)
                if isinstance(cid, str) and cid not in answered:  # (no id: never answered)
                    return i
    return len(messages)


def _tail_start(
    surface: Sequence[Event], messages: Sequence[Message], keep: int, at_most: int
) -> int:
    """Index where the kept recent tail begins: the newest ``keep`` messages (and every
    one from index ``at_most`` on), and more where the boundary would split what must
    stay together (DESIGN.md §7):

    * an assistant tool call and its results: a result kept in the tail pulls in the
      assistant message that made the call, wherever it stands (other messages may
      come between a call and its results: a user's, a system reminder), with
      everything after it; and the tail never starts with a tool result;
    * messages standing at one position (a replace written before the range it
      stands for, DESIGN.md §3): the summary's replace covers a range of positions,
      so it cannot shadow one of them and keep the other.
    """
    n = len(surface)
    i = min(max(0, n - keep), at_most)
    if i == 0:
        return 0
    call_at: dict[Any, int] = {}  # tool call id -> index of the first message making it
    for j in range(i):
        m = messages[j]
        if m.role is Role.ASSISTANT:
            for call in m.tool_calls:
                call_at.setdefault(call.get("id"), j)
    scan_from, scan_to = i, n  # the part of the tail not looked at yet
    while True:
        start = i
        for k in range(scan_from, scan_to):
            m = messages[k]
            if m.role is Role.TOOL:
                at = call_at.get(m.tool_call_id)
                if at is not None and at < start:
                    start = at
        while 0 < start < n and (
            messages[start].role is Role.TOOL
            or surface[start - 1].position == surface[start].position
        ):
            start -= 1
        if start == i:
            return i
        scan_from, scan_to, i = start, i, start
