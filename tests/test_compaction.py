"""The Compactor: trigger, prune, summarise, the tool-call boundary, the record (DESIGN.md §7)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from nous_actor import (
    CompactionError,
    CompactionResult,
    Compactor,
    Log,
    Message,
    Replace,
    Role,
    estimate_tokens,
)
from nous_actor.core.history import compactions, explain, replaced

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 2, 2, tzinfo=UTC)


def summarise(messages: Sequence[Message]) -> str:
    """Deterministic: ``S(`` the contents of the summarised messages ``)``."""
    return "S(" + ",".join(str(m.content) for m in messages) + ")"


def never(messages: Sequence[Message]) -> str:
    raise AssertionError("the summariser must not be called")


def chat(*pairs: tuple[str, str | None]) -> Log:
    log = Log()
    for role, text in pairs:
        log = log.append(f"{role}_message", {"content": text}, T0)
    return log


SEED = (
    ("system", "sys"),
    ("user", "Q1"),
    ("assistant", "A1"),
    ("user", "Q2"),
    ("assistant", "A2"),
    ("user", "Q3"),
    ("assistant", "A3"),
)


def contents(log: Log) -> list[Any]:
    return [m.content for m in log.derive_messages()]


def call(*ids: str) -> dict[str, Any]:
    return {
        "content": None,
        "tool_calls": [{"id": i, "name": "search", "arguments": "{}"} for i in ids],
    }


def result(call_id: str, content: str) -> dict[str, Any]:
    return {"content": content, "tool_call_id": call_id, "name": "search"}


def tool_log(big: int = 4000) -> Log:
    """sys, Q, assistant(c1), tool(c1, big), Q2, A2 at seqs 0..5."""
    return (
        Log()
        .append("system_message", {"content": "sys"}, T0)
        .append("user_message", {"content": "find it"}, T0)
        .append("assistant_message", call("c1"), T0)
        .append("tool_result", result("c1", "x" * big), T0)
        .append("user_message", {"content": "Q2"}, T0)
        .append("assistant_message", {"content": "A2"}, T0)
    )


# -- the seed scenario -----------------------------------------------------------------


def test_seed_scenario_summarises_all_but_the_last_two() -> None:
    """[sys, Q1, A1, Q2, A2, Q3, A3] with keep_recent=2 becomes [sys, summary, Q3, A3]."""
    out = Compactor(budget=1, keep_recent=2, summarise=summarise).compact(chat(*SEED))
    assert contents(out.log) == ["sys", "S(Q1,A1,Q2,A2)", "Q3", "A3"]
    assert [m.role for m in out.log.derive_messages()] == [Role.SYSTEM] * 2 + [
        Role.USER,
        Role.ASSISTANT,
    ]


def test_second_compaction_summarises_the_first_summary_with_what_followed() -> None:
    """A second compaction folds the earlier summary and the messages after it into one."""
    c = Compactor(budget=1, keep_recent=2, summarise=summarise)
    first = c.compact(chat(*SEED)).log
    more = first.append("user_message", {"content": "Q4"}, T0)
    more = more.append("assistant_message", {"content": "A4"}, T0)
    second = c.compact(more)
    assert contents(second.log) == ["sys", "S(S(Q1,A1,Q2,A2),Q3,A3)", "Q4", "A4"]


def test_summary_is_a_system_message_replacing_the_summarised_range() -> None:
    """The summary event is a system_message with Replace(first, last position) of the range."""
    out = Compactor(budget=1, keep_recent=2, summarise=summarise).compact(chat(*SEED), time=T1)
    ev = out.log.events()[out.summary_seq]
    assert ev.type.value == "system_message"
    assert ev.surface_op == Replace(1, 4)
    assert ev.time == T1
    assert ev.data["metadata"]["summary"] == {"seqs": [1, 2, 3, 4], "range": [1, 4]}
    assert out.summarised == (1, 4)
    assert [e.seq for e in out.log.surface()] == [0, ev.seq, 5, 6]


def test_summariser_receives_exactly_the_messages_of_the_range() -> None:
    """The summariser is called once, with the surface messages between the head and the tail."""
    seen: list[list[Message]] = []

    def record(ms: Sequence[Message]) -> str:
        seen.append(list(ms))
        return "s"

    log = chat(*SEED)
    Compactor(budget=1, keep_recent=2, summarise=record).compact(log)
    assert seen == [log.derive_messages()[1:5]]


def test_compaction_never_deletes_events() -> None:
    """Every original event is still in events() after a compaction, only shadowed."""
    log = chat(*SEED)
    out = Compactor(budget=1, keep_recent=2, summarise=summarise).compact(log)
    assert out.log.events()[: log.count()] == log.events()
    assert out.log.count() == log.count() + 2  # the summary and the record


# -- the trigger -----------------------------------------------------------------------


def test_under_budget_changes_nothing_and_returns_the_same_log() -> None:
    """At or under budget, compact returns the very same log and records nothing."""
    log = chat(*SEED)
    est = estimate_tokens(log.derive_messages())
    out = Compactor(budget=est, keep_recent=2, summarise=never).compact(log)
    assert out.log is log
    assert not out.changed
    assert (out.estimate_before, out.estimate_after, out.record_seq) == (est, est, None)


def test_one_token_over_budget_compacts() -> None:
    """An estimate just above the budget triggers the compaction."""
    log = chat(*SEED)
    est = estimate_tokens(log.derive_messages())
    out = Compactor(budget=est - 1, keep_recent=2, summarise=summarise).compact(log)
    assert out.changed
    assert out.estimate_before == est


def test_force_compacts_under_budget() -> None:
    """force=True summarises even when the surface is within budget."""
    out = Compactor(budget=10**6, keep_recent=2, summarise=summarise).compact(
        chat(*SEED), force=True
    )
    assert contents(out.log) == ["sys", "S(Q1,A1,Q2,A2)", "Q3", "A3"]


def test_estimator_is_pluggable() -> None:
    """A custom estimator decides the trigger (here: one token per message)."""
    calls: list[int] = []

    def per_message(ms: Sequence[Message]) -> int:
        calls.append(len(ms))
        return len(ms)

    log = chat(*SEED)
    assert (
        not Compactor(budget=7, keep_recent=2, summarise=never, estimate=per_message)
        .compact(log)
        .changed
    )
    out = Compactor(budget=6, keep_recent=2, summarise=summarise, estimate=per_message).compact(
        log
    )
    assert (out.estimate_before, out.estimate_after) == (7, 4)
    assert calls[0] == 7


def test_default_estimate_is_chars_over_four_plus_four_per_message() -> None:
    """estimate_tokens counts content, reasoning and tool-call chars / 4, plus 4 per message."""
    assert estimate_tokens([Message.user("x" * 40)]) == 10 + 4
    assert estimate_tokens([Message.assistant("ab", reasoning_content="cd")]) == 1 + 4
    calls = [{"id": "c", "name": "abcd", "arguments": "1234"}]
    assert estimate_tokens([Message.assistant(None, tool_calls=calls)]) == 2 + 4
    assert estimate_tokens([Message.user([{"type": "text", "text": "y" * 8}])]) == 2 + 4
    assert estimate_tokens([]) == 0


# -- pruning ---------------------------------------------------------------------------


def test_oversized_tool_result_is_pruned_in_place() -> None:
    """An oversized tool result gets a Replace(p, p) tool_result at the same position."""
    log = tool_log()
    out = Compactor(budget=200, keep_recent=2, prune_over=100, summarise=never).compact(log)
    assert out.pruned == (3,)
    ev = out.log.events()[6]
    assert ev.type.value == "tool_result"
    assert ev.surface_op == Replace(3, 3)
    assert [e.seq for e in out.log.surface()] == [0, 1, 2, 6, 4, 5]
    assert out.log.events()[3] == log.events()[3]  # the original is kept


def test_pruned_result_keeps_tool_call_id_and_name() -> None:
    """The pruning tool_result answers the same call: tool_call_id and name are kept."""
    out = Compactor(budget=200, keep_recent=2, prune_over=100, summarise=never).compact(tool_log())
    m = out.log.derive_messages()[3]
    assert (m.role, m.tool_call_id, m.name) == (Role.TOOL, "c1", "search")
    assert m.content == "[tool result pruned by compaction: about 1004 tokens]"
    assert m.metadata == {"pruned": {"seq": 3, "estimate": 1004}}


def test_pruned_text_is_pluggable() -> None:
    """pruned_text(message, tokens) gives the content of the pruned result."""
    c = Compactor(
        budget=200,
        keep_recent=2,
        prune_over=100,
        summarise=never,
        pruned_text=lambda m, n: f"{m.tool_call_id}: {n} tokens elided",
    )
    assert c.compact(tool_log()).log.derive_messages()[3].content == "c1: 1004 tokens elided"


def test_pruning_that_suffices_skips_the_summary() -> None:
    """When pruning brings the surface under budget, the summariser is never called."""
    out = Compactor(budget=200, keep_recent=2, prune_over=100, summarise=never).compact(tool_log())
    assert out.summarised is None
    assert out.summary_seq is None
    assert out.estimate_after <= 200


def test_tool_results_at_or_under_prune_over_are_kept() -> None:
    """A tool result whose estimate is not above prune_over is not pruned."""
    c = Compactor(budget=200, keep_recent=2, prune_over=1004, summarise=summarise)
    assert c.compact(tool_log()).pruned == ()


def test_prune_over_none_never_prunes() -> None:
    """prune_over=None disables pruning; the oversized result is summarised instead."""
    out = Compactor(budget=200, keep_recent=2, prune_over=None, summarise=summarise).compact(
        tool_log()
    )
    assert out.pruned == ()
    assert out.summarised == (1, 3)


def test_tool_results_in_the_recent_tail_are_never_pruned() -> None:
    """An oversized tool result among the last keep_recent messages stays as it is."""
    log = tool_log().append("user_message", {"content": "Q3"}, T0)
    log = log.append("assistant_message", call("c2"), T0).append(
        "tool_result", result("c2", "y" * 4000), T0
    )
    out = Compactor(budget=200, keep_recent=2, prune_over=100, summarise=summarise).compact(log)
    assert out.pruned == (3,)
    assert out.log.derive_messages()[-1].content == "y" * 4000


def test_prune_then_summary_summarises_the_pruned_text() -> None:
    """Still over budget after pruning, the summariser sees the pruned result, not the original."""
    seen: list[Message] = []

    def record(ms: Sequence[Message]) -> str:
        seen.extend(ms)
        return "s"

    out = Compactor(budget=1, keep_recent=2, prune_over=100, summarise=record).compact(tool_log())
    assert out.pruned == (3,)
    assert out.summarised == (1, 3)
    assert seen[-1].content.startswith("[tool result pruned")


# -- the boundary ----------------------------------------------------------------------


def test_boundary_moves_back_to_keep_a_tool_call_with_its_results() -> None:
    """keep_recent that would split an assistant tool call from its results keeps them all."""
    log = (
        Log()
        .append("system_message", {"content": "sys"}, T0)
        .append("user_message", {"content": "U1"}, T0)
        .append("assistant_message", call("c1", "c2"), T0)
        .append("tool_result", result("c1", "r1"), T0)
        .append("tool_result", result("c2", "r2"), T0)
    )
    out = Compactor(budget=1, keep_recent=1, summarise=lambda ms: "S").compact(log)
    assert [e.seq for e in out.log.surface()] == [0, out.summary_seq, 2, 3, 4]
    assert out.summarised == (1, 1)


def test_a_message_between_a_tool_call_and_its_result_does_not_split_them() -> None:
    """A user's message or a system reminder between a call and its result: the tail that
    keeps the result keeps the call too (it walked back over adjacent results only)."""
    log = (
        Log()
        .append("user_message", {"content": "U1"}, T0)
        .append("assistant_message", call("o"), T0)
        .append("user_message", {"content": "typed while the tool ran"}, T0)
        .append("tool_result", result("o", "-3 C"), T0)
        .append("assistant_message", {"content": "It is -3 C."}, T0)
    )
    out = Compactor(budget=1, keep_recent=3, summarise=lambda ms: "S").compact(log)
    assert [e.seq for e in out.log.surface()] == [out.summary_seq, 1, 2, 3, 4]
    parallel = (
        Log()
        .append("user_message", {"content": "q"}, T0)
        .append("assistant_message", call("a", "b"), T0)
        .append("tool_result", result("a", "ra"), T0)
        .append("system_message", {"content": "reminder"}, T0)
        .append("tool_result", result("b", "rb"), T0)
        .append("assistant_message", {"content": "done"}, T0)
    )
    out = Compactor(budget=1, keep_recent=2, summarise=lambda ms: "S").compact(parallel)
    assert [e.seq for e in out.log.surface()] == [out.summary_seq, 1, 2, 3, 4, 5]
    assert orphaned_tool_results(out.log.derive_messages()) == []


def test_a_kept_message_at_the_position_of_a_summarised_one_stays() -> None:
    """A replace written before the range it stands for stands at that range's position,
    with the message later written there (DESIGN.md §3): a summary cannot shadow one and
    keep the other, so the kept tail takes both."""
    log = (
        Log()
        .append("user_message", {"content": "u0"}, T0)
        .append("system_message", {"content": "R1", "surface_op": Replace(3, 3)}, T0)
        .append("assistant_message", {"content": "a2"}, T0)
        .append("user_message", {"content": "u3"}, T0)
        .append("assistant_message", {"content": "a4"}, T0)
    )
    assert contents(log) == ["u0", "a2", "R1", "u3", "a4"]
    seen: list[Any] = []
    out = Compactor(
        budget=1, keep_recent=2, summarise=lambda ms: seen.extend(m.content for m in ms) or "S"
    ).compact(log)
    assert seen == ["u0", "a2"]
    assert contents(out.log) == ["S", "R1", "u3", "a4"]


def test_leading_system_messages_stay_before_the_summary() -> None:
    """Every system message before the range stays, and the summary comes after them."""
    log = chat(("system", "s1"), ("system", "s2"), *SEED[1:])
    out = Compactor(budget=1, keep_recent=2, summarise=summarise).compact(log)
    assert contents(out.log) == ["s1", "s2", "S(Q1,A1,Q2,A2)", "Q3", "A3"]


def test_later_system_messages_are_summarised() -> None:
    """A system message in the middle of the conversation is part of the summarised range."""
    log = chat(("user", "Q1"), ("system", "note"), ("assistant", "A1"), ("user", "Q2"))
    out = Compactor(budget=1, keep_recent=1, summarise=summarise).compact(log)
    assert contents(out.log) == ["S(Q1,note,A1)", "Q2"]


def test_keep_recent_zero_summarises_everything_after_the_head() -> None:
    """keep_recent=0 replaces every non-leading-system message with the summary."""
    out = Compactor(budget=1, keep_recent=0, summarise=summarise).compact(chat(*SEED))
    assert contents(out.log) == ["sys", "S(Q1,A1,Q2,A2,Q3,A3)"]


def test_nothing_to_summarise_appends_nothing() -> None:
    """Over budget with every message in the kept tail, the log is returned unchanged."""
    log = chat(*SEED)
    out = Compactor(budget=1, keep_recent=10, summarise=never).compact(log)
    assert out.log is log
    assert not out.changed


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("empty", ["", "   \n"])
def test_empty_summary_is_an_error_and_appends_nothing(empty: str) -> None:
    """An empty or blank summary raises CompactionError; nothing is appended, prunes included."""
    log = tool_log()
    c = Compactor(budget=1, keep_recent=2, prune_over=100, summarise=lambda ms: empty)
    with pytest.raises(CompactionError, match=r"empty summary.*log unchanged"):
        c.compact(log)
    assert log.count() == 6
    assert len(log.events()) == 6


def test_summariser_failure_is_a_compaction_error_with_the_cause() -> None:
    """An exception in the summariser becomes CompactionError chained to it."""

    def boom(ms: Sequence[Message]) -> str:
        raise RuntimeError("provider down")

    with pytest.raises(CompactionError, match="RuntimeError: provider down") as info:
        Compactor(budget=1, keep_recent=2, summarise=boom).compact(chat(*SEED))
    assert isinstance(info.value.__cause__, RuntimeError)


def test_over_budget_without_a_summariser_says_what_to_pass() -> None:
    """Needing a summary with summarise=None raises CompactionError naming the fix."""
    with pytest.raises(CompactionError, match=r"pass summarise=callable\(messages\) -> str"):
        Compactor(budget=1, keep_recent=2).compact(chat(*SEED))


COMPACTOR_BAD: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("budget-negative", {"budget": -1}, ValueError, r"budget must be an int >= 0"),
    ("budget-float", {"budget": 1.5}, TypeError, r"budget must be an int .* got float"),
    ("budget-str", {"budget": "100"}, TypeError, r"budget must be an int .* got str"),
    ("budget-bool", {"budget": True}, TypeError, r"budget must be an int .* got bool"),
    ("keep-negative", {"keep_recent": -1}, ValueError, r"keep_recent must be an int >= 0"),
    ("keep-float", {"keep_recent": 2.0}, TypeError, r"keep_recent must be an int"),
    ("keep-none", {"keep_recent": None}, TypeError, r"keep_recent must be an int"),
    ("prune-negative", {"prune_over": -5}, ValueError, r"prune_over must be None or an int >="),
    ("prune-str", {"prune_over": "1000"}, TypeError, r"prune_over must be None or an int"),
    ("prune-float", {"prune_over": 10.5}, TypeError, r"prune_over must be None or an int"),
    ("prune-bool", {"prune_over": False}, TypeError, r"prune_over must be None or an int"),
    ("summarise-str", {"summarise": "gpt"}, TypeError, r"summarise must be None, a callable"),
    ("summarise-int", {"summarise": 3}, TypeError, r"summarise must be None, a callable"),
    ("estimate-none", {"estimate": None}, TypeError, r"estimate must be a callable"),
    ("estimate-int", {"estimate": 4}, TypeError, r"estimate must be a callable"),
    ("pruned-text-str", {"pruned_text": "[pruned]"}, TypeError, r"pruned_text must be a call"),
    ("snapshot-str", {"snapshot": "yes"}, TypeError, r"snapshot must be True or False"),
    ("snapshot-int", {"snapshot": 1}, TypeError, r"snapshot must be True or False"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [case[1:] for case in COMPACTOR_BAD],
    ids=[case[0] for case in COMPACTOR_BAD],
)
def test_compactor_refuses_a_bad_argument(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """A bad Compactor setting raises a typed error naming what to pass, when it is made."""
    args = {"budget": 100, **kwargs}
    with pytest.raises(error, match=match):
        Compactor(**args)


def test_compactor_accepts_the_edges_of_each_range() -> None:
    """Zero budget, keep_recent and prune_over, no pruning, an async summariser."""

    async def summarise(messages: Any) -> str:
        return "s"

    c = Compactor(budget=0, keep_recent=0, prune_over=0, summarise=summarise, snapshot=True)
    assert (c.budget, c.keep_recent, c.prune_over, c.snapshot) == (0, 0, 0, True)
    assert Compactor(budget=1, prune_over=None).prune_over is None


# -- the record and audit --------------------------------------------------------------


def test_compaction_is_recorded_with_range_and_estimates() -> None:
    """The last event is a step_end record of the range, estimates, prunes and summary seq."""
    log = chat(*SEED)
    out = Compactor(budget=1, keep_recent=2, summarise=summarise).compact(log, time=T1)
    rec = out.log.events()[-1]
    assert rec.seq == out.record_seq == 8
    assert rec.type.value == "step_end"
    assert rec.time == T1
    assert rec.data == {
        "step": "compaction",
        "estimate_before": estimate_tokens(log.derive_messages()),
        "estimate_after": estimate_tokens(out.log.derive_messages()),
        "budget": 1,
        "keep_recent": 2,
        "prune_over": 1000,
        "compaction_id": out.compaction_id,
        "pruned": [],
        "summarised": [1, 4],
        "summary_seq": 7,
    }


def test_result_reports_what_the_record_says() -> None:
    """CompactionResult's fields agree with the recorded event."""
    out = Compactor(budget=1, keep_recent=2, prune_over=100, summarise=summarise).compact(
        tool_log()
    )
    assert isinstance(out, CompactionResult)
    assert out.changed
    rec = out.log.events()[out.record_seq].data
    assert (rec["estimate_before"], rec["estimate_after"]) == (
        out.estimate_before,
        out.estimate_after,
    )
    assert (rec["pruned"], rec["summarised"], rec["summary_seq"]) == (
        list(out.pruned),
        list(out.summarised or ()),
        out.summary_seq,
    )


