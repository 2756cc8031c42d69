"""Benchmarks of calls that go to the process where a session lives (G29-G32).

``location`` (``--only location``):

* ``location.fleet``: web-worker processes of `bench.fleet` on one host and one
  store, started with WAIT=0: a request for a session another worker holds is
  forwarded to that worker (the session does not move). 4 workers against 1
  worker alone, side by side in one run (alternating, a fresh store each run),
  32 clients, each request one turn (a user and an assistant message) for a
  conversation picked at random among 20, and the hot shape (4 conversations);
  on SQLite and on PostgreSQL (not run without a server). Rows: the 4 workers'
  requests/s over one worker's (G29: >= 1.5x), their p99 latency over one
  worker's (G30: <= 1.5x), the calls a live worker saw refused (G31: 0), also in
  a separate run where two workers are SIGKILLed midway (the calls whose holder
  died before answering are counted as ambiguous and shown). As context, the
  same 4 workers moving each session to the worker asked (the hand-off,
  ``wait=30``, as before forwarding). Every run's histories are checked (whole
  turns, in order, each acknowledged request once) before its numbers count.
* ``location.append``: one caller appends to a session this process holds
  (local) and to one a child process holds (this process forwards each call
  there), on one SQLite file: the round trip of an awaited append
  (``append().get()``) forwarded over local (G32: <= 3x), the same from one
  asyncio coroutine awaiting each append (G32), and, as context, the pipelined
  throughput of both (every append sent, then every answer collected).

The cyclic GC stays on; SQLite stores use ``durability="full"``.

Run alone: ``python -m bench.location [--quick]``; or ``python -m bench --only location``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from bench import harness as h
from bench.fleet import COLD, ROOT, SERVERS, Fleet, check_histories, open_store, run_clients
from bench.postgres import _schema, _sql, server

__all__ = ["BENCHMARKS", "main"]

THROUGHPUT_ID: Final = "G29"
P99_ID: Final = "G30"
REFUSALS_ID: Final = "G31"
ROUND_TRIP_ID: Final = "G32"
THROUGHPUT_GOAL: Final = 1.5
P99_GOAL: Final = 1.5
ROUND_TRIP_GOAL: Final = 3.0
WORKERS: Final = 4
CLIENTS: Final = 32
CONVERSATIONS: Final = 20
HOT_CONVERSATIONS: Final = 4
HANDOFF_WAIT: Final = 30.0
WARM: Final = 20
"""Awaited appends to each session before the timed runs."""
PAYLOAD: Final = {"content": "a short message of a conversation, about sixty characters."}


# -- the fleet against one worker ---------------------------------------------------------------


@dataclass
class Run:
    """One fleet run: what the clients saw, and what is wrong with the stored histories."""

    kind: str
    workers: int
    requests: int
    per_s: float
    p50: float
    p99: float
    refused: int  # calls a live worker saw refused (SessionStopped), then made again
    ambiguous: int  # calls whose holder died before answering (checked, then made again)
    found: int  # of those, the ones `applied(call_id)` found applied (not made again)
    resent: int  # requests sent again because their worker died
    killed: int
    cpu_ms: float | None = None  # the workers' CPU time per request (None: not measured)
    problems: list[str] = field(default_factory=list)
    client_cpu_ms: float | None = None  # the clients' (this process's) CPU time per request
    p99_warm: float | None = None  # the p99 after the first fleet.COLD answers
    per_s_warm: float | None = None  # requests/s after the first fleet.COLD answers
    server_cpu_ms: float | None = None  # the database server's CPU time per request

    def numbers(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "workers": self.workers,
            "requests": self.requests,
            "per_s": self.per_s,
            "p50_s": self.p50,
            "p99_s": self.p99,
            "p99_warm_s": self.p99_warm,
            "per_s_warm": self.per_s_warm,
            "refused": self.refused,
            "ambiguous": self.ambiguous,
            "found_applied": self.found,
            "resent": self.resent,
            "killed": self.killed,
            "cpu_ms_per_request": self.cpu_ms,
            "client_cpu_ms_per_request": self.client_cpu_ms,
            "server_cpu_ms_per_request": self.server_cpu_ms,
            "problems": self.problems[:5],
        }


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def _cpu_seconds(pids: list[int]) -> float | None:
    """The CPU time (user + system) the processes ``pids`` used so far; ``None`` where the
    system does not say (Linux's /proc does)."""
    total = 0.0
    try:
        for pid in pids:
            fields = _stat(pid)
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return total


def _postmaster(base: str | None) -> int | None:
    """The pid of the PostgreSQL server at ``base`` if it runs on this machine and says
    where its data lives (its first process, the parent of its backends); ``None`` for
    SQLite, a remote server, or a server that does not say."""
    if base is None:
        return None
    try:
        data = _sql(base, "SHOW data_directory")[0][0]
        pid = int((Path(data) / "postmaster.pid").read_text().split()[0])
        _stat(pid)
    except Exception:  # not a local server this process may look at: not measured
        return None
    return pid


def _server_cpu(postmaster: int | None) -> float | None:
    """The CPU time (user + system) the database server used so far: its first process,
    the children it has reaped (their whole time, as the kernel adds it up) and those
    still running; ``None`` where not known."""
    if postmaster is None:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    try:
        fields = _stat(postmaster)
        total = sum(int(f) for f in fields[11:15]) / tick
    except (OSError, ValueError, IndexError):
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat(int(entry.name))
            if int(fields[1]) == postmaster:
                total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile: its time is in the server's reaped children's
    return total


def _fleet_run(
    spec: str, folder: Path, kind: str, workers: int, wait: float,
    sent: list[tuple[str, str]], kills: int = 0, seed: int = 32, postmaster: int | None = None,
    sticky: bool = False, server: str = "threads",
) -> Run:  # fmt: skip
    """``sent`` from `CLIENTS` clients to ``workers`` fresh workers on ``spec``, each
    serving as ``server`` says (`bench.fleet.SERVERS`); with ``kills``, that many workers
    SIGKILLed (and replaced) at even marks of the traffic; ``sticky``: each
    conversation's requests to one worker (see `run_clients`)."""
    open_store(spec).close()  # the store exists before the workers race to make it
    fleet = Fleet(spec, folder, wait=wait, server=server)
    fleet.start(workers)
    rng = random.Random(seed)
    marks = [len(sent) * (k + 1) // (kills + 1) for k in range(kills)]
    killed: list[int] = []
    killers: list[threading.Thread] = []
    lock = threading.Lock()

    def on_progress(done: int) -> None:
        with lock:
            if not marks or done < marks[0]:
                return
            marks.pop(0)
        t = threading.Thread(target=lambda: killed.append(fleet.kill_one(rng)), daemon=True)
        killers.append(t)
        t.start()

    pids = [w.pid for w in fleet.live()]
    cpu0, mine0, db0 = _cpu_seconds(pids), time.process_time(), _server_cpu(postmaster)
    try:
        out = run_clients(fleet, sent, CLIENTS, seed=seed, on_progress=on_progress, sticky=sticky)
        mine = (time.process_time() - mine0) * 1000 / len(sent)
        for t in killers:
            t.join(h.JOIN_TIMEOUT)
        cpu1 = None if kills else _cpu_seconds(pids)
        db1 = None if kills else _server_cpu(postmaster)
    finally:
        fleet.stop()
    store = open_store(spec)
    try:
        histories = {sid: store.load(sid) for sid in store.sessions()}
    finally:
        store.close()
    problems = out.errors + check_histories(histories, out.acked, {r: s for s, r in sent})
    if len(out.acked) != len(sent):
        problems.append(f"{len(out.acked)} of {len(sent)} requests acknowledged")
    if len(killed) != kills:
        problems.append(f"{len(killed)} of {kills} workers killed mid-traffic")
    return Run(
        kind, workers, len(sent), len(sent) / out.seconds, out.p50, out.p99,
        out.stopped, out.ambiguous, out.found, out.retried, len(killed),
        None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) * 1000 / len(sent), problems,
        client_cpu_ms=mine, p99_warm=out.p99_warm, per_s_warm=out.per_s_warm,
        server_cpu_ms=None if db0 is None or db1 is None else (db1 - db0) * 1000 / len(sent),
    )  # fmt: skip


def cpu_bound(fleet: list[Run], alone: list[Run], cpus: int) -> float | None:
    """The most the fleet could serve here over one worker's rate: every CPU busy with
    requests that each cost what the fleet's measured (its workers' CPU plus the clients'
    and, when it runs here, the database server's), over one worker alone's requests/s
    (``None`` where the CPU was not measured)."""
    costs = [
        r.cpu_ms + r.client_cpu_ms + (r.server_cpu_ms or 0.0)
        for r in fleet
        if r.cpu_ms is not None and r.client_cpu_ms is not None
    ]
    if not costs or not alone:
        return None
    most = cpus * 1000 / statistics.median(costs)
    return most / statistics.median(r.per_s for r in alone)


@contextlib.contextmanager
def _fresh(base: str | None, tag: str) -> Iterator[tuple[str, Path]]:
    """A fresh store (a SQLite file, or a PostgreSQL schema on the server ``base``) and a
    fresh folder for the workers' sockets."""
    with h.scratch(tag) as where:
        if base is None:
            yield f"sqlite:{where / 'app.db'}", where
            return
        with _schema(base) as schema:
            yield f"postgres:{schema}:{base}", where


def _requests(n: int, conversations: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [(f"s{rng.randrange(conversations)}", f"r{i}") for i in range(n)]


def _ms(seconds: float) -> str:
    return h.fmt_time(seconds * 1e9)


@dataclass
class Shape:
    label: str  # "20 conversations at random" / "hot: 4 conversations"
    conversations: int
    requests: int
    server: str = "threads"  # how each worker serves its connections (`SERVERS`)

    @property
    def workers(self) -> str:
        """The workers' kind, as the rows name them."""
        return "asyncio workers" if self.server == "asyncio" else "threaded workers"


def _compare(
    base: str | None, store: str, shape: Shape, repeats: int, context: bool
) -> dict[str, list[Run]]:
    """The 4-worker fleet and one worker alone (and, as ``context``, the same fleet with
    each conversation's requests sent to one worker, and for threaded workers the
    hand-off fleet), run alternately ``repeats`` times, each on a fresh store."""
    kinds: list[tuple[str, int, float]] = [("fleet", WORKERS, 0.0), ("alone", 1, 0.0)]
    if context:
        kinds.append(("sticky", WORKERS, 0.0))
        if shape.server == "threads":
            kinds.append(("handoff", WORKERS, HANDOFF_WAIT))
    runs: dict[str, list[Run]] = {k: [] for k, _, _ in kinds}
    postmaster = _postmaster(base)
    for k in range(repeats):
        order = kinds if k % 2 == 0 else list(reversed(kinds))
        sent = _requests(shape.requests, shape.conversations, seed=32 + k)
        for kind, workers, wait in order:
            h.progress(
                f"location.fleet: {store}, {shape.workers}, {shape.label}, {kind}, "
                f"{k + 1}/{repeats}"
            )
            with _fresh(base, f"loc-{kind}") as (spec, folder):
                runs[kind].append(
                    _fleet_run(
                        spec,
                        folder,
                        kind,
                        workers,
                        wait,
                        sent,
                        seed=k,
                        postmaster=postmaster,
                        sticky=kind == "sticky",
                        server=shape.server,
                    )
                )
            h.settle()
    return runs


def _fleet_rows(store: str, shape: Shape, runs: dict[str, list[Run]]) -> list[h.Row]:
    fleet, alone = runs["fleet"], runs["alone"]
    problems = [p for r in fleet + alone for p in r.problems]
    valid = not problems
    rate = h.ratios([r.per_s for r in fleet], [r.per_s for r in alone])
    p99 = h.ratios([r.p99 for r in fleet], [r.p99 for r in alone])
    per_s = h.Stats.of([r.per_s for r in fleet])
    per_s1 = h.Stats.of([r.per_s for r in alone])
    cpu = _cpu_text(fleet), _cpu_text(alone)
    bound = cpu_bound(fleet, alone, len(os.sched_getaffinity(0)))
    numbers = {
        "store": store,
        "shape": shape.label,
        "server": shape.server,
        "fleet": [r.numbers() for r in fleet],
        "alone": [r.numbers() for r in alone],
    }
    what = (
        f"{WORKERS} {shape.workers} forwarding vs 1 alone, {store}, {shape.label}, "
        f"{CLIENTS} clients"
    )
    rows = [
        h.goal_row(
            THROUGHPUT_ID,
            f"{what}: requests/s",
            ours=f"{per_s.median:.0f} [{per_s.min:.0f}-{per_s.max:.0f}] req/s{cpu[0]}"
            + ("" if valid else " (INVALID)"),
            baseline=f"1 worker {per_s1.median:.0f} [{per_s1.min:.0f}-{per_s1.max:.0f}] "
            f"req/s{cpu[1]}",
            ratio=h.fmt_ratio(rate.median, rate.min, rate.max)
            + ("" if bound is None else f"; CPU bound here {bound:.2g}x"),
            value=rate.median,
            sense=">=",
            target=THROUGHPUT_GOAL,
            goal=f">= {THROUGHPUT_GOAL:g}x one worker",
            numbers={**numbers, "ratio": rate.as_dict(), "cpu_bound_ratio": bound},
            valid=valid,
        ),
        h.goal_row(
            P99_ID,
            f"{what}: p99 latency",
            ours="p99 "
            + ", ".join(_ms(r.p99) for r in fleet)
            + f"; p50 {_ms(statistics.median(r.p50 for r in fleet))}",
            baseline="1 worker p99 "
            + ", ".join(_ms(r.p99) for r in alone)
            + f"; p50 {_ms(statistics.median(r.p50 for r in alone))}",
            ratio=h.fmt_ratio(p99.median, p99.min, p99.max),
            value=p99.median,
            sense="<=",
            target=P99_GOAL,
            goal=f"<= {P99_GOAL:g}x one worker's",
            numbers={**numbers, "ratio": p99.as_dict()},
            valid=valid,
        ),
    ]
    # After each run's first answers (a cold start's), where a run counted that many.
    p99_warm = [r.p99_warm or r.p99 for r in fleet], [r.p99_warm or r.p99 for r in alone]
    rate_warm = [r.per_s_warm or r.per_s for r in fleet], [r.per_s_warm or r.per_s for r in alone]
    warm = h.ratios(*p99_warm)
    rows.append(
        h.info_row(
            f"{what}: p99 latency after each run's first {COLD} answers (a cold start's)",
            "p99 " + ", ".join(_ms(x) for x in p99_warm[0]),
            "1 worker p99 " + ", ".join(_ms(x) for x in p99_warm[1]),
            h.fmt_ratio(warm.median, warm.min, warm.max),
            ratio=warm.as_dict(),
        )
    )
    warm_rate = h.ratios(*rate_warm)
    rows.append(
        h.info_row(
            f"{what}: requests/s after each run's first {COLD} answers (a cold start's: "
            "first opens, claims, links)",
            ", ".join(f"{x:.0f}" for x in rate_warm[0]) + " req/s",
            "1 worker " + ", ".join(f"{x:.0f}" for x in rate_warm[1]) + " req/s",
            h.fmt_ratio(warm_rate.median, warm_rate.min, warm_rate.max),
            ratio=warm_rate.as_dict(),
        )
    )
    sticky = runs.get("sticky")
    if sticky:
        rows.append(
            _context_row(
                f"the same {WORKERS} {shape.workers}, each conversation's requests sent to "
                f"one worker (sticky routing: none forwarded once held), {store}, "
                f"{shape.label}",
                sticky,
                alone,
                f"forwarding's fleet {per_s.median:.0f} req/s{cpu[0]}",
            )
        )
    handoff = runs.get("handoff")
    if handoff:
        ho_p99 = h.ratios([r.p99 for r in handoff], [r.p99 for r in alone])
        rows.append(
            _context_row(
                f"the same {WORKERS} workers moving each session to the worker asked "
                f"(hand-off, wait={HANDOFF_WAIT:g}), {store}, {shape.label}",
                handoff,
                alone,
                "p99 ratio " + h.fmt_ratio(ho_p99.median, ho_p99.min, ho_p99.max),
                p99_ratio=ho_p99.as_dict(),
            )
        )
    return rows


def _context_row(what: str, runs: list[Run], alone: list[Run], also: str, **numbers: Any) -> h.Row:
    """A context row of another fleet's ``runs`` beside one worker ``alone``: its
    requests/s (and CPU), the requests refused with ``also``, the ratio to one worker."""
    stats = h.Stats.of([r.per_s for r in runs])
    ratio = h.ratios([r.per_s for r in runs], [r.per_s for r in alone])
    bad = [p for r in runs for p in r.problems]
    return h.info_row(
        what,
        f"{stats.median:.0f} [{stats.min:.0f}-{stats.max:.0f}] req/s{_cpu_text(runs)}"
        + (" (INVALID)" if bad else ""),
        f"refused {sum(r.refused for r in runs)}; {also}",
        h.fmt_ratio(ratio.median, ratio.min, ratio.max) + " one worker",
        runs=[r.numbers() for r in runs],
        ratio=ratio.as_dict(),
        **numbers,
    )


def _cpu_text(runs: list[Run]) -> str:
    """``"; CPU 2.7 ms/req (clients 0.3)"``: the workers' and the clients' median CPU time
    per request ("" if unknown)."""
    known = [r.cpu_ms for r in runs if r.cpu_ms is not None]
    if not known:
        return ""
    clients = [r.client_cpu_ms for r in runs if r.client_cpu_ms is not None]
    server = [r.server_cpu_ms for r in runs if r.server_cpu_ms is not None]
    also = [f"clients {statistics.median(clients):.2g}"] if clients else []
    also += [f"server {statistics.median(server):.2g}"] if server else []
    extra = f" ({', '.join(also)})" if also else ""
    return f"; CPU {statistics.median(known):.2g} ms/req{extra}"


def _refusal_row(what: str, runs: list[Run], goal_note: str) -> h.Row:
    """G31: the share of requests that saw no call refused by a live worker (100%: none)."""
    requests = sum(r.requests for r in runs)
    refused = sum(r.refused for r in runs)
    ambiguous = sum(r.ambiguous for r in runs)
    found = sum(r.found for r in runs)
    resent = sum(r.resent for r in runs)
    killed = sum(r.killed for r in runs)
    problems = [p for r in runs for p in r.problems]
    share = max(0.0, 100.0 * (1 - refused / requests))
    ours = f"{refused} refused of {requests} requests"
    if killed:
        ours += f"; {killed} killed"
    return h.goal_row(
        REFUSALS_ID,
        what,
        ours=ours + (" (INVALID)" if problems else ""),
        baseline=(
            f"ambiguous {ambiguous} (holder died before answering: {found} found applied by "
            f"applied(call_id), {ambiguous - found} not, made again); resent {resent}"
        ),
        ratio="-",
        value=share,
        sense=">=",
        target=100.0,
        goal=goal_note,
        unit="%",
        numbers={
            "requests": requests,
            "refused": refused,
            "ambiguous": ambiguous,
            "found_applied": found,
            "resent": resent,
            "killed": killed,
            "runs": [r.numbers() for r in runs],
            "problems": problems[:5],
        },
        valid=not problems,
    )


def _store_rows(cfg: h.Config, base: str | None, store: str, sec: h.Section) -> None:
    repeats = cfg.pick(3, 1)
    shapes = [
        Shape(label, conversations, cfg.pick(requests, 160), server)
        for label, conversations, requests in (
            (f"{CONVERSATIONS} conversations at random", CONVERSATIONS, 1000),
            (f"hot: {HOT_CONVERSATIONS} conversations", HOT_CONVERSATIONS, 1500),
        )
        for server in SERVERS
    ]
    if cfg.quick:  # a smoke run: the random shape, threaded (and on SQLite asyncio) workers
        shapes = shapes[: 1 if base is not None else 2]
    forwarded: list[Run] = []
    for shape in shapes:
        runs = _compare(base, store, shape, repeats, context=not cfg.quick)
        sec.rows.extend(_fleet_rows(store, shape, runs))
        forwarded += runs["fleet"] + runs["alone"] + runs.get("sticky", [])
    sec.rows.append(
        _refusal_row(
            f"calls refused by a live worker, forwarding, {store}, every run above",
            forwarded,
            "0 refused",
        )
    )
    sent = _requests(cfg.pick(1000, 160), CONVERSATIONS, seed=99)
    for kind in SERVERS:
        workers = Shape("", 0, 0, kind).workers
        h.progress(f"location.fleet: {store}, {workers}, two SIGKILLed midway")
        with _fresh(base, "loc-kills") as (spec, folder):
            killed = _fleet_run(
                spec, folder, "kills", WORKERS, 0.0, sent, kills=2, seed=99, server=kind
            )
        sec.rows.append(
            _refusal_row(
                f"calls refused by a live worker, forwarding, {store}, {WORKERS} {workers}, "
                f"two SIGKILLed midway",
                [killed],
                "0 refused",
            )
        )


def bench_fleet(cfg: h.Config) -> h.Section:
    sec = h.Section()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    _store_rows(cfg, None, "SQLite", sec)
    with server() as dsn:
        if dsn is None:
            sec.rows.append(h.info_row("fleet on PostgreSQL: not run", "no server"))
            sec.notes.append(
                "fleet: the PostgreSQL rows need a server (NOUS_ACTOR_TEST_PG_DSN, or "
                "PostgreSQL's binaries to start one): not run"
            )
        else:
            _store_rows(cfg, dsn, "PostgreSQL", sec)
    sec.notes += [
        f"fleet: worker processes of bench.fleet on one host (a Sessions each, a Unix "
        f"socket server: threaded workers serve a thread per connection, as a threaded web "
        f"server does, and wait on each call's future; asyncio workers serve every "
        f"connection from one event loop, as uvicorn's workers do, and await each call); "
        f"{CLIENTS} client threads each send "
        "a request to a live worker picked at random; a request reads the session without "
        "taking it, opens it, reads its events and writes one turn (turn_start, a user and "
        "an assistant message, turn_end) in one append_many. Forwarding (WAIT=0): a "
        "session held by another worker is called there; the hand-off (context) moves it "
        "to the worker asked. Each run on a fresh store; 4 workers and 1 worker "
        "alternate, ratios per repeat, median [min-max].",
        "fleet: a refusal is a SessionStopped seen by a live worker (the call then made "
        "again); an ambiguous call is one whose holder died before answering "
        "(CallOutcomeUnknown): the worker asks session.applied(call_id) (the session's next "
        "holder reads the call's record) and makes it again only if it was not applied; "
        "the history check then proves each answer right. Every run's "
        "histories are checked (whole turns in order, each acknowledged request once).",
        "fleet: CPU ms/req is the CPU time (user + system) the worker processes used during "
        "the traffic, over the requests: the work a request costs, whatever the machine's "
        "other load; the clients' is this process's CPU time over the same traffic; the "
        "server's (PostgreSQL, when it runs on this machine) is its processes' (the "
        "postmaster, its backends and helpers, those that ended included).",
        "fleet: 'CPU bound here' is the most the 4 workers could reach on this machine at "
        "the cost they measured: all of its CPUs busy with requests that each cost the "
        "workers', the clients' and the database server's CPU time, over one worker "
        "alone's requests/s. A ratio at the bound is limited by the CPUs, not by waiting; "
        "a goal above the bound needs cheaper requests or more CPUs (or the server on "
        "another machine).",
        f"fleet: load average {load:.1f} before the runs; the machine's CPUs are shared by "
        "the client threads, the workers and the store (trust the ratios).",
    ]
    return sec


# -- a forwarded append against a local one -----------------------------------------------------


def _hold(spec: str, session_ids: list[str]) -> None:
    """(The child process.) Hold ``session_ids`` until stdin closes."""
    from nous_actor import Sessions

    sessions = Sessions(open_store(spec), timeout=h.JOIN_TIMEOUT)
    for sid in session_ids:
        sessions.open(sid).append("user_message", {"content": "held here"}).get()
    print("ready", flush=True)
    sys.stdin.readline()
    sessions.close()


@contextlib.contextmanager
def _holder(spec: str, session_ids: list[str]) -> Iterator[subprocess.Popen[str]]:
    """A child process holding ``session_ids`` on ``spec`` (ready when this yields)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.location", "hold", spec, *session_ids],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        cwd=str(ROOT),
    )
    try:
        ready: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        out = proc.stdout
        threading.Thread(target=lambda: ready.put(out.readline()), daemon=True).start()
        try:
            line = ready.get(timeout=60)
        except queue.Empty:
            raise RuntimeError("the holder process did not start within 60 s") from None
        if line.strip() != "ready":
            raise RuntimeError(f"the holder process failed to start: {line!r}")
        yield proc
    finally:
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


def _awaited(chat: Any, n: int) -> list[int]:
    """ns of each of ``n`` appends, each awaited before the next (``append().get()``)."""
    took = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        chat.append("user_message", PAYLOAD).get(timeout=h.JOIN_TIMEOUT)
        took.append(clock() - t0)
    return took


def _pipelined(chat: Any, n: int) -> int:
    """ns to send ``n`` appends, then collect every answer."""
    t0 = time.perf_counter_ns()
    futures = [chat.append("user_message", PAYLOAD) for _ in range(n)]
    seqs = [f.get(timeout=h.JOIN_TIMEOUT).seq for f in futures]
    took = time.perf_counter_ns() - t0
    if seqs != list(range(seqs[0], seqs[0] + n)):
        raise AssertionError("pipelined appends were not applied in the order sent")
    return took


def _coroutine(chat: Any, n: int) -> list[int]:
    """ns of each of ``n`` appends awaited one after another by one asyncio coroutine."""

    async def caller() -> list[int]:
        took = []
        clock = time.perf_counter_ns
        for _ in range(n):
            t0 = clock()
            await chat.append("user_message", PAYLOAD)
            took.append(clock() - t0)
        return took

    return asyncio.run(caller())


def _side_by_side(
    local: Any, remote: Any, repeats: int, measure: Callable[[Any], Any]
) -> tuple[list[Any], list[Any]]:
    """``measure`` on each handle, alternating which goes first, ``repeats`` times."""
    mine: list[Any] = []
    theirs: list[Any] = []
    for k in range(repeats):
        pair = [(local, mine), (remote, theirs)]
        for chat, into in pair if k % 2 == 0 else reversed(pair):
            into.append(measure(chat))
            h.settle()
    return mine, theirs


def bench_append(cfg: h.Config) -> h.Section:
    from nous_actor import Sessions

    sec = h.Section()
    n = cfg.pick(300, 40)
    burst = cfg.pick(2000, 200)
    repeats = cfg.pick(5, 2)
    with h.scratch("loc-append") as folder:
        spec = f"sqlite:{folder / 'append.db'}"
        open_store(spec).close()
        with _holder(spec, ["remote"]) as child:
            store = open_store(spec)
            sessions = Sessions(store, timeout=h.JOIN_TIMEOUT)
            try:
                local = sessions.open("local")
                remote = sessions.open("remote")  # held by the child: forwarded there
                for chat in (local, remote):  # warm: the link, the statements, the actor
                    _awaited(chat, WARM)
                held = sessions.read("remote").held_by().get()
                if sessions.live() != ["local"] or held != f"process {child.pid}":
                    raise AssertionError(
                        f"the sessions are not where the benchmark needs them: here "
                        f"{sessions.live()}, 'remote' held by {held}"
                    )
                h.progress("location.append: awaited appends, one thread")
                th_local, th_remote = _side_by_side(
                    local, remote, repeats, lambda c: _awaited(c, n)
                )
                h.progress("location.append: awaited appends, one asyncio coroutine")
                co_local, co_remote = _side_by_side(
                    local, remote, repeats, lambda c: _coroutine(c, n)
                )
                h.progress("location.append: pipelined appends")
                pl_local, pl_remote = _side_by_side(
                    local, remote, repeats, lambda c: _pipelined(c, burst)
                )
                counts = (local.count().get(), remote.count().get())
            finally:
                sessions.close()
                store.close()
        expected_local = WARM + repeats * (2 * n + burst)
        valid = counts == (expected_local, expected_local + 1)
    for shape, mine, theirs in (
        ("one thread, append().get()", th_local, th_remote),
        ("one asyncio coroutine, await append()", co_local, co_remote),
    ):
        med_local = [statistics.median(x) for x in mine]
        med_remote = [statistics.median(x) for x in theirs]
        ratio = h.ratios(med_remote, med_local)
        fwd, loc = h.Stats.of(med_remote), h.Stats.of(med_local)
        p99_remote = statistics.median(h.Stats.of(x).p99 for x in theirs)
        p99_local = statistics.median(h.Stats.of(x).p99 for x in mine)
        sec.rows.append(
            h.goal_row(
                ROUND_TRIP_ID,
                f"append round trip, forwarded to a child process vs local, SQLite, {shape}",
                ours=f"forwarded {h.fmt_time_spread(fwd)}, p99 {h.fmt_time(p99_remote)}"
                + ("" if valid else " (INVALID)"),
                baseline=f"local {h.fmt_time_spread(loc)}, p99 {h.fmt_time(p99_local)}",
                ratio=h.fmt_ratio(ratio.median, ratio.min, ratio.max),
                value=ratio.median,
                sense="<=",
                target=ROUND_TRIP_GOAL,
                goal=f"<= {ROUND_TRIP_GOAL:g}x local",
                numbers={
                    "shape": shape,
                    "appends": n,
                    "forwarded_median_ns": fwd.as_dict(),
                    "local_median_ns": loc.as_dict(),
                    "forwarded_p99_ns": p99_remote,
                    "local_p99_ns": p99_local,
                    "ratio": ratio.as_dict(),
                },
                valid=valid,
            )
        )
    rate_local = h.Stats.of([burst * 1e9 / ns for ns in pl_local])
    rate_remote = h.Stats.of([burst * 1e9 / ns for ns in pl_remote])
    rate_ratio = h.ratios(
        [burst * 1e9 / ns for ns in pl_remote], [burst * 1e9 / ns for ns in pl_local]
    )
    sec.rows.append(
        h.info_row(
            f"pipelined appends ({burst} sent, then collected), forwarded vs local, SQLite",
            "forwarded " + h.fmt_rate_spread(rate_remote),
            "local " + h.fmt_rate_spread(rate_local),
            h.fmt_ratio(rate_ratio.median, rate_ratio.min, rate_ratio.max) + " local",
            forwarded_per_s=rate_remote.as_dict(),
            local_per_s=rate_local.as_dict(),
            ratio=rate_ratio.as_dict(),
        )
    )
    sec.notes += [
        "append: one SQLite file (durability full); this process holds 'local' and a child "
        "process holds 'remote' (this process's open() of it returns a handle whose calls "
        "go over the child's Unix socket, authenticated by the store's secret); one caller, "
        f"{n} appends of one small user message per run, each awaited before the next; "
        f"local and forwarded alternate, {repeats} runs each; median per-call round trip "
        "of each run, the ratio per pair of runs, median [min-max]. The child commits the "
        "forwarded appends to the same file.",
        "append: checked: both sessions hold exactly the appends acknowledged, the "
        "pipelined ones applied in the order sent, and 'remote' held by the child.",
    ]
    return sec


BENCHMARKS: Final[tuple[h.Benchmark, ...]] = (
    h.Benchmark("location.fleet", "G29-G31 web workers forwarding vs one", bench_fleet),
    h.Benchmark("location.append", "G32 a forwarded append vs a local one", bench_append),
)


def main(argv: list[str] | None = None) -> int:
    return h.run_module(BENCHMARKS, argv)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "hold":
        _hold(sys.argv[2], sys.argv[3:])
    else:
        raise SystemExit(main())
