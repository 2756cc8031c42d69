"""The viewer over HTTP (Starlette's test client): the list, the timeline, as-of, audit,
bad input, and that it never writes to the store."""

from __future__ import annotations

import hashlib
import json
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("starlette", reason="the viewer needs the serve extra")

from starlette.testclient import TestClient
from viewer_sessions import (
    FORK_THROUGH,
    INNER_SUMMARY_SEQ,
    OUTER_SUMMARY_SEQ,
    PRUNE_SEQ,
    fill,
    long_log,
    sqlite_file,
)

from nous_actor import Log
from nous_actor.core import history
from nous_actor.errors import StoreError
from nous_actor.store import MemoryStore, SQLiteStore
from nous_actor.viewer import ReadOnlyStore, create_app, read_only_sqlite
from nous_actor.viewer.app import WINDOW_MAX
from nous_actor.viewer.server import is_loopback, make_server
from nous_actor.viewer.timeline import MAX_LANES, Timeline


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "sessions.db"
    sqlite_file(path)
    return path


@pytest.fixture
def client(db: Path) -> Iterator[TestClient]:
    store = read_only_sqlite(db)
    try:
        with TestClient(create_app(store)) as c:
            yield c
    finally:
        store.close()


def _rows(client: TestClient, session: str = "chat", lo: int = 0, hi: int = 200) -> list[dict]:
    r = client.get("/api/rows", params={"id": session, "lo": lo, "hi": hi})
    assert r.status_code == 200, r.text
    return r.json()["rows"]


# -- the list ---------------------------------------------------------------------------------


def test_the_list_pages_sorts_and_searches(client: TestClient) -> None:
    """The session list is cut into pages, sorted by any column, filtered by id."""
    by_events = client.get("/api/sessions", params={"sort": "events", "order": "desc"}).json()
    assert [r["session_id"] for r in by_events["rows"]] == ["chat", "chat-fork", "hello"]
    assert by_events["rows"][0]["events"] == OUTER_SUMMARY_SEQ + 1
    by_id = client.get("/api/sessions", params={"sort": "id", "order": "asc", "limit": 2}).json()
    assert [r["session_id"] for r in by_id["rows"]] == ["chat", "chat-fork"]
    assert (by_id["total"], by_id["sessions"]) == (3, 3)
    second = client.get("/api/sessions", params={"sort": "id", "order": "asc", "offset": 2}).json()
    assert [r["session_id"] for r in second["rows"]] == ["hello"]
    found = client.get("/api/sessions", params={"q": "FORK"}).json()
    assert [r["session_id"] for r in found["rows"]] == ["chat-fork"]
    assert (found["total"], found["sessions"]) == (1, 3)


def test_the_list_names_the_holder_of_a_session() -> None:
    """A session some writer holds shows who; the others show no holder."""
    store = MemoryStore()
    fill(store)
    store.claim("chat")
    with TestClient(create_app(store)) as c:
        rows = {r["session_id"]: r for r in c.get("/api/sessions").json()["rows"]}
    assert rows["chat"]["holder"] == "this process"
    assert rows["hello"]["holder"] is None


def test_a_bad_sort_is_a_clear_error(client: TestClient) -> None:
    """An unknown sort key or order is a 400 naming the allowed ones."""
    r = client.get("/api/sessions", params={"sort": "size"})
    assert r.status_code == 400
    assert "last_write" in r.json()["error"]
    assert client.get("/api/sessions", params={"limit": "many"}).status_code == 400


def test_the_page_works_offline(client: TestClient) -> None:
    """The page loads its script and style from the viewer itself, nothing from elsewhere."""
    page = client.get("/").text
    assert 'src="/static/viewer.js"' in page
    assert "http://" not in page
    assert "https://" not in page
    script = client.get("/static/viewer.js")
    assert script.status_code == 200
    assert "EventSource" in script.text
    assert "://" not in script.text
    assert client.get("/static/viewer.css").status_code == 200


