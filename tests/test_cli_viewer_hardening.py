"""The command and the viewer against hostile or unusual input: terminal control sequences
in content, page placeholders in session ids, records missing fields, numbers SQLite cannot
store, a snapshot by another process, a stale session list, bracketed and IPv4-mapped
addresses, Ctrl-C while the command starts, and more session pages than a browser keeps
connections to one host."""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bounds import BOUND, INTERPRETER_BOUND, end_child
from cli_process import run
from viewer_sessions import OUTER_SUMMARY_SEQ, compacted_log, sqlite_file

from nous_actor import Log
from nous_actor.cli import _console, _reading
from nous_actor.store import MemoryStore, SQLiteStore

HOSTILE = "\x1b]0;PWNED-TITLE\x07\x1b[2J\x1b[Hall good\rFAKE \x9b31m eight-bit CSI \x7f \x08 back"
"""Content that, printed raw, sets the terminal's title, clears it, overwrites a row (CR),
rings the bell, and starts an 8-bit control sequence (C1), with DEL and backspace."""

RAW_CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
"""What must never reach the terminal raw (the newline ends lines of the command's own)."""


def _imported(tmp_path: Path, messages: list[dict[str, Any]]) -> Path:
    db = tmp_path / "t.db"
    out = run("import", str(db), "chat", stdin=json.dumps(messages))
    assert out.returncode == 0, out.stderr
    return db


# -- 2: terminal control sequences ---------------------------------------------------------


def test_show_escapes_terminal_control_characters(tmp_path: Path) -> None:
    """``show`` (messages, events, JSON) writes no control character of the content raw:
    each is a visible escape such as ``\\x1b``."""
    db = _imported(
        tmp_path,
        [
            {"role": "user", "content": "harmless question"},
            {"role": "tool", "tool_call_id": "c1", "content": HOSTILE},
            {"role": "assistant", "content": "ok\x1b[8m hidden text"},
        ],
    )
    for flags in ([], ["--events"], ["--json"]):
        out = run("show", str(db), "chat", *flags)
        assert out.returncode == 0, out.stderr
        assert RAW_CONTROLS.search(out.stdout) is None, (flags, out.stdout)
    shown = run("show", str(db), "chat").stdout
    assert "\\x1b]0;PWNED-TITLE\\x07" in shown
    assert "good\\rFAKE" in shown
    data = json.loads(run("show", str(db), "chat", "--json").stdout)
    assert data[1]["content"] == HOSTILE  # the JSON still says exactly what is stored


def test_the_console_makes_controls_visible() -> None:
    """The helpers every printed table goes through: C0 (but the newline, shown as
    ``\\n``), DEL and C1 become escapes; other text is left alone."""
    assert (
        _console._short("a\x1bb\x07c\rd\x7fe\x9bf\ng", 80) == "a\\x1bb\\x07c\\rd\\x7fe\\x9bf\\ng"
    )
    assert _console._short("é ünïcode → ok", 80) == "é ünïcode → ok"
    table = _console._table(["id"], [["x\x1b[2Jy"]])
    assert "\x1b" not in table
    assert "x\\x1b[2Jy" in table
    said = _reading._said(
        {"content": "\x1b]0;t\x07hi", "tool_calls": [], "tool_call_id": "\x1b[2J"}
    )
    assert RAW_CONTROLS.search(_console._short(said, 90)) is None


# -- 4: audit of a compaction record that lacks fields ------------------------------------


def test_audit_reads_a_compaction_record_that_lacks_fields(tmp_path: Path) -> None:
    """A compaction record without ``estimate_before`` or ``summarised`` is listed with
    what it has; text and JSON, status 0, no traceback."""
    db = tmp_path / "s.db"
    lines = [
        {"seq": 0, "type": "user_message", "time": "2026-01-01T00:00:00+00:00",
         "data": {"content": "hi"}},
        {"seq": 1, "type": "step_end", "time": "2026-01-01T00:00:01+00:00",
         "data": {"step": "compaction", "pruned": []}},
    ]  # fmt: skip
    out = run("import", str(db), "chat", stdin="".join(json.dumps(x) + "\n" for x in lines))
    assert out.returncode == 0, out.stderr
    text = run("audit", str(db), "chat", "0")
    assert text.returncode == 0, text.stderr
    assert "Traceback" not in text.stderr
    assert "compactions in session   1" in text.stdout
    assert "seq 1:" in text.stdout
    as_json = run("audit", str(db), "chat", "0", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert len(json.loads(as_json.stdout)["compactions"]) == 1


def test_audit_of_the_viewer_fixture(tmp_path: Path) -> None:
    """The viewer tests' compacted session (its record has no ``summarised``) audits."""
    db = tmp_path / "v.db"
    sqlite_file(db)
    out = run("audit", str(db), "chat", "4")
    assert out.returncode == 0, out.stderr
    assert "estimate 900 -> 300" in out.stdout


# -- 8: numbers SQLite cannot store ---------------------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [
        ["--turns", "99999999999999999999"],
        ["--agents", "99999999999999999999"],
        ["--seed", "99999999999999999999", "--agents", "1", "--turns", "1"],
        ["--seed", "-99999999999999999999", "--agents", "1", "--turns", "1"],
    ],
)
def test_demo_refuses_numbers_sqlite_cannot_store(tmp_path: Path, flags: list[str]) -> None:
    """A whole number beyond SQLite's 64-bit INTEGER is bad usage: status 2, one line."""
    out = run("demo", "--db", str(tmp_path / "d.db"), *flags, "--json", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert "SQLite can store" in out.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "d.db").exists()