def test_audit_lists_every_compaction_in_order() -> None:
    """history.compactions returns one entry per compaction, with its record seq."""
    c = Compactor(budget=1, keep_recent=2, summarise=summarise)
    log = c.compact(chat(*SEED), time=T1).log
    log = log.append("user_message", {"content": "Q4"}, T0).append(
        "assistant_message", {"content": "A4"}, T0
    )
    log = c.compact(log, time=T1).log
    found = compactions(log)
    assert [(h["seq"], h["summarised"], h["summary_seq"]) for h in found] == [
        (8, [1, 4], 7),
        (12, [1, 6], 11),
    ]
    assert found[0]["time"] == T1.isoformat()


def test_audit_explains_what_a_summary_replaced_through_both_compactions() -> None:
    """The second summary's range covers the first summary and everything it replaced."""
    c = Compactor(budget=1, keep_recent=2, summarise=summarise)
    log = c.compact(chat(*SEED)).log
    log = log.append("user_message", {"content": "Q4"}, T0).append(
        "assistant_message", {"content": "A4"}, T0
    )
    out = c.compact(log)
    assert out.summarised == (1, 6)
    assert replaced(out.log, out.summary_seq) == [1, 2, 3, 4, 5, 6, 7]
    assert explain(out.log, 1)["shadowed_by"] == [7, 11]
    assert explain(out.log, 7)["shadowed_by"] == [11]


