"""The write queue: processes that write one SQLite file take turns without polling.

SQLite's write lock cannot be waited for: ``BEGIN IMMEDIATE`` fails at once while
another connection writes, and a waiter can only try again later (SQLite's own
busy handler sleeps up to 100 ms a time; `_Connection.begin` polls in steps of up
to 2 ms). Several web workers writing one file then sleep after most of their
lock's releases, and burn a CPU trying again: measured with 4 worker processes on
2 CPUs, a third of their time went there.

`WriteLock` queues the write transactions of every process in the kernel
instead: an exclusive ``flock`` on a lock file beside the database
(``<file>-wlock``), taken before ``BEGIN IMMEDIATE`` and given up after
``COMMIT``. The kernel wakes a waiter as soon as the holder lets go, and frees
the lock of a process that dies (a SIGKILL included). It only orders; SQLite's
own lock still decides who writes, so a writer that does not take it (another
tool, an older release) is waited for as before, and a lock file that cannot be
made (a read-only folder) leaves the store polling as before.

A ``flock`` cannot be waited for with a bound, and every wait of ours has one: a
waiter that finds the lock taken hands the blocking ``flock`` to a helper thread
(one per store, started on its first wait) and waits for it with its deadline. A
lock the helper gets after its waiter gave up is let go at once. (Polling the lock
instead, every 0.1 ms, measured no faster than polling SQLite's.)

Within a process the lock file's descriptor is the store's own (two stores on
one file queue behind each other as two processes do), and its transactions are
serialised by the connection's lock before they get here.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import weakref
from typing import Any, Final

from nous_actor._log import get_logger

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: the store polls (see _Connection.begin)
    fcntl = None  # type: ignore[assignment]

__all__ = ["NO_QUEUE", "SUFFIX", "WriteLock"]

logger = get_logger("nous_actor.store")

SUFFIX: Final = "-wlock"
"""The lock file's name is the database file's with this added (as SQLite adds ``-wal``)."""

IDLE_S: Final = 30.0
"""A helper with no waiter for this long ends (a store forgotten, never closed, keeps
no thread)."""


def _open_like(path: str, db: str) -> int:
    """Open (or make) the lock file with the database file's permissions, whatever the
    umask, as SQLite makes its ``-wal`` and ``-shm``: whoever may write the file may
    queue for it."""
    try:
        mode = stat.S_IMODE(os.stat(db).st_mode)
    except OSError:
        mode = 0o600
    fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
    try:
        st = os.fstat(fd)
        if st.st_size == 0 and stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)  # made just now (narrowed by the umask), or never used
    except OSError:
        pass  # not ours to change: it still locks
    return fd


class WriteLock:
    """Exclusive turns at writing one SQLite file, across processes (see the module).

    ``acquire(timeout)`` says whether this store's turn came within ``timeout``;
    only after ``True`` is ``release()`` called, and one turn is asked for at a
    time (the connection's lock sees to it). A lock that cannot be used (no
    ``fcntl``, the lock file could not be opened, the kernel refuses it) says
    ``True`` at once, each time: the caller's own wait for SQLite's lock is then all
    there is.

    The waiter and the helper meet through two plain locks, so a turn that comes
    costs the waiter one wake-up: ``_wake``, released to send the helper to the
    kernel, and ``_given``, released by the helper when the lock is the waiter's.
    """

    __slots__ = (
        "__weakref__",
        "_closed",
        "_closer",
        "_fd",
        "_given",
        "_helper",
        "_inflight",
        "_mu",
        "_path",
        "_tried",
        "_wake",
        "_wanted",
        "_woken",
    )

    def __init__(self, db_path: str | None) -> None:
        self._path = "" if db_path is None else db_path + SUFFIX
        self._fd: int | None = None
        self._closer: weakref.finalize[Any, Any] | None = None  # closes _fd, once
        self._tried = db_path is None  # no file (an in-memory database): nothing to queue
        self._mu = threading.Lock()  # guards the fields below
        self._wake = threading.Lock()
        self._wake.acquire()
        self._given = threading.Lock()
        self._given.acquire()
        self._wanted = False  # a waiter waits for the helper's flock
        self._woken = False  # _wake is released and the helper has not taken it yet
        self._inflight = False  # the helper is inside its blocking flock
        self._closed = False
        self._helper: threading.Thread | None = None

    @property
    def path(self) -> str:
        """The lock file's path (``""`` for `NO_QUEUE`)."""
        return self._path

    def _open(self) -> int | None:
        if not self._tried:
            self._tried = True
            if fcntl is not None:
                try:
                    self._fd = _open_like(self._path, self._path[: -len(SUFFIX)])
                except OSError as exc:
                    self._unused(exc)
                else:  # closed by close(), or with this object if its store is forgotten
                    self._closer = weakref.finalize(self, os.close, self._fd)
        return self._fd

    def _unused(self, exc: OSError) -> None:
        logger.info(
            "store.write_lock_unused",
            path=self._path,
            reason=type(exc).__name__,
            error=str(exc),
            effect="writers of this file poll for its lock",
        )

    def acquire(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for this store's turn to write; whether it came."""
        fd = self._open()
        if fd is None:
            return True
        with self._mu:
            if self._closed:
                return True  # the connection is closed too: the transaction says so
            # The descriptor holds one lock: while the helper waits in flock for it, a
            # flock here would take that same lock (and the helper, getting it, would
            # let it go): ask the helper instead.
            if not self._inflight:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    pass
                except OSError as exc:  # pragma: no cover - a lock the kernel refuses
                    self._unused(exc)
                    return True
            self._wanted = True
            if self._helper is None:
                self._helper = threading.Thread(
                    target=self._serve, name="nous-sqlite-wlock", daemon=True
                )
                self._helper.start()
            if not self._woken:
                self._woken = True
                self._wake.release()
        got = self._given.acquire(True, timeout)
        with self._mu:
            self._wanted = False
            return got or self._given.acquire(False)  # given as the wait ended

    def release(self) -> None:
        """Give the turn up (after ``acquire`` said ``True``)."""
        fd = self._fd
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the lock file (a helper waiting in the kernel closes it once it gets
        the lock, and lets it go)."""
        if not self._path:
            return  # `NO_QUEUE`, shared by every in-memory store: nothing to close
        with self._mu:
            if self._closed:
                return
            self._closed = True
            if self._helper is not None:  # it closes the descriptor as it ends
                if not self._woken:
                    self._woken = True
                    self._wake.release()
                return
            self._shut()

    def _shut(self) -> None:
        """(Under ``_mu``.) Close the descriptor, once."""
        self._fd = None
        if self._closer is not None:
            self._closer()

    def _serve(self) -> None:
        """(The helper thread.) Take the lock for each waiter, blocking in the kernel;
        end when the store closes, or after `IDLE_S` with nothing asked (the next wait
        starts another)."""
        fd = self._fd
        assert fd is not None
        while True:
            woke = self._wake.acquire(True, IDLE_S)
            with self._mu:
                if not woke:
                    if not self._woken and not self._closed:
                        self._helper = None
                        return
                    self._wake.acquire()  # released as the wait ended: take it
                self._woken = False
                if self._closed:
                    self._helper = None
                    self._shut()
                    return
                if not self._wanted:
                    continue  # its waiter gave up before this took the wake-up
                self._inflight = True
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                failed = False
            except OSError as exc:  # pragma: no cover - a lock the kernel refuses
                self._unused(exc)
                failed = True
            with self._mu:
                self._inflight = False
                if self._wanted and not self._closed:
                    # Served: a wake-up left over from this request (it may come after
                    # the grant) finds nothing wanted. Failed: the waiter goes on to
                    # SQLite's own lock.
                    self._wanted = False
                    self._given.release()
                elif not failed:
                    fcntl.flock(fd, fcntl.LOCK_UN)  # its waiter gave up meanwhile


NO_QUEUE: Final = WriteLock(None)
"""The `WriteLock` of a database no other process can write (``":memory:"``): every
turn comes at once."""
