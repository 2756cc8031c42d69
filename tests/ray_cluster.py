"""A local Ray cluster for the tests: fixtures that tests/conftest.py makes available.

The cluster is the one ``NOUS_ACTOR_TEST_RAY_ADDRESS`` names (``.ci/run`` starts one
with ``.ci/ray.sh`` and exports it, with ``NOUS_ACTOR_TEST_RAY_DIR``, its folder, and the
Ray settings its drivers need), or else one these tests start themselves with
``.ci/ray.sh`` and stop at the end. Without Ray installed the tests skip, saying why,
except under CI (``CI`` set), where a missing Ray fails them.

Fixtures:

* ``ray_cluster`` (session): a `RayCluster`; the test process is connected to it (one
  ``ray.init`` per test session, in a namespace of its own; ``ray.shutdown`` at the end).
* ``ray_scope`` (per test): a `RayScope`, a namespace no other test uses; every named
  actor left in it, and every driver process it started, is killed afterwards.

``add_node`` (of either) starts another node of the cluster on this machine, a
`RayNode` (``.ci/ray.sh add-node``), to be killed (`RayNode.kill`) or stopped.

Ray reads its settings (``RAY_AUTH_MODE``, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER``) from the
environment when it is imported, so this module sets them when it is imported, that is
when tests/conftest.py loads, before any test module imports ray; see .ci/ray.sh for what
they do. Driver processes inherit them.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
SCRIPT = ROOT / ".ci" / "ray.sh"
ADDRESS_ENV = "NOUS_ACTOR_TEST_RAY_ADDRESS"
DIR_ENV = "NOUS_ACTOR_TEST_RAY_DIR"
NAMESPACE_ENV = "NOUS_ACTOR_TEST_RAY_NAMESPACE"

# -- Ray's settings, before anything imports ray ------------------------------------------

_RAY_IMPORTED_EARLY = "ray" in sys.modules
# The cluster these tests would start themselves: its folder is chosen now, because the
# token's path must be in the environment before ray is imported. The path stays short
# (Ray's Unix sockets live under it).
_OWN_FOLDER = Path(f"/tmp/nray-{uuid.uuid4().hex[:8]}")
_SETTINGS = (
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
    "RAY_USAGE_STATS_ENABLED",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN_PATH",
)


def _configure_environment() -> bool:
    """Set Ray's settings for the test cluster; whether that changed any."""
    before = {key: os.environ.get(key) for key in _SETTINGS}
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if os.environ.get(ADDRESS_ENV):
        folder = os.environ.get(DIR_ENV)
        if folder:  # a cluster of .ci/ray.sh: its own token
            os.environ.setdefault("RAY_AUTH_MODE", "token")
            os.environ.setdefault("RAY_AUTH_TOKEN_PATH", f"{folder}/auth_token")
    else:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN_PATH"] = str(_OWN_FOLDER / "auth_token")
    return before != {key: os.environ.get(key) for key in _SETTINGS}


# Ray imported before the settings changed has not seen them.
_RAY_MISSED_SETTINGS = _configure_environment() and _RAY_IMPORTED_EARLY


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"Ray is required under CI: {reason}", pytrace=False)
    pytest.skip(reason)


# -- driver processes -------------------------------------------------------------------------

_PRELUDE = """\
import os
import ray
ray.init(
    address=os.environ["RAY_ADDRESS"],
    namespace=os.environ["NOUS_ACTOR_TEST_RAY_NAMESPACE"],
    logging_level="warning",
    log_to_driver=False,
)
"""


