"""Placement: the Ray options of the shard actors (where and how Ray runs them), and
stopping shards for good."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import ray

_OWN_OPTIONS: Final = {
    "name": "name=",
    "namespace": "namespace=",
    "lifetime": "detached=True",
    "get_if_exists": "name= (shards of that name that run already are reached, not started)",
}
"""Ray actor options that `RaySessions` sets from its own arguments: which argument."""


def _shard_options(remote: Any, actor_options: object) -> dict[str, Any]:
    """The Ray options of the shard actors: ours updated with ``actor_options``, checked by
    Ray (which needs no connection for that), so that a bad one is refused before
    anything starts.

    Raises:
        TypeError: ``actor_options`` is not a mapping of option names, or Ray refuses
            the type of a value.
        ValueError: an option Ray does not know, a bad value, or one that an argument of
            `RaySessions` sets (the message names the argument).
    """
    if actor_options is None:
        actor_options = {}
    if not isinstance(actor_options, Mapping):
        raise TypeError(
            "actor_options must be a mapping of Ray actor options, e.g. "
            f"{{'resources': {{'gpu_node': 1}}}}, or None; got {type(actor_options).__name__}"
        )
    for key in actor_options:
        if not isinstance(key, str):
            raise TypeError(f"actor_options keys must be Ray option names (str), got {key!r}")
        if key in _OWN_OPTIONS:
            raise ValueError(
                f"actor_options may not set {key!r}: pass {_OWN_OPTIONS[key]} to RaySessions"
            )
    base: dict[str, Any] = {
        "max_restarts": -1,
        "max_task_retries": 0,
        "num_cpus": 0,
        # Ray places an actor that asks for no resource on a random node whatever
        # its strategy: a token of memory makes SPREAD (and soft affinity) apply.
        "memory": 1 << 20,
        "scheduling_strategy": "SPREAD",
        **actor_options,
    }
    try:
        remote.options(**base)
    except TypeError as exc:
        raise TypeError(f"actor_options: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"actor_options: {exc}") from None
    return base


def _kill(actors: list[Any]) -> None:
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already gone
            pass
