"""What the adapter writes into a log: the keys that keep an item, mark a cleared
one, and record which call wrote a replace.
"""

from __future__ import annotations

from typing import Final

ITEM_KEY: Final = "openai_item"
"""Key of `metadata` under which an item's event keeps the item verbatim."""

CLEARED_KEY: Final = "openai_cleared"
"""Key of `metadata` that marks a cleared marker (it stands for no item); its value
names the call that wrote it, `"clear_session"` or `"pop_item"`."""

OP_KEY: Final = "openai_session_op"
"""Top-level `data` key (not projected, kept in the log) recording which call wrote a
replace and what it hid, for audit: `{"op": "pop_item", "popped_seq": 7}`, ..."""
