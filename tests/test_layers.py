"""The folders are the layers: each module imports only from its own layer and below.

Read from the source (not run): every ``import`` and ``from ... import`` at
any depth of a module, including the ones inside functions.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "nous_actor"
LEAVES = {"nous_actor", "nous_actor.errors", "nous_actor._log", "nous_actor._version"}

# layer -> the layers (of nous_actor) and third-party packages it may import
ALLOWED: dict[str, tuple[set[str], set[str]]] = {
    "core": ({"core"}, {"structlog", "msgspec"}),
    # (opentelemetry: only runtime/otel.py, the optional extra's sink; msgspec: the
    # structs the cyclic collector never tracks, runtime/flag.py)
    "runtime": ({"runtime"}, {"structlog", "pykka", "opentelemetry", "msgspec"}),
    "store": ({"core", "runtime", "store"}, {"structlog", "psycopg"}),
    "supervision": ({"core", "runtime", "supervision"}, {"structlog", "pykka"}),
    "sessions": (
        {"core", "runtime", "store", "supervision", "sessions"},
        {"structlog", "pykka"},
    ),
    "viewer": (
        {"core", "runtime", "store", "sessions", "viewer"},
        {"structlog", "starlette", "uvicorn"},
    ),
    "cluster": (
        {"core", "runtime", "store", "supervision", "sessions", "cluster"},
        {"structlog", "ray"},
    ),
    # The adapters: the frameworks they adapt (each imported in one module of its own).
    "integrations": (
        {"core", "runtime", "store", "supervision", "sessions", "integrations"},
        {"structlog", "agents", "google", "pydantic_core", "langgraph", "langchain_core"},
    ),
    # What users test with: the runtime underneath, Hypothesis and pytest.
    "testing": (
        {"core", "runtime", "store", "supervision", "sessions", "testing"},
        {"structlog", "pykka", "hypothesis", "pytest"},
    ),
    # The command on top: every layer but the optional engines' (the viewer it serves).
    "cli": (
        {"core", "runtime", "store", "supervision", "sessions", "viewer", "cli"},
        {"structlog", "psycopg"},
    ),
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "nous_actor":  # from nous_actor import store, ...
                found.update(f"nous_actor.{alias.name}" for alias in node.names)
    return found


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "nous_actor" else None


def _modules(layer: str) -> list[Path]:
    return sorted((PACKAGE / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_a_layer_imports_only_the_layers_below_it(layer: str) -> None:
    """No module of a layer imports a layer above it (or an unexpected package)."""
    layers, third_party = ALLOWED[layer]
    bad: dict[str, list[str]] = {}
    for path in _modules(layer):
        for name in sorted(_imports(path)):
            root = name.split(".")[0]
            if name in LEAVES or root in sys.stdlib_module_names or name == "__future__":
                continue
            if root == "nous_actor":
                if _layer_of(name) in layers:
                    continue
            elif root in third_party:
                continue
            bad.setdefault(str(path.relative_to(PACKAGE)), []).append(name)
    assert bad == {}


def test_every_folder_is_a_layer_with_its_rules() -> None:
    """Each folder of the package is a layer this file checks (a new folder needs its
    row in ALLOWED), and every module sits in one (no loose module in a folder that
    is not a package)."""
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(ALLOWED)
    for folder in folders:
        for path in (PACKAGE / folder).rglob("*.py"):
            assert (path.parent / "__init__.py").exists(), path


def test_every_module_is_in_a_layer() -> None:
    """Only the leaves and the package's face sit at the top of the package."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "__main__.py", "_log.py", "_version.py", "errors.py"]


def test_the_leaves_import_no_layer() -> None:
    """errors, _log and _version import nothing of the package's layers."""
    for name in ("errors.py", "_log.py", "_version.py"):
        layers = {_layer_of(m) for m in _imports(PACKAGE / name)} - {None}
        assert layers == set(), name


def test_psycopg_is_imported_by_the_postgres_store_and_the_demo_alone() -> None:
    """The optional driver stays in its own package (and the demo that runs on a server)."""
    store = PACKAGE / "store" / "postgres"
    users = {
        "store/postgres/" if p.parent == store else str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if any(n.split(".")[0] == "psycopg" for n in _imports(p))
    }
    assert sorted(users) == ["cli/agents_demo.py", "store/postgres/"]


def test_ray_is_imported_by_the_cluster_layer_alone() -> None:
    """The optional engine stays in its own layer; nothing below it knows of it."""
    users = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if any(n.split(".")[0] == "ray" for n in _imports(p))
    ]
    assert sorted({user.rpartition("/")[0] for user in users}) == ["cluster/ray"]


