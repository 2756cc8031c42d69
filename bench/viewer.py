"""Benchmark of the viewer's first rows in a real browser (G27).

``viewer.first_rows``: a session of 100,000 events (``--quick``: 10,000) on a
SQLite file, with a compaction every hundred events (a pruned tool result and
a summary of everything before the last ten, each summary covering the one
before: 1,000 of each), as the browser tests make it. ``nous-actor serve``
serves the file in a process of its own; while one busy-loop process per CPU
keeps every CPU busy (each bounded, and killed at the end), headless Chromium
(the system's ``chromium``, driven by Playwright; no browser is downloaded)
opens the session's page. The figure: seconds from the start of the
navigation until the first rows are visible, on a cold server (a fresh one
each time: nothing read yet), the worst of the repeats. The goal: <= 1 s.

Checked before the number counts: the newest event's row is among the first
drawn, and the page then reaches the whole timeline (the counts of summaries).
Context rows: the time until the whole timeline is on the page, and a second
open on the same server (its timeline kept). Without Chromium, Playwright or
the ``serve`` extra the row says why it did not run.

Run alone: ``python -m bench.viewer [--quick]``; or ``python -m bench --only viewer``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from bench import harness as h

__all__ = ["BENCHMARKS", "main"]

GOAL_ID: Final = "G27"
GOAL_S: Final = 1.0
"""Seconds from navigation to the first rows visible, at most."""
EVERY: Final = 100
"""A compaction (a prune and a summary) every this many events."""
WAIT_S: Final = 60.0
"""The bound of every wait (the server's start, the page's rows)."""
BUSY_S: Final = 300.0
"""The longest a busy-loop process lives if it is not killed first."""
BUSY_LOOP: Final = (
    f"import time\nend = time.monotonic() + {BUSY_S}\nwhile time.monotonic() < end:\n    pass\n"
)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _unavailable(why: str) -> h.Section:
    sec = h.Section()
    sec.rows.append(h.info_row("viewer: not run", why))
    sec.notes.append(f"viewer: {why}")
    return sec


def _missing() -> str | None:
    """Why this cannot run here, or ``None``."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install -e '.[test]')"
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return "the viewer needs the serve extra (pip install 'nous-actor[serve]')"
    if _chromium() is None:
        return "no Chromium on this machine (apt-get install chromium)"
    return None


