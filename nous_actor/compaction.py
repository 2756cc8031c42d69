"""Compaction that keeps the originals: prune and summarise by appending replaces.

A :class:`Compactor` never deletes. When the surface's estimated size is over
budget it appends, in order:

1. for each oversized tool result outside the recent tail, a ``tool_result``
   that replaces it in place (``Replace(p, p)``), keeping ``tool_call_id``
   and ``name``;
2. if still over budget, one ``system_message`` holding a summary (from your
   summariser) that replaces everything but the last ``keep_recent``
   messages, after the leading system messages (an earlier summary is not
   one of those: it is summarised again with what followed it), without
   ever separating an assistant message with tool calls from its tool results;
3. a ``step_end`` bookkeeping event recording what it did (kind
   ``"compaction"``, the ranges, the estimates before and after),

and optionally a :meth:`~nous_actor.Log.snapshot`. The replaced events stay in
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog

from nous_actor.errors import NousActorError
from nous_actor.event import Event, EventType
from nous_actor.log import Log
from nous_actor.message import Message, Role

__all__ = ["CompactionError", "CompactionResult", "Compactor", "estimate_tokens"]

logger = structlog.get_logger(__name__)


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
            chars += len(str(call.get("name", ""))) + len(str(call.get("arguments", "")))
    return chars // 4 + 4 * len(messages)


def _default_pruned(message: Message, tokens: int) -> str:
    return f"[tool result pruned by compaction: about {tokens} tokens]"


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction did. ``log`` is the new log (the same object if nothing was done)."""

    log: Log
    estimate_before: int
    estimate_after: int
    pruned: list[int] = field(default_factory=list)
    summarised: tuple[int, int] | None = None
    summary_seq: int | None = None
    record_seq: int | None = None

    @property
    def changed(self) -> bool:
        return self.record_seq is not None


