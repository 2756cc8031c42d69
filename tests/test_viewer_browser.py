"""The viewer in a real browser: headless Chromium (Debian's package) driven by Playwright.

Skipped, with the reason, where Chromium or Playwright is missing; in CI (``CI`` set)
a missing browser fails instead, since ``.ci/run`` installs it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("starlette", reason="the viewer needs the serve extra")

from viewer_sessions import (
    INNER_SUMMARY_SEQ,
    OUTER_SUMMARY_SEQ,
    PRUNE_SEQ,
    compacted_log,
    long_log,
    sqlite_file,
)

from nous_actor.store import SQLiteStore
from nous_actor.viewer import read_only_sqlite
from nous_actor.viewer.server import make_server

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WAIT_MS = 10_000  # the bound of every wait on the page
SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "images" / "viewer-timeline.png"


def _browser_or_skip() -> str:
    missing = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "Playwright is not installed (pip install -e '.[test]')"
    if CHROMIUM is None:
        missing = "no Chromium on this machine (apt-get install chromium)"
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the browser tests must run in CI: {missing}")
        pytest.skip(missing)
    assert CHROMIUM is not None
    return CHROMIUM


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = _browser_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # Root (CI's user) cannot use Chromium's sandbox.
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox"], timeout=WAIT_MS * 3)
        try:
            yield b
        finally:
            b.close()


class Served:
    """A viewer of a SQLite file, served by uvicorn on a thread (loopback, a free port)."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.store = read_only_sqlite(db)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)  # connections wait in the backlog until uvicorn accepts them
        port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.server = make_server(self.store, port=port, where=db.name)  # no tmp path
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.store.close()
        self.sock.close()
        assert not self.thread.is_alive(), "the server did not stop"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    db = tmp_path / "sessions.db"
    sqlite_file(db)
    s = Served(db)
    try:
        yield s
    finally:
        s.stop()


CSP = "default-src 'self'; frame-ancestors 'none'"


def _watched(p: Page, errors: list[str]) -> Page:
    """``p``, with its script errors, console errors (a refusal by the content security
    policy among them) and responses without the policy collected in ``errors``."""
    p.on("pageerror", lambda exc: errors.append(f"script: {exc}"))
    p.on(
        "console",
        lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None,
    )

    def check(response: Any) -> None:
        if response.headers.get("content-security-policy") != CSP:
            errors.append(f"no policy on {response.url}")

    p.on("response", check)
    return p


@pytest.fixture
def page(browser: Browser, served: Served) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 820})
    context.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    p = _watched(context.new_page(), errors)
    try:
        yield p
    finally:
        context.close()
    assert errors == [], f"the page failed: {errors}"


@contextlib.contextmanager
def _long_page(browser: Browser, db: Path) -> Iterator[tuple[Served, Page]]:
    """A viewer of ``db`` and a page of a fresh browser context on it (a long session's
    bound on every wait); on the way out both are closed, and the page must not have
    failed."""
    served = Served(db)
    context = browser.new_context(viewport={"width": 1400, "height": 820})
    context.set_default_timeout(WAIT_MS * 3)
    errors: list[str] = []
    try:
        yield served, _watched(context.new_page(), errors)
    finally:
        context.close()
        served.stop()
    assert errors == [], f"the page failed: {errors}"


def _expect() -> Any:
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    return expect


def test_the_list_sorts_and_searches(page: Page, served: Served) -> None:
    """The list shows every session; a header click sorts it, the search box filters it."""
    expect = _expect()
    page.goto(served.url + "/")
    rows = page.locator("#sessions tbody tr")
    expect(rows).to_have_count(3)
    page.locator("th[data-sort=id]").click()
    expect(rows.first.locator("td").first).to_have_text("chat")
    page.locator("th[data-sort=id]").click()
    expect(rows.first.locator("td").first).to_have_text("hello")
    page.locator("#search").fill("fork")
    expect(rows).to_have_count(1)
    expect(rows.first.locator("td").first).to_have_text("chat-fork")
    rows.first.locator("a").click()
    expect(page.locator("#fork")).to_contain_text("forked from chat through seq 12")


def test_the_timeline_of_a_compacted_session(page: Page, served: Served) -> None:
    """Every event is a row; shadowed rows are greyed, not hidden; nested summaries nest."""
    expect = _expect()
    page.goto(served.url + "/session?id=chat")
    row = page.locator
    expect(row(".row")).to_have_count(OUTER_SUMMARY_SEQ + 1)
    expect(row(".row[data-seq='4']")).to_have_class("row shadowed turn")
    expect(row(".row[data-seq='4'] .badge.pruned")).to_be_visible()
    expect(row(".row[data-seq='0']")).not_to_have_class("row shadowed")
    expect(row(f".row[data-seq='{PRUNE_SEQ}'] .badge.prune")).to_be_visible()
    outer = row(f".span[data-seq='{OUTER_SUMMARY_SEQ}']").bounding_box()
    inner = row(f".span[data-seq='{INNER_SUMMARY_SEQ}']").bounding_box()
    prune = row(f".span[data-seq='{PRUNE_SEQ}']").bounding_box()
    assert outer["x"] < inner["x"] < prune["x"]  # the outer summary is drawn outside
    assert outer["height"] > inner["height"] > prune["height"]


