"""Placeholder: filled in by the hardening work (goal rows G26-G28)."""

from __future__ import annotations

from bench import harness as h

__all__ = ["BENCHMARKS"]

BENCHMARKS: tuple[h.Benchmark, ...] = ()