@dataclass(frozen=True)
class Compactor:
    """Keeps a log's surface under a token budget by appending replaces.

    Args:
        budget: compact when the estimate of the surface exceeds this.
        summarise: turns the messages to summarise into the summary text
            (a plain callable: the library makes no network calls).
        keep_recent: how many of the newest surface messages are never
            pruned or summarised (more, if the boundary would split a tool call
            from its results).
        prune_over: a tool result estimated above this many tokens is pruned
            first (``None``: never prune).
        estimate: the token estimator (default :func:`estimate_tokens`).
        pruned_text: the content of a pruned tool result.
        snapshot: drop the shadowed events afterwards.
    """

    budget: int
    summarise: Callable[[Sequence[Message]], str] | None = None
    keep_recent: int = 6
    prune_over: int | None = 1000
    estimate: Callable[[Sequence[Message]], int] = estimate_tokens
    pruned_text: Callable[[Message, int], str] = _default_pruned
    snapshot: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 0:
            raise ValueError(f"budget must be an int >= 0 (tokens), got {self.budget!r}")
        if isinstance(self.keep_recent, bool) or not isinstance(self.keep_recent, int):
            raise ValueError(f"keep_recent must be an int >= 0, got {self.keep_recent!r}")
        if self.keep_recent < 0:
            raise ValueError(f"keep_recent must be an int >= 0, got {self.keep_recent!r}")
        if self.prune_over is not None and self.prune_over < 0:
            raise ValueError(f"prune_over must be None or >= 0, got {self.prune_over!r}")

    def compact(
        self, log: Log, *, time: datetime | None = None, force: bool = False
    ) -> CompactionResult:
        """Compact ``log`` if its surface is over budget (always, with ``force``).

        Raises:
            CompactionError: the summariser failed or returned an empty summary;
                ``log`` is unchanged (it is a value: nothing was appended to it).
        """
        surface = log.surface()
        messages = [_message(ev) for ev in surface]
        before = self.estimate(messages)
        if before <= self.budget and not force:
            return CompactionResult(log, before, before)
        tail_start = _tail_start(surface, messages, self.keep_recent)
        new = log
        pruned: list[int] = []
        if self.prune_over is not None:
            for ev, m in zip(surface[:tail_start], messages[:tail_start], strict=True):
                if ev.type is not EventType.TOOL_RESULT:
                    continue
                size = self.estimate([m])
                if size <= self.prune_over:
                    continue
                p = ev.position
                new = new.append(
                    "tool_result",
                    {
                        "content": self.pruned_text(m, size),
                        "tool_call_id": m.tool_call_id,
                        "name": m.name,
                        "metadata": {"pruned": {"seq": ev.seq, "estimate": size}},
                        "surface_op": ("replace", p, p),
                    },
                    time,
                )
                pruned.append(ev.seq)
        summarised: tuple[int, int] | None = None
        summary_seq: int | None = None
        current = new.derive_messages()
        if self.estimate(current) > self.budget or force:
            surface2 = new.surface()
            # Leading system messages stay, except earlier summaries: a new
            # summary takes in the previous one with what followed it.
            head = 0
            while (
                head < len(surface2)
                and surface2[head].type is EventType.SYSTEM_MESSAGE
                and not _is_summary(surface2[head])
            ):
                head += 1
            tail2 = _tail_start(surface2, [_message(e) for e in surface2], self.keep_recent)
            lone_summary = tail2 - head == 1 and _is_summary(surface2[head])
            if head < tail2 and not lone_summary:  # a summary of one summary gains nothing
                if self.summarise is None:
                    raise CompactionError(
                        "over budget after pruning and no summariser was given; "
                        "pass summarise=callable(messages) -> str"
                    )
                chunk = surface2[head:tail2]
                # Start the range right after the last message kept before it, so
                # the bookkeeping that opened the summarised turns (turn_start,
                # step_start) goes with them: no turn is left open by a summary.
                range_start = surface2[head - 1].position + 1 if head else 0
                try:
                    text = self.summarise([_message(e) for e in chunk])
                except Exception as exc:
                    raise CompactionError(
                        f"the summariser failed: {type(exc).__name__}: {exc}; log unchanged"
                    ) from exc
                if not isinstance(text, str) or not text.strip():
                    raise CompactionError(
                        f"the summariser returned an empty summary ({text!r}); log unchanged"
                    )
                start, stop = min(range_start, chunk[0].position), chunk[-1].position
                new = new.append(
                    "system_message",
                    {
                        "content": text,
                        "metadata": {
                            "summary": {"seqs": [e.seq for e in chunk], "range": [start, stop]}
                        },
                        "surface_op": ("replace", start, stop),
                    },
                    time,
                )
                summarised = (start, stop)
                summary_seq = new.count() - 1
        if new is log:
            return CompactionResult(log, before, before)
        after = self.estimate(new.derive_messages())
        new = new.append(
            "step_end",
            {
                "step": "compaction",
                "estimate_before": before,
                "estimate_after": after,
                "budget": self.budget,
                "pruned": pruned,
                "summarised": list(summarised) if summarised else None,
                "summary_seq": summary_seq,
            },
            time,
        )
        record_seq = new.count() - 1
        if self.snapshot:
            new = new.snapshot()
        logger.info(
            "log.compacted",
            estimate_before=before,
            estimate_after=after,
            pruned=len(pruned),
            summarised=summarised,
        )
        return CompactionResult(new, before, after, pruned, summarised, summary_seq, record_seq)


def _is_summary(ev: Event) -> bool:
    meta = ev.data.get("metadata")
    return isinstance(meta, dict) and "summary" in meta


def _message(ev: Event) -> Message:
    m = ev.to_message()
    assert m is not None
    return m


def _tail_start(surface: Sequence[Event], messages: Sequence[Message], keep: int) -> int:
    """Index where the kept recent tail begins, moved earlier so that it never starts
    with a tool result whose assistant call lies before it."""
    i = max(0, len(surface) - keep)
    while 0 < i < len(surface) and messages[i].role is Role.TOOL:
        i -= 1  # pull the assistant (and its other results) into the tail
    return i
