"""Sessions on Ray, hardened: which constructor arguments are refused.

On the real local cluster of tests/ray_cluster.py; clients that must not be connected to
Ray yet run as real processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ray_cluster import RayCluster

ray = pytest.importorskip("ray") if not os.environ.get("CI") else __import__("ray")

from nous_actor import ClusterError, MemoryStore  # noqa: E402
from nous_actor.cluster.ray import RaySessions  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- constructor arguments --------------------------------------------------------------------

BAD_ARGUMENTS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"store_factory": "postgresql://db/agents"}, TypeError, "store_factory must be a callable"),
    ({"shards": 0}, ValueError, "shards must be an int >= 1, got 0"),
    ({"shards": "4"}, ValueError, "shards must be an int >= 1, got '4'"),
    ({"name": 7}, TypeError, "name must be a str or None, got int"),
    ({"name": " "}, ValueError, "name must be a non-empty str"),
    ({"namespace": b"ns"}, TypeError, "namespace must be a str or None, got bytes"),
    ({"namespace": ""}, ValueError, "namespace must be a non-empty str"),
    ({"name": "x", "detached": "yes"}, TypeError, "detached must be True or False"),
    ({"detached": True}, ValueError, "detached shards need a name="),
    ({"address": 6379}, TypeError, "address must be a str .* or None, got int"),
    ({"address": "head-node"}, ClusterError, "cannot read the Ray address 'head-node'"),
    ({"timeout": -1}, ValueError, "timeout must be a finite number of seconds > 0"),
    ({"start_timeout": 0}, ValueError, "start_timeout must be a finite number of seconds > 0"),
    ({"start_timeout": "60"}, ValueError, "start_timeout must be a finite number of seconds"),
    ({"start_timeout": True}, ValueError, "start_timeout must be a finite number of seconds"),
    ({"max_sessions": 0}, ValueError, "max_sessions must be an int >= 1"),
    ({"idle_timeout": -5}, ValueError, "idle_timeout must be None or > 0 seconds"),
    ({"max_in_flight": 0}, ValueError, r"max_in_flight must be an int in \[1, 64\]"),
    ({"actor_options": "num_cpus=1"}, TypeError, "actor_options must be a mapping"),
    ({"actor_options": [("num_cpus", 1)]}, TypeError, "actor_options must be a mapping"),
    ({"actor_options": {"name": "x"}}, ValueError, "may not set 'name': pass name="),
    ({"actor_options": {"lifetime": "detached"}}, ValueError, "pass detached=True"),
    ({"actor_options": {"get_if_exists": True}}, ValueError, "may not set 'get_if_exists'"),
    ({"actor_options": {"num_cpu": 1}}, ValueError, "actor_options: Invalid option keyword"),
    ({"actor_options": {"num_cpus": -1}}, ValueError, "actor_options: .*cannot be negative"),
    ({"actor_options": {"resources": "gpu"}}, TypeError, "actor_options: .*'resources'"),
]


def _make(kwargs: dict[str, Any], address: str = "127.0.0.1:1") -> RaySessions:
    """RaySessions(**kwargs), at ``address`` unless they give one (by default, where
    nothing listens: an argument let through meets a ClusterError, not the error its
    check must raise)."""
    args = dict(kwargs)
    factory = args.pop("store_factory", MemoryStore)
    args.setdefault("address", address)
    return RaySessions(factory, **args)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"), BAD_ARGUMENTS, ids=[str(k) for k, _, _ in BAD_ARGUMENTS]
)
def test_a_bad_constructor_argument_is_refused_with_a_typed_error_saying_what_to_pass(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """Each bad argument of RaySessions: its own typed error, whose message names the
    argument and what it must be."""
    with pytest.raises(error, match=match):
        _make(kwargs)


CHECK_ALL = """
import json, os
import ray
from test_ray_hardening import BAD_ARGUMENTS, _make

seen = []
for kwargs, error, _ in BAD_ARGUMENTS:
    try:
        _make(kwargs, os.environ["NOUS_ACTOR_TEST_RAY_ADDRESS"])  # a cluster that runs
    except Exception as exc:
        seen.append([type(exc).__name__, isinstance(exc, error), ray.is_initialized()])
    else:
        seen.append(["nothing", False, ray.is_initialized()])
print(json.dumps(seen))
"""


def test_bad_constructor_arguments_are_refused_before_anything_starts(
    ray_cluster: RayCluster,
) -> None:
    """In a process not connected to Ray, given the address of a running cluster, each bad
    argument is refused before Ray is even reached: the process is still not connected."""
    out = subprocess.run(
        [sys.executable, "-c", CHECK_ALL],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=ray_cluster.driver_env(),
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.splitlines()[-1])
    assert len(seen) == len(BAD_ARGUMENTS)
    for (kwargs, error, _), (got, right, connected) in zip(BAD_ARGUMENTS, seen, strict=True):
        assert right, f"{kwargs}: {got}, not {error.__name__}"
        assert not connected, f"{kwargs}: connected to Ray before refusing it"
