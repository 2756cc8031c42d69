"""The viewer's web app (Starlette, ASGI): two pages, a JSON API under ``/api``, a live feed.

Every route answers ``GET`` (and ``HEAD``) only; nothing here writes to the
store, which is opened read-only besides (`nous_actor.viewer.source`).

Pages: ``/`` (the sessions) and ``/session?id=ID`` (one session as a
timeline); their script and style are served from the package
(``/static``), so the page works with no network. Bad input is a page or a
JSON error saying what was wrong, never a traceback: an unknown or invalid
session id (404), a malformed parameter (400), a store that fails (503).

API (JSON): ``/api/sessions`` (a page of the session list; ``fresh=1`` reads the
store's index for it, as the list's Reload does), ``/api/session``
(one session at a glance), ``/api/tail`` (its newest rows, drawn first: they
do not wait for the whole timeline), ``/api/rows`` (a window of its timeline),
``/api/spans`` (the replaces over a window), ``/api/event`` (one event and its
audit), ``/api/surface`` (the messages as of a seq) and ``/api/live`` (server-sent
events: the session's next seq each time events are committed, from the
store's watch).

A session that holds a LangGraph thread (records of the checkpointer in
``nous_actor.integrations.langgraph``) has two more: ``/api/langgraph`` (its
checkpoints as a tree, forks and hidden ones included, the heads marked) and
``/api/langgraph/messages`` (a checkpoint's ``messages`` channel as a timeline),
read from the raw events by `nous_actor.viewer.langgraph`; the session page
offers them as its LangGraph view.

Every response says that the page loads only from the viewer and may not be
framed (`SECURITY_HEADERS`: a content security policy, no type sniffing, no
referrer); the page's script and style are files, never inline, so the policy
holds. With ``allowed_hosts``, a request addressed to any other host is refused
(400) before it reaches a route.
"""

from __future__ import annotations

import bisect
import html
import json
import re
import threading
import urllib.parse
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from importlib import resources
from typing import Any, Final

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nous_actor.core.ids import check_session_id
from nous_actor.errors import CallTimeout, NousActorError, SessionStopped, StoreError
from nous_actor.store import Store
from nous_actor.viewer.langgraph import MESSAGES, NoCheckpoint, Thread
from nous_actor.viewer.source import SORT_KEYS, ReadOnlyStore, SessionIndex
from nous_actor.viewer.timeline import Timeline

__all__ = ["SECURITY_HEADERS", "create_app"]

