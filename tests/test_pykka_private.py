"""The private names of Pykka the library touches are exactly those listed, with why,
in `nous_actor.runtime.pykka_private`, and each still exists in the installed Pykka.

Read from the source (not run): in every class of the package that derives from a
Pykka actor or future (through the package's own classes too), each method defined
and each ``self.``/``super().`` attribute whose name is one of Pykka's private
names; anywhere else, each ``._name`` of Pykka's (of its actors, futures, refs,
proxies, registry and ``messages``) read or set on anything but the ``self`` of a
class of ours that is no Pykka type (which may have a ``_stop`` of its own); and
every import of a private Pykka module or name.

Run: nothing of ours is set on Pykka's refs, and the part of Pykka's loop that
the library copies (``COPIED``) is still what Pykka ships.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pykka
import pykka.messages
import pytest
from bounds import BOUND

from nous_actor import MemoryStore, Sessions
from nous_actor.runtime import DispatchedActor
from nous_actor.runtime.pykka_private import COPIED, PRIVATE
from nous_actor.sessions.actor import session_cell
from nous_actor.supervision import (
    DispatchedSupervisedActor,
    SupervisedActor,
    cell_of,
    start_monitored,
)

PACKAGE = Path(__file__).resolve().parent.parent / "nous_actor"
PYKKA_TYPES = {
    "Actor": pykka.Actor,
    "ThreadingActor": pykka.ThreadingActor,
    "Future": pykka.Future,
    "ThreadingFuture": pykka.ThreadingFuture,
}


PYKKA_OBJECTS = (pykka.ActorRef, pykka.ActorProxy, pykka.ActorRegistry, pykka.messages)


def _private(names: Any) -> set[str]:
    return {
        n
        for n in names
        if n.startswith("_") and not n.startswith("__") and n not in ("_abc_impl", "_is_protocol")
    }


class _Probe(pykka.ThreadingActor):
    pass


def _pykka_private_names() -> set[str]:
    """Pykka's private names: of its actor and future types, their instances, its refs,
    proxies, registry and message module."""
    names = _private(n for cls in PYKKA_TYPES.values() for n in dir(cls))
    names |= _private(n for obj in PYKKA_OBJECTS for n in dir(obj))
    names |= _private(vars(pykka.ThreadingFuture()))
    actor = _Probe()  # never started: its fields and its ref's, as Pykka makes them
    return names | _private(vars(actor)) | _private(vars(actor.actor_ref))


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _trees() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py"))]


def _used(trees: list[tuple[Path, ast.Module]]) -> dict[str, set[str]]:
    private = _pykka_private_names()
    classes: dict[str, tuple[list[str], ast.ClassDef, Path]] = {}
    for path, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = ([_base_name(b) for b in node.bases], node, path)
    derived = set(PYKKA_TYPES)
    grew = True
    while grew:
        grew = False
        for name, (bases, _, _) in classes.items():
            if name not in derived and derived.intersection(bases):
                derived.add(name)
                grew = True
    used: dict[str, set[str]] = {}
    for name in sorted(derived - set(PYKKA_TYPES)):
        _, cls, path = classes[name]
        where = f"{path.relative_to(PACKAGE)}:{name}"
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in private:
                used.setdefault(node.name, set()).add(where)
            elif isinstance(node, ast.Attribute) and node.attr in private:
                owner = node.value
                if (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) or (
                    isinstance(owner, ast.Call) and _base_name(owner.func) == "super"
                ):
                    used.setdefault(node.attr, set()).add(where)
    ours = set(classes) - derived
    for path, tree in trees:
        where = f"{path.relative_to(PACKAGE)}"
        skip = {
            id(node)
            for cls in ast.walk(tree)
            if isinstance(cls, ast.ClassDef) and cls.name in ours
            for node in ast.walk(cls)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private and id(node) not in skip:
                used.setdefault(node.attr, set()).add(where)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pykka"):
                module = node.module or ""
                for alias in node.names:
                    if any(part.startswith("_") for part in module.split(".")):
                        used.setdefault(f"{module}.{alias.name}", set()).add(where)
                    elif alias.name.startswith("_"):
                        used.setdefault(alias.name, set()).add(where)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if any(p.startswith("_") for p in alias.name.split(".")[1:]):
                        used.setdefault(alias.name, set()).add(where)
    return used


def test_the_list_is_exactly_what_the_source_touches() -> None:
    """A private name used but not listed (or listed but no longer used) fails."""
    used = _used(_trees())
    assert sorted(used) == sorted(PRIVATE), {
        "used, not listed": {n: sorted(w) for n, w in used.items() if n not in PRIVATE},
        "listed, not used": sorted(set(PRIVATE) - set(used)),
    }


def test_every_listed_name_exists_in_the_installed_pykka() -> None:
    """A Pykka release that renames one fails here, not in a user's program."""
    assert version("pykka").split(".")[0] == "4"
    assert set(PRIVATE) <= _pykka_private_names()


