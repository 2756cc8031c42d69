"""The nous-actor command, run through its real entry point in a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest
from cli_process import TIMEOUT, run

from nous_actor import Log, Session, SQLiteStore
from nous_actor.cli import command, main
from nous_actor.core import codec


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database made by a small demo run (shared by the read-only commands)."""
    db = tmp_path_factory.mktemp("cli") / "demo.db"
    out = run(
        "demo", "--db", str(db), "--agents", "3", "--turns", "5", "--crash-rate", "0.1", "--json"
    )
    assert out.returncode == 0, out.stderr
    return db


def test_demo_reports_every_acknowledged_event_present(demo_db: Path) -> None:
    """The demo's JSON report says ok, with every acknowledged event verified in the store."""
    out = run(
        "demo",
        "--db",
        str(demo_db.with_name("again.db")),
        "--agents",
        "2",
        "--turns",
        "3",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] is True
    assert report["verified"] == report["events"] > 0
    assert report["missing"] == []
    assert report["sessions_in_store"] == 2


def test_demo_prints_the_summary_table(tmp_path: Path) -> None:
    """Without --json the demo ends with its table and the OK line."""
    out = run("demo", "--db", str(tmp_path / "t.db"), "--agents", "2", "--turns", "2")
    assert out.returncode == 0, out.stderr
    assert "events acknowledged" in out.stdout
    assert "append latency p50 / p99" in out.stdout
    assert "OK: nothing acknowledged was lost." in out.stdout
    assert "100%" in out.stderr  # the progress bar


def test_sessions_lists_the_demo_sessions(demo_db: Path) -> None:
    """sessions lists every session with its counts; --json gives the same as data."""
    out = run("sessions", str(demo_db), "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["session_id"] for r in rows] == ["agent-0", "agent-1", "agent-2"]
    assert all(r["count"] >= r["retained"] > 0 for r in rows)


def test_show_surface_matches_the_store(demo_db: Path) -> None:
    """show --json gives the session's derive_indexed, as the store has it."""
    out = run("show", str(demo_db), "agent-0", "--json")
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    with SQLiteStore(demo_db) as store:
        log = Log()
        for ev in store.load("agent-0"):
            log = log.append_event(ev)
    assert [m["seq"] for m in shown] == [seq for seq, _ in log.derive_indexed()]


def test_show_events_since_and_as_of(demo_db: Path) -> None:
    """show --since and --as-of restrict the events shown."""
    since = json.loads(run("show", str(demo_db), "agent-1", "--since", "5", "--json").stdout)
    assert since
    assert all(e["seq"] >= 5 for e in since)
    past = run("show", str(demo_db), "agent-1", "--as-of", "3", "--events", "--json")
    assert [e["seq"] for e in json.loads(past.stdout)] == [0, 1, 2, 3]


def test_export_then_import_round_trips(demo_db: Path, tmp_path: Path) -> None:
    """export writes JSON Lines that import reads back into an equal session."""
    exported = run("export", str(demo_db), "agent-2")
    assert exported.returncode == 0, exported.stderr
    other = tmp_path / "copy.db"
    imported = run("import", str(other), "copy", stdin=exported.stdout)
    assert imported.returncode == 0, imported.stderr
    with SQLiteStore(other) as store:
        copy = store.load("copy")
    assert copy == codec.loads(exported.stdout).events()


def test_import_into_an_existing_session_fails_cleanly(demo_db: Path) -> None:
    """Importing over an existing session exits 1 with a message, no traceback."""
    exported = run("export", str(demo_db), "agent-2").stdout
    out = run("import", str(demo_db), "agent-2", stdin=exported)
    assert out.returncode == 1
    assert "already has events" in out.stderr
    assert "Traceback" not in out.stderr


def test_fork_then_snapshot_then_audit(tmp_path: Path) -> None:
    """fork copies a prefix with its seqs; snapshot drops shadowed events; audit explains."""
    db = tmp_path / "h.db"
    log = (
        Log()
        .append("user_message", {"content": "q"})
        .append("assistant_message", {"content": "a"})
        .append("system_message", {"content": "sum", "surface_op": ("replace", 0, 1)})
    )
    with SQLiteStore(db) as store:
        store.write({"s": log.events()})
    fork = run("fork", str(db), "s", "f", "--through", "1", "--json")
    assert fork.returncode == 0, fork.stderr
    assert json.loads(fork.stdout)["count"] == 3  # seqs 0, 1 and the fork record
    audit = json.loads(run("audit", str(db), "s", "0", "--json").stdout)
    assert audit["shadowed_by"] == [2]
    snap = json.loads(run("snapshot", str(db), "s", "--json").stdout)
    assert snap == {"session_id": "s", "dropped": 2, "retained": 1}
    with SQLiteStore(db) as store:
        assert [e.seq for e in store.load("f")][:2] == [0, 1]
        assert [e.seq for e in store.load("s")] == [2]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("sessions", "missing.db"), 1, "no database at"),
        (("show", "{db}", "nope"), 1, "no session 'nope'"),
        (("show", "{db}", "agent-0", "--since", "x"), 2, "expected a seq"),
        (("show", "{db}", "agent-0", "--as-of", "99999"), 1, "past the head"),
        (("audit", "{db}", "agent-0", "99999"), 1, "no retained event"),
        (("fork", "{db}", "agent-0", "agent-1", "--through", "0"), 1, "already has events"),
        (("demo", "--agents", "0"), 2, "expected a number >= 1"),
        (("demo", "--crash-rate", "2"), 2, "0 <= rate < 1"),
        (("import", "{db}", "new"), 1, "nothing on standard input"),
        (("bogus",), 2, "invalid choice"),
    ],
)
def test_bad_input_gets_a_message_and_a_nonzero_exit(
    demo_db: Path, args: tuple[str, ...], code: int, message: str
) -> None:
    """Bad arguments and missing things: a clear one-line message, the right exit code."""
    out = run(*(a.format(db=demo_db) for a in args), stdin="")
    assert out.returncode == code, (out.stdout, out.stderr)
    assert message in out.stderr
    assert "Traceback" not in out.stderr