def test_a_seq_sqlite_cannot_store_is_refused(tmp_path: Path) -> None:
    """The same for a seq (``show --since``, ``fork --through``)."""
    db = tmp_path / "v.db"
    sqlite_file(db)
    for args in (
        ["show", str(db), "chat", "--since", "99999999999999999999"],
        ["fork", str(db), "chat", "other", "--through", "99999999999999999999"],
    ):
        out = run(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert "Traceback" not in out.stderr


# -- 9: Ctrl-C while the command starts ------------------------------------------------------

_INTERRUPTED_IMPORT = """
import os, signal, sys
from importlib.metadata import entry_points

class Interrupt:
    '''Ctrl-C just as the command's modules are imported.'''
    def find_spec(self, name, path=None, target=None):
        if name == "nous_actor.cli.command":
            os.kill(os.getpid(), signal.SIGINT)
        return None

(script,) = entry_points(group="console_scripts", name="nous-actor")
sys.argv = ["nous-actor", "sessions", "nothing.db"]
sys.meta_path.insert(0, Interrupt())
sys.exit(script.load()())
"""


def test_ctrl_c_while_the_command_starts(tmp_path: Path) -> None:
    """The console script, interrupted while it imports the command: status 130 and the
    documented line, no traceback."""
    out = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_IMPORT],
        capture_output=True,
        text=True,
        timeout=INTERPRETER_BOUND,
        check=False,
        cwd=tmp_path,
    )
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 130, out.stderr
    assert out.stderr.strip() == "nous-actor: interrupted"