# -- one session -----------------------------------------------------------------------------


def test_the_timeline_has_every_event_with_what_hid_it_first(client: TestClient) -> None:
    """Every event is a row in seq order; shadowed ones say which replace hid them first."""
    log = sqlite_log()
    rows = _rows(client)
    assert [r["seq"] for r in rows] == [ev.seq for ev in log.events()]
    for r in rows:
        found = history.shadowed_by(log, r["seq"])
        assert r["shadowed_by"] == (found[0] if found else None)
    assert rows[4]["pruned"] is True
    assert rows[4]["shadowed_by"] == PRUNE_SEQ
    assert rows[PRUNE_SEQ]["kind"] == "prune"
    assert rows[INNER_SUMMARY_SEQ]["shadowed_by"] == OUTER_SUMMARY_SEQ
    assert rows[2]["turn"] == 1
    assert rows[0]["turn"] is None


def sqlite_log() -> Log:
    from viewer_sessions import compacted_log

    return compacted_log()


def test_nested_summaries_nest(client: TestClient) -> None:
    """Each replace is a span over the rows it shadows; a summary of summaries lies outside."""
    spans = client.get("/api/spans", params={"id": "chat", "lo": 0, "hi": 41}).json()
    by_seq = {s["seq"]: s for s in spans["spans"]}
    assert (by_seq[PRUNE_SEQ]["lo"], by_seq[PRUNE_SEQ]["hi"]) == (4, 4)
    assert (by_seq[INNER_SUMMARY_SEQ]["lo"], by_seq[INNER_SUMMARY_SEQ]["hi"]) == (1, 18)
    assert (by_seq[OUTER_SUMMARY_SEQ]["lo"], by_seq[OUTER_SUMMARY_SEQ]["hi"]) == (1, 30)
    lanes = [by_seq[s]["lane"] for s in (PRUNE_SEQ, INNER_SUMMARY_SEQ, OUTER_SUMMARY_SEQ)]
    assert lanes == [0, 1, 2]
    only_tail = client.get("/api/spans", params={"id": "chat", "lo": 31, "hi": 41}).json()
    assert only_tail["spans"] == []


def test_a_fork_names_its_parent_and_what_it_inherited(client: TestClient) -> None:
    """A forked session names the session and seq it came from; the rows it copied say so."""
    meta = client.get("/api/session", params={"id": "chat-fork"}).json()
    assert meta["forked_from"] == {"session_id": "chat", "through_seq": FORK_THROUGH}
    rows = _rows(client, "chat-fork")
    assert [r["inherited"] for r in rows] == [True] * (FORK_THROUGH + 1) + [False]


def test_the_surface_as_of_a_seq_is_what_the_model_saw(client: TestClient) -> None:
    """The surface as of any seq is the rewound log's derived messages."""
    log = sqlite_log()
    for seq in (0, 5, PRUNE_SEQ - 1, PRUNE_SEQ, INNER_SUMMARY_SEQ, OUTER_SUMMARY_SEQ):
        body = client.get("/api/surface", params={"id": "chat", "as_of": seq}).json()
        assert [m["seq"] for m in body["messages"]] == [
            s for s, _ in log.as_of(seq).derive_indexed()
        ]
    now = client.get("/api/surface", params={"id": "chat"}).json()
    assert now["as_of"] == OUTER_SUMMARY_SEQ
    assert [m["seq"] for m in now["messages"]] == [s for s, _ in log.derive_indexed()]
    past = client.get("/api/surface", params={"id": "chat", "as_of": 41})
    assert past.status_code == 400
    assert "past the session's last seq" in past.json()["error"]


