"""The viewer on a PostgreSQL store: the same pages, read-only, and a live tail across
connections (the store's LISTEN/NOTIFY watch)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("starlette", reason="the viewer needs the serve extra")

from starlette.testclient import TestClient
from viewer_sessions import OUTER_SUMMARY_SEQ, PRUNE_SEQ, compacted_log, fill

from nous_actor.errors import StoreError
from nous_actor.viewer import ReadOnlyStore, create_app


def test_the_viewer_reads_a_postgres_store(pg_stores: Any) -> None:
    """The list, a timeline and an audit come from PostgreSQL as from SQLite."""
    fill(pg_stores())
    store = ReadOnlyStore(pg_stores(create=False))
    with TestClient(create_app(store)) as c:
        listed = c.get("/api/sessions", params={"sort": "id", "order": "asc"}).json()
        assert [r["session_id"] for r in listed["rows"]] == ["chat", "chat-fork", "hello"]
        rows = c.get("/api/rows", params={"id": "chat"}).json()["rows"]
        assert rows[4]["shadowed_by"] == PRUNE_SEQ
        info = c.get("/api/event", params={"id": "chat", "seq": OUTER_SUMMARY_SEQ}).json()
        assert info["replaces"]["count"] == 32
    with TestClient(create_app(store)) as c:  # a fresh viewer: the newest rows first
        assert c.get("/session", params={"id": "chat"}).status_code == 200
        tail = c.get("/api/tail", params={"id": "chat", "n": 10}).json()
        assert tail["ready"] is False
        assert [r["seq"] for r in tail["rows"]] == list(
            range(OUTER_SUMMARY_SEQ - 9, OUTER_SUMMARY_SEQ + 1)
        )
        assert [r["shadowed_by"] for r in tail["rows"]] == [
            r["shadowed_by"] for r in rows[OUTER_SUMMARY_SEQ - 9 :]
        ]
        assert c.get("/session", params={"id": "nope"}).status_code == 404
    with pytest.raises(StoreError, match="never writes"):
        store.write({"chat": []})


def test_the_live_tail_follows_another_writer(pg_stores: Any) -> None:
    """A watch through the read-only store sees an event another connection commits."""
    writer = pg_stores()
    fill(writer)
    store = ReadOnlyStore(pg_stores(create=False))
    log = compacted_log().append("user_message", {"content": "later"})
    with store.watch("chat", OUTER_SUMMARY_SEQ + 1, timeout=30) as feed:
        assert writer.write({"chat": log.events()[-1:]}) == {}
        ev = feed.get(timeout=30)
    assert (ev.seq, ev.data["content"]) == (OUTER_SUMMARY_SEQ + 1, "later")
