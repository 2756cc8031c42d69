"""SQLiteStore under the real fault: a writer process killed with SIGKILL at a random moment.

A child process appends through sessions on a SQLite file (plain appends,
replaces, pipelined batches over several sessions, snapshots) and prints a
line for each event it is about to send (``I``) and each event whose future
resolved (``A``, flushed as soon as it resolves). The parent kills it at a
random point (after a random number of acknowledgements, after a random delay,
or during start-up), then checks the file against what the child printed:

* ``PRAGMA integrity_check`` is ``ok``;
* every acknowledged event is stored intact (seq, type, time, data hash),
  unless a snapshot requested after it dropped it as shadowed;
* every stored event is one the child sent, intact;
* no hole: below a session's last stored seq, every seq is stored or was
  legitimately dropped by a snapshot (so no event is stored without its
  predecessors: no partial batch);
* a session started on the file afterwards recovers exactly the stored events
  and accepts appends.

The same file carries over from round to round, so later children recover from
a killed writer's file (stale writer claims, WAL replay, snapshot gaps).

A second test kills processes while they create a new store file (a fork
per round, killed after a random delay within the time a creation takes):
every file left behind must open as a healthy store.

Reproduce a failure with ``NOUS_CRASH_SEED=<seed printed in the failure>``
(the operations repeat exactly; the kill moments are timing and cannot).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

import pytest

from nous_actor import Event, Session, SQLiteStore
from nous_actor.core.codec import encode_data, format_time

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")

Durability = Literal["full", "normal"]
ROOT: Final = Path(__file__).resolve().parents[1]
ROUNDS: Final = 15
SESSIONS: Final = 3
LINE_TIMEOUT: Final = 20.0
"""Seconds to wait for the child's next line before calling it hung."""
EXIT_TIMEOUT: Final = 10.0
SEED: Final = int(os.environ.get("NOUS_CRASH_SEED", random.SystemRandom().randrange(2**32)))

CHILD: Final = r'''
import hashlib, json, random, sys

import structlog

# Our protocol owns stdout; the library's log lines go to stderr.
structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))

from nous_actor import Session, SQLiteStore
from nous_actor.core.codec import encode_data, format_time

path, durability, seed, n_sessions = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
out = sys.stdout
SURFACE = ("user_message", "assistant_message", "tool_result", "system_message")
BOOKKEEPING = ("tool_call", "turn_start", "step_end", "request_header")
TEXT = "the agent reads file returns error patch diff résumé ✓ tokens budget " * 40


def say(*lines):
    out.write("".join(line + "\n" for line in lines))
    out.flush()


def digest(data):
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


store = SQLiteStore(path, durability=durability)
ids = [f"s{i}" for i in range(n_sessions)]
sessions = {sid: Session.start(sid, store=store) for sid in ids}
nxt = {sid: s.count().get() for sid, s in sessions.items()}
say("R " + " ".join(f"{sid}={nxt[sid]}" for sid in ids))
made = 0


def make(sid):
    """The next event of ``sid``: (intent line, type, data)."""
    global made
    made += 1
    seq = nxt[sid]
    nxt[sid] += 1
    big = rng.random() < 0.05
    content = TEXT[: rng.randrange(20_000 if big else 300)] + f" #{made}"
    if seq and rng.random() < 0.2:
        start = rng.randrange(seq)
        stop = start + rng.randrange(4)
        etype = rng.choice(("system_message", "tool_result"))
        data = {"content": content, "surface_op": ["replace", start, stop]}
        op = f"{start} {stop}"
    else:
        etype = rng.choice(SURFACE + BOOKKEEPING)
        data = {"content": content, "n": made, "meta": {"k": [1, 2.5, None, True]}}
        op = "-"
    return f"I {sid} {seq} {etype} {digest(data)} {op}", etype, data


def ack(fut):
    ev = fut.get(timeout=30)
    data = json.loads(encode_data(ev))
    say(f"A {sid_of[id(fut)]} {ev.seq} {ev.type.value} {digest(data)} {format_time(ev.time)}")


sid_of = {}
while True:
    r = rng.random()
    if r < 0.05:
        sid = rng.choice(ids)
        say(f"S {sid}")
        n = sessions[sid].snapshot().get(timeout=30)
        say(f"s {sid} {n}")
        continue
    if r < 0.55:  # one append, acknowledged before the next
        batch = [rng.choice(ids)]
    else:  # a pipelined batch over one or more sessions: every future, then every get
        pool = rng.sample(ids, rng.randint(1, len(ids)))
        batch = [rng.choice(pool) for _ in range(rng.randint(2, 40))]
    made_now = [(sid, *make(sid)) for sid in batch]
    say(*[line for _, line, _, _ in made_now])
    futs = []
    for sid, _, etype, data in made_now:
        fut = sessions[sid].append(etype, data)
        sid_of[id(fut)] = sid
        futs.append(fut)
    for fut in futs:
        ack(fut)
    sid_of.clear()
'''


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass
class Known:
    """An event the parent knows of: sent by a child, or found stored after a round."""

    type: str
    digest: str
    op: tuple[int, int] | None
    time: str | None = None
    acked_at: int | None = None
    """Output line index of its acknowledgement; -1 when stored before this round."""


