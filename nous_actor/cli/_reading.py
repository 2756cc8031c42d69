"""The commands that look inside a store: ``sessions``, ``show``, ``export``, ``audit``,
``langgraph`` (a LangGraph thread's checkpoints and messages) and ``serve`` (a read-only
web page)."""

from __future__ import annotations

import argparse
import errno
import socket
from typing import Any

from nous_actor.cli._console import (
    _content_text,
    _emit,
    _event_rows,
    _fail,
    _json_safe,
    _json_text,
    _note,
    _out,
    _short,
    _table,
)
from nous_actor.cli._stores import _LISTED, _load, _open_existing, _partial, _where
from nous_actor.core import history
from nous_actor.core.codec import event_to_dict, message_to_dict
from nous_actor.store import SessionInfo, export_session, list_sessions


def _session_row(info: SessionInfo) -> list[Any]:
    if info.error is not None:
        return [info.session_id, "?", "?", "unreadable: " + info.error.replace("\n", " ")]
    when = "" if info.last_time is None else info.last_time.isoformat()
    return [info.session_id, info.events, info.next_seq, when]


def cmd_sessions(args: argparse.Namespace) -> int:
    store = _open_existing(args.db, args.schema)
    infos = list_sessions(store)  # from the index: no session is loaded in full
    payload = [
        {
            "session_id": i.session_id,
            "retained": i.events,
            "count": i.next_seq,
            "last_time": None if i.last_time is None else i.last_time.isoformat(),
            "error": i.error,
        }
        for i in infos
    ]
    rows = [_session_row(i) for i in infos]
    _emit(args, payload, _table(["session", "retained", "count", "last event"], rows))
    bad = [i.session_id for i in infos if i.error is not None]
    if bad:
        named = ", ".join(bad[:_LISTED])
        if len(bad) > _LISTED:
            named += f" and {len(bad) - _LISTED} more"
        _fail(
            f"{len(bad)} of {len(infos)} sessions could not be read ({named}): see their "
            "rows; the others are listed"
        )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    store = _open_existing(args.db, args.schema)
    log = _load(store, args.session_id)
    if args.as_of is not None:
        try:
            log = log.as_of(args.as_of)
        except ValueError as exc:
            _fail(str(exc))
        _partial(log, args.as_of)
    if args.events or args.since is not None:
        events = log.events() if args.since is None else log.since(args.since)
        payload: Any = [event_to_dict(e) for e in events]
        text = _table(["seq", "type", "pos", "replaces", "content"], _event_rows(events))
    else:
        pairs = log.derive_indexed()
        payload = [{"seq": seq, **message_to_dict(m)} for seq, m in pairs]
        rows = [
            [seq, m.role.value, _short(_content_text(m.content, m.tool_calls))] for seq, m in pairs
        ]
        text = _table(["seq", "role", "content"], rows)
    _emit(args, payload, text)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    store = _open_existing(args.db, args.schema)
    _load(store, args.session_id)
    _out(_json_safe(export_session(store, args.session_id)))  # the same JSON, C1 escaped
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    store = _open_existing(args.db, args.schema)
    log = _load(store, args.session_id)
    try:
        info = history.explain(log, args.seq)
    except KeyError as exc:
        _fail(str(exc.args[0]))
    _partial(log)
    info["compactions"] = history.compactions(log)
    lines = [f"{k:24} {v}" for k, v in info.items() if k != "compactions"]
    lines.append(f"{'compactions in session':24} {len(info['compactions'])}")
    lines.extend(f"  seq {c['seq']}: {_compaction_text(c)}" for c in info["compactions"])
    _emit(args, info, "\n".join(lines))
    return 0


def _compaction_text(record: dict[str, Any]) -> str:
    """What a compaction record says, field by field as far as it has them: a record
    written by other code (or an older version) may lack any of them."""
    parts = []
    before, after = record.get("estimate_before"), record.get("estimate_after")
    if before is not None or after is not None:
        parts.append(
            f"estimate {'?' if before is None else before} -> {'?' if after is None else after}"
        )
    for key in ("pruned", "summarised"):
        if key in record:
            parts.append(f"{key} {record[key]}")
    return ", ".join(parts) or "(no estimate, pruned or summarised recorded)"


def _marks(row: dict[str, Any]) -> str:
    marks = []
    if row.get("head"):
        marks.append("head")
    if row["fork"]:
        marks.append(f"fork x{row['children']}")
    if row["gone"]:
        marks.append(f"{row['gone']} at seq {row['gone_at']}")
    return ", ".join(marks)


def _said(message: dict[str, Any]) -> str:
    """A LangGraph message's content, then its tool calls (``-> name(args)``)."""
    parts = [message["content"]] if message["content"] else []
    calls = [f"{c['name']}({_json_text(c['args'])})" for c in message["tool_calls"]]
    if calls:
        parts.append("-> " + ", ".join(calls))
    if message["tool_call_id"]:
        parts.insert(0, f"[{message['tool_call_id']}]")
    return " ".join(parts)


