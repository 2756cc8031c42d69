"""Importing nous_actor.testing without Hypothesis says which extra to install.

Each case runs in a fresh interpreter in which Hypothesis is made unimportable
(nothing is uninstalled): either ``sys.modules["hypothesis"] = None``, or a
``sys.meta_path`` finder that refuses it the way a missing package does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from bounds import INTERPRETER_BOUND as BOUND

_BLOCKERS = {
    "sys_modules_none": """
        import sys
        sys.modules["hypothesis"] = None
    """,
    "meta_path_finder": """
        import sys

        class NoHypothesis:
            def find_spec(self, name, path=None, target=None):
                if name == "hypothesis" or name.startswith("hypothesis."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        for mod in [m for m in sys.modules if m.split(".")[0] == "hypothesis"]:
            del sys.modules[mod]
        sys.meta_path.insert(0, NoHypothesis())
    """,
}

_TRY_IMPORT = """
    import json
    try:
        import {module}
    except ImportError as exc:
        print(json.dumps({{"type": type(exc).__name__, "name": exc.name, "message": str(exc)}}))
    else:
        print(json.dumps(None))
"""


def _import_without(blocker: str, module: str) -> dict[str, str] | None:
    code = textwrap.dedent(blocker) + textwrap.dedent(_TRY_IMPORT.format(module=module))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=BOUND, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, str] | None = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("blocker", sorted(_BLOCKERS))
@pytest.mark.parametrize(
    "module",
    ["nous_actor.testing", "nous_actor.testing.strategies", "nous_actor.testing.machines"],
)
def test_import_without_hypothesis_names_the_extra_to_install(blocker: str, module: str) -> None:
    """The error is a ModuleNotFoundError (an ImportError) naming the `testing` extra."""
    got = _import_without(_BLOCKERS[blocker], module)
    assert got is not None, f"{module} imported although Hypothesis is unimportable"
    assert got["type"] == "ModuleNotFoundError"
    assert got["name"] == "hypothesis"
    assert "nous_actor.testing needs Hypothesis" in got["message"]
    assert "pip install 'nous-actor[testing]'" in got["message"]


@pytest.mark.parametrize("blocker", sorted(_BLOCKERS))
def test_the_core_imports_without_hypothesis(blocker: str) -> None:
    """Only nous_actor.testing needs Hypothesis: the package itself imports without it."""
    assert _import_without(_BLOCKERS[blocker], "nous_actor") is None


def test_a_missing_dependency_of_hypothesis_itself_is_not_renamed() -> None:
    """A broken Hypothesis install (one of its own dependencies missing) keeps its own error."""
    blocker = """
        import sys
        sys.modules["sortedcontainers"] = None
    """
    got = _import_without(blocker, "nous_actor.testing")
    assert got is not None
    assert got["name"] == "sortedcontainers"
    assert "nous-actor[testing]" not in got["message"]
