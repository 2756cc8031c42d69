"""Benchmark of the SQLite events table's layout: which one the store should write.

``schema.layouts`` (``--only schema``): raw ``sqlite3`` (no store, no actors), WAL,
``synchronous=FULL``, the store's own encoded rows (written once through a
`SQLiteStore`, then reused: what its committer hands SQLite), 100 rows per
transaction in one multi-row ``INSERT`` (as the store's `writes._insert_rows`
does), spread over N sessions as a group commit spreads them. For each candidate
layout:

* write throughput with 100 and 10,000 sessions, on an empty file and on a copy of a
  file pre-filled with ~1M events of other sessions (the copy is flushed to disk
  before the clock starts); the WAL autocheckpoint as the store leaves it (SQLite's
  default), so its checkpoints are part of the cost;
* WAL bytes per commit (a few more commits after the timed ones, the autocheckpoint
  off, the WAL's size divided by them) and bytes written per commit by the timed
  run, WAL and checkpoints together (``wchar`` of ``/proc/self/io``);
* whole-session reads of a 1k- and a 100k-event session of the pre-filled file,
  whose rows were written interleaved with the other sessions' (one row in 1,000
  and one in 10): a fresh connection, the store's ``SELECT`` in seq order,
  ``fetchall``.

Every figure is a median of repeats, the layouts alternating order, and each
row's ratio is to today's layout (a ``WITHOUT ROWID`` table clustered on
``(session_id, seq)``) in the same repeat. Each run is checked: the rows in the
file counted after the writes, every read's row count and seq order.

Run alone: ``python -m bench.schema [--quick]``; or ``python -m bench --only schema``.
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Final

from bench import harness as h
from nous_actor import Log, SQLiteStore

__all__ = [
    "BENCHMARKS",
    "LAYOUTS",
    "WriteRun",
    "append_rows",
    "layout_named",
    "main",
    "write_rows",
]

ROWS_PER_COMMIT: Final = 100
WAL_COMMITS: Final = 20
"""Untimed commits after a timed run, the autocheckpoint off, to size the WAL per commit."""
BUILD_ROWS: Final = 50_000
"""Rows per transaction while a pre-filled file is built (untimed)."""
READ_GOAL: Final = 1.2
"""A layout may read a whole session back at most this much slower than today's."""

Row = tuple[str, int, str, str, str]
"""(session_id, seq, type, time, data): one stored event as the store encodes it."""


@dataclass(frozen=True)
class Layout:
    """One candidate table layout: how it is made, written and read."""

    name: str
    text: str
    ddl: tuple[str, ...]
    reads: tuple[tuple[str, str], ...]
    """(label, SQL): a whole session, in seq order, as the store would read it."""
    keyed: bool = False
    """A key table pointing into a payload table: each row is two inserts."""
    numbered: bool = False
    """Sessions numbered in a table of their own; events keyed by that number."""
    page_size: int | None = None
    count_sql: str = "SELECT count(*) FROM events"


_SELECT: Final = "SELECT seq, type, time, data FROM events WHERE session_id = ? ORDER BY seq"
_COLUMNS: Final = """session_id TEXT NOT NULL,
    seq INTEGER NOT NULL CHECK (seq >= 0),
    type TEXT NOT NULL,
    time TEXT NOT NULL,
    data TEXT NOT NULL"""
_CLUSTERED: Final = (
    f"CREATE TABLE events ({_COLUMNS},\n    PRIMARY KEY (session_id, seq)) WITHOUT ROWID",
)

