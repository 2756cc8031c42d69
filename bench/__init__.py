"""The benchmark suite of nous_actor (``make bench``, i.e. ``python -m bench``).

Measures the goals of DESIGN.md §8 side by side with a baseline in one run,
the cyclic GC on in every timed section, and prints a table of ratios with
PASS/FAIL verdicts (``bench/results/latest.{txt,json}``, figures beside them).
Modules:

* :mod:`bench.harness`: goals, rows, sizing, timing, threads, statistics, formatting;
* :mod:`bench.workload`: deterministic session-shaped workloads and a log builder;
* :mod:`bench.core`: the pure core (G7 fold, G6 append + derive, append, codec);
* :mod:`bench.session`: the session actor (G1 round trip, G2 pipelined, threads, derive);
* :mod:`bench.durable`: SQLite (G3 100x100 in three caller shapes vs the peers and the
  raw-sqlite3 floor, G37 CPU per append, G4 sweep, G8 recovery);
* :mod:`bench.runtime`: the process: G14 threads, G15 idle memory, G16 open 10,000, G17 exit;
* :mod:`bench.lifetime`: G5 long compacted session, G9 slow summariser, G10 memory;
* :mod:`bench.peers`: the optional peers (eventsourcing, the Agents SDK SQLiteSession);
* :mod:`bench.adk`: ADK's session service (G18-G21), beside ADK's ``DatabaseSessionService``;
* :mod:`bench.report`, :mod:`bench.plot`: the table, the JSON file, the figures.
"""