def test_as_of_shows_what_the_model_saw(page: Page, served: Served) -> None:
    """Setting the seq box rewinds the surface and the greying to that seq."""
    expect = _expect()
    page.goto(served.url + "/session?id=chat")
    loc = page.locator
    expect(loc("#surface li")).to_have_count(6)
    loc("#asof-seq").fill(str(PRUNE_SEQ - 1))
    loc("#asof-seq").press("Enter")
    expect(loc("#surface-title")).to_contain_text(f"as of seq {PRUNE_SEQ - 1}")
    seen = [s for s, _ in compacted_log().as_of(PRUNE_SEQ - 1).derive_indexed()]
    expect(loc("#surface li")).to_have_count(len(seen))
    expect(loc(".row[data-seq='4']")).not_to_have_class("shadowed")
    expect(loc(f".row[data-seq='{INNER_SUMMARY_SEQ}']")).to_have_class("row future")
    loc("#asof-now").click()
    expect(loc("#surface li")).to_have_count(6)


def test_audit_clicks(page: Page, served: Served) -> None:
    """Clicking a summary shows what it replaced; clicking an event, what shadowed it."""
    expect = _expect()
    page.goto(served.url + "/session?id=chat")
    loc = page.locator
    loc(f".span[data-seq='{OUTER_SUMMARY_SEQ}']").click()
    expect(loc("#detail h2")).to_have_text(f"Event {OUTER_SUMMARY_SEQ}: system_message")
    expect(loc("#detail .replaces")).to_contain_text("it replaced 32 event(s)")
    loc("#detail .replaced a", has_text=str(INNER_SUMMARY_SEQ)).click()
    expect(loc("#detail h2")).to_have_text(f"Event {INNER_SUMMARY_SEQ}: system_message")
    loc(".row[data-seq='4']").click()
    expect(loc("#detail .shadowers")).to_have_text(
        f"{PRUNE_SEQ}, {INNER_SUMMARY_SEQ}, {OUTER_SUMMARY_SEQ}"
    )


def test_a_live_append_appears(page: Page, served: Served) -> None:
    """An event committed by a writer shows up on an open page without a reload."""
    expect = _expect()
    page.goto(served.url + "/session?id=chat")
    loc = page.locator
    expect(loc("#status")).to_have_text("live")
    log = compacted_log().append("user_message", {"content": "a live question"})
    writer = SQLiteStore(served.db)
    try:
        assert writer.write({"chat": log.events()[-1:]}) == {}
    finally:
        writer.close()
    expect(loc(f".row[data-seq='{OUTER_SUMMARY_SEQ + 1}']")).to_contain_text("a live question")
    expect(loc("#surface li").last).to_contain_text("a live question")
    expect(loc("#summary")).to_contain_text(f"{OUTER_SUMMARY_SEQ + 2} events")


def test_a_screenshot_of_the_timeline(page: Page, served: Served, tmp_path: Path) -> None:
    """The timeline renders to a screenshot (kept as the docs' image with
    NOUS_ACTOR_DOCS_SCREENSHOT=1)."""
    expect = _expect()
    page.goto(served.url + "/session?id=chat")
    loc = page.locator
    loc(f".row[data-seq='{OUTER_SUMMARY_SEQ}']").click()
    expect(loc("#detail .replaces")).to_be_visible()
    loc(".row[data-seq='4']").hover()
    shot = tmp_path / "timeline.png"
    page.screenshot(path=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("NOUS_ACTOR_DOCS_SCREENSHOT"):
        SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)


@pytest.fixture(scope="module")
def long_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("long") / "long.db"
    store = SQLiteStore(db, durability="normal")
    try:
        assert store.write({"long": long_log(100_000, 100).events()}) == {}
    finally:
        store.close()
    return db


