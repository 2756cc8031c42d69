"""`frozen_alike`: equal, and frozen the same way at every level (two reads of stored
data compared by the codec's tests)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from nous_actor.core._frozen import FrozenDict, FrozenList


def frozen_alike(a: Any, b: Any) -> bool:
    """Equal, and frozen the same way at every level (-0.0 stays -0.0, a time keeps
    its offset: floats and times are compared by their text)."""
    if type(a) is not type(b):
        return False
    if type(a) is FrozenDict:
        return list(a) == list(b) and all(frozen_alike(a[k], b[k]) for k in a)
    if type(a) is FrozenList:
        return len(a) == len(b) and all(frozen_alike(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is float or type(a) is datetime:
        return bool(str(a) == str(b))
    return bool(a == b)
