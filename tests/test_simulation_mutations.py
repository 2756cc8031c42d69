"""The simulation finds planted defects: each within 200 schedules, every run.

Each `nous_actor.testing.races.MUTATIONS` entry replaces a line of the runtime
by a known bug (a subscription ended before acknowledged events reach it, an
ask left unanswered in a stop race, a compaction applied twice after a retry,
an append acknowledged before its commit, a restart that loses the last
committed batch); the race scenario written for it must fail under one of the
first 200 seeded schedules, and pass without the mutation.
"""

from __future__ import annotations

import pytest

from nous_actor.testing.races import MUTATIONS, Mutation, mutate
from nous_actor.testing.simulation import find, replay

BUDGET = 200


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.function + ":" + m.name)
def test_the_simulation_finds_a_planted_defect_within_200_schedules(mutation: Mutation) -> None:
    """With the defect planted, a schedule among the first 200 fails, and replays failing."""
    scenario = mutation.scenario()
    with mutate(mutation):
        found = find(scenario, range(BUDGET))
        assert found is not None, f"{mutation.name}: not found in {BUDGET} schedules"
        n, outcome = found
        assert isinstance(outcome.error, AssertionError), outcome.error
        again = replay(scenario, outcome.schedule)
    assert again.digest == outcome.digest
    assert n <= BUDGET


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.function + ":" + m.name)
def test_a_mutation_is_undone_after_its_block(mutation: Mutation) -> None:
    """Leaving the block restores the function (the defect is gone)."""
    import importlib

    module, _, cls = mutation.owner.partition(":")
    owner = getattr(importlib.import_module(module), cls)
    before = owner.__dict__[mutation.function]
    with mutate(mutation):
        assert owner.__dict__[mutation.function] is not before
    assert owner.__dict__[mutation.function] is before


def test_a_mutation_that_no_longer_applies_says_so() -> None:
    """A mutation whose line is gone from the source is refused, naming it."""
    stale = Mutation(
        "stale", MUTATIONS[0].owner, "_shut", "no such line", "x", MUTATIONS[0].scenario
    )
    with pytest.raises(LookupError, match="stale"), mutate(stale):
        pass