def test_no_layer_imports_the_cluster_layer() -> None:
    """The cluster layer sits on top: core, store, supervision and sessions never import it."""
    for layer in ("core", "store", "supervision", "sessions"):
        for path in _modules(layer):
            assert not any(_layer_of(n) == "cluster" for n in _imports(path)), path


@pytest.mark.parametrize(
    ("framework", "home"),
    [
        ("agents", "integrations/openai_agents/framework.py"),
        ("google", "integrations/adk/framework.py"),
        ("pydantic_core", "integrations/adk/framework.py"),
        ("langgraph", "integrations/langgraph/framework.py"),
        ("langchain_core", "integrations/langgraph/framework.py"),
    ],
)
def test_a_framework_is_imported_by_one_module_of_its_adapter(framework: str, home: str) -> None:
    """Each adapter imports its framework in one module (which says how to install it
    when it is missing); the rest of the adapter, and the package, never do."""
    users = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if any(n.split(".")[0] == framework for n in _imports(p))
    )
    assert users == [home]


# -- import circles ----------------------------------------------------------------------------
#
# A circle is a set of modules that import each other in a loop, by any import: at module
# level, inside a function, or under ``if TYPE_CHECKING:`` (a type-only import is still a
# dependency). ``from pkg import module`` is an import of that module; a relative import is
# resolved against its package; ``import a.b.c`` depends on ``a.b.c`` alone (not on the
# packages above it, whose ``__init__`` a package's own modules may import).