def test_the_console_script_still_runs() -> None:
    """The console script's entry point runs the command (``--help``: status 0)."""
    code = (
        "import sys\n"
        "from importlib.metadata import entry_points\n"
        "(script,) = entry_points(group='console_scripts', name='nous-actor')\n"
        "sys.argv = ['nous-actor', '--help']\n"
        "sys.exit(script.load()())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=INTERPRETER_BOUND,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "usage: nous-actor" in out.stdout


# -- the viewer over HTTP ------------------------------------------------------------------

pytest.importorskip("starlette", reason="the viewer needs the serve extra")

from starlette.testclient import TestClient  # noqa: E402

from nous_actor.viewer import create_app, read_only_sqlite  # noqa: E402
from nous_actor.viewer.source import SessionIndex  # noqa: E402

# -- 5: placeholders in session ids ----------------------------------------------------------


@pytest.mark.parametrize(
    "sid", ["x{{preload}}", "y{{session}}z", "{{title}}{{view}}", 'q"><b>{{session}}']
)
def test_a_session_id_holding_the_page_placeholders(sid: str) -> None:
    """The page of a session whose id holds ``{{preload}}`` or ``{{session}}`` says the
    id once per place, escaped, and nothing is substituted twice."""
    store = MemoryStore()
    assert store.write({sid: Log().append("user_message", {"content": "hi"}).events()}) == {}
    with TestClient(create_app(store)) as c:
        r = c.get("/session", params={"id": sid})
    assert r.status_code == 200
    body = re.search(r"<body[^>]*>", r.text)
    assert body is not None
    assert body.group(0) == (
        f'<body data-view="session" data-session="{html.escape(sid, quote=True)}">'
    )
    title = re.search(r"<title>(.*?)</title>", r.text, re.S)
    assert title is not None
    assert title.group(1) == f"Session {html.escape(sid)} · nous_actor"
    assert r.text.count('<link id="tail"') == 1
    assert "<b>" not in r.text


# -- 3: a snapshot by another process ---------------------------------------------------------


def test_the_viewer_forgets_what_a_snapshot_dropped(tmp_path: Path) -> None:
    """After another process's snapshot the viewer shows the retained events only: a
    dropped seq is the app's own 404."""
    db = tmp_path / "s.db"
    log = sqlite_file(db)
    store = read_only_sqlite(db)
    try:
        with TestClient(create_app(store)) as c:
            assert c.get("/api/session", params={"id": "chat"}).json()["rows"] == log.count()
            assert c.get("/api/event", params={"id": "chat", "seq": 2}).status_code == 200
            out = run("snapshot", str(db), "chat", "--json")
            assert out.returncode == 0, out.stderr
            retained = json.loads(out.stdout)["retained"]
            assert retained < log.count()
            meta = c.get("/api/session", params={"id": "chat"}).json()
            assert meta["rows"] == retained
            gone = c.get("/api/event", params={"id": "chat", "seq": 2})
            assert gone.status_code == 404
            assert "dropped by a snapshot" in gone.json()["error"]
            rows = c.get("/api/rows", params={"id": "chat", "lo": 0, "hi": 1000}).json()
            assert len(rows["rows"]) == retained
    finally:
        store.close()


# -- 7: Reload reads the list afresh -----------------------------------------------------------


def test_a_fresh_page_of_the_list_reads_the_index_again(tmp_path: Path) -> None:
    """``/api/sessions?fresh=1`` (the Reload button) shows a session written since the
    last read, however young that read is."""
    db = tmp_path / "s.db"
    sqlite_file(db)
    store = read_only_sqlite(db)
    try:
        with TestClient(create_app(store)) as c:
            first = c.get("/api/sessions").json()
            writer = SQLiteStore(db)
            try:
                new = Log().append("user_message", {"content": "x"}).events()
                assert writer.write({"newcomer": new}) == {}
            finally:
                writer.close()
            fresh = c.get("/api/sessions", params={"fresh": "1"}).json()
            assert fresh["sessions"] == first["sessions"] + 1
            assert "newcomer" in [r["session_id"] for r in fresh["rows"]]
    finally:
        store.close()


def test_a_fresh_read_waits_for_one_under_way(tmp_path: Path) -> None:
    """A fresh page asked for while an older read runs reads after it, not before."""
    store = MemoryStore()
    assert store.write({"a": Log().append("user_message", {"content": "x"}).events()}) == {}
    from nous_actor.viewer import ReadOnlyStore

    index = SessionIndex(ReadOnlyStore(store), ttl=3600.0)
    assert index.page().sessions == 1
    assert store.write({"b": Log().append("user_message", {"content": "x"}).events()}) == {}
    assert index.page().sessions == 1  # young: the last read serves
    assert index.page(fresh=True).sessions == 2


# -- 6: serve on a bracketed or IPv4-mapped address --------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _serving(db: Path, host: str, port: int) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "nous_actor", "serve", str(db), "--host", host, "--port",
         str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(BOUND)
            except subprocess.TimeoutExpired:
                pass
        end_child(proc)
        if proc.stderr is not None:
            proc.stderr.close()


def _first_line(proc: subprocess.Popen[str], bound: float) -> str:
    """The first line ``proc`` writes to standard output ('' if it ends first); fails
    after ``bound`` seconds."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(bound):
            raise AssertionError(f"no line from the server within {bound} s")
    return proc.stdout.readline()


@pytest.mark.parametrize(
    ("host", "connect"), [("::ffff:127.0.0.1", "127.0.0.1"), ("[::1]", "[::1]")]
)
def test_serve_on_a_mapped_or_bracketed_address(tmp_path: Path, host: str, connect: str) -> None:
    """``serve --host ::ffff:127.0.0.1`` and ``--host [::1]`` listen; the line that says
    so comes once the server listens (the page answers at once)."""
    if ":1]" in host and not _ipv6_loopback():
        pytest.skip("no IPv6 loopback on this machine")
    db = tmp_path / "s.db"
    sqlite_file(db)
    port = _free_port()
    with _serving(db, host, port) as proc:
        assert proc.stdout is not None
        line = _first_line(proc, INTERPRETER_BOUND)
        assert "serving" in line, (line, proc.wait(BOUND), proc.stderr and proc.stderr.read())
        assert "[[" not in line
        with urllib.request.urlopen(f"http://{connect}:{port}/api/sessions", timeout=BOUND) as r:
            assert json.loads(r.read())["sessions"] == 3
        proc.send_signal(signal.SIGINT)
        assert proc.wait(BOUND) == 0


def test_serve_on_an_address_of_no_interface_blames_the_address(tmp_path: Path) -> None:
    """An address this machine does not have is an address error, not the port's."""
    db = tmp_path / "s.db"
    sqlite_file(db)
    out = run("serve", str(db), "--host", "192.0.2.1", "--port", str(_free_port()))
    assert out.returncode == 1
    assert "--host" in out.stderr
    assert "--port" not in out.stderr
    assert "serving" not in out.stdout


# -- 1 and 7 in a real browser ----------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
WAIT_MS = 10_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "Playwright is not installed (pip install -e '.[test]')"
    if not os.path.exists(CHROMIUM):
        missing = "no Chromium on this machine (apt-get install chromium)"
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the browser tests must run in CI: {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], timeout=WAIT_MS * 3)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    from test_viewer_browser import Served

    db = tmp_path / "sessions.db"
    sqlite_file(db)
    s = Served(db)
    try:
        yield db, s.url
    finally:
        s.stop()


