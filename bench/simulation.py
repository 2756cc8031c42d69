"""The deterministic simulation: schedules per minute, and how soon it finds planted bugs.

* ``simulation.schedules``: a registry with crashes (10 sessions, 3 callers, crashes,
  stops, failed and slow commits, ~300 steps a schedule) run under seeded schedules,
  on a MemoryStore and on a SQLite file: schedules per minute (goal of the issue:
  >= 1,000 on 2 CPUs), and the digest of one seed over three runs (equal); and the
  same on a MemoryStore with two asyncio callers (coroutines on the simulation's
  event loop) beside the three generator callers.
* ``simulation.mutations``: each planted defect of ``nous_actor.testing.races``:
  how many schedules the simulation needs to find it, and how many runs on real
  threads (capped) find it, side by side.
"""

from __future__ import annotations

import sys
import time
from typing import Final

from bench import harness as h
from nous_actor.testing.races import MUTATIONS, mutate, registry_scenario, run_real
from nous_actor.testing.simulation import FaultRates, Schedule, find, replay

__all__ = ["BENCHMARKS"]

SCHEDULES_GOAL: Final = 1000.0
"""Schedules per minute the registry-with-crashes scenario must reach (the issue's goal)."""

RATES: Final = FaultRates(crash=0.01, stop=0.005, fail_commit=0.01, slow_commit=0.03)


def bench_schedules(cfg: h.Config) -> h.Section:
    """Schedules per minute of the registry-with-crashes scenario (memory and SQLite)."""
    sec = h.Section()
    runs = (
        ("memory", cfg.pick(600, 60), 0),
        ("sqlite", cfg.pick(200, 20), 0),
        ("memory", cfg.pick(300, 30), 2),
    )
    for store, n, coroutines in runs:
        scenario = registry_scenario(
            sessions=10, callers=3, appends=12, store=store, async_callers=coroutines
        )
        also = f" + {coroutines} asyncio callers" if coroutines else ""
        h.progress(f"simulation.schedules: {n} schedules on {store}{also}")
        steps: list[float] = []
        handoffs: list[float] = []
        failed = 0
        t0 = time.perf_counter()
        for seed in range(n):
            out = replay(scenario, Schedule(seed, rates=RATES))
            steps.append(out.steps)
            handoffs.append(out.handoffs)
            failed += out.error is not None
        secs = time.perf_counter() - t0
        per_min = n * 60.0 / secs
        digests = {replay(scenario, Schedule(7, rates=RATES)).digest for _ in range(3)}
        st = h.Stats.of(steps)
        sec.rows.append(
            h.info_row(
                f"simulation: registry with crashes on {store}, 10 sessions x 3 callers"
                f"{also}, ~{st.median:.0f} steps a schedule",
                f"{per_min:,.0f} schedules/min",
                f"goal >= {SCHEDULES_GOAL:,.0f}",
                f"{per_min / SCHEDULES_GOAL:.1f}x goal",
                schedules=n,
                asyncio_callers=coroutines,
                seconds=secs,
                per_minute=per_min,
                steps=st.as_dict(),
                handoffs=h.Stats.of(handoffs).as_dict(),
                failed=failed,
                digests_of_three_runs=len(digests),
                meets_goal=per_min >= SCHEDULES_GOAL,
            )
        )
        if failed or len(digests) != 1:
            raise AssertionError(
                f"simulation.schedules: {failed} schedules failed, {len(digests)} digests"
            )
    sec.notes.append(
        "each schedule: a fresh Simulation (seeded), a registry on a new store, 3 caller "
        "tasks appending 12 times each to 10 sessions, each append checked against the store "
        "at its acknowledgement and read back; faults drawn from the seed (crash 1%, stop "
        "0.5%, failed commit 1%, slow commit 3% per step). The GC stays on. The digest of "
        "seed 7 over three runs is equal (checked). handoffs: how often a schedule passed the "
        "baton between real threads (a step that cannot block, a turn or a commit, runs on the "
        "thread that chose it)."
    )
    return sec


def bench_mutations(cfg: h.Config) -> h.Section:
    """Schedules (simulation) vs runs (real threads) to find each planted defect."""
    budget = 200
    real_cap = cfg.pick(50, 3)
    sec = h.Section()
    for m in MUTATIONS:
        h.progress(f"simulation.mutations: {m.name}")
        with mutate(m):
            t0 = time.perf_counter()
            found = find(m.scenario(), range(budget))
            sim_s = time.perf_counter() - t0
            real_runs = None
            t0 = time.perf_counter()
            for k in range(1, real_cap + 1):
                if run_real(m.scenario(), timeout=2.0) is not None:
                    real_runs = k
                    break
            real_s = time.perf_counter() - t0
        sim_n = None if found is None else found[0]
        sec.rows.append(
            h.info_row(
                f"simulation: planted defect, {m.name}",
                f"found in {sim_n} schedules ({sim_s:.2f} s)"
                if sim_n
                else f"not found in {budget}",
                f"threads: {real_runs} runs ({real_s:.1f} s)"
                if real_runs
                else f"threads: not in {real_cap} runs ({real_s:.1f} s)",
                "-",
                schedules=sim_n,
                sim_seconds=sim_s,
                real_runs=real_runs,
                real_cap=real_cap,
                real_seconds=real_s,
            )
        )
    sec.notes.append(
        f"simulation: seeds 0..{budget - 1} in order until one fails; real threads: the same "
        f"scenario on threads (a 2 s bound on every call), up to {real_cap} runs."
    )
    return sec


BENCHMARKS: Final[tuple[h.Benchmark, ...]] = (
    h.Benchmark("simulation.schedules", "simulation schedules per minute", bench_schedules),
    h.Benchmark("simulation.mutations", "simulation finds planted defects", bench_mutations),
)


if __name__ == "__main__":
    sys.exit(h.run_module(BENCHMARKS))