def test_a_summary_says_what_it_replaced(client: TestClient) -> None:
    """A replace's audit lists every event it shadows and the summaries it covers."""
    log = sqlite_log()
    info = client.get("/api/event", params={"id": "chat", "seq": OUTER_SUMMARY_SEQ}).json()
    assert info["replaces"]["seqs"] == history.replaced(log, OUTER_SUMMARY_SEQ)
    assert info["replaces"]["nested_replaces"] == [PRUNE_SEQ, INNER_SUMMARY_SEQ]
    prune = client.get("/api/event", params={"id": "chat", "seq": PRUNE_SEQ}).json()
    assert prune["replaces"]["pruned_original"] == 4


def test_an_event_says_what_shadowed_it(client: TestClient) -> None:
    """An event's audit lists every replace that shadows it, the first one apart."""
    info = client.get("/api/event", params={"id": "chat", "seq": 4}).json()
    assert info["shadowed_by"] == [PRUNE_SEQ, INNER_SUMMARY_SEQ, OUTER_SUMMARY_SEQ]
    assert info["first_shadowed_by"] == PRUNE_SEQ
    assert info["event"]["data"]["tool_call_id"] == "c0"
    visible = client.get("/api/event", params={"id": "chat", "seq": 0}).json()
    assert visible["shadowed_by"] == []
    assert visible["first_shadowed_by"] is None


def test_a_long_session_is_read_a_window_at_a_time() -> None:
    """A window of rows is bounded, and the spans over it are the innermost lanes plus a count."""
    log = long_log(3000, 100)
    store = MemoryStore()
    store.write({"long": log.events()})
    with TestClient(create_app(store)) as c:
        meta = c.get("/api/session", params={"id": "long"}).json()
        assert meta["rows"] == log.count()
        assert meta["summaries"] > 20
        body = c.get("/api/rows", params={"id": "long", "lo": 0, "hi": 10**6}).json()
        assert len(body["rows"]) == WINDOW_MAX
        spans = c.get("/api/spans", params={"id": "long", "lo": 30, "hi": 60}).json()
        assert len({s["lane"] for s in spans["spans"]}) == MAX_LANES
        assert spans["more"] > 0
        jump = c.get("/api/rows", params={"id": "long", "seq": 2500, "hi": 0}).json()
        assert jump["lo"] == 2500


def test_the_timeline_follows_appends_without_a_refold() -> None:
    """Events added to a timeline later shadow exactly what a fresh one would."""
    log = sqlite_log()
    events = log.events()
    grown = Timeline("chat", events[:20])
    grown.extend(events[20:])
    fresh = Timeline("chat", events)
    assert grown.first_shadow == fresh.first_shadow
    assert grown.rows(0, 41) == fresh.rows(0, 41)


# -- bad input, and never a write ------------------------------------------------------


def test_an_unknown_session_is_a_clear_page(client: TestClient) -> None:
    """An unknown or invalid session id is a 404 page naming the problem, not a traceback."""
    r = client.get("/session", params={"id": "nope"})
    assert r.status_code == 404
    assert "no session &#x27;nope&#x27;" in r.text
    assert "Traceback" not in r.text
    bad = client.get("/session", params={"id": " padded "})
    assert bad.status_code == 404
    assert "whitespace" in bad.text
    assert client.get("/api/session", params={"id": "nope"}).status_code == 404
    assert client.get("/api/event", params={"id": "chat", "seq": 99}).status_code == 404
    assert client.get("/session").status_code == 400
    assert client.get("/nowhere").status_code == 404


def test_a_failing_store_is_a_clear_page(db: Path) -> None:
    """A store that fails while serving gives a 503 saying so, never a traceback."""
    store = read_only_sqlite(db)
    with TestClient(create_app(store)) as c:
        store.close()
        page = c.get("/session", params={"id": "chat"})
        assert page.status_code == 503
        assert "closed" in page.text
        assert c.get("/api/sessions").status_code == 503