def test_compaction_logs_a_structlog_event() -> None:
    """A compaction that appends emits log.compacted with its estimates."""
    with capture_logs() as captured:
        out = Compactor(budget=1, keep_recent=2, summarise=summarise).compact(chat(*SEED))
    [entry] = [e for e in captured if e["event"] == "log.compacted"]
    assert (entry["estimate_before"], entry["estimate_after"]) == (
        out.estimate_before,
        out.estimate_after,
    )
    assert entry["summarised"] == (1, 4)


# -- snapshot ----------------------------------------------------------------------------


def test_snapshot_option_drops_the_shadowed_events() -> None:
    """With snapshot=True the summarised originals are gone; count and surface are kept."""
    log = chat(*SEED)
    plain = Compactor(budget=1, keep_recent=2, summarise=summarise).compact(log, time=T1)
    snap = Compactor(budget=1, keep_recent=2, summarise=summarise, snapshot=True).compact(
        log, time=T1
    )
    assert [e.seq for e in snap.log.events()] == [0, 5, 6, 7, 8]
    assert snap.log.count() == plain.log.count()
    assert snap.log.derive_indexed() == plain.log.derive_indexed()


# -- stability ---------------------------------------------------------------------------


def test_compacting_a_compacted_log_again_appends_nothing() -> None:
    """Compacting the result again, with nothing appended in between, changes nothing."""
    c = Compactor(budget=1, keep_recent=2, summarise=summarise)
    first = c.compact(chat(*SEED))
    again = c.compact(first.log)
    assert again.log is first.log
    assert not again.changed