SECURITY_HEADERS: Final = (
    ("content-security-policy", "default-src 'self'; frame-ancestors 'none'"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
)
"""Sent with every response: load only from the viewer, never framed, never sniffed,
no referrer to anywhere."""

CACHED_SESSIONS: Final = 4
"""Timelines kept in memory (the sessions looked at last)."""

WINDOW_MAX: Final = 1000
"""The most rows one ``/api/rows`` call returns."""

TAIL: Final = 200
"""The newest rows ``/api/tail`` returns by default (at most `WINDOW_MAX`)."""

KEEPALIVE: Final = 15.0
"""Seconds between comments on a quiet live feed (so proxies keep it open)."""

TICK: Final = 0.25
"""How often a quiet live feed looks whether the server is stopping (``app.state.stopping``)."""

_STATIC = resources.files("nous_actor.viewer") / "static"

_PLACEHOLDER: Final = re.compile(r"\{\{(\w+)\}\}")
"""A placeholder of the page template (``{{name}}``), filled by `_shell`."""


class _BadRequest(Exception):
    """A parameter of the request is malformed (400)."""


class _NoSession(Exception):
    """The session id is invalid, or the store holds no such session (404)."""


class Timelines:
    """The timelines of the sessions looked at last, each brought up to date on use
    (one read of the events committed since)."""

    def __init__(self, store: ReadOnlyStore, keep: int = CACHED_SESSIONS) -> None:
        self.store = store
        self.keep = keep
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Timeline] = OrderedDict()
        # One gate per session being loaded (gone with its last user).
        self._loading: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()

    def get(self, session_id: str) -> Timeline:
        """The timeline of ``session_id``, current as of this call: the events committed
        since are read; if the store now holds fewer of the events read before (another
        process's snapshot dropped some, or the session was deleted), it is read anew.

        Raises:
            _NoSession: the id is not valid, or the session has no stored event.
            StoreError: the store failed.
        """
        self._check(session_id)
        with self._lock:
            gate = self._loading.get(session_id)
            if gate is None:
                gate = self._loading[session_id] = threading.Lock()
        with gate:  # one load of a session at a time; the others wait and reuse it
            with self._lock:
                tl = self._cache.get(session_id)
                if tl is not None:
                    self._cache.move_to_end(session_id)
            if tl is not None:
                tl.extend(self.store.load_since(session_id, tl.next_seq))
                if not self._shrank(tl):
                    return tl
            events = self.store.load_since(session_id, 0)
            if not events:
                with self._lock:
                    self._cache.pop(session_id, None)
                raise self._missing(session_id)
            tl = Timeline(session_id, events)
            with self._lock:
                self._cache[session_id] = tl
                self._cache.move_to_end(session_id)
                while len(self._cache) > self.keep:
                    self._cache.popitem(last=False)
            return tl

    def _shrank(self, tl: Timeline) -> bool:
        """Whether the store holds fewer of ``tl``'s seqs than ``tl`` does (one count: a
        snapshot drops shadowed events, never the newest, so ``next_seq`` alone cannot
        tell; a store that cannot count them cheaply is trusted until it can)."""
        with tl._lock:
            top, held = tl.next_seq, len(tl.events)
        stored = self.store.retained_before(tl.session_id, top)
        return stored is not None and stored < held

    def built(self, session_id: str) -> Timeline | None:
        """The timeline of ``session_id`` if one is kept (not brought up to date)."""
        with self._lock:
            return self._cache.get(session_id)

    def exists(self, session_id: str) -> None:
        """Check that ``session_id`` is valid and stored, without reading its events.

        Raises:
            _NoSession: it is not valid, or the session has no stored event.
            StoreError: the store failed.
        """
        self._check(session_id)
        if self.built(session_id) is None and self.store.next_seq(session_id) == 0:
            raise self._missing(session_id)

    def tail(self, session_id: str, n: int) -> dict[str, Any]:
        """The newest rows of ``session_id`` (the events from seq ``next_seq - n`` on) with
        the spans over them. When no timeline is kept they are read from the store and
        folded on their own, without building the whole, which gives each of them what
        the whole would (what shadows an event comes after it: those replaces are among
        the rows read), except the turn of the rows before the first turn boundary read;
        their ``row`` then counts from the first of them (``lo`` is ``None``: how many
        rows come before is not known without reading them all), and ``older`` says
        whether earlier seqs exist. ``ready``: the whole timeline is kept (``lo`` and
        ``row`` are then its row numbers).

        Raises:
            _NoSession: it is not valid, or the session has no stored event.
            StoreError: the store failed.
        """
        self._check(session_id)
        tl = self.built(session_id)
        if tl is None:
            top = self.store.next_seq(session_id)  # one indexed max: no count, no decoding
            first = max(0, top - n)
            events = self.store.load_since(session_id, first) if top else []
            if not events:
                raise self._missing(session_id)
            part = Timeline(session_id, events)
            count = len(events)
            return {
                "lo": None,
                "rows": part.rows(0, count),
                "spans": part.spans_over(0, count),
                "older": first > 0,
                "next_seq": part.next_seq,
                "ready": False,
            }
        with tl._lock:
            total = len(tl.events)
            lo = max(0, bisect.bisect_left(tl.seqs, tl.next_seq - n))
            return {
                "lo": lo,
                "rows": tl.rows(lo, total),
                "spans": tl.spans_over(lo, total),
                "older": lo > 0,
                "next_seq": tl.next_seq,
                "ready": True,
            }

    @staticmethod
    def _check(session_id: str) -> None:
        try:
            check_session_id(session_id, "id")
        except (TypeError, ValueError) as exc:
            raise _NoSession(str(exc)) from None

    def _missing(self, session_id: str) -> _NoSession:
        return _NoSession(
            f"no session {session_id!r} in {self.store.where}; the list of sessions is at /"
        )