# -- closed standard streams -------------------------------------------------------------


def run_closed(*args: str, close: tuple[int, ...]) -> subprocess.CompletedProcess[str]:
    """Run the command with the standard file descriptors ``close`` closed, as ``<&-``/``>&-``."""

    def close_fds() -> None:
        for fd in close:
            os.close(fd)

    return subprocess.run(
        [sys.executable, "-m", "nous_actor", *args],
        stdin=subprocess.DEVNULL if 0 not in close else None,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        preexec_fn=close_fds,
    )


def one_error_line(err: str, *words: str) -> None:
    """``err`` is exactly one line, a ``nous-actor:`` error mentioning every word."""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("nous-actor: "), err
    for word in words:
        assert word in lines[0], err


def test_import_with_stdin_closed_fails_cleanly(tmp_path: Path) -> None:
    """``import DB ID <&-``: a one-line error, exit 1, and no database made."""
    db = tmp_path / "e.db"
    out = run_closed("import", str(db), "x", close=(0,))
    assert out.returncode == 1
    one_error_line(out.stderr, "standard input is closed")
    assert not db.exists()


@pytest.mark.parametrize(
    "args",
    [
        ("export", "{db}", "agent-0"),
        ("sessions", "{db}", "--json"),
        ("sessions", "{db}"),
        ("show", "{db}", "agent-0"),
        ("show", "{db}", "agent-0", "--events", "--json"),
        ("audit", "{db}", "agent-0", "0"),
        ("tour",),
    ],
)
def test_stdout_closed_is_an_error(demo_db: Path, args: tuple[str, ...]) -> None:
    """``>&-``: a command that has output to write says it cannot, and exits 1."""
    out = run_closed(*(a.format(db=demo_db) for a in args), close=(1,))
    assert out.returncode == 1, out.stderr
    one_error_line(out.stderr, "standard output is closed")


def test_stdout_and_stderr_closed_still_exit_nonzero(demo_db: Path) -> None:
    """With nowhere to write even the error, the exit status still says it failed."""
    out = run_closed("sessions", str(demo_db), close=(1, 2))
    assert out.returncode == 1