# -- properties ----------------------------------------------------------------------------

_small = st.text(alphabet="abc ", max_size=12)
_sized = _small | st.integers(0, 2000).map(lambda n: "x" * n)


@st.composite
def conversations(draw: st.DrawFn, max_blocks: int = 10) -> list[tuple[str, dict[str, Any]]]:
    """(type, data) steps of a chat with tool calls: leading system messages, then blocks of
    user text, assistant text, an assistant tool call followed by all its results (a user's
    message or a system note now and then between them), system notes and bookkeeping;
    optionally a final tool call whose results are still pending."""
    steps: list[tuple[str, dict[str, Any]]] = [
        ("system_message", {"content": draw(_small)}) for _ in range(draw(st.integers(0, 2)))
    ]
    calls = 0
    for _ in range(draw(st.integers(0, max_blocks))):
        kind = draw(st.sampled_from(["user", "assistant", "tools", "tools", "note", "turn"]))
        if kind == "user":
            steps.append(("user_message", {"content": draw(_sized)}))
        elif kind == "assistant":
            steps.append(("assistant_message", {"content": draw(_sized)}))
        elif kind == "note":
            steps.append(("system_message", {"content": draw(_small)}))
        elif kind == "turn":
            steps.append((draw(st.sampled_from(["turn_start", "turn_end", "step_end"])), {}))
        else:
            ids = [f"call-{calls + k}" for k in range(draw(st.integers(1, 3)))]
            calls += len(ids)
            steps.append(("assistant_message", call(*ids)))
            for i in ids:  # a user's message or a system note may come between them
                if draw(st.integers(0, 3)) == 0:
                    between = draw(st.sampled_from(["user_message", "system_message"]))
                    steps.append((between, {"content": draw(_small)}))
                steps.append(("tool_result", result(i, draw(_sized))))
    if draw(st.booleans()):
        steps.append(("assistant_message", call(f"call-{calls}")))
    return steps