@dataclass
class Model:
    """What the file must hold, carried from round to round."""

    known: dict[str, dict[int, Known]] = field(default_factory=dict)
    dropped: dict[str, set[int]] = field(default_factory=dict)
    """Seqs a verified snapshot dropped in an earlier round."""


@dataclass(frozen=True)
class Stored:
    type: str
    time: str
    digest: str
    op: tuple[int, int] | None


def _rows(path: Path) -> dict[str, dict[int, Stored]]:
    """Every stored event, read with plain SQL (after checking the file's integrity)."""
    out: dict[str, dict[int, Stored]] = {}
    if not path.exists():
        return out
    conn = sqlite3.connect(path)
    try:
        check = conn.execute("PRAGMA integrity_check").fetchall()
        assert check == [("ok",)], f"integrity_check: {check}"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        if "events" not in tables:
            return out
        for sid, seq, etype, t, text in conn.execute(
            "SELECT session_id, seq, type, time, data FROM events ORDER BY session_id, seq"
        ):
            data = json.loads(text)
            op = data.get("surface_op")
            out.setdefault(sid, {})[seq] = Stored(
                etype, t, _digest(data), None if op is None else (op[1], op[2])
            )
    finally:
        conn.close()
    return out


def _read_lines(stream: Any, into: queue.Queue[str | None]) -> None:
    for line in stream:
        into.put(line)
    into.put(None)


class _Child:
    """A running child and the lines it printed so far (read by a thread, taken with bounds)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.acks = 0
        self.eof = False
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(
            target=_read_lines, args=(proc.stdout, self._queue), daemon=True
        )
        self.reader.start()

    def ready(self) -> bool:
        """Whether the child has recovered its sessions (its first line, ``R``)."""
        return bool(self.lines)

    def _take(self, timeout: float) -> bool:
        """Take one line, waiting at most ``timeout``; False on timeout or end of output."""
        try:
            line = self._queue.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return False
        if line is None:
            self.eof = True
            return False
        self.lines.append(line)
        self.acks += line.startswith("A ")
        return True

    def take_until(self, done: Callable[[], bool], deadline: float) -> None:
        """Take lines until ``done()`` or the ``deadline`` (monotonic seconds)."""
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if not self._take(remaining):
                if self.eof:
                    raise AssertionError("the child exited on its own; see its stderr")
                return

    def kill_and_drain(self) -> list[str]:
        """SIGKILL, wait, then every complete line it printed (the pipe keeps them)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=EXIT_TIMEOUT)
        deadline = time.monotonic() + EXIT_TIMEOUT
        while not self.eof and self._take(deadline - time.monotonic()):
            pass
        assert self.eof, "the child's output did not end after SIGKILL"
        assert self.proc.returncode == -signal.SIGKILL, (
            f"the child ended with {self.proc.returncode} before the kill"
        )
        return [ln for ln in self.lines if ln.endswith("\n")]


