"""The table of logged events in docs/supervision.md is complete and current.

The package's source is read (not run): every call of a structlog logger made
with ``get_logger`` at module level is an emitted event, its name
the call's first argument. Each must have a row in the table with its level
and its keys, and each row must still be emitted.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import nous_actor

PACKAGE = Path(nous_actor.__file__).parent
DOC = PACKAGE.parent / "docs" / "supervision.md"
LEVELS = {
    "debug": "debug",
    "info": "info",
    "warning": "warning",
    "warn": "warning",
    "error": "error",
    "exception": "error",
    "critical": "critical",
    "fatal": "critical",
}


@dataclass(frozen=True)
class Emitted:
    name: str
    level: str
    keys: frozenset[str]
    where: str


@dataclass(frozen=True)
class Row:
    level: str
    keys: frozenset[str]


def _loggers(tree: ast.Module) -> set[str]:
    """Module-level names bound to ``get_logger(...)`` (the library's, or structlog's)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called == "get_logger":
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            yield node


def _calls_of(trees: list[ast.Module], name: str) -> Iterator[ast.Call]:
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                if (isinstance(func, ast.Name) and func.id == name) or (
                    isinstance(func, ast.Attribute) and func.attr == name
                ):
                    yield node


def _param_values(trees: list[ast.Module], fn: ast.FunctionDef, param: str) -> set[str] | None:
    """Every str a parameter of ``fn`` can hold: its default and what call sites pass."""
    params = [a.arg for a in fn.args.args]
    if param not in params:
        return None
    index = params.index(param)
    values: set[str] = set()
    defaults = fn.args.defaults
    first_default = len(params) - len(defaults)
    if index >= first_default:
        default = defaults[index - first_default]
        if not (isinstance(default, ast.Constant) and isinstance(default.value, str)):
            return None
        values.add(default.value)
    method = bool(params) and params[0] in ("self", "cls")
    for call in _calls_of(trees, fn.name):
        pos = index - (1 if method and isinstance(call.func, ast.Attribute) else 0)
        given = [k.value for k in call.keywords if k.arg == param]
        if 0 <= pos < len(call.args):
            given.append(call.args[pos])
        for value in given:
            if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
                return None
            values.add(value.value)
    return values


def _names(trees: list[ast.Module], expr: ast.expr, fn: ast.FunctionDef | None) -> set[str] | None:
    """The event names ``expr`` can evaluate to, or None if they cannot be read."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    if isinstance(expr, ast.IfExp):
        a, b = _names(trees, expr.body, fn), _names(trees, expr.orelse, fn)
        return None if a is None or b is None else a | b
    if isinstance(expr, ast.Name) and fn is not None:
        return _param_values(trees, fn, expr.id)
    return None


def _keys(trees: list[ast.Module], call: ast.Call, fn: ast.FunctionDef | None) -> set[str]:
    keys = {k.arg for k in call.keywords if k.arg is not None}
    for k in call.keywords:
        if k.arg is None and isinstance(k.value, ast.Name) and fn is not None:
            kwarg = fn.args.kwarg
            if kwarg is not None and kwarg.arg == k.value.id:  # **context: what callers pass
                for site in _calls_of(trees, fn.name):
                    keys.update(kw.arg for kw in site.keywords if kw.arg is not None)
    return keys


def emitted_events() -> list[Emitted]:
    """Every event the package's source emits, read from its syntax tree."""
    paths = sorted(PACKAGE.rglob("*.py"))
    trees = [ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in paths]
    found: list[Emitted] = []
    unreadable: list[str] = []
    for path, tree in zip(paths, trees, strict=True):
        loggers = _loggers(tree)
        if not loggers:
            continue
        enclosing: dict[int, ast.FunctionDef] = {}
        for fn in _functions(tree):
            for node in ast.walk(fn):
                enclosing[id(node)] = fn  # innermost wins: walk visits outer functions first
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in loggers
                and node.func.attr in LEVELS
            ):
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            owner = enclosing.get(id(node))
            names = _names(trees, node.args[0], owner) if node.args else None
            if names is None:
                unreadable.append(where)
                continue
            keys = frozenset(_keys(trees, node, owner))
            found.extend(Emitted(n, LEVELS[node.func.attr], keys, where) for n in names)
    assert not unreadable, (
        "cannot tell which event these calls emit; name the event with a str literal "
        f"(or a parameter given literals): {unreadable}"
    )
    return found


