"""The codec's fast path (msgspec) reads exactly what the stdlib path reads.

Stored JSON is read by msgspec first; whatever it refuses is read again by the
stdlib decoder, which has the last word (its value or its error). These tests hold
the two paths to one meaning: on every text msgspec accepts, the value is the one the
stdlib path gives, frozen the same way; on text it refuses, the stdlib path decides.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from nous_actor import FrozenDict
from nous_actor.core import codec
from nous_actor.core._frozen import FrozenList, encode_json, freeze

_ATOMS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_VALUES = st.recursive(
    _ATOMS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
_OBJECTS = st.dictionaries(st.text(), _VALUES, max_size=5)


def _stdlib(text: str) -> Any:
    """The stdlib path alone: the decoder's scanner with the freezing hook."""
    value, end = codec._DECODER.scan_once(text, 0)
    assert not text[end:].strip()
    return value


def _assert_frozen_alike(a: Any, b: Any) -> None:
    """Equal, and frozen the same way at every level (FrozenDict / FrozenList)."""
    assert type(a) is type(b)
    if type(a) is FrozenDict:
        assert list(a) == list(b)
        for k in a:
            _assert_frozen_alike(a[k], b[k])
    elif type(a) is FrozenList:
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_frozen_alike(x, y)
    elif type(a) is float:
        assert str(a) == str(b)  # equal, and -0.0 stays -0.0
    else:
        assert a == b


@given(_OBJECTS)
@example({"x": -0.0, "y": 1e308, "z": "\x00", "big": 2**200})
@example({"a": "\U0001f600\u2028", "b": [], "c": {}})
def test_what_the_fast_path_reads_is_what_the_stdlib_path_reads(obj: dict[str, Any]) -> None:
    for text in (
        encode_json(freeze(obj)),
        json.dumps(obj),
        json.dumps(obj, indent=1, ensure_ascii=True),
    ):
        fast = codec._fast_object(text, codec._frozen_tree)
        assert fast is not None
        _assert_frozen_alike(fast, _stdlib(text))
        _assert_frozen_alike(codec._load_stored(text, 0), _stdlib(text))


@given(st.text(max_size=40))
@example('{"a": 1, "a": 2}')
@example('{"a": 1e999}')
@example('{"a": "\\ud800"}')
@example('{"a": NaN}')
@example('{"a": 1} {}')
@example("[1, 2]")
def test_on_any_text_the_fast_path_agrees_or_defers(text: str) -> None:
    """On arbitrary text the fast path either reads the stdlib's value or gives up."""
    fast = codec._fast_object(text, codec._frozen_tree)
    if fast is None:
        return
    _assert_frozen_alike(fast, _stdlib(text))


@given(_OBJECTS)
def test_encoding_a_frozen_value_is_the_stdlib_text_read_back(obj: dict[str, Any]) -> None:
    """The fast encoder's text reads back as the value (byte-for-byte text may differ
    only in how a float is spelled: 1e-07 or 1e-7)."""
    frozen = freeze(obj)
    text = encode_json(frozen)
    _assert_frozen_alike(_stdlib(text), frozen)
    assert json.loads(text) == json.loads(codec.JSON_ENCODER.encode(frozen))
