"""The commands that write a session: ``import`` (from standard input), ``fork`` and
``snapshot`` (each runs in the process that holds the session, or here if none does)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TypeVar

from nous_actor.cli._console import _emit, _fail
from nous_actor.cli._stores import (
    _is_dsn,
    _load,
    _not_a_file,
    _open_existing,
    _open_postgres,
    _partial,
)
from nous_actor.core.codec import loads
from nous_actor.core.ids import check_session_id
from nous_actor.core.log import Log
from nous_actor.store import import_session
from nous_actor.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    from collections.abc import Callable

    from nous_actor.sessions.handle import Session

T = TypeVar("T")


def cmd_import(args: argparse.Namespace) -> int:
    if 0 in args.closed_fds:
        _fail(
            "standard input is closed; pipe the session in: "
            "nous-actor import DB SESSION < EXPORT.jsonl"
        )
    why = _not_a_file(args.db)
    if why is not None:
        _fail(why)
    text = sys.stdin.read()
    if not text.strip():
        _fail("nothing on standard input: pipe a JSON Lines export (or a v1 JSON list) in")
    # Everything that can be refused without the database is, before it is opened:
    # a failed import never leaves a new empty store behind.
    check_session_id(args.session_id)
    if not loads(text).events():
        _fail("the input holds no events, so there is no session to import")
    store = (
        _open_postgres(args.db, args.schema, create=True)
        if _is_dsn(args.db)
        else SQLiteStore(args.db)
    )
    try:
        n = import_session(store, args.session_id, text)
    finally:
        store.close()
    _emit(
        args,
        {"session_id": args.session_id, "events": n},
        f"imported {n} events into {args.session_id}",
    )
    return 0


def _with_session(args: argparse.Namespace, work: Callable[[Session], T]) -> tuple[Log, T]:
    """Run ``work`` on the stored session ``args.session_id``: in the process that holds
    it (a running app's worker: the call goes there, as any worker's does), or started
    and stopped here if no process holds it.

    Returns the session's log as it was stored before, and what ``work`` returned.
    """
    from nous_actor.sessions.registry import Sessions

    store = _open_existing(args.db, args.schema)
    log = _load(store, args.session_id)
    sessions = Sessions(store)
    try:
        return log, work(sessions.open(args.session_id))
    finally:
        sessions.close()


def cmd_fork(args: argparse.Namespace) -> int:
    log, forked = _with_session(args, lambda s: s.fork(args.through, args.new_id).get())
    _partial(log, args.through)
    _emit(
        args,
        {
            "session_id": args.new_id,
            "from": args.session_id,
            "through_seq": args.through,
            "count": forked.count(),
        },
        f"forked {args.session_id} through seq {args.through} into {args.new_id} "
        f"({len(forked.events())} events)",
    )
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    _, (dropped, kept) = _with_session(args, lambda s: (s.snapshot().get(), len(s.events().get())))
    _emit(
        args,
        {"session_id": args.session_id, "dropped": dropped, "retained": kept},
        f"snapshot of {args.session_id}: dropped {dropped} shadowed events, {kept} retained",
    )
    return 0
