"""The benchmark suite still runs: one cheap benchmark, quick sizes, in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["benchmark", "ours", "baseline", "ratio", "goal", "verdict"]


def test_quick_memory_benchmark_prints_table_and_writes_json(tmp_path: Path) -> None:
    """`python -m bench --quick --only memory` prints the table and writes every key."""
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "memory", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0]
    assert [c.strip() for c in header.split("|")] == COLUMNS
    assert "== core.memory:" in done.stdout
    assert "memory, plain Log" in done.stdout
    assert "core.memory: start" in done.stderr  # progress goes to stderr

    doc = json.loads(out.read_text(encoding="utf-8"))
    assert set(doc) == {"meta", "summary", "benchmarks"}
    assert doc["meta"]["quick"] is True
    assert {"python", "cpu_count", "loadavg", "started", "finished"} <= set(doc["meta"])
    assert list(doc["benchmarks"]) == ["core.memory"]
    section = doc["benchmarks"]["core.memory"]
    assert {"title", "seconds", "rows", "notes", "data"} <= set(section)
    assert section["rows"]
    for row in section["rows"]:
        assert set(row) == {*COLUMNS, "numbers"}
        assert row["verdict"] in {"pass", "fail", "info"}
        assert row["numbers"]["ours_bytes_per_event"] > 0