def test_a_long_session_opens_and_scrolls_a_window_at_a_time(
    browser: Browser, long_db: Path
) -> None:
    """A 100k-event session with 1k compactions opens quickly, and the page holds only
    the rows in view, also after a jump to its middle."""
    with _long_page(browser, long_db) as (served, page):
        expect = _expect()
        loc = page.locator
        began = time.perf_counter()
        page.goto(served.url + "/session?id=long")
        expect(loc(".row").last).to_be_visible()
        opened = time.perf_counter() - began
        expect(loc("#summary")).to_contain_text("1000 summaries")
        assert loc(".row").count() < 200
        loc("#goto").fill("50000")
        loc("#goto").press("Enter")
        expect(loc(".row[data-seq='50000']")).to_be_visible()
        assert loc(".row").count() < 200
        assert loc(".span").count() > 0
        # A generous bound for a shared machine; the docs give the measured figure.
        print(f"a 100k-event session with 1k compactions opened in {opened:.2f} s")
        assert opened < 5.0, f"the long session took {opened:.2f} s to open"


def test_a_long_session_draws_its_newest_rows_before_the_rest_is_read(
    browser: Browser, long_db: Path
) -> None:
    """The newest rows are drawn, at the bottom of the whole, while the rest of the
    session is still being read (here held back until they are seen), with a line
    saying so; then every feature is there: the counts, the spans, the surface, live."""
    held: list[Any] = []
    with _long_page(browser, long_db) as (served, page):
        expect = _expect()

        def hold(route: Any) -> None:  # the whole timeline waits
            held.append(route)

        page.route("**/api/session?*", hold)
        loc = page.locator
        page.goto(served.url + "/session?id=long")
        last = long_log(100_000, 100).count() - 1
        expect(loc(f".row[data-seq='{last}']")).to_be_visible()
        expect(loc("#summary")).to_contain_text(
            f"the newest 200 events (seq {last - 199} to {last})"
        )
        expect(loc("#status")).to_have_text("reading the session…")
        page.evaluate("document.getElementById('timeline').scrollTop = 0")
        expect(loc("#older")).to_be_visible()  # above the newest rows: what is still read
        expect(loc("#older")).to_contain_text(f"Reading the older events (seq {last - 200} and")
        assert loc(".span").count() > 0  # the replaces over the newest rows
        assert held, "the whole timeline was asked for"
        for route in held:
            route.continue_()
        page.unroute("**/api/session?*", hold)
        expect(loc("#summary")).to_contain_text("1000 summaries")
        expect(loc("#older")).to_have_count(0)
        expect(loc("#status")).to_have_text("live")
        expect(loc(f".row[data-seq='{last}']")).to_be_visible()  # following the tail
        expect(loc("#surface-title")).to_contain_text(f"as of seq {last} (now)")


def test_a_session_read_already_draws_its_newest_rows_from_the_tail(
    browser: Browser, long_db: Path
) -> None:
    """When the server has read the whole timeline already, the first drawing still holds
    the newest rows: the tail's answer fills the last chunks, so they never wait for a
    chunk read (here every one is held back), and never come after older rows."""
    import json
    import urllib.request

    held: list[Any] = []
    with _long_page(browser, long_db) as (served, page):
        with urllib.request.urlopen(served.url + "/api/session?id=long", timeout=60) as r:
            assert r.status == 200  # the server reads the whole timeline now
        with urllib.request.urlopen(served.url + "/api/tail?id=long", timeout=60) as r:
            assert json.load(r)["ready"] is True
        expect = _expect()
        page.route("**/api/rows?*", lambda route: held.append(route))
        loc = page.locator
        page.goto(served.url + "/session?id=long")
        last = long_log(100_000, 100).count() - 1
        expect(loc(f".row[data-seq='{last}']")).to_be_visible()
        expect(loc("#summary")).to_contain_text("1000 summaries")
        for route in held:
            route.continue_()
        page.unroute("**/api/rows?*")


def test_five_digit_seq_ranges_stay_in_their_column(
    browser: Browser, long_db: Path, tmp_path: Path
) -> None:
    """A replace's range of 5-digit seqs fits its column: nothing spills into the text."""
    served = Served(long_db)
    context = browser.new_context(viewport={"width": 1400, "height": 820})
    context.set_default_timeout(WAIT_MS * 3)
    try:
        expect = _expect()
        page = context.new_page()
        page.goto(served.url + "/session?id=long")
        expect(page.locator("#summary")).to_contain_text("1000 summaries")
        ops = page.locator(".row .op .badge.summary")
        expect(ops.first).to_be_visible()
        page.screenshot(path=str(tmp_path / "five-digits.png"))
        spills = page.evaluate(
            """() => [...document.querySelectorAll('.row')].flatMap((row) => {
                const op = row.querySelector('.op'), text = row.querySelector('.text');
                const cells = [...row.querySelectorAll('.seq, .type, .op')];
                const clipped = cells.filter((c) => c.scrollWidth > c.clientWidth);
                const over = op.getBoundingClientRect().right > text.getBoundingClientRect().left;
                return clipped.length || over ? [row.dataset.seq + ': ' + op.textContent] : [];
            })"""
        )
        assert spills == []
    finally:
        context.close()
        served.stop()