def build(steps: Sequence[tuple[str, dict[str, Any]]], log: Log | None = None) -> Log:
    log = Log() if log is None else log
    for etype, data in steps:
        log = log.append(etype, data, T0)
    return log


def short_summary(messages: Sequence[Message]) -> str:
    """Deterministic and short, so that a summary can bring the surface under budget."""
    return f"summary of {len(messages)}: " + ",".join(m.role.value[0] for m in messages)


compactors = st.builds(
    Compactor,
    budget=st.integers(0, 400),
    summarise=st.just(short_summary),
    keep_recent=st.integers(0, 8),
    prune_over=st.none() | st.integers(0, 200),
)


def compact(c: Compactor, log: Log, **kwargs: Any) -> CompactionResult:
    """``c.compact(log)``, where a compaction refused because its summary would make the
    surface larger counts as none (after checking the log was left as it was)."""
    try:
        return c.compact(log, **kwargs)
    except CompactionError as exc:
        assert "would make the surface larger" in str(exc)
        est = c.estimate(log.derive_messages())
        return CompactionResult(log, est, est, budget=c.budget)


def orphaned_tool_results(messages: Sequence[Message]) -> list[int]:
    """Indices of tool messages whose call is not made by an assistant message before them."""
    called: set[Any] = set()
    orphans = []
    for i, m in enumerate(messages):
        if m.role is Role.ASSISTANT:
            called.update(c["id"] for c in m.tool_calls)
        elif m.role is Role.TOOL and m.tool_call_id not in called:
            orphans.append(i)
    return orphans


