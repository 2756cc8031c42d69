"""The library never configures logging: a bare program sees nothing below a warning."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import sys
    from nous_actor import Compactor, Session, SQLiteStore
    {setup}
    store = SQLiteStore(sys.argv[1])
    s = Session.start("chat", store=store)
    for i in range(8):
        s.append("user_message", {{"content": f"q{{i}} " * 20}}).get()
    s.compact(Compactor(budget=10, keep_recent=2, summarise=lambda ms: "sum")).get()
    s.append_or_log("no_such_type", {{}}).get()  # a warning: log.event_dropped
    s.stop()
    s = Session.start("chat", store=store)  # an info: session.recovered
    s.stop()
    print("done")
    """
)


def run(tmp_path: Path, setup: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT.format(setup=setup), str(tmp_path / "q.db")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_a_program_that_configured_nothing_sees_only_warnings_on_stderr(tmp_path: Path) -> None:
    """No info events anywhere, nothing but the program's own output on stdout; the
    dropped event's warning reaches stderr."""
    done = run(tmp_path)
    assert done.stdout == "done\n"
    assert "log.event_dropped" in done.stderr
    assert "session.recovered" not in done.stderr
    assert "log.compacted" not in done.stderr


def test_configured_stdlib_logging_sees_the_info_events(tmp_path: Path) -> None:
    """logging.basicConfig(level=INFO) is enough to see every event, key=value."""
    done = run(tmp_path, "import logging; logging.basicConfig(level=logging.INFO)")
    assert done.stdout == "done\n"
    assert "session.recovered" in done.stderr
    assert "reason='loaded_from_store'" in done.stderr
    assert "log.compacted" in done.stderr


def test_configured_structlog_gets_the_events_through_its_own_pipeline(tmp_path: Path) -> None:
    """An application that configured structlog receives the events as structlog events."""
    setup = textwrap.dedent(
        """
        import structlog
        structlog.configure(processors=[structlog.processors.JSONRenderer()])
        """
    )
    done = run(tmp_path, setup)
    assert '"event": "session.recovered"' in done.stdout
    assert '"event": "log.event_dropped"' in done.stdout
    assert done.stdout.endswith("done\n")


def test_each_configuration_of_structlog_gets_the_events_logged_under_it() -> None:
    """A module's logger is bound once per structlog configuration: events logged after
    `structlog.configure` (a capture, a level filter, the previous configuration back)
    go through that configuration's pipeline, never an earlier one's."""
    import logging

    import structlog
    from structlog.testing import LogCapture

    from nous_actor._log import get_logger

    log = get_logger("nous_actor.test")
    before = structlog.get_config()
    first, second = LogCapture(), LogCapture()
    try:
        structlog.configure(processors=[first])
        log.info("one", n=1)
        structlog.configure(
            processors=[second],
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        )
        log.info("filtered out", n=2)
        log.warning("two", n=3)
        structlog.configure(
            processors=[first], wrapper_class=structlog.make_filtering_bound_logger(logging.NOTSET)
        )
        log.debug("three", n=4)
    finally:
        structlog.configure(**before)
    assert [(e["event"], e["n"]) for e in first.entries] == [("one", 1), ("three", 4)]
    assert [(e["event"], e["n"]) for e in second.entries] == [("two", 3)]