def test_the_scan_sees_a_new_touch(tmp_path: Path) -> None:
    """The check has teeth: an override of a private Pykka name in a subclass of the
    package's own actor type, or a private name read off an actor, is seen."""
    source = (
        "class Mine(DispatchedActor):\n"
        "    def _actor_loop_running(self):\n"
        "        return super()._actor_loop_running()\n"
        "def poke(actor):\n"
        "    return actor._get_hook_result\n"
    )
    trees = [*_trees(), (PACKAGE / "runtime" / "mine.py", ast.parse(source))]
    used = _used(trees)
    assert "runtime/mine.py:Mine" in used["_actor_loop_running"]
    assert "runtime/mine.py" in used["_get_hook_result"]


@pytest.mark.parametrize(
    ("source", "name"),
    [
        # the two the list missed: a ref reached through the actor's private field, and
        # Pykka's private stop message
        ("def f(a):\n    a._actor_ref.x = 1\n", "_actor_ref"),
        ("from pykka import messages\nX = messages._ActorStop\n", "_ActorStop"),
        ("import pykka\nX = pykka.messages._ActorStop\n", "_ActorStop"),
        ("from pykka.messages import _ActorStop\n", "_ActorStop"),
        ("from pykka._envelope import Envelope\n", "pykka._envelope.Envelope"),
        ("def f(ref):\n    return ref._actor_weakref()\n", "_actor_weakref"),
        ("from pykka import ActorRegistry\nX = ActorRegistry._actor_refs\n", "_actor_refs"),
    ],
)
def test_the_scan_sees_any_private_name_read_off_a_pykka_object(source: str, name: str) -> None:
    """A private name of Pykka's read anywhere (not only off ``self`` in an actor class
    or off a variable named ``actor``), or imported, is seen."""
    trees = [*_trees(), (PACKAGE / "runtime" / "mine.py", ast.parse(source))]
    assert "runtime/mine.py" in _used(trees).get(name, set())


def test_the_scan_leaves_our_own_classes_own_names_alone() -> None:
    """A class of ours that is no Pykka type may have a ``_stop`` of its own."""
    source = "class Pump:\n    def go(self):\n        self._stop = 1\n"
    trees = [*_trees(), (PACKAGE / "runtime" / "mine.py", ast.parse(source))]
    assert "runtime/mine.py" not in _used(trees).get("_stop", set())


class _Plain(DispatchedActor):
    pass


class _Threaded(SupervisedActor):
    pass


class _Dispatched(DispatchedSupervisedActor):
    pass