@contextmanager
def _child(path: Path, durability: str, seed: int, log: Path) -> Iterator[_Child]:
    """A child writing to ``path``; killed and reaped on the way out, whatever happened."""
    with log.open("ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), durability, str(seed), str(SESSIONS)],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            text=True,
            encoding="utf-8",
        )
        child = _Child(proc)
        try:
            yield child
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=EXIT_TIMEOUT)
            child.reader.join(timeout=EXIT_TIMEOUT)
            assert proc.stdout is not None
            proc.stdout.close()


def _run_round(path: Path, durability: str, seed: int, rng: random.Random, log: Path) -> list[str]:
    """Start a child, kill it at a random point, return its complete output lines."""
    with _child(path, durability, seed, log) as child:
        plan = rng.choice(("acks", "acks", "delay", "start-up"))
        started = time.monotonic()
        if plan == "start-up":  # anywhere in start-up: imports, open, claims, recovery
            child.take_until(lambda: False, started + rng.uniform(0.0, 0.4))
        else:
            child.take_until(child.ready, started + LINE_TIMEOUT)
            assert child.ready(), f"the child printed nothing in {LINE_TIMEOUT:g} s (hung?)"
            if plan == "acks":
                want = rng.choice((0, 1, rng.randint(2, 40), rng.randint(40, 400)))
                child.take_until(lambda: child.acks >= want, time.monotonic() + LINE_TIMEOUT)
                assert child.acks >= want, f"no {want} acks in {LINE_TIMEOUT:g} s (hung?)"
            else:
                child.take_until(lambda: False, time.monotonic() + rng.uniform(0.0, 0.3))
        return child.kill_and_drain()


def _shadows(r: Known, r_seq: int, seq: int, k: Known) -> bool:
    pos = k.op[0] if k.op is not None else seq
    return r.op is not None and r_seq > seq and r.op[0] <= pos <= r.op[1]


def _verify(model: Model, lines: list[str], rows: dict[str, dict[int, Stored]]) -> None:
    """Check the stored rows against the model and what the child printed."""
    intents: dict[str, dict[int, Known]] = {}
    snapshots: dict[str, list[int]] = {}
    for i, line in enumerate(lines):
        kind, *f = line.split()
        if kind == "R":
            for item in f:
                sid, _, count = item.partition("=")
                known = model.known.get(sid, {})
                want = max(known, default=-1) + 1
                assert int(count) == want, f"child recovered {sid} with count {count}, not {want}"
        elif kind == "I":
            sid, seq = f[0], int(f[1])
            assert seq not in model.known.get(sid, {}), f"child reused stored seq {sid}/{seq}"
            op = None if f[4] == "-" else (int(f[4]), int(f[5]))
            intents.setdefault(sid, {})[seq] = Known(f[2], f[3], op)
        elif kind == "A":
            sid, seq = f[0], int(f[1])
            k = intents[sid][seq]
            assert (k.type, k.digest) == (f[2], f[3]), f"ack of {sid}/{seq} differs from intent"
            k.time, k.acked_at = f[4], i
        elif kind == "S":
            snapshots.setdefault(f[0], []).append(i)
    sids = set(model.known) | set(intents) | set(rows)
    for sid in sorted(sids):
        stored = rows.get(sid, {})
        every = {**model.known.get(sid, {}), **intents.get(sid, {})}

        def dropped_ok(seq: int, sid: str = sid, every: dict[int, Known] = every) -> bool:
            k = every.get(seq)
            if k is None or k.acked_at is None:
                return False  # never acknowledged: a snapshot cannot have dropped it
            return any(
                r.acked_at is not None and r.acked_at < s and _shadows(r, r_seq, seq, k)
                for s in snapshots.get(sid, [])
                if s > k.acked_at
                for r_seq, r in every.items()
            )

        for seq, row in stored.items():
            k = every.get(seq)
            assert k is not None, f"{sid}/{seq} is stored but was never sent"
            assert (row.type, row.digest) == (k.type, k.digest), f"{sid}/{seq} stored corrupt"
            assert row.op == k.op, f"{sid}/{seq} stored with another surface_op"
            if k.time is not None:
                assert row.time == k.time, f"{sid}/{seq} stored with another time"
        for seq, k in every.items():
            if k.acked_at is not None and seq not in stored:
                assert dropped_ok(seq), f"acknowledged {sid}/{seq} is lost"
        top = max(stored, default=-1)
        for seq in range(top):
            if seq not in stored and seq not in model.dropped.get(sid, set()):
                assert dropped_ok(seq), (
                    f"{sid}/{seq} is missing while {sid}/{top} is stored (partial write)"
                )


