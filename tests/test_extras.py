"""Each optional part, imported without its extra, says which extra to install.

Every case runs in a fresh interpreter in which the extra's package is made
unimportable (nothing is uninstalled): ``sys.modules[name] = None``, or a
``sys.meta_path`` finder that refuses it as a missing package does, or a
package of that name on the path whose import fails (an installed package
that is broken). ``nous-actor bench`` and ``make demo`` are checked the same
way: the first run as a program, the second read with ``make -n``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from bounds import EXTRAS_BOUND as BOUND

ROOT = Path(__file__).resolve().parent.parent

# entry point (the import a user writes) -> (extra, the package it needs)
ENTRIES = {
    "from nous_actor.store.postgres import PostgresStore": ("postgres", "psycopg"),
    "from nous_actor.store.postgres.store import PostgresStore": ("postgres", "psycopg"),
    "from nous_actor.cluster.ray import RaySessions": ("ray", "ray"),
    "from nous_actor.integrations.openai_agents import NousSession": ("openai-agents", "agents"),
    "from nous_actor.integrations.adk import NousSessionService": ("adk", "google.adk"),
    "from nous_actor.integrations.langgraph import NousCheckpointSaver": (
        "langgraph",
        "langgraph",
    ),
    "from nous_actor.runtime.otel import OpenTelemetrySink": ("otel", "opentelemetry"),
    "from nous_actor.viewer import serve": ("serve", "starlette"),
    "from nous_actor.viewer.app import create_app": ("serve", "starlette"),
    "from nous_actor.viewer.server import serve": ("serve", "uvicorn"),
}

_BLOCKERS = {
    "sys_modules_none": """
        import sys
        sys.modules[{name!r}] = None
    """,
    "meta_path_finder": """
        import sys

        class Missing:
            def find_spec(self, name, path=None, target=None):
                if name == {name!r} or name.startswith({name!r} + "."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        for mod in [m for m in sys.modules if m == {name!r} or m.startswith({name!r} + ".")]:
            del sys.modules[mod]
        sys.meta_path.insert(0, Missing())
    """,
}

_TRY = """
    import json
    try:
        {entry}
    except ImportError as exc:
        print(json.dumps({{
            "type": type(exc).__name__,
            "message": str(exc),
            "name": exc.name,
            "cause": type(exc.__cause__).__name__,
        }}))
    else:
        print(json.dumps(None))
"""


def _attempt(code: str, **env: str) -> dict[str, str] | None:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BOUND,
        env={**_environ(), **env},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, str] | None = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


@pytest.mark.parametrize("blocker", sorted(_BLOCKERS))
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_an_entry_point_without_its_extra_names_the_extra(entry: str, blocker: str) -> None:
    """The import raises a `ModuleNotFoundError` (an `ImportError`) naming the module it
    needs and the ``pip install`` of the extra, chained to the original error."""
    extra, package = ENTRIES[entry]
    code = textwrap.dedent(_BLOCKERS[blocker].format(name=package)) + textwrap.dedent(
        _TRY.format(entry=entry)
    )
    got = _attempt(code)
    assert got is not None, f"{entry} imported with {package} missing"
    assert got["type"] == "ModuleNotFoundError", got
    assert got["name"] == package, got
    assert got["cause"] == "ModuleNotFoundError", got
    assert f"install the {extra} extra: pip install 'nous-actor[{extra}]'" in got["message"]
    assert "not installed" in got["message"]


@pytest.mark.parametrize("entry", list(ENTRIES)[:3])
def test_an_installed_but_broken_extra_says_to_reinstall_it(entry: str, tmp_path: Path) -> None:
    """The extra's package is there but its own import fails (a dependency of its own is
    missing): an `ImportError` that keeps the package's error and says to reinstall."""
    extra, package = ENTRIES[entry]
    top = tmp_path / package.split(".")[0]
    top.mkdir()
    (top / "__init__.py").write_text(f"import {top.name}._native  # a part that is missing\n")
    got = _attempt(textwrap.dedent(_TRY.format(entry=entry)), PYTHONPATH=str(tmp_path))
    assert got is not None
    assert got["type"] == "ImportError", got
    assert f"reinstall the {extra} extra: pip install 'nous-actor[{extra}]'" in got["message"]
    assert f"{package}._native" in got["message"]


def test_the_library_imports_no_extra() -> None:
    """``import nous_actor`` (and its stores, CLI and telemetry probe) works with every
    extra's package missing."""
    packages = sorted({package.split(".")[0] for _, package in ENTRIES.values()})
    code = (
        f"import sys\nfor name in {packages!r}:\n    sys.modules[name] = None\n"
        "import nous_actor, nous_actor.store, nous_actor.cli, nous_actor.integrations\n"
        "from nous_actor import Session, SQLiteStore\n"
        "s = Session.start('x', pinned=True)\n"
        "s.append('user_message', {'content': 'hi'}).get(timeout=30)\n"
        "s.stop()\n"
        "import json; print(json.dumps(None))\n"
    )
    assert _attempt(code) is None


def test_bench_without_its_packages_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """``nous-actor bench`` where a package of the bench extra is missing: one line naming it
    and the install, status 2 (it printed the suite's import traceback)."""
    fake = tmp_path / "hypothesis"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'hypothesis'\", name='hypothesis')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "nous_actor", "bench", "--list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BOUND,
        env={**_environ(), "PYTHONPATH": str(tmp_path)},
        check=False,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "needs hypothesis" in lines[0]
    assert "pip install -e '.[bench]'" in lines[0]


def test_make_demo_installs_the_package_alone() -> None:
    """``make demo`` installs no extra (the demo needs none), and ``make test`` still
    installs the test and docs extras."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make")

    def planned(target: str) -> list[str]:
        done = subprocess.run(
            [make, "-n", "-B", target],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=BOUND,
            check=True,
        )
        return [line for line in done.stdout.splitlines() if "pip install" in line]

    demo = planned("demo")
    assert demo, "make demo installs nothing"
    assert all("-e ." in line and "[" not in line for line in demo if "--upgrade pip" not in line)
    assert any("-e '.[test,docs]'" in line for line in planned("test"))
