"""The Ray example of docs/beyond.md runs against a real Ray cluster and PostgreSQL server.

The plain docs test (tests/test_docs.py) runs only ```python blocks, which need no
server; this example is a ```text block after a marker comment, run here with the
``ray_cluster`` / ``ray_scope`` and ``pg_server`` fixtures (which skip without Ray or a
server, and fail under CI).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from postgres_server import Server
    from ray_cluster import RayScope

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "beyond.md"
MARKER = (
    "<!-- runs against Ray and PostgreSQL: "
    "tests/test_ray_docs.py::test_the_beyond_example_runs -->"
)


def _example() -> str:
    """The example's source: the ```text block right after the marker."""
    text = PAGE.read_text(encoding="utf-8")
    assert text.count(MARKER) == 1
    after = text.split(MARKER, 1)[1]
    assert after.startswith("\n```text\n")
    return after.split("\n```text\n", 1)[1].split("\n```\n", 1)[0] + "\n"


def test_the_beyond_example_runs(
    ray_scope: RayScope, pg_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example runs, its asserts holding, in a schema and a Ray namespace of its own,
    and shuts its shards down at the end."""
    code = _example()
    schema = pg_server.fresh_schema()
    # The schema first: '"agents"' (the name and the namespace) is not inside it.
    for old, new in (('"agents_ray"', repr(schema)), ('"agents"', repr(ray_scope.namespace))):
        assert old in code
        code = code.replace(old, new)
    monkeypatch.setenv("NOUS_ACTOR_DSN", pg_server.dsn)
    monkeypatch.setenv("NOUS_ACTOR_RAY_ADDRESS", ray_scope.cluster.address)
    try:
        exec(compile(code, str(PAGE), "exec"), {"__name__": "docs_beyond"})
        # No shard is left running: the example's shutdown() stopped them all.
        deadline = time.monotonic() + 30
        while ray_scope.named_actors():
            assert time.monotonic() < deadline, ray_scope.named_actors()
            time.sleep(0.05)
    finally:
        pg_server.drop_schema(schema)


def test_the_commands_to_try_it_use_what_the_scripts_export() -> None:
    """The page's shell commands read only variables that .ci/postgres.sh and .ci/ray.sh
    export or that the commands set themselves, and set the ones the example reads."""
    text = PAGE.read_text(encoding="utf-8")
    block = text.split("## Try it locally", 1)[1].split("```text\n", 1)[1].split("\n```", 1)[0]
    shell = re.sub(r"'[^']*'", "''", block)  # no variables inside single quotes
    exported = {
        name
        for script in ("postgres.sh", "ray.sh")
        for name in re.findall(r'echo "export (\w+)=', (ROOT / ".ci" / script).read_text())
    }
    assert {"NOUS_ACTOR_TEST_PG_DSN", "NOUS_ACTOR_TEST_RAY_ADDRESS"} <= exported
    assigned = set(re.findall(r"\b(\w+)=\"", shell))
    assert set(re.findall(r"\$\{?(\w+)", shell)) <= exported | assigned
    for name in re.findall(r'os\.environ\["(\w+)"\]', _example()):
        assert name in assigned
