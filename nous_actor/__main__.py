"""``python -m nous_actor`` is the ``nous-actor`` command."""

import sys

from nous_actor.cli import main

sys.exit(main())