class Threads:
    """The LangGraph threads of the sessions looked at last, each folded from its
    session's timeline and brought up to date on use (the events committed since)."""

    def __init__(self, timelines: Timelines, keep: int = CACHED_SESSIONS) -> None:
        self.timelines = timelines
        self.keep = keep
        self._lock = threading.Lock()
        # Each thread with the timeline it is folded from.
        self._cache: OrderedDict[str, tuple[Timeline, Thread]] = OrderedDict()

    def get(self, session_id: str) -> Thread:
        """The thread ``session_id`` holds, current as of this call.

        Raises:
            _NoSession: the id is not valid, the session has no stored event, or it
                holds no LangGraph record.
            StoreError: the store failed.
        """
        tl = self.timelines.get(session_id)
        with tl._lock:
            if not tl.langgraph:
                raise _NoSession(
                    f"session {session_id!r} holds no LangGraph checkpoint (no record of "
                    "the LangGraph checkpointer); its timeline is at /session?id="
                    + urllib.parse.quote(session_id, safe="")
                )
            with self._lock:
                kept = self._cache.get(session_id)
                if kept is None or kept[0] is not tl:  # new, or its timeline was read anew
                    kept = self._cache[session_id] = (tl, Thread(session_id))
                th = kept[1]
                self._cache.move_to_end(session_id)
                while len(self._cache) > self.keep:
                    self._cache.popitem(last=False)
            lo = bisect.bisect_left(tl.seqs, th.next_seq)
            th.extend(tl.events[lo:])
        return th


def _host_of(header: str) -> str | None:
    """The host part of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``),
    lower case, IPv6 without brackets; ``None`` if it is malformed."""
    text = header.strip().lower()
    if text.startswith("["):
        end = text.find("]")
        rest = text[end + 1 :]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return text[1:end]
    name, colon, port = text.partition(":")
    if colon and not port.isdigit():
        return None
    return name or None


class _Guard:
    """ASGI middleware: refuses a request addressed to a host that is not allowed (400),
    and adds `SECURITY_HEADERS` to every response, the refusal included."""

    def __init__(
        self, app: ASGIApp, allowed: Sequence[str] | Callable[[str], bool] | None
    ) -> None:
        self.app = app
        if allowed is None or callable(allowed):
            self.allowed = allowed
        else:
            names = frozenset(_host_of(h) or h.lower() for h in allowed)
            self.allowed = names.__contains__

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {k.lower() for k, _ in headers}
                for name, value in SECURITY_HEADERS:
                    if name.encode() not in present:
                        headers.append((name.encode(), value.encode()))
                message["headers"] = headers
            await send(message)

        if self.allowed is not None:
            header = ""
            for key, value in scope.get("headers", ()):
                if key == b"host":
                    header = value.decode("latin-1")
                    break
            host = _host_of(header)
            if host is None or not self.allowed(host):
                refusal = PlainTextResponse(
                    "Invalid host header: this viewer answers only requests addressed to "
                    "its own loopback names",
                    status_code=400,
                )
                await refusal(scope, receive, secured)
                return
        await self.app(scope, receive, secured)


def _int(request: Request, name: str, default: int | None = None, low: int = 0) -> int:
    text = request.query_params.get(name)
    if text is None or text == "":
        if default is None:
            raise _BadRequest(f"the parameter {name!r} is missing (a whole number >= {low})")
        return default
    try:
        value = int(text)
    except ValueError:
        raise _BadRequest(f"{name}={text!r} is not a whole number") from None
    if value < low:
        raise _BadRequest(f"{name}={value} is below {low}")
    return value


def _session_id(request: Request) -> str:
    sid = request.query_params.get("id")
    if sid is None:
        raise _BadRequest("the parameter 'id' (the session id) is missing")
    return sid


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{html.escape(title)} · nous_actor</title>"
        '<link rel=stylesheet href="/static/viewer.css"></head>'
        f'<body><main class="message"><h1>{html.escape(title)}</h1>{body}'
        '<p><a href="/">All sessions</a></p></main></body></html>',
        status_code=status,
    )


def _shell(view: str, title: str, session_id: str = "") -> HTMLResponse:
    template = (_STATIC / "page.html").read_text(encoding="utf-8")
    preload = ""
    if view == "session":  # the newest rows are asked for with the page's script and style
        tail = "/api/tail?" + urllib.parse.urlencode({"id": session_id, "n": TAIL})
        preload = (
            f'<link id="tail" rel="preload" as="fetch" crossorigin="anonymous" '
            f'href="{html.escape(tail, quote=True)}">'
        )
    # Each value escaped for its place (text, or an attribute's quoted value), and every
    # placeholder filled in one pass over the template: a value that holds a placeholder
    # (a session id may: "{{preload}}") is never filled in again.
    values = {
        "view": html.escape(view, quote=True),
        "title": html.escape(title, quote=True),
        "session": html.escape(session_id, quote=True),
        "preload": preload,
    }
    page = _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group()), template)
    return HTMLResponse(page)


