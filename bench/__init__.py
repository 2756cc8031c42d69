"""The benchmark suite of nous_actor (``make bench``, i.e. ``python -m bench``).

Measures the goals of DESIGN.md §8 side by side with a baseline in one run
and prints a table of ratios with pass/fail verdicts. Never part of the test
run. Modules:

* :mod:`bench.harness`: registration, sizing, timing and statistics helpers;
* :mod:`bench.workload`: deterministic session-shaped workloads and a log builder;
* :mod:`bench.core`: the pure core (fold, append + derive, append, memory, codec);
* :mod:`bench.report`: the table and the JSON file of all numbers.
"""