@given(conversations(), conversations(), compactors)
def test_property_no_orphaned_tool_result_after_any_compaction(
    first: list[tuple[str, dict[str, Any]]],
    second: list[tuple[str, dict[str, Any]]],
    c: Compactor,
) -> None:
    """After any compaction, for every keep_recent, every tool result follows its call."""
    log = compact(c, build(first)).log
    assert orphaned_tool_results(log.derive_messages()) == []
    log = compact(c, build(second, log)).log
    assert orphaned_tool_results(log.derive_messages()) == []


@given(conversations(), compactors)
def test_property_the_recent_tail_and_leading_system_messages_are_untouched(
    steps: list[tuple[str, dict[str, Any]]], c: Compactor
) -> None:
    """The surface after is the leading system messages, at most one summary, then a tail
    of the original surface at least keep_recent long (or all of it)."""
    log = build(steps)
    before = log.derive_indexed()
    out = compact(c, log)
    after = out.log.derive_indexed()
    if out.summary_seq is None:
        assert len(after) == len(before)
        assert [s for s, _ in after if s < log.count()] == [
            s for s, _ in before if s not in out.pruned
        ]
        return
    head = 0
    while before[head][1].role is Role.SYSTEM:
        head += 1
    assert after[:head] == before[:head]
    assert after[head][0] == out.summary_seq
    tail = after[head + 1 :]
    assert tail == before[len(before) - len(tail) :]
    assert len(tail) >= min(c.keep_recent, len(before) - head - 1)