def create_app(
    store: Store,
    *,
    where: str | None = None,
    allowed_hosts: Sequence[str] | Callable[[str], bool] | None = None,
) -> Starlette:
    """The viewer of ``store`` as an ASGI app (serve it with uvicorn, or test it with
    Starlette's ``TestClient``).

    Args:
        store: the store; it is read through a `ReadOnlyStore`, which refuses every
            write (`read_only_sqlite` opens a SQLite file with read-only connections).
        where: how the pages name the store (default: its file or server).
        allowed_hosts: the host names a request may address (its ``Host`` header,
            without the port), or a function that says whether a host may be
            addressed, or ``None`` for any. A server on loopback should allow only
            loopback names, so that no web page elsewhere can reach it through a DNS
            name it controls (`nous_actor.viewer.serve` passes
            `nous_actor.viewer.server.is_loopback`).
    """
    if not isinstance(store, ReadOnlyStore):
        store = ReadOnlyStore(store)
    index = SessionIndex(store)
    timelines = Timelines(store)
    threads = Threads(timelines)
    label = where or store.where

    async def api(work: Callable[[], Any]) -> Response:
        try:
            return JSONResponse(await run_in_threadpool(work))
        except _BadRequest as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        except (_NoSession, NoCheckpoint) as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        except StoreError as exc:
            return JSONResponse({"error": f"the store failed: {exc}"}, status_code=503)

    async def list_page(request: Request) -> Response:
        return _shell("list", f"Sessions in {label}")

    async def session_page(request: Request) -> Response:
        sid = request.query_params.get("id")
        if sid is None:
            return _page("No session named", "<p>Give one: <code>/session?id=ID</code>.</p>", 400)
        try:  # the page does not wait for the timeline: it draws the newest rows first
            await run_in_threadpool(timelines.exists, sid)
        except _NoSession as exc:
            return _page("No such session", f"<p>{html.escape(str(exc))}</p>", 404)
        except StoreError as exc:
            return _store_failed(exc)
        return _shell("session", f"Session {sid}", sid)

    async def sessions_api(request: Request) -> Response:
        def work() -> Any:
            sort = request.query_params.get("sort", "last_write")
            if sort not in SORT_KEYS:
                raise _BadRequest(f"sort={sort!r}: sort by one of {', '.join(SORT_KEYS)}")
            order = request.query_params.get("order", "desc")
            if order not in ("asc", "desc"):
                raise _BadRequest(f"order={order!r}: 'asc' or 'desc'")
            limit = min(_int(request, "limit", 100, low=1), 1000)
            page = index.page(
                offset=_int(request, "offset", 0),
                limit=limit,
                sort=sort,
                descending=order == "desc",
                query=request.query_params.get("q", ""),
                fresh=request.query_params.get("fresh", "") not in ("", "0"),
            )
            return {
                "store": label,
                "rows": page.rows,
                "total": page.total,
                "sessions": page.sessions,
                "offset": page.offset,
                "limit": limit,
                "read_at": page.read_at,
            }

        return await api(work)

    async def session_api(request: Request) -> Response:
        return await api(lambda: {**timelines.get(_session_id(request)).meta(), "store": label})

    async def tail_api(request: Request) -> Response:
        def work() -> Any:
            n = min(_int(request, "n", TAIL, low=1), WINDOW_MAX)
            return {**timelines.tail(_session_id(request), n), "store": label}

        return await api(work)

    async def rows_api(request: Request) -> Response:
        def work() -> Any:
            tl = timelines.get(_session_id(request))
            if "seq" in request.query_params:  # the window that starts at a seq
                lo = tl.row_of(_int(request, "seq"))
            else:
                lo = _int(request, "lo", 0)
            hi = min(_int(request, "hi", lo + 200), lo + WINDOW_MAX)
            return {"lo": lo, "rows": tl.rows(lo, hi), "next_seq": tl.next_seq}

        return await api(work)

    async def spans_api(request: Request) -> Response:
        def work() -> Any:
            tl = timelines.get(_session_id(request))
            lo = _int(request, "lo", 0)
            return tl.spans_over(lo, max(_int(request, "hi", lo + 1), lo + 1))

        return await api(work)

    async def event_api(request: Request) -> Response:
        def work() -> Any:
            tl = timelines.get(_session_id(request))
            seq = _int(request, "seq")
            try:
                return tl.event(seq)
            except KeyError:
                raise _NoSession(
                    f"session {tl.session_id!r} holds no event with seq {seq} (never "
                    "appended, or dropped by a snapshot)"
                ) from None

        return await api(work)

    async def surface_api(request: Request) -> Response:
        def work() -> Any:
            tl = timelines.get(_session_id(request))
            text = request.query_params.get("as_of", "")
            seq = None if text == "" else _int(request, "as_of")
            if seq is not None and seq >= tl.next_seq:
                raise _BadRequest(
                    f"as_of={seq} is past the session's last seq ({tl.next_seq - 1})"
                )
            return tl.surface_as_of(seq)

        return await api(work)

    async def langgraph_api(request: Request) -> Response:
        def work() -> Any:
            th = threads.get(_session_id(request))
            return {**th.summary(), "rows": th.tree(), "store": label}

        return await api(work)

    async def langgraph_messages_api(request: Request) -> Response:
        def work() -> Any:
            th = threads.get(_session_id(request))
            params = request.query_params
            cid = params.get("checkpoint") or None
            channel = params.get("channel") or MESSAGES
            return th.messages(params.get("ns", ""), cid, channel)

        return await api(work)

    async def live_api(request: Request) -> Response:
        try:
            sid = _session_id(request)
            tl = await run_in_threadpool(timelines.get, sid)
            start = _int(request, "from", tl.next_seq)
            sub = await run_in_threadpool(store.watch, sid, start)
        except _BadRequest as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        except _NoSession as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        except StoreError as exc:
            return JSONResponse({"error": f"the store failed: {exc}"}, status_code=503)

        stopping: Callable[[], bool] = getattr(request.app.state, "stopping", lambda: False)

        async def feed() -> AsyncIterator[str]:
            try:
                yield "retry: 2000\n\n"
                quiet = 0.0
                while True:
                    if stopping():  # end the feed, so that the server stops cleanly
                        yield 'event: end\ndata: {"error": "the server stopped"}\n\n'
                        return
                    try:
                        ev = await sub.aget(timeout=TICK)
                    except CallTimeout:
                        quiet += TICK
                        if quiet >= KEEPALIVE:
                            quiet = 0.0
                            yield ": still here\n\n"
                        continue
                    quiet = 0.0
                    last = ev.seq
                    while (more := sub.get_nowait()) is not None:  # one message a batch
                        last = more.seq
                    yield f"data: {json.dumps({'next_seq': last + 1})}\n\n"
            except (SessionStopped, NousActorError) as exc:
                yield f"event: end\ndata: {json.dumps({'error': str(exc)})}\n\n"
            finally:
                sub.close()

        return StreamingResponse(
            feed(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def not_found(request: Request, exc: Exception) -> Response:
        code = exc.status_code if isinstance(exc, HTTPException) else 404
        if code == 405:
            return _page(
                "Read-only", "<p>The viewer only reads the store: use GET.</p>", status=405
            )
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": f"no such page: {request.url.path}"}, status_code=code)
        return _page("No such page", f"<p>{html.escape(request.url.path)}</p>", status=code)

    async def failed(request: Request, exc: Exception) -> Response:
        return _page(
            "The viewer failed",
            f"<p>{html.escape(type(exc).__name__)}: {html.escape(str(exc))}</p>",
            status=500,
        )

    routes = [
        Route("/", list_page),
        Route("/session", session_page),
        Route("/api/sessions", sessions_api),
        Route("/api/session", session_api),
        Route("/api/tail", tail_api),
        Route("/api/rows", rows_api),
        Route("/api/spans", spans_api),
        Route("/api/event", event_api),
        Route("/api/surface", surface_api),
        Route("/api/live", live_api),
        Route("/api/langgraph", langgraph_api),
        Route("/api/langgraph/messages", langgraph_messages_api),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Mount(
            "/static", app=StaticFiles(packages=[("nous_actor.viewer", "static")]), name="static"
        ),
    ]
    middleware = [Middleware(_Guard, allowed=allowed_hosts)]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={HTTPException: not_found, Exception: failed},
    )
    app.state.store = store
    app.state.timelines = timelines
    app.state.threads = threads
    return app


def _store_failed(exc: StoreError) -> HTMLResponse:
    return _page(
        "The store cannot be read",
        f"<p>{html.escape(str(exc))}</p><p>Check the file or the server, then reload.</p>",
        status=503,
    )
