"""The Ray test cluster itself (tests/ray_cluster.py, .ci/ray.sh): reachable from the test
process and from driver processes, detached actors outliving a SIGKILLed driver, loopback
only, clients without its token refused."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ray_cluster import RayCluster, RayScope

if os.environ.get("CI"):
    import ray  # under CI, a missing Ray fails
else:
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[test]')")


@ray.remote
class Echo:
    def pid(self) -> int:
        return os.getpid()

    def echo(self, value: object) -> object:
        return value


def test_the_test_process_reaches_the_cluster(
    ray_cluster: RayCluster, ray_scope: RayScope
) -> None:
    assert ray.is_initialized()
    assert ray.get_runtime_context().gcs_address == ray_cluster.address
    assert ray.get_runtime_context().namespace == ray_cluster.namespace
    actor = Echo.options(name=ray_scope.name("echo"), namespace=ray_scope.namespace).remote()
    try:
        assert ray.get(actor.echo.remote({"n": 1}), timeout=60) == {"n": 1}
        pid = ray.get(actor.pid.remote(), timeout=30)
        assert pid != os.getpid()
        assert ray_cluster.processes().get(pid, "").startswith("ray::Echo")
        assert ray_scope.named_actors() == [ray_scope.name("echo")]
    finally:
        ray.kill(actor)


_DRIVER = """
import os, threading

@ray.remote
class Echo:
    def pid(self):
        return os.getpid()

detached = Echo.options(name=os.environ["DETACHED"], lifetime="detached").remote()
owned = Echo.options(name=os.environ["OWNED"]).remote()
pids = ray.get([detached.pid.remote(), owned.pid.remote()], timeout=60)
print("ready", os.getpid(), *pids, flush=True)
threading.Event().wait()
"""


def test_a_detached_actor_outlives_its_sigkilled_driver(ray_scope: RayScope) -> None:
    detached, owned = ray_scope.name("detached"), ray_scope.name("owned")
    driver = ray_scope.start_driver(_DRIVER, env={"DETACHED": detached, "OWNED": owned})
    word, driver_pid, detached_pid, owned_pid = driver.read_line(timeout=90).split()
    assert (word, int(driver_pid)) == ("ready", driver.pid)
    assert sorted(ray_scope.named_actors()) == sorted([detached, owned])

    os.kill(driver.pid, signal.SIGKILL)
    assert driver.wait(30) == -signal.SIGKILL

    actor = ray_scope.get_actor(detached)
    assert ray.get(actor.pid.remote(), timeout=30) == int(detached_pid)
    # The actor the driver owned (not detached) goes with it, once the cluster notices.
    deadline = time.monotonic() + 60
    while owned in ray_scope.named_actors():
        assert time.monotonic() < deadline, "the dead driver's own actor is still named"
        time.sleep(0.05)
    deadline = time.monotonic() + 60
    while Path(f"/proc/{owned_pid}").exists() and _state(int(owned_pid)) != "Z":
        assert time.monotonic() < deadline, f"the owned actor's worker {owned_pid} lives on"
        time.sleep(0.05)
    assert ray.get(actor.pid.remote(), timeout=30) == int(detached_pid)
    ray.kill(actor, no_restart=True)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def _listening(pids: set[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket of those processes."""
    owners: dict[str, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owners[target[8:-1]] = pid
    found = []
    for table in ("tcp", "tcp6"):
        lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in owners:  # 0A: LISTEN
                continue
            hexaddr, hexport = local.split(":")
            raw = bytes.fromhex(hexaddr)
            # The kernel prints the address as 32-bit words, each in host byte order.
            words = [raw[i : i + 4] for i in range(0, len(raw), 4)]
            if sys.byteorder == "little":
                words = [word[::-1] for word in words]
            packed = b"".join(words)
            found.append((owners[inode], str(ipaddress.ip_address(packed)), int(hexport, 16)))
    return found


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def test_the_cluster_listens_on_loopback_only(ray_cluster: RayCluster) -> None:
    actor = Echo.remote()  # a worker too, which listens as well
    try:
        worker = ray.get(actor.pid.remote(), timeout=60)
        processes = ray_cluster.processes()
        names = set(processes.values())
        assert {"gcs_server", "raylet"} <= names, names
        assert worker in processes
        listening = _listening(set(processes))
        ports = {port for _, _, port in listening}
        assert int(ray_cluster.address.rsplit(":", 1)[1]) in ports, listening
        assert worker in {pid for pid, _, _ in listening}, listening
        exposed = [
            (processes[pid], address, port)
            for pid, address, port in listening
            if not _loopback(address)
        ]
        assert exposed == []
        assert ray_cluster.address.startswith("127.0.0.1:")
    finally:
        ray.kill(actor)


def test_a_client_without_the_token_is_refused(ray_cluster: RayCluster, tmp_path: Path) -> None:
    if os.environ.get("RAY_AUTH_MODE") != "token":
        pytest.skip("the cluster was not started by .ci/ray.sh: no token authentication")
    status = [sys.executable, "-m", "ray.scripts.scripts", "status"]
    status.append(f"--address={ray_cluster.address}")
    env = ray_cluster.driver_env()
    ok = subprocess.run(status, env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr[-2000:]
    wrong = tmp_path / "token"
    wrong.write_text("0" * 64)
    refused = subprocess.run(
        status,
        env={**env, "RAY_AUTH_TOKEN_PATH": str(wrong)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0
    assert "Authentication" in refused.stdout + refused.stderr