def _recover(path: Path, durability: Durability, model: Model, round_no: int) -> None:
    """Sessions started on the file recover the stored events and accept appends."""
    rows = _rows(path)
    store = SQLiteStore(path, durability=durability)
    try:
        for i in range(SESSIONS):
            sid = f"s{i}"
            stored = rows.get(sid, {})
            s = Session.start(sid, store=store, timeout=10)
            try:
                count = max(stored, default=-1) + 1
                assert s.count().get() == count, f"{sid} recovered a wrong count"
                got = [
                    (e.seq, e.type.value, format_time(e.time), _digest(json.loads(encode_data(e))))
                    for e in s.events().get()
                ]
                want = [
                    (q, stored[q].type, stored[q].time, stored[q].digest) for q in sorted(stored)
                ]
                assert got == want, f"{sid} recovered other events than the file holds"
                s.derive_messages().get()
                ev = s.append("user_message", {"content": f"parent, round {round_no}"}).get()
                assert ev.seq == count
            finally:
                s.stop()
    finally:
        store.close()
    rows = _rows(path)
    model.known = {
        sid: {seq: Known(r.type, r.digest, r.op, r.time, acked_at=-1) for seq, r in stored.items()}
        for sid, stored in rows.items()
    }
    model.dropped = {
        sid: set(range(max(stored) + 1)) - set(stored) for sid, stored in rows.items()
    }
    for i in range(SESSIONS):
        assert f"s{i}" in rows, f"the parent's append to s{i} is not stored"


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_sigkill_loses_no_acknowledged_event_and_leaves_no_partial_write(
    tmp_path: Path, durability: Durability
) -> None:
    """A writer killed with SIGKILL at random points never loses or tears acknowledged events."""
    rng = random.Random(f"{SEED}-{durability}")
    path = tmp_path / "crash.db"
    stderr_log = tmp_path / "child-stderr.log"
    model = Model()
    acks = 0
    for round_no in range(ROUNDS):
        where = f"seed {SEED} ({durability}), round {round_no}"
        try:
            lines = _run_round(path, durability, rng.randrange(2**32), rng, stderr_log)
            rows = _rows(path)
            _verify(model, lines, rows)
            _recover(path, durability, model, round_no)
        except AssertionError as exc:
            tail = stderr_log.read_text(errors="replace")[-3000:] if stderr_log.exists() else ""
            raise AssertionError(
                f"{exc}\n[{where}; reproduce with NOUS_CRASH_SEED={SEED}]\n"
                f"child stderr (tail):\n{tail}"
            ) from exc
        acks += sum(ln.startswith("A ") for ln in lines)
    assert acks > 0, f"no round acknowledged anything (seed {SEED})"


# -- SIGKILL while a store file is being created ---------------------------------------------