def test_stdout_closed_under_a_running_interpreter(demo_db: Path) -> None:
    """fd 1 closed after Python set up ``sys.stdout``: the same one-line error, exit 1."""
    code = (
        "import os, sys; os.close(1); "
        "from nous_actor.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "show", str(demo_db), "agent-0"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert out.returncode == 1
    one_error_line(out.stderr, "standard output is closed")


def test_stdout_that_refuses_writes_is_an_error(demo_db: Path) -> None:
    """fd 1 open read-only: the write fails; one line, exit 1, nothing about it at exit."""
    with open(os.devnull, "rb") as read_only:
        out = subprocess.run(
            [sys.executable, "-m", "nous_actor", "sessions", str(demo_db)],
            stdout=read_only,
            stderr=subprocess.PIPE,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    assert out.returncode == 1
    one_error_line(out.stderr, "cannot write to standard output")


# -- errors: one line, and what to do ----------------------------------------------------


def test_conflict_is_exactly_one_line(tmp_path: Path) -> None:
    """A session another writer holds: one line on stderr (no log record before it)."""
    db = tmp_path / "c.db"
    with SQLiteStore(db) as store:
        store.write({"s": Log().append("user_message", {"content": "hi"}).events()})
    with SQLiteStore(db) as store:
        held = Session.start("s", store=store)
        try:
            for args in (
                ("snapshot", str(db), "s"),
                ("fork", str(db), "s", "t", "--through", "0"),
            ):
                out = run(*args)
                assert out.returncode == 1
                one_error_line(out.stderr, "ConflictError", "live writer")
        finally:
            held.stop()


def test_a_session_a_running_app_holds_is_snapshotted_and_forked_through_it(
    tmp_path: Path,
) -> None:
    """A session a running app's registry holds (here, this process's): ``snapshot`` and
    ``fork`` from the command line go to that process, as any worker's calls do, where
    they were refused; the session stays where it was."""
    from nous_actor import Replace, Sessions

    db = tmp_path / "live.db"
    with Sessions(SQLiteStore(db), timeout=TIMEOUT) as app:
        chat = app.open("s")
        for n in range(4):
            chat.append("user_message", {"content": f"m{n}"}).get()
        summary = {"content": "summary", "surface_op": Replace(0, 2)}
        chat.append("system_message", summary).get()
        out = run("snapshot", str(db), "s")
        assert out.returncode == 0, out.stderr
        assert "dropped 3 shadowed events, 2 retained" in out.stdout
        assert [e.seq for e in chat.events().get()] == [3, 4]  # dropped by the holder
        out = run("fork", str(db), "s", "t", "--through", "4")
        assert out.returncode == 0, out.stderr
        assert app.live() == ["s"]  # never moved
        assert [m.content for m in app.read("t").derive_messages().get()] == ["summary", "m3"]


def test_unknown_session_says_how_many_more_exist(tmp_path: Path) -> None:
    """Of 25 sessions the message names 10 and says 15 more exist."""
    db = tmp_path / "many.db"
    log = Log().append("user_message", {"content": "hi"})
    with SQLiteStore(db) as store:
        store.write({f"s{i:02d}": log.events() for i in range(25)})
    out = run("show", str(db), "nope")
    assert out.returncode == 1
    one_error_line(out.stderr, "no session 'nope'", "s00", "s09", "and 15 more")
    assert "s10" not in out.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("sessions", "{dir}"),
        ("show", "{dir}", "x"),
        ("export", "{dir}", "x"),
        ("import", "{dir}", "x"),
        ("demo", "--db", "{dir}"),
        ("demo", "--db", "{dir}", "--keep"),
    ],
)
def test_a_directory_is_not_a_database(tmp_path: Path, args: tuple[str, ...]) -> None:
    """A directory given as the database: said so, exit 1, nothing suggested that would fail."""
    out = run(*(a.format(dir=tmp_path) for a in args), stdin="[]")
    assert out.returncode == 1
    one_error_line(out.stderr, "is a directory")
    assert "demo --db" not in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_show_events_prints_tool_calls(tmp_path: Path) -> None:
    """An assistant tool call shows its calls in every view, never ``null``; a custom call
    shows its name and input."""
    db = tmp_path / "t.db"
    call = {"id": "c1", "name": "grep", "arguments": '{"q": "leak"}'}
    custom = {"id": "c2", "type": "custom", "custom": {"name": "shell", "input": "ls"}}
    log = (
        Log()
        .append("user_message", {"content": "find the leak"})
        .append("assistant_message", {"content": None, "tool_calls": [call, custom]})
        .append("tool_result", {"content": "3 matches", "tool_call_id": "c1"})
    )
    with SQLiteStore(db) as store:
        store.write({"s": log.events()})
    for view in ((), ("--events",), ("--since", "1")):
        out = run("show", str(db), "s", *view)
        assert out.returncode == 0, out.stderr
        row = next(line for line in out.stdout.splitlines() if line.startswith("1 "))
        assert 'grep({"q": "leak"}), shell(ls)' in row
        assert "null" not in row


