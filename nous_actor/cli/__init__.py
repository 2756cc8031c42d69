"""The ``nous-actor`` command: the demo, the tour, and a look inside a store.

Importing this package is light (`main` imports the command when it runs), so that the
console script catches a Ctrl-C that comes while the command's modules are imported.
"""

from nous_actor.cli._entry import main

__all__ = ["main"]
