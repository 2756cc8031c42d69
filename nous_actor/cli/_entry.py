"""The ``nous-actor`` console script: a thin start that turns Ctrl-C into status 130.

The command's modules take a moment to import; Ctrl-C then would end the interpreter
with a ``KeyboardInterrupt`` traceback and a death by signal. This module imports only
the standard library (and ``nous_actor.cli`` imports only it), so that the import of
the command and its run are both inside one ``except KeyboardInterrupt``: status 130
and the documented one line, as for an interrupt while the command runs
(``nous_actor.cli.command.main``). The package's own ``__init__`` still runs before
this module (Python imports a package before its modules): a Ctrl-C during it is not
caught here.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Final

__all__ = ["INTERRUPTED", "main"]

INTERRUPTED: Final = 130
"""The exit status of an interrupted command (128 + SIGINT, as a shell reports it)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``nous-actor`` command (``sys.argv[1:]`` unless ``argv``); returns the exit
    status, `INTERRUPTED` after Ctrl-C however early it came."""
    try:
        from nous_actor.cli.command import main as command

        return command(argv)
    except KeyboardInterrupt:
        try:
            if sys.stderr is not None:
                sys.stderr.write("nous-actor: interrupted\n")
                sys.stderr.flush()
        except (OSError, ValueError):
            pass
        return INTERRUPTED