def cmd_langgraph(args: argparse.Namespace) -> int:
    try:  # the viewer's reader of the records (the serve extra), not the adapter
        from nous_actor.viewer.langgraph import NoCheckpoint, read_thread, session_of
    except ImportError as exc:  # says which extra to install
        _fail(str(exc))
    try:
        sid = session_of(args.thread)
    except ValueError as exc:
        _fail(str(exc))
    store = _open_existing(args.db, args.schema)
    events = store.load(sid)
    if not events:
        _fail(
            f"no LangGraph thread {args.thread!r} in {_where(store)}: it has no session "
            f"{sid!r} ('nous-actor sessions' lists the sessions; a thread's starts with "
            "langgraph/)"
        )
    thread = read_thread(sid, events)
    if not thread.records:
        _fail(
            f"session {sid!r} holds no LangGraph checkpoint (no record of the LangGraph "
            f"checkpointer); 'nous-actor show {args.db} {sid}' shows its messages"
        )
    try:
        shown = thread.messages(args.ns, args.checkpoint, args.channel)
    except NoCheckpoint as exc:
        _fail(str(exc))
    info = thread.summary()
    rows = thread.tree()
    payload = {"thread": info, "checkpoints": rows, **shown}
    several = len(info["namespaces"]) > 1
    table = _table(
        [*(["ns"] if several else []), "checkpoint", "step", "source", "msgs", "marks"],
        [
            [
                *([r["ns"]] if several else []),
                "  " * r["depth"] + r["id"],
                "" if r["step"] is None else r["step"],
                r["source"] or "",
                "?" if r["messages"] is None else r["messages"],
                _marks(r),
            ]
            for r in rows
        ],
    )
    cp = shown["checkpoint"]
    hidden = f", {info['hidden']} hidden from LangGraph (kept)" if info["hidden"] else ""
    lines = [
        f"thread {info['thread_id'] or sid}: {info['checkpoints']} checkpoints, "
        f"{info['forks']} fork(s){hidden}; head {info['head'] or '(none)'}",
        "",
        table,
        "",
        f"{shown['channel']} at checkpoint {cp['id']}"
        + (f" (namespace {cp['ns']!r})" if cp["ns"] else "")
        + (" (head)" if cp["head"] else "")
        + (f", {cp['gone']} at seq {cp['gone_at']}" if cp["gone"] else "")
        + f": {len(shown['messages'])} message(s)",
    ]
    if shown["partial"]:
        lines.append("(an ancestor's record is missing: earlier messages are not shown)")
    if not shown["present"]:
        lines.append(f"(no {shown['channel']} channel at this checkpoint)")
    if shown["messages"]:
        lines.append(
            _table(
                ["#", "type", "content"],
                [
                    [
                        m["index"],
                        m["type"],
                        _short(_said(m), 90),
                    ]
                    for m in shown["messages"]
                ],
            )
        )
    _emit(args, payload, "\n".join(lines))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from nous_actor.viewer import serve
        from nous_actor.viewer.server import bind_host, is_loopback
    except ImportError as exc:  # says which extra to install
        _fail(str(exc))
    address = bind_host(args.host)  # no brackets; an IPv4-mapped address as IPv4
    shown = f"[{address}]" if ":" in address else address
    why = _cannot_listen(address, args.port)
    if why is not None:
        _fail(f"could not listen on {shown}:{args.port}: {why}")
    store = _open_existing(args.db, args.schema, read_only=True)
    where = getattr(store, "where", None) or _where(store)

    def listening() -> None:  # said once the server listens, not before
        _out(
            f"nous-actor: serving {where} read-only at http://{shown}:{args.port}/ "
            "(Ctrl-C stops)\n"
        )
        if not is_loopback(args.host):
            _note(f"bound to {args.host}: whoever reaches this machine can read every session")

    try:
        listened = serve(store, host=address, port=args.port, on_listening=listening)
    except KeyboardInterrupt:  # Ctrl-C is how it stops (after a clean shutdown): status 0
        return 0
    if not listened:  # the address or the port: uvicorn's error above says which
        _fail(f"could not listen on {shown}:{args.port} (the error above says why)")
    return 0


def _cannot_listen(host: str, port: int) -> str | None:
    """Why the viewer could not listen on ``host``:``port`` (tried, then let go), in
    words that say what to change; ``None`` if it can.

    Every address ``host`` names is tried, with the socket options uvicorn's listening
    sockets (asyncio's) have: ``SO_REUSEADDR``, and IPv6 only on an IPv6 socket.
    """
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"{exc.strerror or exc}; --host takes an address or name of this machine"
    for family, kind, proto, _, address in dict.fromkeys(found):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                return _bind_failure(exc)
    return None


def _bind_failure(exc: OSError) -> str:
    """What a failed bind says to change: the port (in use, privileged) or the address."""
    if exc.errno == errno.EADDRINUSE:
        return "the port is in use; pick another --port"
    if exc.errno == errno.EACCES:
        return "not allowed to use that port (below 1024?); pick another --port"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "no interface of this machine has that address; pick another --host"
    return f"{exc.strerror or exc}; pick another --host"
