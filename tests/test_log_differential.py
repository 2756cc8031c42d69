"""The Log's fold agrees with the naive reference fold after every step of any program."""

from __future__ import annotations

from hypothesis import given

from nous_actor import Log
from nous_actor.testing import log_programs, reference_derive_indexed, reference_surface
from nous_actor.testing.strategies import LogOp


@given(log_programs())
def test_fold_matches_reference_after_every_step(program: list[LogOp]) -> None:
    """Surface seqs and derive_indexed equal the reference fold after each operation."""
    log = Log()
    for op in program:
        log = op.apply(log)
        events = log.events()
        assert [e.seq for e in log.surface()] == [e.seq for e in reference_surface(events)]
        assert log.derive_indexed() == reference_derive_indexed(events)