def _session_file(path: Path, events: int) -> int:
    """Write the long session to a SQLite file at ``path``; its event count."""
    from nous_actor import Log, SQLiteStore

    log = Log().append("system_message", {"content": "You are helpful."})
    k = 0
    while log.count() < events:
        n = log.count()
        if n % EVERY == EVERY - 1 and n > 20:
            log = log.append(
                "tool_result", {"content": "[pruned]", "surface_op": ("replace", n - 5, n - 5)}
            )
            log = log.append(
                "system_message", {"content": f"summary {k}", "surface_op": ("replace", 1, n - 10)}
            )
            k += 1
        elif n % 3 == 0:
            log = log.append("user_message", {"content": f"question {n}"})
        elif n % 3 == 1:
            log = log.append("assistant_message", {"content": f"answer {n}"})
        else:
            log = log.append("tool_result", {"content": f"result {n}", "tool_call_id": "c"})
    store = SQLiteStore(path, durability="normal")
    try:
        refused = store.write({"long": log.events()})
        if refused:
            raise RuntimeError(f"the session was not written: {refused}")
    finally:
        store.close()
    return log.count()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _server(db: Path) -> Iterator[str]:
    """``nous-actor serve db`` in a process of its own; its URL once it answers."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nous_actor", "serve", str(db), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                with urllib.request.urlopen(url + "/favicon.ico", timeout=5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the viewer did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=30)


@contextlib.contextmanager
def _busy_cpus() -> Iterator[int]:
    """One bounded busy-loop process per CPU, killed on exit; yields how many."""
    n = os.cpu_count() or 1
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(n)]
    try:
        yield n
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=30)


def _open(browser: Any, url: str, last_seq: int) -> tuple[float, float, list[str]]:
    """Open the session's page: seconds to the first rows visible, to the whole
    timeline on the page, and what went wrong."""
    problems: list[str] = []
    context = browser.new_context(viewport={"width": 1400, "height": 820})
    context.set_default_timeout(WAIT_S * 1000)
    try:
        page = context.new_page()
        page.on("pageerror", lambda exc: problems.append(f"the page's script failed: {exc}"))
        began = time.perf_counter()
        page.goto(url + "/session?id=long", wait_until="commit")
        page.wait_for_selector(".row", state="visible")
        first = time.perf_counter() - began
        if page.locator(f".row[data-seq='{last_seq}']").count() != 1:
            problems.append("the newest event was not among the first rows drawn")
        page.wait_for_selector("#summary:has-text('summaries')")  # (no eval: the policy)
        whole = time.perf_counter() - began
    finally:
        context.close()
    return first, whole, problems


def bench_first_rows(cfg: h.Config) -> h.Section:
    why = _missing()
    if why is not None:
        return _unavailable(why)
    from playwright.sync_api import sync_playwright

    events = cfg.pick(100_000, 10_000)
    repeats = cfg.pick(3, 1)
    chromium = _chromium()
    assert chromium is not None
    sec = h.Section()
    problems: list[str] = []
    firsts: list[float] = []
    wholes: list[float] = []
    warm: list[float] = []
    with tempfile.TemporaryDirectory(prefix="nous-viewer-bench-") as tmp:
        db = Path(tmp) / "long.db"
        count = _session_file(db, events)
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=chromium, args=["--no-sandbox"], timeout=WAIT_S * 1000
            )
            try:
                with _busy_cpus() as cpus:
                    for _ in range(repeats):
                        with _server(db) as url:
                            first, whole, bad = _open(browser, url, count - 1)
                            firsts.append(first)
                            wholes.append(whole)
                            problems += bad
                            again, _, bad = _open(browser, url, count - 1)
                            warm.append(again)
                            problems += bad
                    load = os.getloadavg()[0]
            finally:
                browser.close()
    worst = max(firsts)
    sec.rows.append(
        h.goal_row(
            GOAL_ID,
            f"viewer: a {h.fmt_count(count)}-event session's first rows in Chromium, "
            f"{cpus} busy CPUs (cold server, worst of {repeats})",
            ours=f"{worst:.2f} s",
            baseline=f"median {statistics.median(firsts):.2f} s",
            ratio="-",
            value=worst,
            sense="<=",
            target=GOAL_S,
            goal=f"<= {GOAL_S:g} s",
            unit="s",
            numbers={
                "first_rows_s": firsts,
                "whole_timeline_s": wholes,
                "warm_first_rows_s": warm,
                "events": count,
                "busy_cpus": cpus,
                "load_average": load,
                "problems": problems,
            },
            valid=not problems,
        )
    )
    sec.rows.append(
        h.info_row(
            "viewer: the same page until the whole timeline is on it (counts, spans, surface)",
            f"{max(wholes):.2f} s",
            f"median {statistics.median(wholes):.2f} s",
            "-",
            seconds=wholes,
        )
    )
    sec.rows.append(
        h.info_row(
            "viewer: first rows on a second open (the server keeps the timeline)",
            f"{max(warm):.2f} s",
            f"median {statistics.median(warm):.2f} s",
            "-",
            seconds=warm,
        )
    )
    sec.notes.append(
        f"viewer: the server in a process of its own, {cpus} busy-loop processes beside it "
        f"(load average {load:.1f} at the end); the first rows come from /api/tail, the rest "
        "when the whole timeline is read"
    )
    for problem in problems:
        sec.notes.append(f"viewer: PROBLEM: {problem}")
    return sec


BENCHMARKS: Final[tuple[h.Benchmark, ...]] = (
    h.Benchmark(
        "viewer.first_rows", "a long session's first rows in a real browser", bench_first_rows
    ),
)


def main(argv: list[str] | None = None) -> int:
    return h.run_module(BENCHMARKS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
