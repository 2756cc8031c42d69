"""The ``nous-actor`` command: the demo, the tour, and a look inside a store."""

from nous_actor.cli.command import main

__all__ = ["main"]
