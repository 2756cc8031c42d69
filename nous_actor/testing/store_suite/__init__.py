"""`StoreContract`: the `Store` rules as a pytest suite (the stateful part is in
`nous_actor.testing.store_machine`; `nous_actor.testing.store_contract` offers both).

The package's modules, each importing only those above it: ``_helpers`` (the
events and checks the tests share), then the rules by subject, ``_writes``
(write and load, conflicts), ``_sessions`` (drop, delete, claims, a closed
store), ``_transfer`` (export and import, errors as StoreError), ``_sharing``
(the optional methods for other processes), and ``_contract`` (`StoreContract`,
which runs them all).
"""

from __future__ import annotations

from nous_actor.testing.store_machine import assert_same_events as assert_same_events
from nous_actor.testing.store_suite._contract import StoreContract as StoreContract

__all__ = ["StoreContract", "assert_same_events"]
