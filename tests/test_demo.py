"""The tour runs as ``python -m nous_actor.cli.tour`` and states the facts of the core."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nous_actor.cli import tour as demo

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def run() -> subprocess.CompletedProcess[str]:
    """One run of the demo as a separate process, as ``make demo`` does it."""
    return subprocess.run(
        [sys.executable, "-m", "nous_actor.cli.tour"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _section(out: str, number: int) -> str:
    """The text of the demo's step ``number``, up to the next step."""
    start = out.index(f"\n{number}. ")
    end = out.find(f"\n{number + 1}. ", start)
    return out[start:] if end < 0 else out[start:end]


def _surface_seqs(table: str) -> list[int]:
    """The seq column of one printed ``derive_messages()`` table."""
    seqs = []
    for line in table.splitlines()[2:]:
        cols = line.split()
        if len(cols) < 3 or not cols[0].isdigit():
            break
        seqs.append(int(cols[1]))
    return seqs


def test_exits_zero_with_every_check_passed(run: subprocess.CompletedProcess[str]) -> None:
    """The demo exits 0, writes nothing to stderr and reports all checks passed."""
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stderr == ""
    assert "FAILED" not in run.stdout
    assert run.stdout.rstrip().endswith("checks passed.")


def test_surface_before_and_after_compaction(run: subprocess.CompletedProcess[str]) -> None:
    """Compaction turns the 7-message surface into system prompt, summary and turn 2."""
    step = _section(run.stdout, 4)
    before, after = step.split("  before:\n")[1].split("  after:\n")
    assert "7 messages" in before
    assert _surface_seqs(before) == [0, 2, 3, 11, 5, 8, 9]
    assert "4 messages" in after
    assert _surface_seqs(after) == [0, 12, 8, 9]
    assert "Summary of turn 1" in after


def test_snapshot_keeps_count_and_seqs(run: subprocess.CompletedProcess[str]) -> None:
    """The snapshot drops the shadowed events but not count(), the seqs or the surface."""
    step = _section(run.stdout, 6)
    assert "retained events   13 -> 6" in step
    assert "count()           13 -> 13" in step
    assert "kept seqs         [0, 7, 8, 9, 10, 12]" in step
    assert "derive_indexed()  unchanged" in step
    assert "next append       seq 13" in step


def test_json_lines_round_trip(run: subprocess.CompletedProcess[str]) -> None:
    """The JSON Lines export reads back equal, for the snapshot and the full log."""
    step = _section(run.stdout, 7)
    assert step.count('{"seq":') == 6
    assert "from_jsonl(to_jsonl(snap)) == snap  True" in step
    assert "full log (13 lines) round trip      True" in step
    assert "False" not in step


def test_output_is_deterministic(run: subprocess.CompletedProcess[str]) -> None:
    """Fixed timestamps: a second run prints exactly the same text."""
    again = subprocess.run(
        [sys.executable, "-m", "nous_actor.cli.tour"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.stdout == run.stdout


def test_main_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    """main() can be imported and called: it returns 0 and prints all seven steps."""
    assert demo.main([]) == 0
    out = capsys.readouterr().out
    for number in range(1, 8):
        assert f"\n{number}. " in out
    assert "2026-01-01T09:00:10.000000+00:00" in out


def test_main_rejects_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo takes no options; an unknown one is a usage error (exit status 2)."""
    with pytest.raises(SystemExit) as exc:
        demo.main(["--fast"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --fast" in capsys.readouterr().err


def test_stdout_closed_is_an_error() -> None:
    """``python -m nous_actor.cli.tour >&-``: one line on stderr and exit 1, not a silent 0."""
    out = subprocess.run(
        [sys.executable, "-m", "nous_actor.cli.tour"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=lambda: os.close(1),
    )
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1
    assert "standard output is closed" in out.stderr