def test_the_viewer_only_answers_reads(client: TestClient) -> None:
    """Anything but GET is refused."""
    for method in ("POST", "PUT", "DELETE"):
        r = client.request(method, "/api/session", params={"id": "chat"})
        assert r.status_code == 405


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_serving_leaves_the_database_file_unchanged(db: Path) -> None:
    """Reading every page leaves the file byte for byte as it was."""
    before = _digest(db)
    store = read_only_sqlite(db)
    with TestClient(create_app(store)) as c:
        for path in ("/", "/api/sessions", "/session?id=chat", "/api/rows?id=chat"):
            assert c.get(path).status_code == 200
        c.get("/api/event", params={"id": "chat", "seq": OUTER_SUMMARY_SEQ})
    store.close()
    assert _digest(db) == before


def test_the_store_refuses_writes_in_python_and_in_sqlite(db: Path) -> None:
    """The wrapper refuses every write, and its SQLite connections are read-only too."""
    store = read_only_sqlite(db)
    try:
        with pytest.raises(StoreError, match="never writes"):
            store.write({"chat": []})
        with pytest.raises(StoreError, match="never writes"):
            store.claim("chat")
        assert isinstance(store.inner, SQLiteStore)
        with pytest.raises(StoreError, match=r"readonly|read-only"):
            store.inner.claim("chat")
    finally:
        store.close()


def test_a_foreign_file_is_refused_unchanged(tmp_path: Path) -> None:
    """Another application's SQLite file is refused and left as it was."""
    foreign = tmp_path / "other.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.commit()
    conn.close()
    before = _digest(foreign)
    with pytest.raises(StoreError, match="another application"):
        read_only_sqlite(foreign)
    assert _digest(foreign) == before
    assert isinstance(ReadOnlyStore(MemoryStore()).index(), list)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nous_actor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_serve_refuses_what_it_cannot_open(tmp_path: Path) -> None:
    """``serve`` of a missing or foreign file fails with one line, before listening."""
    missing = _cli("serve", str(tmp_path / "missing.db"))
    assert missing.returncode == 1
    assert missing.stderr.startswith("nous-actor: no database at")
    assert "Traceback" not in missing.stderr
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    foreign = _cli("serve", str(text))
    assert foreign.returncode == 1
    assert "not a SQLite database" in foreign.stderr
    assert text.read_text() == "hello\n"
    bad_port = _cli("serve", str(text), "--port", "0")
    assert bad_port.returncode == 2
    assert "a port is from 1 to 65535" in bad_port.stderr


