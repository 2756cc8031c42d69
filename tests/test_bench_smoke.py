"""The benchmark suite still runs: one cheap benchmark, quick sizes, in a subprocess."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert "summary: the DESIGN.md §8 goals" in done.stdout
    assert "- (core.fold not run)" in done.stdout
    assert "plot: none" in done.stdout  # neither scaling benchmark ran: no PNG
    assert not (tmp_path / "scaling.png").exists()

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


@pytest.mark.timeout(300)
@pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib (bench extra) missing"
)
def test_quick_scaling_run_writes_the_plot(tmp_path: Path) -> None:
    """`--quick --only append_derive,sweep` writes the JSON and scaling.png next to it."""
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--only",
            "append_derive,sweep",
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    png = tmp_path / "scaling.png"
    assert f"plot: {png}" in done.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000  # two drawn panels, not an empty canvas

    doc = json.loads(out.read_text(encoding="utf-8"))
    assert list(doc["benchmarks"]) == ["core.append_derive", "durable.sweep"]
    sweep = doc["benchmarks"]["durable.sweep"]["data"]["sweep"]
    assert sweep["sessions"] == [1, 5, 20]
    assert {"ours full pipelined", "ours full threads"} <= set(sweep["variants"])
    for points in sweep["variants"].values():
        assert [p["sessions"] for p in points] == [1, 5, 20]
        assert all(p["events_per_s"]["median"] > 0 for p in points)
    assert "derive_messages after one append on a 100k-event log" in done.stdout
