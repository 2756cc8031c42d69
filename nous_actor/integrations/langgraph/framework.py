"""LangGraph's names that the adapter uses.

LangGraph is imported here alone (every other module of the package takes its
names from here), so that importing the adapter without LangGraph says which
extra to install.
"""

from __future__ import annotations

import importlib.util


def _installed(name: str) -> bool:
    """Whether the module ``name`` can be found (not whether it imports)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # blocked, or a module without a spec
        return False


try:
    from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
    from langchain_core.messages import BaseMessage, messages_from_dict
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        DeltaChannelHistory,
        PendingWrite,
        get_checkpoint_id,
        get_checkpoint_metadata,
        writes_sort_key,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.checkpoint.serde.types import ERROR, INTERRUPT
    from langgraph.pregel import Pregel
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    _pip = "pip install 'nous-actor[langgraph]'"
    _where = "nous_actor.integrations.langgraph"
    if not _installed("langgraph"):
        raise ModuleNotFoundError(
            f"{_where} needs LangGraph, which is not installed; install the langgraph "
            f"extra: {_pip}",
            name="langgraph",
        ) from exc
    raise ImportError(
        f"{_where} needs LangGraph, which is installed but does not import "
        f"({type(exc).__name__}: {exc}); reinstall the langgraph extra: {_pip}",
        name=exc.name,
    ) from exc

__all__ = [
    "ERROR",
    "INTERRUPT",
    "WRITES_IDX_MAP",
    "AsyncCallbackHandler",
    "BaseCallbackHandler",
    "BaseCheckpointSaver",
    "BaseMessage",
    "ChannelVersions",
    "Checkpoint",
    "CheckpointMetadata",
    "CheckpointTuple",
    "DeltaChannelHistory",
    "PendingWrite",
    "Pregel",
    "RunnableConfig",
    "SerializerProtocol",
    "get_checkpoint_id",
    "get_checkpoint_metadata",
    "messages_from_dict",
    "writes_sort_key",
]