LAYOUTS: Final[tuple[Layout, ...]] = (
    Layout("clustered", "today: WITHOUT ROWID, clustered on (session_id, seq)", _CLUSTERED,
           (("seq order", _SELECT),)),
    Layout(
        "rowid",
        "rowid table + UNIQUE INDEX (session_id, seq)",
        (
            f"CREATE TABLE events ({_COLUMNS})",
            "CREATE UNIQUE INDEX events_key ON events (session_id, seq)",
        ),
        (
            ("seq order", _SELECT),
            (
                "rowid order",
                "SELECT seq, type, time, data FROM events WHERE session_id = ? ORDER BY rowid",
            ),
        ),
    ),
    Layout(
        "keyed",
        "clustered key table (session_id, seq) -> append-only payload table",
        (
            "CREATE TABLE event_keys (session_id TEXT NOT NULL, seq INTEGER NOT NULL, "
            "ref INTEGER NOT NULL, PRIMARY KEY (session_id, seq)) WITHOUT ROWID",
            "CREATE TABLE payloads (id INTEGER PRIMARY KEY, type TEXT NOT NULL, "
            "time TEXT NOT NULL, data TEXT NOT NULL)",
        ),
        (
            (
                "seq order",
                "SELECT k.seq, p.type, p.time, p.data FROM event_keys AS k "
                "JOIN payloads AS p ON p.id = k.ref WHERE k.session_id = ? ORDER BY k.seq",
            ),
        ),
        keyed=True,
        count_sql="SELECT count(*) FROM event_keys",
    ),
    Layout("clustered-1k", "today's table in 1 KiB pages (4 KiB: SQLite's default)",
           _CLUSTERED, (("seq order", _SELECT),), page_size=1024),
    Layout(
        "numbered",
        "sessions numbered (sessions: id INTEGER PRIMARY KEY, session_id UNIQUE); events "
        "WITHOUT ROWID, clustered on (number, seq)",
        (
            "CREATE TABLE sessions (id INTEGER PRIMARY KEY, session_id TEXT NOT NULL UNIQUE)",
            "CREATE TABLE events (session INTEGER NOT NULL, seq INTEGER NOT NULL CHECK "
            "(seq >= 0), type TEXT NOT NULL, time TEXT NOT NULL, data TEXT NOT NULL, "
            "PRIMARY KEY (session, seq)) WITHOUT ROWID",
        ),
        (
            (
                "seq order",
                "SELECT seq, type, time, data FROM events WHERE session = "
                "(SELECT id FROM sessions WHERE session_id = ?) ORDER BY seq",
            ),
        ),
        numbered=True,
    ),
)  # fmt: skip
"""The candidates; the first is today's layout, the one every ratio is taken to."""


@dataclass(frozen=True)
class Sizes:
    """How big a run is (`Config.pick`: full or ``--quick``)."""

    sessions: tuple[int, ...]
    commits: int
    prefill: int
    long_every: int
    short_every: int
    others: int
    repeats: int

    @property
    def long_events(self) -> int:
        return len(range(0, self.prefill, self.long_every))

    @property
    def short_events(self) -> int:
        return len(range(1, self.prefill, self.short_every))


FULL: Final = Sizes((100, 10_000), 300, 1_000_000, 10, 1_000, 10_000, 3)
QUICK: Final = Sizes((10, 100), 10, 4_000, 10, 100, 100, 1)


# -- rows ---------------------------------------------------------------------------------


def _stored_rows(n: int) -> list[tuple[str, str, str]]:
    """(type, time, data) of ``n`` appends of ``{'content': 'short text <j>'}`` (the
    durable benchmarks' payload), as a `SQLiteStore` encodes and stores them."""
    log = Log()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for j in range(n):
        log = log.append("user_message", {"content": f"short text {j}"}, time=t0)
    with h.scratch("schema-rows") as folder:
        store = SQLiteStore(folder / "rows.db")
        try:
            refused = store.write({"rows": log.events()})
        finally:
            store.close()
        if refused:
            raise AssertionError(f"schema: the store refused the template rows: {refused}")
        conn = sqlite3.connect(folder / "rows.db")
        try:
            got = conn.execute(
                "SELECT type, time, data FROM events WHERE session_id = 'rows' ORDER BY seq"
            ).fetchall()
        finally:
            conn.close()
    return [(str(a), str(b), str(c)) for a, b, c in got]


_TEMPLATE: list[tuple[str, str, str]] = []


def _payload(j: int) -> tuple[str, str, str]:
    if not _TEMPLATE:
        _TEMPLATE.extend(_stored_rows(100))
    return _TEMPLATE[j % len(_TEMPLATE)]


def _ids(n: int, seed: int) -> list[str]:
    """``n`` session ids as agents name sessions (UUIDs), deterministic."""
    rng = random.Random(seed)
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]


@dataclass(frozen=True)
class Prefill:
    """The pre-filled file's rows in the order they are written, and who they are of."""

    rows: list[Row]
    long_id: str
    short_id: str
    others: list[str]
    """The other sessions, in the order they were first written."""
    counts: list[int]
    """How many rows each of ``others`` has."""