def test_serve_says_why_it_cannot_listen_in_one_line(db: Path) -> None:
    """A port in use, or a host that is not this machine's: one line on standard error
    saying what to change, nothing on standard output (it said it was serving, then
    uvicorn's own error line, then told to pick another port for a bad host too)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        in_use = _cli("serve", str(db), "--port", str(port))
    assert in_use.returncode == 1
    assert in_use.stdout == ""
    assert in_use.stderr == (
        f"nous-actor: could not listen on 127.0.0.1:{port}: the port is in use; "
        "pick another --port\n"
    )
    for host, says in (("no.such.host.invalid", "--host"), ("192.0.2.1", "pick another --host")):
        bad = _cli("serve", str(db), "--host", host, "--port", str(_free_port()))
        assert bad.returncode == 1
        assert bad.stdout == ""
        assert bad.stderr.count("\n") == 1
        assert bad.stderr.startswith(f"nous-actor: could not listen on {host}:")
        assert says in bad.stderr


def test_importing_the_library_leaves_the_viewer_out() -> None:
    """``import nous_actor`` imports neither the viewer nor its web stack."""
    code = (
        "import sys, nous_actor\n"
        "loaded = [m for m in ('nous_actor.viewer', 'starlette', 'uvicorn') if m in sys.modules]\n"
        "print(loaded)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def test_serve_without_the_extra_says_how_to_get_it(db: Path) -> None:
    """Without the web stack installed, ``serve`` names the extra to install."""
    code = (
        "import sys\n"
        "sys.modules['starlette'] = None  # as if not installed\n"
        "from nous_actor.cli import main\n"
        f"sys.exit(main(['serve', {str(db)!r}]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 1
    assert "pip install 'nous-actor[serve]'" in out.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_serves_the_store_on_loopback(db: Path) -> None:
    """``nous-actor serve`` says where it listens, on 127.0.0.1, answers there, and
    stops cleanly on Ctrl-C while a live feed is open."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nous_actor", "serve", str(db), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert (
            line
            == f"nous-actor: serving {db} read-only at http://127.0.0.1:{port}/ (Ctrl-C stops)\n"
        )
        deadline = time.monotonic() + 30
        while True:  # until the server accepts (bounded)
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/api/sessions", timeout=5
                ) as r:
                    body = json.loads(r.read())
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        assert sorted(row["session_id"] for row in body["rows"]) == ["chat", "chat-fork", "hello"]
        live = urllib.request.urlopen(f"http://127.0.0.1:{port}/api/live?id=chat", timeout=10)
        assert live.readline() == b"retry: 2000\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert err == ""
        assert b'"the server stopped"' in live.read()
        live.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def test_a_loopback_server_answers_only_loopback_names(db: Path) -> None:
    """Served on loopback, the viewer refuses a request addressed to another host name
    (a page elsewhere reaching it through a DNS name it controls)."""
    store = read_only_sqlite(db)
    try:
        app = make_server(store).config.app
        with TestClient(app, base_url="http://127.0.0.1:8470") as c:
            assert c.get("/api/sessions").status_code == 200
        with TestClient(app, base_url="http://localhost:8470") as c:
            assert c.get("/").status_code == 200
        with TestClient(app, base_url="http://rebound.example:8470") as c:
            assert c.get("/api/sessions").status_code == 400
    finally:
        store.close()


# -- headers and hosts -----------------------------------------------------------------------

SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def _secured(response: Any) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert response.headers.get(name) == value, (response.url, name, response.headers)


def test_every_response_carries_the_security_headers(db: Path) -> None:
    """Pages, the API, static files, errors and refusals: each says the page may load
    only from the viewer, may not be framed, is not sniffed and sends no referrer."""
    store = read_only_sqlite(db)
    try:
        app = make_server(store).config.app
        with TestClient(app, base_url="http://127.0.0.1:8470") as c:
            answers = [
                c.get("/"),
                c.get("/session", params={"id": "chat"}),
                c.get("/session", params={"id": "nope"}),
                c.get("/session"),
                c.get("/api/sessions"),
                c.get("/api/session", params={"id": "chat"}),
                c.get("/api/rows", params={"id": "chat"}),
                c.get("/api/tail", params={"id": "chat"}),
                c.get("/api/spans", params={"id": "chat"}),
                c.get("/api/event", params={"id": "chat", "seq": 0}),
                c.get("/api/surface", params={"id": "chat"}),
                c.get("/api/rows", params={"id": "chat", "lo": "x"}),
                c.get("/static/viewer.js"),
                c.get("/static/viewer.css"),
                c.get("/static/nothing.js"),
                c.get("/favicon.ico"),
                c.get("/nowhere"),
                c.post("/api/sessions"),
            ]
            assert {r.status_code for r in answers} == {200, 204, 400, 404, 405}
            for r in answers:
                _secured(r)
        with TestClient(app, base_url="http://rebound.example:8470") as c:
            refused = c.get("/")
            assert refused.status_code == 400
            _secured(refused)
    finally:
        store.close()


def test_the_live_feed_carries_the_security_headers(db: Path) -> None:
    store = read_only_sqlite(db)
    port = _free_port()
    server = make_server(store, port=port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:  # bounded
            assert time.monotonic() < deadline, "the server did not start"
            assert thread.is_alive(), "the server did not start"
            time.sleep(0.01)
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/live?id=chat", timeout=10
        ) as live:
            for name, value in SECURITY_HEADERS.items():
                assert live.headers.get(name) == value
            assert live.readline() == b"retry: 2000\n"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        store.close()
    assert not thread.is_alive()


