"""Sessions on Ray across two nodes on one machine: a node that dies (every process of it
SIGKILLed) takes its shard with it; Ray restarts the shard on the other node, and its
sessions recover there from the store, through the same handles.

The second node is a real Ray node (its own raylet, object store and workers; see
``RayCluster.add_node``). The cluster learns of its death only through its health
checks, as it would of a machine that is gone: that, with Ray's defaults, takes some
15 s, and bounds how soon the sessions are back.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from functools import partial
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from postgres_server import Server
    from ray_cluster import RayScope

ray = pytest.importorskip("ray") if not os.environ.get("CI") else __import__("ray")
psycopg = pytest.importorskip("psycopg") if not os.environ.get("CI") else __import__("psycopg")

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from nous_actor import CallTimeout, ConflictError, SessionStopped  # noqa: E402
from nous_actor.cluster.ray import RaySessions  # noqa: E402
from nous_actor.store.postgres import PostgresStore  # noqa: E402

BACK_WITHIN = 120.0
"""Seconds from the node's death to the sessions answering again, at most (the health
checks take ~15 s of it with Ray's defaults; a new worker on a loaded machine, more)."""


def _head_node_id() -> str:
    heads = [n["NodeID"] for n in ray.nodes() if "node:__internal_head__" in n["Resources"]]
    assert len(heads) == 1, heads
    return heads[0]


def _watch_death(node: Any, killed_at: float, out: list[float]) -> None:
    """Append to ``out`` how long after ``killed_at`` the cluster counted ``node`` dead."""
    while time.monotonic() - killed_at < BACK_WITHIN:
        if not node.alive():
            out.append(time.monotonic() - killed_at)
            return
        time.sleep(0.1)


def _stored(pg_server: Server, schema: str, sid: str) -> list[Any]:
    with PostgresStore(pg_server.dsn, schema=schema) as store:
        return list(store.load(sid))


def test_a_killed_nodes_sessions_come_back_on_another_node_from_the_store(
    ray_scope: RayScope, pg_server: Server, schema: str
) -> None:
    """A shard runs on node B with three sessions: acknowledged appends, then more in
    flight, and node B dies. Ray restarts the shard on the head; the same handles reach
    it, every acknowledged append is in the store exactly once and in order, and the
    sessions take new appends."""
    node = ray_scope.add_node(resources={"node_b": 1})
    head = _head_node_id()
    assert node.node_id != head
    sessions = RaySessions(
        partial(PostgresStore, pg_server.dsn, schema=schema, lease=3.0),
        shards=1,
        timeout=30,
        actor_options={
            # On node B while it lives, elsewhere after: soft affinity. Ray places an
            # actor that asks for no resources at all on a random node, whatever its
            # scheduling strategy, so the shard asks for a little memory.
            "memory": 1 << 20,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=True),
        },
    )
    try:
        before = sessions.shard_info()[0]
        assert before["node_id"] == node.node_id
        assert before["pid"] in node.processes()
        assert not set(node.processes()) & set(ray_scope.cluster.processes())
        handles = [sessions.open(f"node-{uuid.uuid4().hex[:8]}-{i}") for i in range(3)]
        acked: dict[str, list[str]] = {h.session_id: [] for h in handles}
        sent: dict[str, list[str]] = {h.session_id: [] for h in handles}

        def append(h: Any, text: str) -> Any:
            sent[h.session_id].append(text)
            return h.append("user_message", {"content": text})

        for h in handles:  # acknowledged before the node dies
            for text, fut in [
                (t, append(h, t)) for t in (f"{h.session_id}:{n}" for n in range(30))
            ]:
                fut.get()
                acked[h.session_id].append(text)
        in_flight = [
            (h, text, append(h, text))
            for h in handles
            for text in (f"{h.session_id}:late-{n}" for n in range(20))
        ]

        killed_at = node.kill()
        assert node.processes() == {}
        marked_dead: list[float] = []
        watcher = threading.Thread(
            target=_watch_death, args=(node, killed_at, marked_dead), daemon=True
        )
        watcher.start()

        crashed = 0
        for h, text, fut in in_flight:  # each answered: applied, or lost with the node
            try:
                fut.get(timeout=BACK_WITHIN)
            except SessionStopped:  # SessionCrashed: in flight when the shard was lost
                crashed += 1
            else:
                acked[h.session_id].append(text)

        # The same handles, until the restarted shard answers (recovering from the store).
        answered: dict[str, float] = {}
        failures: dict[str, int] = {}
        while len(answered) < len(handles):
            now = time.monotonic()
            if now - killed_at > BACK_WITHIN:
                raise AssertionError(
                    f"sessions {sorted(set(acked) - set(answered))} not back within "
                    f"{BACK_WITHIN:g} s of the node's death ({failures} failed calls)"
                )
            for h in handles:
                if h.session_id in answered:
                    continue
                try:
                    h.count().get(timeout=10)
                except (SessionStopped, ConflictError, CallTimeout) as exc:
                    key = type(exc).__name__
                    failures[key] = failures.get(key, 0) + 1
                    time.sleep(0.05)
                else:
                    answered[h.session_id] = time.monotonic() - killed_at
        first = min(answered.values())
        watcher.join(BACK_WITHIN)
        assert marked_dead, "the node is still counted alive"
        print(
            f"\nnode killed -> marked dead {marked_dead[0]:.1f} s, first answered "
            f"call {first:.1f} s, all {max(answered.values()):.1f} s; in flight: "
            f"{len(in_flight) - crashed} acknowledged, {crashed} crashed; "
            f"failed probes: {failures}"
        )

        after = sessions.shard_info()[0]
        assert after["node_id"] == head  # restarted on the node still alive
        assert after["pid"] != before["pid"]
        assert not node.alive()

        for h in handles:
            sid = h.session_id
            stored = _stored(pg_server, schema, sid)
            contents = [ev.data["content"] for ev in stored]
            assert [ev.seq for ev in stored] == list(range(len(stored)))
            assert len(contents) == len(set(contents)), "an append stored twice"
            assert set(acked[sid]) <= set(contents), "an acknowledged append lost"
            assert set(contents) <= set(sent[sid]), "an append nobody made"
            order = {text: i for i, text in enumerate(contents)}
            assert [order[t] for t in acked[sid]] == sorted(order[t] for t in acked[sid])
            # The restarted shard serves what it recovered, and takes new appends.
            assert [e.data["content"] for e in h.events().get()] == contents
            seq = h.append("user_message", {"content": f"{sid}:after"}).get().seq
            assert seq == len(stored)
            assert [ev.data["content"] for ev in _stored(pg_server, schema, sid)] == [
                *contents,
                f"{sid}:after",
            ]
    finally:
        sessions.shutdown()