@given(conversations(), compactors, st.booleans())
def test_property_repeated_compaction_is_stable(
    steps: list[tuple[str, dict[str, Any]]], c: Compactor, force: bool
) -> None:
    """Compacting a compacted log again, with nothing appended in between, changes nothing."""
    once = compact(c, build(steps), force=force).log
    again = compact(c, once, force=force)
    assert again.log is once
    assert not again.changed


@given(conversations(), compactors)
def test_property_compaction_with_snapshot_leaves_the_same_surface(
    steps: list[tuple[str, dict[str, Any]]], c: Compactor
) -> None:
    """snapshot=True gives the surface, seqs and count of a plain compaction, minus shadowed."""
    log = build(steps)
    plain = compact(c, log, time=T1, compaction_id="c1").log
    snapper = Compactor(
        budget=c.budget,
        summarise=c.summarise,
        keep_recent=c.keep_recent,
        prune_over=c.prune_over,
        snapshot=True,
    )
    snap = compact(snapper, log, time=T1, compaction_id="c1")
    assert snap.log.derive_indexed() == plain.derive_indexed()
    assert snap.log.count() == plain.count()
    assert snap.log.events() == plain.snapshot().events()


@given(conversations(), compactors)
def test_property_the_input_log_is_never_changed(
    steps: list[tuple[str, dict[str, Any]]], c: Compactor
) -> None:
    """compact leaves the log it was given exactly as it was (a Log is a value)."""
    log = build(steps)
    events, surface = log.events(), log.derive_indexed()
    compact(c, log)
    assert log.events() == events
    assert log.derive_indexed() == surface


