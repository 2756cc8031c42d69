"""What the ``nous-actor`` command says, and where: how a command fails (one line, exit 1),
the standard streams (closed ones, a reader gone away), tables and JSON on standard
output, and where the library's log records go."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

import structlog

from nous_actor.core.event import Event
from nous_actor.core.message import tool_call_parts


class _Failure(Exception):
    """A command failed in a way the user can act on (exit status 1)."""


class _PipeClosed(Exception):
    """The reader of standard output went away (e.g. ``| head``): stop quietly."""


def _fail(message: str) -> NoReturn:
    raise _Failure(message)


# -- standard streams ------------------------------------------------------------------


def _closed_standard_fds() -> frozenset[int]:
    """The standard fds that are closed (``<&-``, ``>&-``), each reopened on /dev/null.

    Reopening keeps a file the command opens later (a database, a log) from
    landing on fd 0, 1 or 2, where a stray write would corrupt it.
    """
    streams = (sys.stdin, sys.stdout, sys.stderr)
    closed = set()
    for fd, stream in enumerate(streams):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        else:
            if stream is None:
                closed.add(fd)
    return frozenset(closed)


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null, so that the interpreter's last flush cannot fail again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    except OSError:
        pass


def _stdout_failed(exc: OSError) -> NoReturn:
    """A write to standard output failed: quiet for a closed pipe, else the failure."""
    _silence_stdout()
    if isinstance(exc, BrokenPipeError):
        raise _PipeClosed from None
    _fail(f"cannot write to standard output ({exc.strerror or exc}); redirect it to a file")


def _out(text: str) -> None:
    """Write ``text`` to standard output, now (errors become the command's failure)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        _stdout_failed(exc)


def _err(line: str) -> None:
    """Write one line to standard error, if it is open."""
    if sys.stderr is None:
        return
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _note(text: str) -> None:
    _err(f"nous-actor: note: {text}")


# -- formatting ------------------------------------------------------------------------


_CONTROLS: Final = re.compile("[\x00-\x1f\x7f-\x9f]")
"""The C0 controls, DEL and the C1 controls: a terminal acts on them (clears the screen,
sets its title, moves the cursor, overwrites a row), so content never prints them raw."""

_C1_AND_DEL: Final = re.compile("[\x7f-\x9f]")
"""What JSON may hold raw (only C0 must be escaped there) that a terminal acts on."""

_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(text: str) -> str:
    """``text`` with every control character (C0, the newline included, DEL and C1) as a
    visible escape (``\\n``, ``\\r``, ``\\t``, else ``\\x1b``): content printed to a
    terminal says what it holds and cannot drive the terminal."""
    return _CONTROLS.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


def _json_safe(text: str) -> str:
    """JSON text with DEL and the C1 controls as ``\\u`` escapes (the same JSON), so that
    ``--json`` on a terminal cannot drive it either (C0 is escaped by `json.dumps`)."""
    return _C1_AND_DEL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_visible(str(c)) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = [headers, ["-" * w for w in widths], *cells]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in lines
    )


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _short(value: Any, width: int = 60) -> str:
    """``value`` on one line, its control characters visible (`_visible`), cut to ``width``."""
    text = _visible(_json_text(value))
    return text if len(text) <= width else text[: width - 3] + "..."


def _calls_text(calls: Any) -> str:
    """Tool calls as ``-> name(arguments)``, in any shape (flat, OpenAI's, custom: its input)."""
    parts = []
    for call in calls if isinstance(calls, list | tuple) else [calls]:
        if not isinstance(call, Mapping):
            parts.append(_json_text(call))
            continue
        _, name, args = tool_call_parts(call)
        parts.append(
            f"{'?' if name is None else name}({'' if args is None else _json_text(args)})"
        )
    return "-> " + ", ".join(parts)


def _content_text(content: Any, calls: Any) -> str:
    """What a message says: its content, then its tool calls."""
    parts = [] if content is None else [_json_text(content)]
    if calls:
        parts.append(_calls_text(calls))
    return " ".join(parts)


def _event_rows(events: Sequence[Event]) -> list[list[Any]]:
    rows = []
    for ev in events:
        op = ev.surface_op
        data = {k: v for k, v in ev.data.items() if k != "surface_op"}
        text = _content_text(data.get("content"), data.get("tool_calls"))
        rows.append(
            [
                ev.seq,
                ev.type.value,
                ev.position,
                f"{op.start}..{op.stop}" if op else "",
                _short(text or data),
            ]
        )
    return rows


def _emit(args: argparse.Namespace, payload: Any, text: str) -> None:
    """Write a command's result: ``payload`` as JSON with ``--json``, else ``text``, its
    lines' control characters visible (whatever part of it came from the store)."""
    if args.json:
        _out(_json_safe(json.dumps(payload, ensure_ascii=False, indent=2)) + "\n")
    else:
        _out("\n".join(_visible(line) for line in text.split("\n")) + "\n")


# -- where the library's log records go ----------------------------------------------------


class _Held(logging.Handler):
    """Holds the library's records until the command is over: shown on success only,
    since a failed command's one-line error already says what went wrong."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def show(self) -> None:
        records, self.records = self.records, []
        for record in records:
            _err(f"nous-actor: {record.levelname.lower()}: {record.getMessage()}")


def _log_to_file(path: Path) -> None:
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(message)s"))
    _configure_logging(handler, logging.INFO, stamped=True)


def _configure_logging(handler: logging.Handler, level: int, *, stamped: bool) -> None:
    """The command is an application: it decides where the library's events go."""
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.getLogger("pykka").setLevel(logging.CRITICAL)
    processors: list[Any] = (
        [
            structlog.stdlib.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.KeyValueRenderer(key_order=["timestamp", "level", "event"]),
        ]
        if stamped
        else [structlog.processors.KeyValueRenderer(key_order=["event"])]  # level leads
    )
    structlog.configure(
        processors=processors,
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
    )