def _snapshotted(db: Path) -> None:
    """Session ``s``: seqs 0..3 summarised by seq 4, then a turn; snapshot drops 0..3."""
    log = Log()
    for i in range(4):
        log = log.append("user_message", {"content": f"m{i}"})
    log = log.append("system_message", {"content": "sum", "surface_op": ("replace", 0, 3)})
    log = log.append("turn_start", {}).append("user_message", {"content": "q"})
    log = log.append("turn_end", {})
    with SQLiteStore(db) as store:
        store.write({"s": log.events()})
    snap = run("snapshot", str(db), "s", "--json")
    assert json.loads(snap.stdout)["dropped"] == 4


NOTE = "note: 4 events were dropped by a snapshot; history before seq 4 is partial"


@pytest.mark.parametrize(
    "args",
    [
        ("show", "{db}", "s", "--as-of", "5"),
        ("show", "{db}", "s", "--as-of", "5", "--events", "--json"),
        ("fork", "{db}", "s", "f", "--through", "4"),
        ("audit", "{db}", "s", "5"),
        ("audit", "{db}", "s", "5", "--json"),
    ],
)
def test_history_after_a_snapshot_is_said_to_be_partial(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    """as-of, fork and audit on a snapshotted session say that older history is gone."""
    db = tmp_path / "p.db"
    _snapshotted(db)
    out = run(*(a.format(db=db) for a in args))
    assert out.returncode == 0, out.stderr
    assert out.stderr == f"nous-actor: {NOTE}\n"
    if "--json" in args:
        json.loads(out.stdout)  # the note stays out of the data


def test_no_partial_note_without_a_gap(tmp_path: Path) -> None:
    """No note when the history asked about is whole (the gap lies elsewhere, or nowhere)."""
    db = tmp_path / "w.db"
    with SQLiteStore(db) as store:
        store.write({"s": Log().append("user_message", {"content": "hi"}).events()})
    for args in (("show", str(db), "s", "--as-of", "0"), ("audit", str(db), "s", "0")):
        out = run(*args)
        assert out.returncode == 0, out.stderr
        assert out.stderr == ""


# -- what the demo may replace -----------------------------------------------------------


def _foreign_sqlite(path: Path) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.close()


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("kind", ["text", "sqlite"])
def test_demo_leaves_a_file_it_did_not_make_unchanged(
    tmp_path: Path, kind: str, keep: bool
) -> None:
    """A text file or another application's SQLite database: refused, byte for byte intact."""
    db = tmp_path / "precious.db"
    if kind == "text":
        db.write_text("my notes\n")
    else:
        _foreign_sqlite(db)
    before = db.read_bytes()
    out = run("demo", "--db", str(db), "--agents", "1", "--turns", "1", *(["--keep"] * keep))
    assert out.returncode == 1
    one_error_line(out.stderr, str(db), "left unchanged", "--db")
    assert out.stdout == ""
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.db"]


def test_demo_refuses_a_store_it_did_not_make_unless_kept(tmp_path: Path) -> None:
    """Our own store with a user's session: replaced only by name (--keep adds to it)."""
    db = tmp_path / "mine.db"
    run("import", str(db), "chat", stdin='[{"role": "user", "content": "hi"}]')
    out = run("demo", "--db", str(db), "--agents", "1", "--turns", "1")
    assert out.returncode == 1
    one_error_line(out.stderr, "did not make", "--keep")
    with SQLiteStore(db) as store:
        assert store.sessions() == ["chat"]
    kept = run("demo", "--db", str(db), "--agents", "1", "--turns", "1", "--keep", "--json")
    assert kept.returncode == 0, kept.stderr
    with SQLiteStore(db) as store:
        assert store.sessions() == ["agent-0", "chat"]
    again = run("demo", "--db", str(db), "--agents", "1", "--turns", "1")
    assert again.returncode == 1  # still the user's store, demo sessions and all


def test_demo_kept_in_a_store_never_writes_into_a_session_of_its_own_name(
    tmp_path: Path,
) -> None:
    """``--keep`` on a store holding a session the demo would write (``agent-0``, the
    user's own here): refused, the store unchanged (the demo appended its turn to it)."""
    db = tmp_path / "mine.db"
    run("import", str(db), "agent-0", stdin='[{"role": "user", "content": "my private chat"}]')
    out = run("demo", "--db", str(db), "--agents", "1", "--turns", "1", "--keep")
    assert out.returncode == 1
    one_error_line(out.stderr, "already holds session 'agent-0'", "--db")
    with SQLiteStore(db) as store:
        assert [e.data["content"] for e in store.load("agent-0")] == ["my private chat"]


def test_demo_replaces_its_own_database(tmp_path: Path) -> None:
    """A database an earlier demo made is replaced (with forks of its sessions in it)."""
    db = tmp_path / "demo.db"
    first = run("demo", "--db", str(db), "--agents", "2", "--turns", "1", "--json")
    assert first.returncode == 0, first.stderr
    fork = run("fork", str(db), "agent-0", "agent-0-b", "--through", "0")
    assert fork.returncode == 0, fork.stderr
    second = run("demo", "--db", str(db), "--agents", "1", "--turns", "1", "--json")
    assert second.returncode == 0, second.stderr
    with SQLiteStore(db) as store:
        assert store.sessions() == ["agent-0"]


def test_demo_leaves_a_log_file_it_did_not_write_unchanged(tmp_path: Path) -> None:
    """``DB.log`` is the demo's log: someone else's file of that name is refused too."""
    db = tmp_path / "d.db"
    log = tmp_path / "d.db.log"
    log.write_text("my diary\n")
    out = run("demo", "--db", str(db), "--agents", "1", "--turns", "1")
    assert out.returncode == 1
    one_error_line(out.stderr, "d.db.log", "left unchanged")
    assert log.read_text() == "my diary\n"
    assert not db.exists()


def test_demo_crashes_amid_pipelined_appends(tmp_path: Path) -> None:
    """Some crashes land while appends are in flight: the calls queued behind a crash
    reach the restarted session (none is refused, so none is sent again), and acknowledged
    events (also those acknowledged after their session crashed) are all in the store."""
    out = run(
        "demo",
        "--db",
        str(tmp_path / "c.db"),
        "--agents",
        "3",
        "--turns",
        "8",
        "--crash-rate",
        "0.15",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] is True
    assert report["crashes_in_flight"] > 0
    assert report["retries"] == 0
    assert report["verified"] == report["events"]
    assert report["restarts"] == report["crashes"]


# -- sessions: from the index ------------------------------------------------------------


def test_sessions_lists_a_corrupt_session_on_its_own_row(tmp_path: Path) -> None:
    """One damaged session: every other is listed, the damaged one says why, exit 1."""
    db = tmp_path / "k.db"
    log = Log().append("user_message", {"content": "hi"}).append("turn_end", {})
    with SQLiteStore(db) as store:
        store.write({sid: log.events() for sid in ("a", "b", "c")})
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE events SET time = 'garbage' WHERE session_id = 'b'")
    out = run("sessions", str(db))
    assert out.returncode == 1
    one_error_line(out.stderr, "1 of 3 sessions could not be read (b)")
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[2:]}
    assert sorted(rows) == ["a", "b", "c"]
    assert "unreadable" in rows["b"]
    assert rows["a"].split()[1:3] == ["2", "2"]
    listed = json.loads(run("sessions", str(db), "--json").stdout)
    assert [(r["session_id"], r["error"] is None) for r in listed] == [
        ("a", True),
        ("b", False),
        ("c", True),
    ]