CREATOR: Final = r"""
import os, signal, sys, time

from nous_actor import SQLiteStore

# Reads "<path>\t<delay>" lines. For each, forks a process that runs SQLiteStore(path),
# SIGKILLs it after `delay` seconds unless it finished first, reaps it, and says which.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
print("ready", flush=True)
for line in sys.stdin:
    path, delay = line.rstrip("\n").split("\t")
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            SQLiteStore(path).close()
        finally:
            os._exit(0)
    signal.sigtimedwait({signal.SIGCHLD}, float(delay))  # the child's end, or the delay
    os.kill(pid, signal.SIGKILL)  # a no-op for a child that has exited (not yet reaped)
    _, status = os.waitpid(pid, 0)
    signal.sigtimedwait({signal.SIGCHLD}, 0)  # this child's SIGCHLD must not end the next wait
    outcome = "killed" if os.WIFSIGNALED(status) else "finished"
    print(outcome, f"{time.perf_counter() - started:.6f}", flush=True)
"""
CREATE_ROUNDS: Final = 100


def _empty_sqlite_database(path: Path) -> None:
    """A SQLite file with nothing in it (one page): it becomes a store like a missing path."""
    conn = sqlite3.connect(path)
    conn.execute("VACUUM")
    conn.close()
    assert path.stat().st_size > 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("start", ["missing", "empty SQLite database"])
def test_sigkill_while_a_store_file_is_created_leaves_no_store_or_a_whole_one(
    tmp_path: Path, start: str
) -> None:
    """A process killed at a random moment of `SQLiteStore(path)`, on a missing path or an
    empty SQLite database, leaves no store or a whole one: every file opens, healthy."""
    rng = random.Random(f"{SEED}-create-{start}")

    def fresh(name: str) -> Path:
        path = tmp_path / name
        if start != "missing":
            _empty_sqlite_database(path)
        return path

    proc = subprocess.Popen(
        [sys.executable, "-c", CREATOR],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        text=True,
    )
    child = _Child(proc)
    try:

        def run(path: Path, delay: float) -> tuple[str, float]:
            assert proc.stdin is not None
            proc.stdin.write(f"{path}\t{delay}\n")
            proc.stdin.flush()
            before = len(child.lines)
            child.take_until(lambda: len(child.lines) > before, time.monotonic() + LINE_TIMEOUT)
            assert len(child.lines) > before, f"no answer within {LINE_TIMEOUT:g} s"
            outcome, seconds = child.lines[-1].split()
            return outcome, float(seconds)

        child.take_until(child.ready, time.monotonic() + LINE_TIMEOUT)
        assert child.lines == ["ready\n"], "the creator did not start"
        # How long a creation takes here, so that the kills spread over all of it.
        took = sorted(run(fresh(f"calibrate-{i}.db"), LINE_TIMEOUT)[1] for i in range(3))
        span = 1.3 * took[1]
        outcomes = [
            run(fresh(f"new-{i}.db"), rng.uniform(0.0, span))[0] for i in range(CREATE_ROUNDS)
        ]
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=EXIT_TIMEOUT)
        child.reader.join(timeout=EXIT_TIMEOUT)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert "killed" in outcomes, f"no creation was killed (seed {SEED})"
    refused = []
    for i in range(CREATE_ROUNDS):
        path = tmp_path / f"new-{i}.db"
        left = "no file" if not path.exists() else f"{path.stat().st_size} bytes"
        try:
            with SQLiteStore(path) as store:
                assert store.integrity_check() == "ok"
                assert store.write({"s": [Event(0, "turn_start", datetime.now(UTC), {})]}) == {}
                assert [e.seq for e in store.load("s")] == [0]
        except Exception as exc:
            refused.append(f"{path.name} ({outcomes[i]}, left {left}): {exc}")
    assert not refused, (
        f"{len(refused)} of {CREATE_ROUNDS} files are not stores (seed {SEED}):\n"
        + ("\n".join(refused[:5]))
    )
