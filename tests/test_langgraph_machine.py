"""A differential stateful test: NousCheckpointSaver driven beside LangGraph's
InMemorySaver through random puts (children of the latest checkpoint or of an earlier
one, in two namespaces), writes, deletes and reads; every read agrees."""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from langgraph.checkpoint.base import Checkpoint, CheckpointTuple, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver

from nous_actor import MemoryStore, Sessions
from nous_actor.integrations.langgraph import NousCheckpointSaver

NAMESPACES = ("", "sub:1")
THREADS = ("a", "b")


def _view(tup: CheckpointTuple | None) -> Any:
    """What both savers must agree on about one checkpoint tuple."""
    if tup is None:
        return None
    cp = tup.checkpoint
    return (
        tup.config["configurable"]["checkpoint_id"],
        cp["channel_values"],
        cp["channel_versions"],
        cp["versions_seen"],
        tup.metadata.get("step"),
        None if tup.parent_config is None else tup.parent_config["configurable"]["checkpoint_id"],
        sorted(tup.pending_writes or [], key=repr),
    )


class SaverMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sessions = Sessions(MemoryStore(), timeout=20)
        self.ours = NousCheckpointSaver(self.sessions)
        self.ref = InMemorySaver()
        self.prefix = uuid.uuid4().hex[:8]
        self.made: dict[tuple[str, str], list[dict[str, Any]]] = {}  # (thread, ns) -> configs
        self.values: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.version = 0

    def _cfg(self, thread: str, ns: str, cid: str | None = None) -> dict[str, Any]:
        conf: dict[str, Any] = {"thread_id": f"{self.prefix}-{thread}", "checkpoint_ns": ns}
        if cid is not None:
            conf["checkpoint_id"] = cid
        return {"configurable": conf}

    @rule(
        thread=st.sampled_from(THREADS),
        ns=st.sampled_from(NAMESPACES),
        back=st.integers(0, 3),
        grow=st.lists(st.integers(0, 9), max_size=3),
        replace=st.booleans(),
        note=st.none() | st.text(max_size=3),
    )
    def put(
        self, thread: str, ns: str, back: int, grow: list[int], replace: bool, note: str | None
    ) -> None:
        """A checkpoint: a child of the latest (or an earlier one), its list extended or
        replaced, a note set or dropped."""
        made = self.made.setdefault((thread, ns), [])
        parent = made[-1 - min(back, len(made) - 1)] if made else None
        before = (
            self.values.get((thread, ns, parent["configurable"]["checkpoint_id"]))
            if parent
            else None
        )
        old = list((before or {}).get("m", []))
        values: dict[str, Any] = {"m": list(grow) if replace else [*old, *grow]}
        if note is not None:
            values["note"] = note
        self.version += 1
        versions = {k: self.version for k in values}
        cp: Checkpoint = empty_checkpoint()
        cp["channel_values"] = values
        cp["channel_versions"] = versions
        cp["versions_seen"] = {"node": {"m": self.version - 1}}
        config = parent or self._cfg(thread, ns)
        meta: Any = {"source": "loop", "step": self.version}
        mine = self.ours.put(config, cp, meta, versions)
        theirs = self.ref.put(config, cp, meta, versions)
        assert mine["configurable"]["checkpoint_id"] == theirs["configurable"]["checkpoint_id"]
        made.append(dict(mine))
        self.values[(thread, ns, cp["id"])] = {
            k: list(v) if isinstance(v, list) else v for k, v in values.items()
        }

    @precondition(lambda self: any(self.made.values()))
    @rule(data=st.data(), value=st.integers(-99, 99), task=st.sampled_from(["t1", "t2"]))
    def put_writes(self, data: st.DataObject, value: int, task: str) -> None:
        """Pending writes for some stored checkpoint."""
        key = data.draw(st.sampled_from(sorted(k for k, v in self.made.items() if v)))
        config = data.draw(st.sampled_from(self.made[key]))
        writes = [("m", [value]), ("other", value)]
        self.ours.put_writes(config, writes, task)
        self.ref.put_writes(config, writes, task)

    @rule(thread=st.sampled_from(THREADS))
    def delete(self, thread: str) -> None:
        """delete_thread on both."""
        self.ours.delete_thread(f"{self.prefix}-{thread}")
        self.ref.delete_thread(f"{self.prefix}-{thread}")
        for ns in NAMESPACES:
            self.made.pop((thread, ns), None)

    @invariant()
    def latest_and_every_stored_checkpoint_agree(self) -> None:
        for thread in THREADS:
            for ns in NAMESPACES:
                cfg = self._cfg(thread, ns)
                assert _view(self.ours.get_tuple(cfg)) == _view(self.ref.get_tuple(cfg))
                for config in self.made.get((thread, ns), []):
                    assert _view(self.ours.get_tuple(config)) == _view(self.ref.get_tuple(config))

    @invariant()
    def listings_agree(self) -> None:
        for thread in THREADS:
            cfg = self._cfg(thread, "")
            assert [_view(t) for t in self.ours.list(cfg)] == [
                _view(t) for t in self.ref.list(cfg)
            ]

    def teardown(self) -> None:
        self.sessions.close()


TestSaverMachine = SaverMachine.TestCase
TestSaverMachine.settings = settings(
    settings.default, stateful_step_count=20, max_examples=25, deadline=None
)
