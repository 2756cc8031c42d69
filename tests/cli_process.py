"""The nous-actor command, run through its real entry point (``python -m nous_actor``) in a
subprocess: the helper the command's tests share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TIMEOUT = 120


def run(
    *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``nous-actor ARGS`` with ``stdin`` as its standard input; its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "nous_actor", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        cwd=cwd,
    )
