"""The private names of Pykka the library touches are exactly those listed, with why,
in `nous_actor.runtime.pykka_private`, and each still exists in the installed Pykka.

Read from the source (not run): in every class of the package that derives from a
Pykka actor or future (through the package's own classes too), each method defined
and each ``self.``/``super().`` attribute whose name is one of Pykka's private
names; and anywhere, such a name read off an ``actor`` (the dispatcher's turn and
the simulation's steps work on the actor they are given).
"""

from __future__ import annotations

import ast
from importlib.metadata import version
from pathlib import Path

import pykka

from nous_actor.runtime.pykka_private import PRIVATE

PACKAGE = Path(__file__).resolve().parent.parent / "nous_actor"
PYKKA_TYPES = {
    "Actor": pykka.Actor,
    "ThreadingActor": pykka.ThreadingActor,
    "Future": pykka.Future,
    "ThreadingFuture": pykka.ThreadingFuture,
}


def _pykka_private_names() -> set[str]:
    names = {
        n
        for cls in PYKKA_TYPES.values()
        for n in dir(cls)
        if n.startswith("_") and not n.startswith("__") and n not in ("_abc_impl", "_is_protocol")
    }
    return names | {n for n in vars(pykka.ThreadingFuture()) if n.startswith("_")}


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
    for path, tree in trees:
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and isinstance(node.value, ast.Name)
                and node.value.id == "actor"
            ):
                used.setdefault(node.attr, set()).add(f"{path.relative_to(PACKAGE)}")
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
