"""The nous-actor command, run through its real entry point in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nous_actor import Log, SQLiteStore, codec

TIMEOUT = 120


def run(
    *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nous_actor", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=cwd,
    )


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