def _prefill_rows(sizes: Sizes) -> Prefill:
    """The pre-filled file's rows, interleaved through sessions: one row in
    ``long_every`` is the long session's, one in ``short_every`` the short one's, the
    others round-robin over ``others`` sessions."""
    long_id, short_id = _ids(2, 1)
    others = _ids(sizes.others, 2)
    seqs = [0] * sizes.others
    long_seq = short_seq = 0
    rows: list[Row] = []
    k = 0
    for i in range(sizes.prefill):
        if i % sizes.long_every == 0:
            sid, seq = long_id, long_seq
            long_seq += 1
        elif i % sizes.short_every == 1:
            sid, seq = short_id, short_seq
            short_seq += 1
        else:
            o = k % sizes.others
            k += 1
            sid, seq = others[o], seqs[o]
            seqs[o] += 1
        rows.append((sid, seq, *_payload(i)))
    return Prefill(rows, long_id, short_id, others, seqs)


def _commits(
    ids: list[str], seqs: list[int], commits: int, by_seq: bool = False
) -> list[list[Row]]:
    """``commits`` transactions of `ROWS_PER_COMMIT` rows over the sessions ``ids`` (each
    continuing from its seq in ``seqs``): each round gives every session one row, in a
    random order of its own (as a group commit takes whichever sessions appended
    last), seqs in order per session. ``by_seq``: a row's payload is that of its seq
    (as the durable benchmarks append them), else of its place in the run."""
    sessions = len(ids)
    rng = random.Random(sessions)
    seqs = list(seqs)
    order: list[int] = []
    out: list[list[Row]] = []
    for c in range(commits):
        rows: list[Row] = []
        for j in range(ROWS_PER_COMMIT):
            if not order:
                order = list(range(sessions))
                rng.shuffle(order)
            i = order.pop()
            rows.append((ids[i], seqs[i], *_payload(seqs[i] if by_seq else c + j)))
            seqs[i] += 1
        out.append(rows)
    return out


# -- writing ------------------------------------------------------------------------------

Statement = tuple[str, list[Any]]
_SQL: dict[tuple[str, int], str] = {}


def _sql(table: str, columns: str, width: int, n: int) -> str:
    key = (table + columns, n)
    found = _SQL.get(key)
    if found is None:
        marks = "(" + ", ".join("?" * width) + ")"
        found = _SQL[key] = f"INSERT INTO {table} ({columns}) VALUES " + ",".join([marks] * n)
    return found


def _statements(
    layout: Layout, rows: Sequence[Row], first_id: int, numbers: dict[str, int]
) -> list[Statement]:
    """The statements that store ``rows`` (one multi-row INSERT per table, chunks of
    200 rows as the store makes them); ``first_id``: the key layout's next payload id;
    ``numbers``: the numbered layout's session numbers so far (new ones are added, and
    stored in the same transaction)."""
    out: list[Statement] = []
    if layout.numbered:
        new = list(dict.fromkeys(r[0] for r in rows if r[0] not in numbers))
        for sid in new:
            numbers[sid] = len(numbers) + 1
        for i in range(0, len(new), 200):
            named = new[i : i + 200]
            flat = [v for sid in named for v in (numbers[sid], sid)]
            out.append((_sql("sessions", "id, session_id", 2, len(named)), flat))
    for i in range(0, len(rows), 200):
        chunk = rows[i : i + 200]
        n = len(chunk)
        if layout.keyed:
            ids = range(first_id + i, first_id + i + n)
            payload = [v for ref, r in zip(ids, chunk, strict=True) for v in (ref, *r[2:])]
            keys = [v for ref, r in zip(ids, chunk, strict=True) for v in (r[0], r[1], ref)]
            out.append((_sql("payloads", "id, type, time, data", 4, n), payload))
            out.append((_sql("event_keys", "session_id, seq, ref", 3, n), keys))
        elif layout.numbered:
            flat = [v for r in chunk for v in (numbers[r[0]], *r[1:])]
            out.append((_sql("events", "session, seq, type, time, data", 5, n), flat))
        else:
            flat = [v for r in chunk for v in r]
            out.append((_sql("events", "session_id, seq, type, time, data", 5, n), flat))
    return out


def _connect(path: Path) -> sqlite3.Connection:
    """A connection as the store opens one: WAL, ``synchronous=FULL``, autocommit."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def _make(layout: Layout, path: Path) -> None:
    """An empty file of ``layout``, in WAL mode."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        if layout.page_size:
            conn.execute(f"PRAGMA page_size = {layout.page_size}")
        conn.execute("BEGIN")
        for statement in layout.ddl:
            conn.execute(statement)
        conn.execute("COMMIT")
        conn.execute("PRAGMA journal_mode = WAL")
    finally:
        conn.close()


