"""What the saver writes into a thread's log: one ``request_header`` event per record,
its data a mapping under the key `RECORD_KEY` naming the record's kind.

* ``{"lg": "cp", "ns", "id", "parent", "meta", "vals", "vers", "seen", ["full", "v",
  "ts", "upd", "drop", "vers_drop", "seen_drop", "run", "x"]}``: a checkpoint (the
  keys in brackets only when they say something: ``v`` when it is not
  `CHECKPOINT_V`, ``ts`` when the event's time does not hold it exactly).
  Without ``full`` it holds only what changed since its parent checkpoint
  ``parent`` (of the same namespace): ``vals`` the channels whose value changed
  (``["w", value]`` whole, ``["t", tail]`` a list extended, ``["r", [[task,
  idx], ...]]`` a list extended by what the parent's pending writes to the
  channel hold, so that it is not kept twice, ``["e", runs]`` a list that keeps
  some of the parent's elements: ``["k", start, stop]`` runs of them and
  ``["n", elements]`` new ones, in order), ``drop`` the
  channels it no longer has, ``vers``/``vers_drop`` and ``seen``/``seen_drop``
  the same for ``channel_versions`` and ``versions_seen`` (a node's versions
  are kept whole when they changed). With ``full`` it holds everything.
  ``meta`` is the metadata (see `nous_actor.integrations.langgraph.codec`),
  ``run`` the run id of its metadata, ``x`` any other key of the checkpoint.
* ``{"lg": "w", "ns", "cp", "task", "path", "w": [[idx, channel, value], ...]}``:
  pending writes of one task for checkpoint ``cp``.
* ``{"lg": "del"}``: `delete_thread`; every checkpoint before it is gone for
  LangGraph (the events stay).
* ``{"lg": "prune", "keep": [[ns, id], ...]}``: `prune`; every checkpoint before
  it but those kept is gone.
* ``{"lg": "runs", "runs": [run id, ...]}``: `delete_for_runs`; the checkpoints of
  those runs before it are gone.
* ``{"lg": "part", "of", "i", "n", "s"}``: part ``i`` of ``n`` of a record too large
  for one event (over `nous_actor.core.limits.max_event_bytes`, 16 MiB by
  default: a channel value that large): ``s`` is a piece of the record's JSON
  text; the ``n`` parts of one record (``of``, a random id) are appended in one
  batch, and the record counts, once its last part is read, as if it were
  the last part's event.

A rollback of a run by another (``multitask_strategy="rollback"``) is the
session's own replace over the run's turn: the checkpoints inside it are gone
for LangGraph, and kept in the log.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, Final, NamedTuple

from nous_actor.integrations.langgraph.codec import (
    EDIT,
    TAIL,
    WHOLE,
    WRITTEN,
    decode,
    delta,
    edit,
    encode,
    reads_back_as_is,
    same,
    stored_same,
)
from nous_actor.integrations.langgraph.framework import Checkpoint, SerializerProtocol

__all__ = [
    "CHECKPOINT_V",
    "KNOWN_KEYS",
    "RECORD_KEY",
    "State",
    "checkpoint_record",
    "split_record",
    "time_of",
    "writes_record",
]

RECORD_KEY: Final = "lg"
"""Top-level data key of every record of the saver (its value names the kind)."""

CHECKPOINT_V: Final = 4
"""The checkpoint format version LangGraph writes today (a record says ``v`` only when it
holds another)."""

KNOWN_KEYS: Final = frozenset(
    {"v", "id", "ts", "channel_values", "channel_versions", "versions_seen", "updated_channels"}
)
"""The checkpoint keys kept in fields of their own; any other key is kept in ``x``."""


_NONE: Final[Mapping[str, Any]] = MappingProxyType({})


class State(NamedTuple):
    """A checkpoint's channel values, channel versions and versions seen, resolved; and, in
    the process that put it, the values put where they differ from those read back
    (``put``: a later checkpoint holding the same object did not change it)."""

    values: dict[str, Any]
    versions: dict[str, Any]
    seen: dict[str, dict[str, Any]]
    put: Mapping[str, Any] = _NONE


def _own(value: Any) -> Any:
    """A copy of a list or dict value (its elements shared); anything else as is."""
    t = type(value)
    if t is list or t is dict:
        return t(value)
    return value


def checkpoint_record(
    serde: SerializerProtocol,
    ns: str,
    checkpoint: Checkpoint,
    meta: list[Any],
    parent: str | None,
    base: State | None,
    run: str | None,
    written: Callable[[str], tuple[list[Any], Sequence[Any]] | None] | None = None,
) -> tuple[dict[str, Any], State]:
    """The record of ``checkpoint`` (namespace ``ns``, parent ``parent``): what changed
    since ``base``, the parent's state, or everything when ``base`` is None; and the
    state a read of the record gives.

    That state is what any process reads back: the values put where they read back as
    they are (plain JSON, LangChain messages) or are the parent's, the stored form
    decoded where they do not (a tuple a list, say); so the process that put a
    checkpoint returns what every other returns.

    ``written(channel)`` gives the parent's one pending write to a channel (its
    ``[task, idx]`` and its value as kept), or None: a tail kept exactly as that
    write's value is kept as a reference to it."""
    values = checkpoint["channel_values"]
    versions = checkpoint["channel_versions"]
    seen = checkpoint["versions_seen"]
    rec: dict[str, Any] = {
        RECORD_KEY: "cp",
        "ns": ns,
        "id": checkpoint["id"],
        "parent": parent,
        "meta": meta,
    }
    if base is None:
        rec["full"] = True
    if checkpoint["v"] != CHECKPOINT_V:
        rec["v"] = checkpoint["v"]
    if time_of(checkpoint["ts"]) is None:
        rec["ts"] = checkpoint["ts"]
    upd = checkpoint.get("updated_channels")
    if upd:
        rec["upd"] = list(upd)
    if run is not None:
        rec["run"] = run
    extra = {k: v for k, v in checkpoint.items() if k not in KNOWN_KEYS}
    if extra:
        rec["x"] = encode(serde, extra)
    state = State(
        {},
        dict(versions),
        {n: dict(vs) for n, vs in seen.items()},
    )
    got = state.values
    put: dict[str, Any] = {}
    vals: dict[str, Any] = {}
    for ch, v in values.items():
        if base is not None and ch in base.values:
            pv = base.values[ch]
            if v is base.put.get(ch, pv) or stored_same(serde, v, pv):
                got[ch] = pv
                if ch in base.put:
                    put[ch] = base.put[ch]
                continue
            tail = delta(pv, v, serde)
            if tail is not None:
                kept = encode(serde, tail)
                found = None if written is None or not tail else written(ch)
                if found is not None and list(found[1]) == kept:
                    vals[ch] = [WRITTEN, [found[0]]]
                else:
                    vals[ch] = [TAIL, kept]
                got[ch] = [*pv, *_read(serde, kept, tail)]
                continue
            runs = edit(serde, pv, v)
            if runs is not None:
                stored: list[Any] = []
                now: list[Any] = []
                for r in runs:
                    if r[0] == "k":
                        stored.append(r)
                        now.extend(pv[r[1] : r[2]])
                    else:
                        kept = encode(serde, r[1])
                        stored.append(["n", kept])
                        now.extend(_read(serde, kept, r[1]))
                vals[ch] = [EDIT, stored]
                got[ch] = now
                continue
        kept = encode(serde, v)
        vals[ch] = [WHOLE, kept]
        if reads_back_as_is(kept):
            got[ch] = _own(v)
        else:
            got[ch] = decode(serde, kept)
            put[ch] = v
    if put:
        state = state._replace(put=put)
    rec["vals"] = vals
    if base is None:
        rec["vers"] = dict(versions)
        rec["seen"] = {n: dict(vs) for n, vs in seen.items()}
        return rec, state
    rec["vers"] = {
        k: v
        for k, v in versions.items()
        if k not in base.versions or not same(base.versions[k], v)
    }
    rec["seen"] = {
        n: dict(vs) for n, vs in seen.items() if n not in base.seen or not same(base.seen[n], vs)
    }
    for name, gone in (
        ("drop", [ch for ch in base.values if ch not in values]),
        ("vers_drop", [k for k in base.versions if k not in versions]),
        ("seen_drop", [n for n in base.seen if n not in seen]),
    ):
        if gone:
            rec[name] = gone
    return rec, state