LOOPBACK_BINDS = ["127.0.0.1", "127.0.0.2", "127.255.255.254", "localhost", "::1", "[::1]",
                  "::ffff:127.0.0.1", "::ffff:7f00:2", "[::ffff:127.0.0.1]"]  # fmt: skip
OTHER_BINDS = ["0.0.0.0", "::", "192.0.2.7", "::ffff:192.0.2.7", "10.0.0.1", "example.org"]


@pytest.mark.parametrize("host", LOOPBACK_BINDS)
def test_a_server_on_any_loopback_address_answers_only_loopback_names(db: Path, host: str) -> None:
    """Bound to any loopback address (IPv4, IPv6, IPv4-mapped IPv6), the viewer checks
    the Host header as it does on 127.0.0.1: loopback names and addresses only."""
    assert is_loopback(host)
    store = read_only_sqlite(db)
    try:
        app = make_server(store, host=host).config.app
        for base in ("http://127.0.0.1:8470", "http://localhost", "http://127.0.0.2:1",
                     "http://[::1]:8470", "http://[::ffff:7f00:1]:8470"):  # fmt: skip
            with TestClient(app, base_url=base) as c:
                assert c.get("/api/sessions").status_code == 200, base
        for base in ("http://rebound.example:8470", "http://127.0.0.1.example",
                     "http://192.0.2.7:8470", "http://[::ffff:192.0.2.7]"):  # fmt: skip
            with TestClient(app, base_url=base) as c:
                assert c.get("/api/sessions").status_code == 400, base
    finally:
        store.close()


@pytest.mark.parametrize("host", OTHER_BINDS)
def test_a_server_on_another_address_answers_any_name(db: Path, host: str) -> None:
    assert not is_loopback(host)
    store = read_only_sqlite(db)
    try:
        app = make_server(store, host=host).config.app
        with TestClient(app, base_url="http://viewer.example:8470") as c:
            assert c.get("/api/sessions").status_code == 200
    finally:
        store.close()


@given(st.ip_addresses())
def test_loopback_is_what_the_address_says_also_when_mapped(address: Any) -> None:
    mapped = address.ipv4_mapped if address.version == 6 else None
    expected = address.is_loopback or (mapped is not None and mapped.is_loopback)
    assert is_loopback(str(address)) == expected
    if address.version == 4:
        assert is_loopback(f"::ffff:{address}") == address.is_loopback
    else:
        assert is_loopback(f"[{address}]") == expected


@pytest.mark.parametrize(("host", "warned"), [("127.0.0.2", False), ("::ffff:127.0.0.1", False),
                                              ("0.0.0.0", True)])  # fmt: skip
