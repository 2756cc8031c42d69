"""A LangGraph thread in a real browser (headless Chromium, Playwright): the session page's
LangGraph view of a thread the real saver wrote shows its checkpoints, its fork, and the
messages of the head and of a chosen checkpoint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

pytest.importorskip("starlette", reason="the viewer needs the serve extra")
pytest.importorskip("langgraph", reason="the thread is written by the LangGraph saver")

from test_viewer_browser import WAIT_MS, Served, _expect, _watched
from test_viewer_browser import browser as browser  # the module's one Chromium
from test_viewer_langgraph import add_turn, write_thread

from nous_actor.integrations.langgraph import thread_key

if TYPE_CHECKING:
    from playwright.sync_api import Browser


@pytest.fixture
def thread(tmp_path: Path) -> Iterator[tuple[Served, list[tuple[str, list[str]]]]]:
    db = tmp_path / "thread.db"
    listed = write_thread(db)
    s = Served(db)
    try:
        yield s, listed
    finally:
        s.stop()


def test_the_langgraph_view_shows_checkpoints_forks_and_messages(
    browser: Browser, thread: tuple[Served, list[tuple[str, list[str]]]]
) -> None:
    """The session page offers the LangGraph view; it lists every checkpoint with the fork
    and the head marked, shows the head's messages (the tool call too) and follows a run
    committed meanwhile, and a click on an earlier checkpoint shows the messages it held."""
    served, listed = thread
    expect = _expect()
    context = browser.new_context(viewport={"width": 1400, "height": 820})
    context.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page: Any = _watched(context.new_page(), errors)
    try:
        page.goto(served.url + "/session?" + f"id={thread_key('chat').replace('/', '%2F')}")
        loc = page.locator
        toggle = loc("#lg-toggle")
        expect(toggle).to_be_visible()
        expect(loc("#timeline-split")).to_be_visible()
        toggle.click()
        expect(loc("#timeline-split")).to_be_hidden()
        expect(loc("#lg-checkpoints .lg-cp")).to_have_count(len(listed))
        expect(loc("#lg-checkpoints .lg-cp .badge.fork")).to_have_count(1)
        head = loc("#lg-checkpoints .lg-cp.head")
        expect(head).to_have_count(1)
        expect(head).to_have_attribute("data-id", listed[0][0])
        messages = loc("#lg-messages .lg-msg")
        expect(messages).to_have_count(len(listed[0][1]))
        expect(messages.last).to_contain_text("echo: a branch")
        expect(loc("#lg-messages .lg-call")).to_contain_text('add({"a":2,"b":3})')
        expect(loc("#lg-messages-title")).to_contain_text("(head)")
        # A run committed meanwhile: the view follows the thread's new head.
        expect(loc("#status")).to_have_text("live")
        add_turn(served.db, "a live question")
        expect(messages).to_have_count(len(listed[0][1]) + 2)
        expect(messages.last).to_contain_text("echo: a live question")
        expect(loc("#lg-checkpoints .lg-cp")).to_have_count(len(listed) + 3)
        expect(loc("#lg-checkpoints .lg-cp.head")).not_to_have_attribute("data-id", listed[0][0])
        # An earlier checkpoint of the main line, before the fork's branch was taken.
        cid, held = next((c, m) for c, m in listed if "and again" in m)
        # Its messages are held back while another run commits and the view refreshes
        # the thread: the checkpoint chosen stays chosen (the head does not win).
        waiting: list[Any] = []
        page.route("**/api/langgraph/messages?*checkpoint=*", lambda r: waiting.append(r))
        with page.expect_request(lambda r: "checkpoint=" in r.url):
            loc(f"#lg-checkpoints .lg-cp[data-id='{cid}']").click()
        with page.expect_response(lambda r: "/api/langgraph?" in r.url):
            add_turn(served.db, "one more")
        (route,) = waiting
        route.continue_()
        page.unroute("**/api/langgraph/messages?*checkpoint=*")
        expect(messages).to_have_count(len(held))
        expect(messages.last).to_contain_text(held[-1])
        expect(loc(f"#lg-checkpoints .lg-cp[data-id='{cid}']")).to_have_class(
            "lg-cp branch selected"
        )
        # Back to the timeline: the page works as for any session.
        toggle.click()
        expect(loc("#timeline-split")).to_be_visible()
        expect(loc(".row").first).to_be_visible()
    finally:
        context.close()
    assert errors == [], f"the page failed: {errors}"
