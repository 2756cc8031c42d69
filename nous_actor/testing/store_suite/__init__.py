"""`StoreContract`: the `Store` rules as a pytest suite (the stateful part is in
`nous_actor.testing.store_machine`; `nous_actor.testing.store_contract` offers both).

Two modules: ``_helpers`` (the events and checks the tests share) and
``_contract`` (`StoreContract`, one class whose tests are grouped by section:
writes, sessions, transfer, sharing, then the threads and the stateful test).
"""

from __future__ import annotations

from nous_actor.testing.store_machine import assert_same_events as assert_same_events
from nous_actor.testing.store_suite._contract import StoreContract as StoreContract

__all__ = ["StoreContract", "assert_same_events"]