def test_serve_warns_about_a_bind_beyond_loopback_by_the_same_rule(
    db: Path, host: str, warned: bool
) -> None:
    """The command's note about a bind anyone can reach follows `is_loopback`: served on
    each address (then stopped with Ctrl-C), it says so for all interfaces only."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        try:
            probe.bind((host, 0))
        except OSError:
            pytest.skip(f"this machine cannot bind {host}")
        port = probe.getsockname()[1]
    command = ["serve", str(db), "--host", host, "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "nous_actor", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("nous-actor: serving ")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert ("whoever reaches this machine" in err) == warned, err


# -- the newest rows first ------------------------------------------------------------------


class _CountingStore(SQLiteStore):
    """A SQLiteStore that records the seq each read of events starts from."""

    reads: list[int]

    def load_since(self, session_id: str, from_seq: int) -> list[Any]:
        self.reads.append(from_seq)
        return super().load_since(session_id, from_seq)


def test_the_page_and_its_newest_rows_do_not_wait_for_the_whole_timeline(
    tmp_path: Path,
) -> None:
    """Opening a long session reads only its newest events; the whole timeline is
    read when first asked for (the meta, a window, the surface), not before."""
    log = long_log(5000, 100)
    store = _CountingStore(tmp_path / "long.db")
    store.reads = []
    store.write({"long": log.events()})
    with store, TestClient(create_app(store)) as c:
        assert c.get("/session", params={"id": "long"}).status_code == 200
        tail = c.get("/api/tail", params={"id": "long", "n": 50}).json()
        assert store.reads == [log.count() - 50]  # the newest 50, nothing else
        assert tail["ready"] is False
        total = log.count()
        assert (tail["lo"], tail["older"], tail["next_seq"]) == (None, True, total)
        assert [r["row"] for r in tail["rows"]] == list(range(50))  # counted from the first
        assert [r["seq"] for r in tail["rows"]] == list(range(total - 50, total))
        assert c.get("/session", params={"id": "nope"}).status_code == 404
        assert c.get("/api/tail", params={"id": "nope"}).status_code == 404
        assert c.get("/api/tail", params={"id": "long", "n": 0}).status_code == 400
        whole = c.get("/api/rows", params={"id": "long", "lo": total - 50, "hi": total}).json()
        assert store.reads[-1] == 0  # now the timeline is read
        assert strip_turn(whole["rows"]) == strip_turn(tail["rows"])
        again = c.get("/api/tail", params={"id": "long", "n": 50}).json()
        assert (again["ready"], again["lo"], again["older"]) == (True, total - 50, True)
        assert again["rows"] == whole["rows"]


def strip_turn(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as the newest rows read alone give them: no turn, no row number."""
    return [{k: v for k, v in r.items() if k not in ("turn", "row")} for r in rows]


@st.composite
def _logs(draw: st.DrawFn) -> Log:
    """Messages, turns and replaces (prunes, summaries, summaries of summaries) at random."""
    log = Log().append("system_message", {"content": "start"})
    for _ in range(draw(st.integers(1, 60))):
        n = log.count()
        kind = draw(st.sampled_from(["user", "assistant", "replace", "turn"]))
        if kind == "replace" and n > 2:
            start = draw(st.integers(1, n - 1))
            stop = draw(st.integers(start, n - 1))
            data = {"content": f"summary {n}", "surface_op": ("replace", start, stop)}
            log = log.append("system_message", data)
        elif kind == "turn":
            log = log.append("turn_start", {"turn_id": f"t{n}", "owner": "o", "policy": "enqueue"})
        else:
            role = "assistant" if kind == "assistant" else "user"
            log = log.append(f"{role}_message", {"content": f"{role} {n}"})
    return log


@given(_logs(), st.integers(1, 80), st.integers(0, 10))
def test_the_newest_rows_read_alone_are_the_whole_timeline_s(
    log: Log, n: int, dropped: int
) -> None:
    """Folded on their own, the newest n events are shadowed, greyed, badged and placed
    as in the whole timeline (what shadows an event comes after it), also with seqs
    dropped before them (a snapshot)."""
    events = log.events()
    kept = [ev for ev in events if not (0 < ev.seq <= dropped and ev.surface_op is None)]
    fresh, built = MemoryStore(), MemoryStore()
    for store in (fresh, built):
        store.write({"s": kept})
    with TestClient(create_app(fresh)) as c, TestClient(create_app(built)) as whole:
        tail = c.get("/api/tail", params={"id": "s", "n": n}).json()
        assert tail["ready"] is False
        rows = whole.get("/api/rows", params={"id": "s", "lo": 0, "hi": 1000}).json()["rows"]
    top = kept[-1].seq + 1
    newest = [r for r in rows if r["seq"] >= top - n]
    assert strip_turn(tail["rows"]) == strip_turn(newest)
    assert tail["older"] == (top > n)