def _read(serde: SerializerProtocol, kept: Sequence[Any], put: list[Any]) -> list[Any]:
    """New list elements as a read of ``kept`` gives them: ``put``, the elements put, when
    they read back as they are; else ``kept`` decoded."""
    if reads_back_as_is(kept):
        return put
    got = decode(serde, kept)
    return got if isinstance(got, list) else list(got)


def time_of(ts: object) -> datetime | None:
    """The UTC time a checkpoint's ``ts`` names, when an event's time keeps it exactly (its
    ``isoformat()`` gives ``ts`` back); else None (the record keeps ``ts`` itself)."""
    if not isinstance(ts, str):
        return None
    try:
        when = datetime.fromisoformat(ts)
    except ValueError:
        return None
    if when.utcoffset() != timedelta(0) or when.astimezone(UTC).isoformat() != ts:
        return None
    return when.astimezone(UTC)


def writes_record(
    serde: SerializerProtocol,
    ns: str,
    checkpoint_id: str,
    task_id: str,
    task_path: str,
    writes: list[tuple[int, str, Any]],
) -> dict[str, Any]:
    """The record of ``writes`` (``(idx, channel, value)``) of one task."""
    return {
        RECORD_KEY: "w",
        "ns": ns,
        "cp": checkpoint_id,
        "task": task_id,
        "path": task_path,
        "w": [[idx, ch, encode(serde, v)] for idx, ch, v in writes],
    }


PART_ROOM: Final = 256
"""Bytes of a part record's event left for its keys, besides its piece of text."""


def split_record(record: Mapping[str, Any], limit: int) -> list[dict[str, Any]] | None:
    """``record`` as ``part`` records of events of at most ``limit`` bytes each, when its
    compact JSON is larger than ``limit``; else None (it fits: it was refused for
    another reason)."""
    text = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
    if len(text.encode("utf-8")) <= limit:
        return None
    # A character costs at most 6 bytes in a JSON string (an escaped control character).
    step = max(1, (limit - PART_ROOM) // 6)
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    of = uuid.uuid4().hex
    return [
        {RECORD_KEY: "part", "of": of, "i": i, "n": len(pieces), "s": piece}
        for i, piece in enumerate(pieces)
    ]


def joined(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The record the ``part`` records ``parts`` (all of one record, in order) hold."""
    record: dict[str, Any] = json.loads("".join(str(p["s"]) for p in parts))
    return record


def kind_of(data: Mapping[str, Any]) -> str | None:
    """The record kind of an event's data, or None for an event that is not a record."""
    kind = data.get(RECORD_KEY)
    return kind if isinstance(kind, str) else None
