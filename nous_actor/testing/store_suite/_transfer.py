"""The store contract: export and import, and the backend's errors raised as
`nous_actor.errors.StoreError` (odd ids, huge seqs, large data)."""

from __future__ import annotations

import contextlib
import json

import pytest

from nous_actor.core.codec import CodecError, from_v1, loads_event
from nous_actor.core.log import Log
from nous_actor.errors import ConflictError, StoreError
from nous_actor.store.base import Store, export_session, import_session
from nous_actor.testing.store_machine import assert_same_events
from nous_actor.testing.store_suite._helpers import (
    _ev,
    _jsonl,
    _poisoned,
    _stored_or_store_error,
    _varied_log,
)


class TransferRules:
    """Export and import; errors are StoreError, never the backend's own."""

    # -- export and import ----------------------------------------------------------------

    def test_export_then_import_round_trips_a_session(self, store: Store) -> None:
        """import_session(export_session(...)) under a new id stores the same events."""
        log = _varied_log().snapshot()
        store.write({"s": log.events()})
        text = export_session(store, "s")
        assert import_session(store, "copy", text) == len(log.events())
        assert_same_events(store.load("copy"), store.load("s"))

    def test_export_is_json_lines_with_one_event_a_line(self, store: Store) -> None:
        """export_session gives one JSON record per stored event, each line ending in \\n."""
        events = list(_varied_log().events())
        store.write({"s": events})
        text = export_session(store, "s")
        assert text.endswith("\n")
        lines = text[:-1].split("\n")
        assert [loads_event(line) for line in lines] == events
        replace = json.loads(lines[-2])
        assert replace["data"]["surface_op"] == ["replace", 1, 7]

    def test_export_of_a_session_without_events_raises_store_error(self, store: Store) -> None:
        """There is nothing to export from a session with no events: StoreError."""
        with pytest.raises(StoreError):
            export_session(store, "nobody")

    def test_import_of_a_v1_message_list_seeds_the_session(self, store: Store) -> None:
        """A v1 JSON list of messages imports through Log.seed, one event per message."""
        when = "2026-01-01T00:00:00.000001+00:00"
        v1 = [
            {"role": "system", "content": "be brief", "created_at": when},
            {"role": "user", "content": "hi", "created_at": when},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
                "created_at": when,
            },
            {"role": "tool", "content": "42", "tool_call_id": "c1", "created_at": when},
        ]
        expected = from_v1(v1)
        assert import_session(store, "v1", json.dumps(v1)) == 4
        loaded = store.load("v1")
        assert_same_events(loaded, expected.events())
        rebuilt = Log()
        for ev in loaded:
            rebuilt = rebuilt.append_event(ev)
        assert [m.role.value for m in rebuilt.derive_messages()] == [
            "system",
            "user",
            "assistant",
            "tool",
        ]
        assert rebuilt.derive_messages() == expected.derive_messages()

    def test_import_into_a_session_with_events_raises_conflict_error(self, store: Store) -> None:
        """Importing over existing events is refused with ConflictError and changes nothing."""
        store.write({"s": [_ev(0), _ev(1)]})
        text = export_session(store, "s")
        store.write({"t": [_ev(0, data={"content": "mine"})]})
        with pytest.raises(ConflictError):
            import_session(store, "t", text)
        assert_same_events(store.load("t"), [_ev(0, data={"content": "mine"})])

    def test_import_of_malformed_text_raises_codec_error_and_stores_nothing(
        self, store: Store
    ) -> None:
        """Text that is not a session raises CodecError; no event is stored."""
        good = _jsonl([_ev(0)])
        with pytest.raises(CodecError):
            import_session(store, "s", good + "{not json}\n")
        assert store.load("s") == []
        assert store.sessions() == []

    # -- errors are StoreError, never the backend's own ---------------------------------------

    @pytest.mark.parametrize(
        "session_id",
        [
            "",
            "with space",
            "ünïcødé-日本",
            "a/b\\c",
            "'; DROP TABLE events; --",
            "%_*?",
            "x" * 1000,
            "nul\x00inside",
        ],
    )
    def test_any_str_session_id_round_trips_or_raises_store_error(
        self, store: Store, session_id: str
    ) -> None:
        """An awkward session id either works like any other or is refused with StoreError."""
        _stored_or_store_error(store, session_id, [_ev(0), _ev(1)])

    def test_a_session_id_with_a_lone_surrogate_round_trips_or_raises_store_error(
        self, store: Store
    ) -> None:
        """A str id holding a lone surrogate either works or is refused with StoreError."""
        _stored_or_store_error(store, "lone-\udc80", [_ev(0)])
        for call in (
            lambda: store.load("lone-\udc80"),
            lambda: store.claim("lone-\udc80"),
            lambda: store.delete("lone-\udc80"),
        ):
            with contextlib.suppress(StoreError):
                call()

    def test_a_seq_past_64_bits_round_trips_or_raises_store_error(self, store: Store) -> None:
        """A seq of 2**63 (past what `Event` accepts, so made past its checks) is
        stored or refused with StoreError."""
        _stored_or_store_error(store, "s", [_poisoned(0, "seq")])

    def test_the_largest_64_bit_seq_round_trips(self, store: Store) -> None:
        """Seq 2**63 - 1 loads back as written."""
        events = [_ev(0), _ev(2**63 - 1)]
        store.write({"s": events})
        assert_same_events(store.load("s"), events)

    def test_large_data_round_trips(self, store: Store) -> None:
        """An event with a megabyte of text loads back equal."""
        events = [_ev(0, "tool_result", {"content": "x" * 1_000_000, "tool_call_id": "c"})]
        store.write({"s": events})
        assert_same_events(store.load("s"), events)