def _build(layout: Layout, path: Path, rows: Sequence[Row]) -> None:
    """A file of ``layout`` holding ``rows`` (untimed: big transactions, no sync)."""
    _make(layout, path)
    conn = sqlite3.connect(path, isolation_level=None)
    numbers: dict[str, int] = {}
    try:
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("PRAGMA cache_size = -262144")
        for i in range(0, len(rows), BUILD_ROWS):
            conn.execute("BEGIN")
            for sql, params in _statements(layout, rows[i : i + BUILD_ROWS], 1 + i, numbers):
                conn.execute(sql, params)
            conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    _flush(path)


def _flush(path: Path) -> None:
    """Put ``path`` on disk, so that no later timed fsync pays for writing it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _written() -> int:
    """Bytes this process has passed to write calls so far (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass(frozen=True)
class WriteRun:
    ns: int
    rows: int
    written_per_commit: float
    wal_per_commit: float


def _write(
    layout: Layout,
    folder: Path,
    base: Path | None,
    work: list[list[Row]],
    tail: int = WAL_COMMITS,
) -> WriteRun:
    """Time ``work`` (all but the last ``tail`` commits) into a fresh file of
    ``layout``, a copy of ``base`` or empty; then size the WAL of the rest (none
    without a tail)."""
    path = folder / f"{layout.name}.db"
    if base is None:
        _make(layout, path)
    else:
        shutil.copyfile(base, path)
        _flush(path)
    conn = _connect(path)
    try:
        before = int(conn.execute(layout.count_sql).fetchone()[0])
        next_id = 1
        if layout.keyed:
            next_id = int(
                conn.execute("SELECT coalesce(max(id), 0) + 1 FROM payloads").fetchone()[0]
            )
        numbers: dict[str, int] = {}
        if layout.numbered:
            numbers.update(conn.execute("SELECT session_id, id FROM sessions ORDER BY id"))
        plans: list[list[Statement]] = []
        for rows in work:
            plans.append(_statements(layout, rows, next_id, numbers))
            next_id += len(rows)
        timed, rest = plans[: len(plans) - tail], plans[len(plans) - tail :]
        execute = conn.execute
        w0 = _written()
        ns = h.time_ns(lambda: _run(execute, timed))
        w1 = _written()
        wal = 0
        if rest:
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            _run(execute, rest)
            wal = os.path.getsize(f"{path}-wal")
        after = int(conn.execute(layout.count_sql).fetchone()[0])
    finally:
        conn.close()
    stored = sum(len(r) for r in work)
    if after - before != stored:
        raise AssertionError(f"schema {layout.name}: {after - before} rows stored, not {stored}")
    return WriteRun(ns, stored - sum(len(r) for r in work[len(work) - tail :]),
                    (w1 - w0) / len(timed), wal / len(rest) if rest else 0.0)  # fmt: skip


def layout_named(name: str) -> Layout:
    """The candidate layout called ``name``."""
    for candidate in LAYOUTS:
        if candidate.name == name:
            return candidate
    raise KeyError(f"no layout {name!r}; the layouts are {[c.name for c in LAYOUTS]}")


def append_rows(ids: list[str], events: int) -> list[list[Row]]:
    """The rows of ``events`` appends of ``{'content': 'short text <j>'}`` to each session
    of ``ids``, encoded as the store stores them, in transactions of `ROWS_PER_COMMIT`
    rows: each round gives every session its next row, in a random order (as a group
    commit of as many sessions' appends). Needs ``len(ids) * events`` to be a multiple of
    `ROWS_PER_COMMIT`."""
    total = len(ids) * events
    if total % ROWS_PER_COMMIT:
        raise ValueError(f"{total} rows are not transactions of {ROWS_PER_COMMIT}")
    return _commits(ids, [0] * len(ids), total // ROWS_PER_COMMIT, by_seq=True)


def write_rows(layout: Layout, folder: Path, work: list[list[Row]]) -> WriteRun:
    """Raw sqlite3 (WAL, ``synchronous=FULL``, as the store opens a file) writing ``work``
    into a fresh file of ``layout`` in ``folder``, a transaction per item (statements
    made before the clock starts), every row counted after: the time and rows."""
    return _write(layout, folder, None, work, tail=0)


def _run(execute: Any, plans: list[list[Statement]]) -> None:
    for plan in plans:
        execute("BEGIN")
        for sql, params in plan:
            execute(sql, params)
        execute("COMMIT")


# -- reading ------------------------------------------------------------------------------


def _read(path: Path, sql: str, sid: str, n: int) -> int:
    """A whole session read on a fresh connection: its rows, checked, counted."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(sql, (sid,)).fetchall()
    finally:
        conn.close()
    if len(rows) != n or [r[0] for r in rows] != list(range(n)):
        raise AssertionError(f"schema: read {len(rows)} rows of {sid}, not seqs 0..{n - 1}")
    return len(rows)


# -- the benchmark ------------------------------------------------------------------------


def bench_layouts(cfg: h.Config) -> h.Section:
    """Each candidate layout's writes, WAL per commit and whole-session reads, as ratios
    to today's layout."""
    sizes = cfg.pick(FULL, QUICK)
    today = LAYOUTS[0].name
    h.progress(f"schema.layouts: {h.fmt_count(sizes.prefill)} pre-fill rows")
    filled = _prefill_rows(sizes)
    prefill, long_id, short_id = filled.rows, filled.long_id, filled.short_id
    n = sizes.commits + WAL_COMMITS
    work: dict[tuple[int, str], list[list[Row]]] = {}
    for s in sizes.sessions:
        new = _commits(_ids(s, 3 + s), [0] * s, n)
        step = len(filled.others) // s  # spread over the file's sessions, as they were made
        own = filled.others[::step][:s], filled.counts[::step][:s]
        work[(s, "empty")] = work[(s, "pre-filled")] = new
        work[(s, "pre-filled, its sessions")] = _commits(*own, n)
    fills = ("empty", "pre-filled", "pre-filled, its sessions")
    writes: dict[tuple[str, int, str], list[WriteRun]] = {}
    reads: dict[tuple[str, str, str], list[int]] = {}
    sessions_read = {
        h.fmt_count(sizes.short_events): (short_id, sizes.short_events),
        h.fmt_count(sizes.long_events): (long_id, sizes.long_events),
    }
    build_ns: dict[str, int] = {}
    with h.scratch("schema") as folder:
        bases: dict[str, Path] = {}
        for layout in LAYOUTS:
            h.progress(f"schema.layouts: building the pre-filled {layout.name} file")
            bases[layout.name] = folder / f"base-{layout.name}.db"
            build_ns[layout.name] = h.time_ns(partial(_build, layout, bases[layout.name], prefill))
        del prefill
        h.settle()
        for k in range(sizes.repeats):
            order = LAYOUTS if k % 2 == 0 else LAYOUTS[::-1]
            for fill in fills:
                for s in sizes.sessions:
                    h.progress(
                        f"schema.layouts: writes, {s} sessions, {fill} file, "
                        f"repeat {k + 1}/{sizes.repeats}"
                    )
                    for layout in order:
                        run_folder = folder / "run"
                        run_folder.mkdir()
                        try:
                            base = None if fill == "empty" else bases[layout.name]
                            got = _write(layout, run_folder, base, work[(s, fill)])
                        finally:
                            shutil.rmtree(run_folder)
                        writes.setdefault((layout.name, s, fill), []).append(got)
                        h.settle()
            h.progress(f"schema.layouts: whole-session reads, repeat {k + 1}/{sizes.repeats}")
            for layout in order:
                for label, sql in layout.reads:
                    for size, (sid, n) in sessions_read.items():
                        ns = h.time_ns(partial(_read, bases[layout.name], sql, sid, n))
                        reads.setdefault((layout.name, label, size), []).append(ns)
                h.settle()
        file_bytes = {name: p.stat().st_size for name, p in bases.items()}
    return _section(sizes, writes, reads, build_ns, file_bytes, today)


def _section(
    sizes: Sizes,
    writes: dict[tuple[str, int, str], list[WriteRun]],
    reads: dict[tuple[str, str, str], list[int]],
    build_ns: dict[str, int],
    file_bytes: dict[str, int],
    today: str,
) -> h.Section:
    sec = h.Section()
    matrix: dict[str, dict[str, float]] = {layout.name: {} for layout in LAYOUTS}
    for (name, s, fill), runs in writes.items():
        rates = [r.rows * 1e9 / r.ns for r in runs]
        base = [r.rows * 1e9 / r.ns for r in writes[(today, s, fill)]]
        q = h.ratios(rates, base)
        wal = h.Stats.of([r.wal_per_commit for r in runs])
        wal_today = h.Stats.of([r.wal_per_commit for r in writes[(today, s, fill)]])
        written = h.Stats.of([r.written_per_commit for r in runs])
        matrix[name][f"write {s} {fill}"] = q.median
        matrix[name][f"WAL/commit {s} {fill}"] = wal.median / wal_today.median
        sec.rows.append(
            h.info_row(
                f"schema {name}: writes, {s} sessions, {fill} file",
                h.fmt_rate_spread(h.Stats.of(rates)).replace("ev/s", "rows/s")
                + f", WAL {wal.median / 1024:.0f} KiB/commit",
                f"today {h.fmt_count(h.Stats.of(base).median)} rows/s, "
                f"WAL {wal_today.median / 1024:.0f} KiB",
                h.fmt_ratio(q.median, q.min, q.max) + " today's rate",
                layout=name,
                sessions=s,
                fill=fill,
                rows_per_s=h.Stats.of(rates).as_dict(),
                ratio=q.as_dict(),
                wal_bytes_per_commit=wal.as_dict(),
                written_bytes_per_commit=written.as_dict(),
            )
        )
    for (name, label, size), times in reads.items():
        base_t = reads[(today, "seq order", size)]
        q = h.ratios(times, base_t)
        matrix[name][f"read {size} ({label})"] = q.median
        sec.rows.append(
            h.info_row(
                f"schema {name}: read a {size}-event session, {label}",
                h.fmt_time_spread(h.Stats.of(times)),
                "today " + h.fmt_time(h.Stats.of(base_t).median),
                h.fmt_ratio(q.median, q.min, q.max) + " today's time",
                layout=name,
                read=label,
                session=size,
                ns=h.Stats.of(times).as_dict(),
                ratio=q.as_dict(),
            )
        )
    sec.data["ratios_to_today"] = matrix
    sec.data["file_bytes"] = file_bytes
    sec.data["build_ns"] = build_ns
    sec.notes += [
        "raw sqlite3, WAL, synchronous=FULL, SQLite's default autocheckpoint; the store's "
        f"encoded rows ({{'content': 'short text <j>'}} appends), {ROWS_PER_COMMIT} rows per "
        "transaction in one multi-row INSERT, each round of N rows giving every one of "
        f"N sessions one row, in a random order; {sizes.commits} timed transactions per run "
        "on a fresh file: empty, or a copy (flushed to disk first) of a file pre-filled with "
        f"{h.fmt_count(sizes.prefill)} rows of {sizes.others} other sessions written "
        f"interleaved (a {h.fmt_count(sizes.long_events)}-event session one row in "
        f"{sizes.long_every}, a {h.fmt_count(sizes.short_events)}-event one one row in "
        f"{sizes.short_every}). 'pre-filled': N new sessions write into it; 'pre-filled, "
        "its sessions': N of the sessions it holds (spread over the order they were made) "
        "go on appending. WAL per commit: {WAL_COMMITS} more commits with the "
        "autocheckpoint off, the WAL's bytes / commits. Reads: those two sessions of the "
        "pre-filled file, a fresh connection, the SELECT in seq order, fetchall. Median "
        f"[min-max] of {sizes.repeats} repeats, layouts alternating order; ratio = layout / "
        f"today ({today}) in the same repeat. GC on. Goal of the layout choice: writes faster "
        f"with 10,000 sessions and on the pre-filled file, whole-session reads <= "
        f"{READ_GOAL:g}x today's.",
        "layouts: "
        + "; ".join(f"{layout.name} = {layout.text}" for layout in LAYOUTS)
        + ". Pre-filled file sizes: "
        + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in file_bytes.items())
        + ".",
        "ratios to today (writes: rate, higher is better; WAL: bytes, reads: time, lower "
        "is better): "
        + "; ".join(
            f"{name}: " + ", ".join(f"{k} {v:.2f}x" for k, v in cols.items())
            for name, cols in matrix.items()
            if name != today
        ),
    ]
    return sec


BENCHMARKS: Final[tuple[h.Benchmark, ...]] = (
    h.Benchmark("schema.layouts", "the events table's layout, raw sqlite3", bench_layouts),
)


def main(argv: list[str] | None = None) -> int:
    return h.run_module(BENCHMARKS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