@pytest.mark.parametrize(
    ("returned", "named"),
    [(42, "int"), (None, "NoneType"), (b"summary", "bytes"), (["a", "b"], "list")],
)
def test_a_summariser_returning_no_str_is_named_for_what_it_returned(
    returned: object, named: str
) -> None:
    """A summariser that returns something other than a str is told so: the error names
    the type it returned and says to return a str (not "an empty summary"); nothing
    is appended."""
    log = tool_log()
    c = Compactor(budget=1, keep_recent=2, prune_over=100, summarise=lambda ms: returned)
    with pytest.raises(CompactionError) as info:
        c.compact(log)
    text = str(info.value)
    assert f"returned {named}" in text
    assert "return the summary text as a str" in text
    assert "empty" not in text
    assert "log unchanged" in text
    assert log.count() == 6


def test_a_summary_larger_than_what_it_replaces_is_refused() -> None:
    """A compaction whose own estimate says the surface grew (``estimate_after >
    estimate_before``) is refused with CompactionError naming both estimates; nothing is
    appended and nothing is logged as compacted."""
    log = chat(*SEED)
    long = "a long summary " * 50
    c = Compactor(budget=1, keep_recent=2, summarise=lambda ms: long)
    before = estimate_tokens(log.derive_messages())
    with capture_logs() as logs, pytest.raises(CompactionError) as info:
        c.compact(log)
    text = str(info.value)
    assert f"estimate {before}" in text
    assert "larger" in text
    assert "log unchanged" in text
    assert log.count() == len(SEED)
    assert not [e for e in logs if e["event"] == "log.compacted"]


@given(extra=st.integers(min_value=0, max_value=400))
def test_a_compaction_never_makes_the_surface_larger(extra: int) -> None:
    """Whatever the summary's length: either the compaction is refused and the log is
    unchanged, or the surface's estimate after it is at most the one before (property)."""
    log = chat(*SEED)
    c = Compactor(budget=1, keep_recent=2, summarise=lambda ms: "s" * (1 + extra))
    before = estimate_tokens(log.derive_messages())
    try:
        out = c.compact(log)
    except CompactionError as exc:
        assert "larger" in str(exc)
        assert log.count() == len(SEED)
    else:
        assert out.estimate_before == before
        assert out.estimate_after == estimate_tokens(out.log.derive_messages()) <= before


def test_a_summary_of_the_same_size_is_kept() -> None:
    """Equal estimates are not growth: the compaction applies (the rule is ``after >
    before``), as a forced compaction of a tiny session whose summary costs what it
    replaces does."""
    log = chat(("user", "Q1"), ("assistant", "A1"))
    before = estimate_tokens(log.derive_messages())
    same = "x" * ((before - 4) * 4)  # one message of the same estimate
    c = Compactor(budget=10_000, keep_recent=0, summarise=lambda ms: same)
    out = c.compact(log, force=True)
    assert (out.estimate_before, out.estimate_after) == (before, before)
    assert out.changed