class Driver:
    """A driver process (``python -c``) started by `RayCluster.start_driver`.

    Its stdout is read line by line, each read with a deadline; `kill` is SIGKILL.
    """

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=env,
        )
        self.pid = self.proc.pid
        self._buffer = b""

    def read_line(self, timeout: float = 60.0) -> str:
        """The next line the driver prints (fails after ``timeout`` seconds or at its exit)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"driver {self.pid} printed no line within {timeout} s")
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(
                        f"driver {self.pid} exited ({self.wait(10)}): {self.stderr_tail()}"
                    )
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def wait(self, timeout: float = 60.0) -> int:
        """Its exit status (negative: killed by that signal), within ``timeout`` seconds."""
        return self.proc.wait(timeout)

    def stderr_tail(self, limit: int = 3000) -> str:
        """The end of what it wrote to stderr; only once it has exited."""
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            return self.proc.stderr.read().decode(errors="replace")[-limit:]
        return ""

    def kill(self) -> None:
        """SIGKILL (if still running), then wait for it; closes its pipes."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)  # should a test have stopped it
            self.proc.kill()
        self.proc.wait(30)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def _processes_under(session: str) -> dict[int, str]:
    """The processes of a node's session folder ``session``, pid -> name (see
    `RayCluster.processes`)."""
    found: dict[int, str] = {}
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = (entry / "stat").read_text()
            parents[pid] = int(stat.rsplit(")", 1)[1].split()[1])
            if pid == os.getpid():
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            outputs = [os.readlink(entry / "fd" / n) for n in ("1", "2")]
        except (OSError, ValueError, IndexError):
            continue
        if session in cmdline or any(o.startswith(session) for o in outputs):
            found[pid] = (entry / "comm").read_text().strip()
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if pid not in found and parent in found:
                with contextlib.suppress(OSError):
                    found[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
                    grew = True
    return found


def _running(pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie counts as gone)."""
    left = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            left.append(pid)
    return left


class RayNode:
    """Another node of the test cluster, on this machine: `RayCluster.add_node`.

    Its own raylet, object store, agents and workers, with their state and logs in
    its own folder; on loopback, like the head. `kill` is its sudden death, `stop`
    its orderly end (and the removal of its folder); both may be called again.
    """

    def __init__(self, cluster: RayCluster, folder: Path, node_id: str) -> None:
        self.cluster = cluster
        self.folder = folder
        self.node_id = node_id
        """Ray's id of the node (hex), as in ``ray.nodes()`` and ``get_node_id()``."""
        self.killed_at: float | None = None
        """``time.monotonic()`` when `kill` had signalled every process."""

    def processes(self) -> dict[int, str]:
        """The node's processes, pid -> name (``raylet``, ``ray::...``), found as
        `RayCluster.processes` finds the head's."""
        return _processes_under(f"{self.folder}/session_")

    def alive(self) -> bool:
        """Whether the cluster (its GCS) counts the node as alive."""
        import ray

        return any(n["NodeID"] == self.node_id and n["Alive"] for n in ray.nodes())

    def kill(self, timeout: float = 30.0) -> float:
        """SIGKILL every process of the node at once (raylet, object store, agents,
        workers), as when its machine dies; waits until they are gone (at most
        ``timeout`` seconds). The cluster finds out by itself, through its health checks.
        Returns `killed_at`."""
        pids = list(self.processes())
        if not pids:
            raise AssertionError(f"node {self.node_id[:12]} has no processes to kill")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.killed_at = time.monotonic()
        deadline = self.killed_at + timeout
        while left := _running(pids):
            if time.monotonic() > deadline:
                raise AssertionError(f"processes {left} of the node outlived SIGKILL")
            time.sleep(0.01)
        return self.killed_at

    def stop(self) -> None:
        """Stop the node's processes (``.ci/ray.sh stop`` on its folder) and remove it."""
        if self in self.cluster.nodes:
            self.cluster.nodes.remove(self)
        subprocess.run([str(SCRIPT), "stop", str(self.folder)], timeout=120, check=False)

    def __enter__(self) -> RayNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<RayNode {self.node_id[:12]} in {self.folder}>"


# -- the cluster --------------------------------------------------------------------------------


@dataclass
class RayCluster:
    """The cluster of this test run; the test process is connected to it."""

    address: str
    """``127.0.0.1:PORT``, the GCS."""
    folder: Path | None
    """Its folder (``.ci/ray.sh``'s DIR), when known."""
    namespace: str
    """The test process's own namespace (unique per test session)."""
    drivers: list[Driver] = field(default_factory=list)
    nodes: list[RayNode] = field(default_factory=list)
    """The nodes `add_node` started and that are not stopped yet."""

    def driver_env(self, namespace: str | None = None, **extra: str) -> dict[str, str]:
        """The environment of a driver process: this one's, plus ``RAY_ADDRESS`` (so that a
        bare ``ray.init()`` connects here), ``NOUS_ACTOR_TEST_RAY_ADDRESS`` and
        ``NOUS_ACTOR_TEST_RAY_NAMESPACE``."""
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]),
            "RAY_ADDRESS": self.address,
            ADDRESS_ENV: self.address,
            NAMESPACE_ENV: namespace or self.namespace,
            **extra,
        }

    def _argv(self, code: str, connect: bool) -> list[str]:
        return [sys.executable, "-u", "-c", (_PRELUDE if connect else "") + code]

    def run_driver(
        self,
        code: str,
        timeout: float = 60.0,
        namespace: str | None = None,
        connect: bool = True,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``code`` in a new driver process to its end; fails if it exits non-zero or
        takes more than ``timeout`` seconds. With ``connect`` (the default) the code runs
        after ``ray.init`` to this cluster, in ``namespace`` (default: the test
        process's)."""
        argv = self._argv(code, connect)
        try:
            done = subprocess.run(
                argv,
                cwd=ROOT,
                env=self.driver_env(namespace, **(env or {})),
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
            raise AssertionError(f"driver ran over {timeout} s: {err[-3000:]}") from None
        if done.returncode != 0:
            raise AssertionError(f"driver exited {done.returncode}: {done.stderr[-3000:]}")
        return done

    def start_driver(
        self,
        code: str,
        namespace: str | None = None,
        connect: bool = True,
        env: dict[str, str] | None = None,
    ) -> Driver:
        """Start ``code`` in a new driver process and return at once (see `run_driver`);
        it is killed at the end of the test session at the latest."""
        driver = Driver(self._argv(code, connect), self.driver_env(namespace, **(env or {})))
        self.drivers.append(driver)
        return driver

    def session_dir(self) -> Path:
        """The cluster's session folder (``DIR/session_*``), as the GCS tells it."""
        import ray

        node = ray._private.worker.global_worker.node
        return Path(node.get_session_dir_path())

    def processes(self) -> dict[int, str]:
        """The cluster's processes, pid -> name (``gcs_server``, ``raylet``, ``ray::...``).

        As ``.ci/ray.sh stop`` finds them: those whose command line names the session
        folder, those whose stdout or stderr goes to a log in it (workers, agents), and
        their descendants. Drivers (this process too) are not among them.
        """
        return _processes_under(str(self.session_dir()))

    def kill_drivers(self) -> None:
        for driver in self.drivers:
            driver.kill()
        self.drivers.clear()

    def add_node(
        self,
        resources: dict[str, float] | None = None,
        num_cpus: int = 0,
        timeout: float = 120.0,
    ) -> RayNode:
        """Start another node of this cluster on this machine (``.ci/ray.sh add-node``):
        ``num_cpus`` CPUs and the custom ``resources`` (e.g. ``{"node_b": 1}``), its
        folder of its own. Returns once the cluster counts it alive (at most
        ``timeout`` seconds). It is stopped at the end of the test session at the latest;
        `RayScope.add_node` stops it after the test."""
        folder = Path(f"/tmp/nray-{uuid.uuid4().hex[:8]}")  # short: Ray's sockets
        env = {
            **os.environ,
            "PYTHON": sys.executable,  # the Ray of this interpreter
            "NOUS_ACTOR_TEST_RAY_NODE_CPUS": str(num_cpus),
        }
        deadline = time.monotonic() + timeout
        try:
            out = subprocess.run(
                [str(SCRIPT), "add-node", str(folder), self.address, json.dumps(resources or {})],
                check=True,
                timeout=timeout,
                capture_output=True,
                text=True,
                env=env,
            ).stdout
        except (subprocess.SubprocessError, OSError) as exc:
            subprocess.run([str(SCRIPT), "stop", str(folder)], timeout=120, check=False)
            detail = getattr(exc, "stderr", "") or ""
            raise AssertionError(f"could not add a node: {exc} {detail}".strip()) from None
        node = RayNode(self, folder, _parse_exports(out)["NOUS_ACTOR_TEST_RAY_NODE_ID"])
        self.nodes.append(node)
        while not node.alive():
            if time.monotonic() > deadline:
                node.stop()
                raise AssertionError(f"{node} was not alive within {timeout} s")
            time.sleep(0.05)
        return node

    def stop_nodes(self) -> None:
        """Stop every node `add_node` started (the head stays)."""
        for node in list(self.nodes):
            node.stop()


@dataclass
class RayScope:
    """One test's corner of the cluster: a namespace no other test uses."""

    cluster: RayCluster
    namespace: str
    drivers: list[Driver] = field(default_factory=list)
    nodes: list[RayNode] = field(default_factory=list)

    def name(self, label: str) -> str:
        """An actor name for this test (unique, since the namespace is)."""
        return f"{self.namespace}-{label}"

    def run_driver(self, code: str, timeout: float = 60.0, **kwargs: Any) -> Any:
        """`RayCluster.run_driver`, in this test's namespace."""
        kwargs.setdefault("namespace", self.namespace)
        return self.cluster.run_driver(code, timeout, **kwargs)

    def start_driver(self, code: str, **kwargs: Any) -> Driver:
        """`RayCluster.start_driver`, in this test's namespace; killed after the test."""
        kwargs.setdefault("namespace", self.namespace)
        driver = self.cluster.start_driver(code, **kwargs)
        self.drivers.append(driver)
        return driver

    def get_actor(self, name: str) -> Any:
        """The actor named ``name`` in this test's namespace (``ValueError`` if none)."""
        import ray

        return ray.get_actor(name, namespace=self.namespace)

    def named_actors(self) -> list[str]:
        """The names of the live named actors in this test's namespace."""
        import ray.util

        return [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == self.namespace
        ]

    def add_node(self, **kwargs: Any) -> RayNode:
        """`RayCluster.add_node`; the node is stopped after the test."""
        node = self.cluster.add_node(**kwargs)
        self.nodes.append(node)
        return node

    def close(self) -> None:
        """Kill this test's drivers, stop its nodes, then kill every named actor left in
        its namespace."""
        import ray

        for node in self.nodes:
            node.stop()
        self.nodes.clear()
        for driver in self.drivers:
            driver.kill()
            with contextlib.suppress(ValueError):
                self.cluster.drivers.remove(driver)
        self.drivers.clear()
        for name in self.named_actors():
            with contextlib.suppress(ValueError):
                ray.kill(self.get_actor(name), no_restart=True)


def _parse_exports(out: str) -> dict[str, str]:
    return dict(
        shlex.split(line.removeprefix("export "))[0].split("=", 1)
        for line in out.splitlines()
        if line.startswith("export ")
    )


def _start_own_cluster() -> tuple[str, Path]:
    """``.ci/ray.sh start`` in `_OWN_FOLDER`: its address and folder."""
    env = dict(os.environ)
    cli = Path(sys.executable).parent / "ray"
    if "RAY" not in env and cli.is_file():
        env["RAY"] = str(cli)  # the Ray of this interpreter
    try:
        out = subprocess.run(
            [str(SCRIPT), "start", str(_OWN_FOLDER)],
            check=True,
            timeout=150,
            capture_output=True,
            text=True,
            env=env,
        ).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        _unavailable(f"could not start a Ray cluster: {exc} {detail}".strip())
    exports = _parse_exports(out)
    assert exports["RAY_AUTH_TOKEN_PATH"] == os.environ["RAY_AUTH_TOKEN_PATH"], exports
    return exports[ADDRESS_ENV], _OWN_FOLDER


def _stop_own_cluster(folder: Path) -> None:
    subprocess.run([str(SCRIPT), "stop", str(folder)], timeout=120, check=False)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """The Ray cluster of this test run, the test process connected (see the module docs)."""
    try:
        import ray
    except ImportError:
        _unavailable("ray is not installed (pip install -e '.[test]')")
    if _RAY_MISSED_SETTINGS:
        pytest.fail(
            "ray was imported before tests/ray_cluster.py set Ray's environment "
            f"({', '.join(_SETTINGS)}); import it only in tests, or export what "
            ".ci/ray.sh start prints",
            pytrace=False,
        )
    if ray.is_initialized():
        pytest.fail("this process is already connected to a Ray cluster", pytrace=False)
    own: Path | None = None
    address = os.environ.get(ADDRESS_ENV)
    if address:
        folder = os.environ.get(DIR_ENV)
        cluster_folder = Path(folder) if folder else None
    else:
        address, own = _start_own_cluster()
        cluster_folder = own
    try:
        namespace = f"nous-test-{uuid.uuid4().hex[:8]}"
        try:
            ray.init(
                address=address,
                namespace=namespace,
                logging_level="warning",
                log_to_driver=False,
            )
        except (ConnectionError, RuntimeError) as exc:
            pytest.fail(f"the Ray cluster at {address} does not answer: {exc}", pytrace=False)
        cluster = RayCluster(address, cluster_folder, namespace)
        try:
            yield cluster
        finally:
            cluster.kill_drivers()
            cluster.stop_nodes()
            ray.shutdown()
    finally:
        if own is not None:
            _stop_own_cluster(own)


@pytest.fixture
def ray_scope(ray_cluster: RayCluster) -> Iterator[RayScope]:
    """A namespace of this test's own on the cluster; its actors and drivers are killed after."""
    scope = RayScope(ray_cluster, f"nous-t-{uuid.uuid4().hex[:12]}")
    try:
        yield scope
    finally:
        scope.close()