def test_sessions_loads_no_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The listing comes from the index: it works with loading every session made to fail."""
    db = tmp_path / "i.db"
    log = Log()
    for i in range(5):
        log = log.append("user_message", {"content": f"m{i}"})
    log = log.append("system_message", {"content": "sum", "surface_op": ("replace", 0, 3)})
    with SQLiteStore(db) as store:
        store.write({"s": log.events(), "t": log.events()[:2]})
        store.drop("s", [0, 1])

    def no_load(self: SQLiteStore, session_id: str) -> NoReturn:
        raise AssertionError(f"sessions loaded {session_id!r} in full")

    monkeypatch.setattr(SQLiteStore, "load", no_load)
    assert main(["sessions", str(db), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["session_id"], r["retained"], r["count"]) for r in listed] == [
        ("s", 4, 6),
        ("t", 2, 2),
    ]
    assert all(r["last_time"] and r["error"] is None for r in listed)


def test_reading_an_empty_file_leaves_it_empty(tmp_path: Path) -> None:
    """``sessions`` on a 0-byte file: no database there, and the file is not made into one."""
    db = tmp_path / "empty.db"
    db.write_bytes(b"")
    out = run("sessions", str(db))
    assert out.returncode == 1
    one_error_line(out.stderr, "no database at", "empty file")
    assert db.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]


def test_version_prints_the_package_version() -> None:
    """nous-actor --version prints the installed version and exits 0."""
    from nous_actor import __version__

    done = subprocess.run(
        [sys.executable, "-m", "nous_actor", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout.strip() == f"nous-actor {__version__}"


# -- FILE or DSN: what names a PostgreSQL server -------------------------------------------

EXPORT_V1 = '[{"role": "user", "content": "hi"}]'


@pytest.mark.parametrize(
    ("db", "is_dsn"),
    [
        ("postgresql://me@db/agents", True),
        ("postgres:///agents?host=/run/postgresql", True),
        ("host=/run/postgresql dbname=agents", True),
        ("dbname=agents", True),
        ("host = db  port=5433 user='a b' password=p\\ q sslmode=require", True),
        ("chat.db", False),
        ("a=b.db", False),
        ("./host=x", False),
        ("host=x junk", False),
        ("host=x dbnme=y", False),
    ],
)
def test_a_dsn_is_a_uri_or_libpq_key_value_pairs(db: str, is_dsn: bool) -> None:
    """FILE|DSN: a postgresql:// URI or key/value pairs of libpq keywords name a server;
    anything else (./host=x included) is a file."""
    assert command._is_dsn(db) is is_dsn


def test_a_misspelt_key_value_dsn_is_refused_and_no_file_is_made(tmp_path: Path) -> None:
    """'host=... dbnme=...' names the keyword libpq does not know and says how to name such
    a file, instead of making a SQLite file called that."""
    out = run("import", "host=db dbnme=agents", "chat", stdin=EXPORT_V1, cwd=tmp_path)
    assert out.returncode == 1
    assert "'dbnme' is not a libpq keyword" in out.stderr
    assert "'./host=db dbnme=agents' for a SQLite file" in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_file_whose_name_reads_as_a_dsn_is_named_with_a_dot_slash(tmp_path: Path) -> None:
    """./dbname=x is a SQLite file in the current folder."""
    out = run("import", "./dbname=x", "chat", stdin=EXPORT_V1, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "dbname=x").is_file()
    store = SQLiteStore(tmp_path / "dbname=x", create=False)
    try:
        assert store.sessions() == ["chat"]
    finally:
        store.close()


def test_bench_runs_the_suite_of_the_checkout(tmp_path: Path) -> None:
    """``nous-actor bench`` finds the benchmark suite of the checkout it is installed
    from (it once looked one folder too deep and always said it was missing)."""
    done = run("bench", "--", "--list", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "processes.mix" in done.stdout


def test_langgraph_shows_a_thread_s_checkpoints_and_messages(tmp_path: Path) -> None:
    """``langgraph`` prints the checkpoint tree (the fork and the head marked) and the head's
    messages, or those of ``--checkpoint``, as ``--json`` too; a thread that is not there,
    a session that is no thread and an unknown checkpoint are one clear line each."""
    pytest.importorskip("langgraph", reason="the thread is written by the LangGraph saver")
    from test_viewer_langgraph import write_thread

    db = tmp_path / "thread.db"
    listed = write_thread(db)
    head = listed[0][0]
    out = run("langgraph", str(db), "chat")
    assert out.returncode == 0, out.stderr
    assert f"head {head}" in out.stdout
    assert "fork x2" in out.stdout
    assert '-> add({"a": 2, "b": 3})' in out.stdout
    assert out.stdout.rstrip().endswith("echo: a branch")
    earlier, held = listed[-3]
    out = run("langgraph", str(db), "langgraph/chat", "--checkpoint", earlier, "--json")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert [m["content"] for m in body["messages"]] == held
    assert body["checkpoint"]["id"] == earlier
    assert {r["id"] for r in body["checkpoints"]} == {cid for cid, _ in listed}
    assert body["thread"]["forks"] == 1
    store = SQLiteStore(db)
    try:
        plain = Log().append("user_message", {"content": "hi"}).events()
        assert store.write({"langgraph/plain": plain}) == {}
    finally:
        store.close()
    for args, words in [
        (("other",), "no LangGraph thread 'other'"),
        (("plain",), "'langgraph/plain' holds no LangGraph checkpoint"),
        (("langgraph/chat", "--checkpoint", "nope"), "no checkpoint 'nope'"),
    ]:
        out = run("langgraph", str(db), *args)
        assert out.returncode == 1, out.stdout
        one_error_line(out.stderr, *words.split())