@pytest.mark.parametrize("actor_type", [_Plain, _Threaded, _Dispatched])
def test_nothing_of_ours_is_set_on_pykka_refs(
    actor_type: type[pykka.Actor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pykka's ref gets what Pykka's ``ActorRef.__init__`` sets, once each, and nothing
    else: no ``finished``/``started`` of ours, and its ``actor_stopped`` is never
    replaced (a dispatched actor's Flag is the one the ref copied at its making)."""
    sets: list[str] = []
    real = pykka.ActorRef.__setattr__

    def record(ref: pykka.ActorRef[Any], name: str, value: Any) -> None:
        sets.append(name)
        real(ref, name, value)

    monkeypatch.setattr(pykka.ActorRef, "__setattr__", record)
    ref = (
        start_monitored(actor_type.start, lambda exit: None)
        if (actor_type is not _Plain)
        else actor_type.start()
    )
    ref.stop(block=True, timeout=BOUND)
    monkeypatch.undo()
    expected = sorted(vars(_Probe().actor_ref))
    assert sorted(sets) == expected
    assert sorted(vars(ref)) == expected
    if actor_type is not _Threaded:
        assert ref.actor_stopped.is_set()
    if actor_type is not _Plain:
        assert cell_of(ref).finished.wait(BOUND)


def test_nothing_of_ours_is_set_on_a_session_actors_ref(monkeypatch: pytest.MonkeyPatch) -> None:
    """A session's ref (started by a registry with a store, its turn opened and closed,
    then stopped and reopened) gets what Pykka sets and nothing else: its ``released``
    and whether it is in a turn live in its `SessionCell`, beside the ref."""
    sets: list[tuple[int, str]] = []
    real = pykka.ActorRef.__setattr__

    def record(ref: pykka.ActorRef[Any], name: str, value: Any) -> None:
        sets.append((id(ref), name))
        real(ref, name, value)

    monkeypatch.setattr(pykka.ActorRef, "__setattr__", record)
    reg = Sessions(MemoryStore(), timeout=BOUND)
    refs: list[pykka.ActorRef[Any]] = []
    try:
        chat = reg.open("s1")
        with chat.turn() as turn:
            turn.append("user_message", {"content": "hi"}).get(timeout=BOUND)
            refs.append(chat._actor())  # type: ignore[attr-defined]
            assert session_cell(refs[-1]).in_turn
        assert not session_cell(refs[-1]).in_turn
        chat.stop(timeout=BOUND)
        assert session_cell(refs[-1]).released.is_set()
        # Reopened: a second actor.
        chat.append("user_message", {"content": "again"}).get(timeout=BOUND)
        refs.append(chat._actor())  # type: ignore[attr-defined]
    finally:
        reg.close()
    monkeypatch.undo()
    expected = sorted(vars(_Probe().actor_ref))
    assert refs[0] is not refs[1]
    for ref in refs:
        assert sorted(name for who, name in sets if who == id(ref)) == expected
        assert sorted(vars(ref)) == expected


def test_session_cell_of_a_ref_that_is_no_session_says_what_to_do() -> None:
    ref = start_monitored(_Dispatched.start, lambda exit: None)
    with pytest.raises(TypeError, match="is not the ref of a SessionActor"):
        session_cell(ref)
    ref.stop(block=True, timeout=BOUND)


def test_a_dispatched_actor_and_its_ref_share_one_stopped_flag() -> None:
    """What ``is_alive`` reads off the ref is what the actor's stop sets."""
    ref = _Plain.start()
    assert ref.is_alive()
    ref.stop(block=True, timeout=BOUND)
    assert not ref.is_alive()


def test_cell_of_a_ref_that_is_not_supervised_says_what_to_do() -> None:
    ref = _Plain.start()
    with pytest.raises(TypeError, match="start a SupervisedActor"):
        cell_of(ref)
    with pytest.raises(TypeError, match="is not the ref of a SupervisedActor"):
        cell_of("not a ref")  # type: ignore[arg-type]


# Pykka 4.5.0's copied methods, as ``ast.unparse`` of their parsed source: the code without
# its comments and layout, the same text on every Python the package supports (``ast.dump``
# is not: 3.12 added fields to a function's node, 3.13 leaves empty ones out).
_COPIED_4_5_0 = {
    "Actor._actor_loop_running": (
        "e6988bfb650b6451f12d29dcd5fcca9c6e15cb9fe82be31e93bb76adb6dd2588",
        "nous_actor.runtime.dispatcher.receive_one (or reuse it)",
    ),
    "Actor.__init__": (
        "0f4224368e35d6afbfe71d5ab6e70f6aca62f72fedf62a1805209cabe5d85114",
        "nous_actor.runtime.dispatcher.DispatchedActor.__init__",
    ),
}


@pytest.mark.parametrize("name", sorted(_COPIED_4_5_0))
def test_the_copied_code_is_still_what_pykka_ships(name: str) -> None:
    """What the library copies of Pykka (why: ``COPIED``): the body of its message loop
    (``receive_one``) and what its ``Actor.__init__`` sets. A Pykka release that
    changes either fails here: compare the copy with it, then update the digest."""
    assert set(COPIED) == set(_COPIED_4_5_0)
    digest, port = _COPIED_4_5_0[name]
    method = getattr(pykka.Actor, name.split(".")[1])
    tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
    found = hashlib.sha256(ast.unparse(tree.body[0]).encode()).hexdigest()
    assert found == digest, (
        f"Pykka {version('pykka')} changed {name}: port the change to {port}, then pin "
        "the new digest"
    )


def test_a_dispatched_actor_has_the_fields_pykkas_init_sets() -> None:
    """``DispatchedActor.__init__`` sets what Pykka's would: the same attributes, an urn
    of Pykka's form unique per actor, its own inbox, a stopped flag its ref shares."""

    class Threaded(pykka.ThreadingActor):
        pass

    pykkas = set(vars(Threaded()))
    a, b = _Plain(), _Plain()
    assert set(vars(a)) - {"_stopped"} >= pykkas - {"actor_stopped"}
    assert a.actor_urn != b.actor_urn
    assert uuid.UUID(a.actor_urn).version == 4  # Pykka's form
    assert a.actor_ref.actor_urn == a.actor_urn
    assert a.actor_ref.actor_stopped is a.actor_stopped
    assert a.actor_inbox is not b.actor_inbox
