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
    "core": ({"core"}, {"structlog"}),
    # (opentelemetry: only runtime/otel.py, the optional extra's sink)
    "runtime": ({"runtime"}, {"structlog", "pykka", "opentelemetry"}),
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
        {"structlog", "agents", "google", "pydantic_core"},
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
        ("agents", "integrations/openai_agents/base.py"),
        ("google", "integrations/adk/base.py"),
        ("pydantic_core", "integrations/adk/base.py"),
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