def _expect() -> Any:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    return expect


def test_eight_session_pages_of_one_browser_all_load(
    browser: Any, served: tuple[Path, str]
) -> None:
    """Eight session pages open at once in one browser (which keeps six connections to a
    host) all draw their rows and follow the session; the list page loads beside them."""
    db, url = served
    expect = _expect()
    context = browser.new_context()
    context.set_default_timeout(WAIT_MS)
    try:
        pages = []
        for _ in range(8):
            p = context.new_page()
            p.goto(url + "/session?id=chat")
            expect(p.locator(".row").first).to_be_visible()
            pages.append(p)
        listing = context.new_page()
        listing.goto(url + "/")
        expect(listing.locator("#sessions tbody tr")).to_have_count(3)
        _set_hidden(pages[0], True)  # as if another tab were in front of it
        assert pages[0].evaluate("live.es === null && !live.on")  # its feed let go
        log = compacted_log().append("user_message", {"content": "a live question"})
        writer = SQLiteStore(db)
        try:
            assert writer.write({"chat": log.events()[-1:]}) == {}
        finally:
            writer.close()
        grown = f"{OUTER_SUMMARY_SEQ + 2} events"
        for p in (pages[1], pages[-1]):  # one with a live feed, one waiting for one
            expect(p.locator("#summary")).to_contain_text(grown)
        expect(pages[0].locator("#summary")).not_to_contain_text(grown)
        _set_hidden(pages[0], False)  # in front again: it catches up
        expect(pages[0].locator("#summary")).to_contain_text(grown)
    finally:
        context.close()


def _set_hidden(page: Any, hidden: bool) -> None:
    """Tell ``page`` it is hidden (or shown), as a browser does when another tab is put
    in front of it (headless Chromium shows every page)."""
    page.evaluate(
        """(hidden) => {
            Object.defineProperty(document, "hidden", { value: hidden, configurable: true });
            Object.defineProperty(document, "visibilityState",
                { value: hidden ? "hidden" : "visible", configurable: true });
            document.dispatchEvent(new Event("visibilitychange"));
        }""",
        hidden,
    )


def test_reload_shows_a_session_written_since(browser: Any, served: tuple[Path, str]) -> None:
    """The list's Reload shows a session another process wrote after the page loaded,
    at the first press."""
    db, url = served
    expect = _expect()
    context = browser.new_context()
    context.set_default_timeout(WAIT_MS)
    try:
        p = context.new_page()
        p.goto(url + "/")
        expect(p.locator("#sessions tbody tr")).to_have_count(3)
        writer = SQLiteStore(db)
        try:
            new = Log().append("user_message", {"content": "x"}).events()
            assert writer.write({"newcomer": new}) == {}
        finally:
            writer.close()
        p.click("#reload")
        expect(p.locator("#sessions tbody tr")).to_have_count(4)
    finally:
        context.close()


def test_a_store_without_a_count_is_read_anew_once_it_says_it_shrank() -> None:
    """A store the viewer cannot count cheaply (here a `MemoryStore`) tells by its index
    entry: after a drop, the dropped seq is a 404 too."""
    store = MemoryStore()
    log = compacted_log()
    assert store.write({"chat": log.events()}) == {}
    with TestClient(create_app(store)) as c:
        assert c.get("/api/event", params={"id": "chat", "seq": 2}).status_code == 200
        store.drop("chat", [2, 3])
        assert c.get("/api/event", params={"id": "chat", "seq": 2}).status_code == 404
        assert c.get("/api/session", params={"id": "chat"}).json()["rows"] == log.count() - 2