# The circles that remain, each as the modules in it: other work removes them, and each
# one removed is struck from here (the list only shrinks: a circle that is gone but still
# listed fails the test, as does any circle not listed).
REMAINING_CIRCLES: set[frozenset[str]] = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_modules(name: str, source: str, modules: set[str], package: bool) -> set[str]:
    """The modules of ``modules`` that module ``name`` (a package's ``__init__`` if
    ``package``) imports in ``source``, by every import at any depth."""
    home = name if package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = home.split(".")[: len(home.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            submodules = [f"{module}.{a.name}" for a in node.names]
            named = [m for m in submodules if m in modules]  # from pkg import module
            targets = named if len(named) == len(submodules) else [module, *named]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: _imported_modules(name, path.read_text(), set(paths), path.name == "__init__.py")
        for name, path in paths.items()
    }


def _circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Each set of two or more modules that reach one another (Tarjan's components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _ties(graph: dict[str, set[str]], circle: frozenset[str]) -> list[str]:
    return sorted(f"{a} -> {b}" for a in circle for b in graph[a] & circle)


def test_the_import_graph_reads_every_kind_of_import() -> None:
    """The reader sees function-local, TYPE_CHECKING, relative and ``from pkg import
    module`` imports, and a name inside a module as that module; a loop is a circle,
    a module importing itself or one that leads into a loop is not."""
    modules = {"p", "p.a", "p.b", "p.c", "q", "q.d"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .a import X\n"
        "def f():\n    from p import b\n"
        "import q.d.name\n"
        "from . import c as see\n"
    )
    assert _imported_modules("p.m", source, modules, package=False) == {"p.a", "p.b", "p.c", "q.d"}
    assert _imported_modules("p", "from .a import X", modules, package=True) == {"p.a"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _circles(graph) == {frozenset({"a", "b", "c"})}


def test_no_import_circles_but_the_listed_ones() -> None:
    """No modules of the package import each other in a loop, by any import (module
    level, function-local, under TYPE_CHECKING), except the circles that remain in
    sessions/ and testing/simulation/, each listed exactly."""
    graph = _import_graph()
    found = _circles(graph)
    new = {", ".join(sorted(c)): _ties(graph, c) for c in found - REMAINING_CIRCLES}
    assert new == {}, "import circles (each with what ties it)"
    gone = [sorted(c) for c in REMAINING_CIRCLES - found]
    assert gone == [], "these circles are gone (or changed): strike them from REMAINING_CIRCLES"
    assert all(
        any(m.startswith(p) for p in ("nous_actor.sessions.", "nous_actor.testing.simulation."))
        for circle in REMAINING_CIRCLES
        for m in circle
    )


# -- modules named for what they hold -----------------------------------------------------------

PLACE_NAMES = {"base", "_base", "core", "_core", "_face", "_life"}
"""Names that say where a module sits in the import order, not what it holds."""

# The modules that keep such a name for now (other work renames them; the list only shrinks).
# store/base.py is the public Store protocol, imported by that path.
REMAINING_PLACE_NAMES = {
    "store/base.py",
}


def test_modules_are_named_for_what_they_hold() -> None:
    """No module is named for its place in the import order (``_base``, ``base``,
    ``core``, ``_core``, ``_face``, ``_life``) but the listed ones, each listed exactly."""
    named = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.stem in PLACE_NAMES}
    assert named == REMAINING_PLACE_NAMES


# -- classes built from the package's own bases -------------------------------------------------
#
# No class is assembled from stateless mixins: a class has at most two of the package's own
# classes among its bases, counted through every level (its MRO without itself), third-party
# bases (pykka.Actor, ADK's BaseSessionService, Exception) not counted. Read by importing every
# module (every extra is installed for the tests), so a base is known whatever its import path.

MAX_OWN_BASES = 2

# The classes that still break the rule, by name (other work moves their modules; the list only
# shrinks: a class listed that keeps the rule fails the test, as does any class not listed).
REMAINING_ASSEMBLED = {
    # sessions/ (other work): a SessionActor is a DispatchedSupervisedActor, which joins
    # supervision's _Supervised and the runtime's DispatchedActor.
    "SessionActor",
}


def _own_classes() -> dict[str, type]:
    """Every class of the package that a module holds (at its top or inside a class), by
    qualified name (its module and its name)."""
    import importlib
    import inspect
    import pkgutil

    import nous_actor

    def fail(name: str) -> None:
        raise ImportError(f"cannot import {name}")

    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(nous_actor.__path__, "nous_actor.", onerror=fail):
        if info.name.rpartition(".")[2] == "__main__":
            continue  # runs the command line when imported
        todo = list(vars(importlib.import_module(info.name)).values())
        while todo:
            obj = todo.pop()
            if inspect.isclass(obj) and obj.__module__.split(".")[0] == "nous_actor":
                name = f"{obj.__module__}.{obj.__qualname__}"
                if name not in found:
                    found[name] = obj
                    todo.extend(vars(obj).values())
    return found


def _own_bases(cls: type) -> list[type]:
    return [b for b in cls.__mro__[1:] if b.__module__.split(".")[0] == "nous_actor"]


def test_no_class_is_built_from_more_than_two_of_the_packages_own_bases() -> None:
    """Each class of the package has at most two of the package's classes among its bases
    (transitively), but the listed ones, each listed exactly. The errors are a line of
    descent users catch by (DESIGN.md fixes it), not an assembly: each has at most one of
    the package's errors as a direct base, however deep."""
    classes = _own_classes()
    assert "nous_actor.errors.TurnBusy" in classes  # the reader sees the package
    errors = {n: c for n, c in classes.items() if issubclass(c, BaseException)}
    joined = {
        n: [b.__qualname__ for b in c.__bases__ if b.__module__.split(".")[0] == "nous_actor"]
        for n, c in errors.items()
    }
    assert {n: bases for n, bases in joined.items() if len(bases) > 1} == {}
    assembled = {
        name.rpartition(".")[2]: f"{name}: {[b.__qualname__ for b in _own_bases(cls)]}"
        for name, cls in classes.items()
        if name not in errors and len(_own_bases(cls)) > MAX_OWN_BASES
    }
    new = sorted(full for name, full in assembled.items() if name not in REMAINING_ASSEMBLED)
    assert new == [], "classes built from more than two of the package's own bases"
    gone = REMAINING_ASSEMBLED - set(assembled)
    assert gone == set(), "these classes keep the rule now: strike them from REMAINING_ASSEMBLED"


# -- the scheduling seam ------------------------------------------------------------------------


def _seam_reads(source: str) -> list[str]:
    """What ``source`` reads of `nous_actor.runtime.scheduling` other than its public
    calls: a private name (``_host``...), the default host (``REAL``, ``RealHost``), or
    the module's installed host as data (``host``): the ways to ask whether a
    simulation runs."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "scheduling"
            and (node.attr.startswith("_") or node.attr in {"REAL", "RealHost", "host"})
        ):
            found.append(f"scheduling.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").endswith("scheduling"):
            found += [a.name for a in node.names if a.name in {"REAL", "RealHost", "host"}]
    return found


def test_production_code_never_asks_whether_a_simulation_runs() -> None:
    """Outside the seam's own module and the simulation (``testing/``), code calls the
    installed host and never reads which host it is: no branch on a simulation."""
    outside = [
        p
        for p in PACKAGE.rglob("*.py")
        if p.relative_to(PACKAGE).parts[0] != "testing"
        and p != PACKAGE / "runtime" / "scheduling.py"
    ]
    reads = {
        str(p.relative_to(PACKAGE)): r
        for p in outside
        if (r := _seam_reads(p.read_text(encoding="utf-8")))
    }
    assert reads == {}
    assert len(outside) > 100
    assert _seam_reads("if scheduling.host is None:\n    pass\n") == ["scheduling.host"]
    assert _seam_reads("from nous_actor.runtime.scheduling import REAL\n") == ["REAL"]
    assert _seam_reads("scheduling.current().wait(f, 1.0, g)\n") == []