_ROW = re.compile(r"^\|\s*`([a-z_]+\.[a-z_]+)`\s*\|\s*([a-z]+)\s*\|([^|]*)\|")


def documented_events() -> dict[str, Row]:
    """The rows of the table under '## Logged events' in docs/supervision.md."""
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## Logged events")
    end = text.find("\n## ", start + 1)
    rows: dict[str, Row] = {}
    for line in text[start : end if end != -1 else None].splitlines():
        m = _ROW.match(line)
        if m:
            name, level, keys_cell = m.groups()
            assert name not in rows, f"{name} has two rows"
            found = re.findall(r"`([^`]+)`", keys_cell)
            keys = frozenset(k for k in found if k.isidentifier() and k.islower())
            rows[name] = Row(level, keys)
    return rows


def test_the_source_emits_events_this_test_can_read() -> None:
    """The scan finds the events it must (a broken scan would make the table test vacuous)."""
    names = {e.name for e in emitted_events()}
    assert {"log.event_dropped", "session.crashed", "session.start_failed"} <= names
    assert {"session.passivated", "session.stopped", "log.compacted"} <= names


def test_every_emitted_event_has_a_row_and_every_row_is_emitted() -> None:
    """The docs table names exactly the events the package emits."""
    emitted = {e.name: e.where for e in emitted_events()}
    documented = documented_events()
    missing = {n: w for n, w in emitted.items() if n not in documented}
    stale = sorted(set(documented) - set(emitted))
    assert not missing, f"add rows to the table in docs/supervision.md for {missing}"
    assert not stale, f"remove rows for events no longer emitted: {stale}"


@pytest.mark.parametrize("event", emitted_events(), ids=lambda e: f"{e.name}@{e.where}")
def test_each_emission_matches_its_row(event: Emitted) -> None:
    """Each emission's level is its row's, and each key it passes is listed in the row."""
    row = documented_events().get(event.name)
    if row is None:
        pytest.skip("no row: reported by the completeness test")
    assert event.level == row.level, (
        f"{event.where}: logged at {event.level}, row says {row.level}"
    )
    undocumented = sorted(event.keys - row.keys)
    assert not undocumented, f"{event.where}: keys {undocumented} missing from the row"


def test_each_row_lists_only_keys_that_are_emitted() -> None:
    """No row lists a key that no emission of its event passes."""
    keys: dict[str, set[str]] = {}
    for e in emitted_events():
        keys.setdefault(e.name, set()).update(e.keys)
    extra = {
        name: sorted(row.keys - keys[name])
        for name, row in documented_events().items()
        if name in keys and row.keys - keys[name]
    }
    assert not extra, f"rows list keys that are never logged: {extra}"


RECOVERY_OR_FAILURE = re.compile(
    r"\.(restart|escalate|gave_up|recovered.*|.*dropped|.*skipped|crashed|start_failed)$"
)


def test_every_restart_escalation_drop_and_recovery_carries_a_reason() -> None:
    """DESIGN.md §5: restart, escalation, drop and recovery events carry a ``reason``, and the
    session's id (or, for a supervisor's child, the supervisor and the child)."""
    lacking = sorted(
        f"{e.name}@{e.where}"
        for e in emitted_events()
        if RECOVERY_OR_FAILURE.search(e.name) and "reason" not in e.keys
    )
    assert not lacking, f"no reason: {lacking}"
    no_id = sorted(
        f"{e.name}@{e.where}"
        for e in emitted_events()
        if RECOVERY_OR_FAILURE.search(e.name)
        and e.name.startswith("session.")
        and "session_id" not in e.keys
    )
    assert not no_id, f"no session_id: {no_id}"
