"""LangGraph's checkpointer, kept in supervised, durable nous_actor sessions.

`NousCheckpointSaver` implements LangGraph's ``BaseCheckpointSaver`` (sync and
async: ``get_tuple``, ``list``, ``put``, ``put_writes``, ``delete_thread``,
``delete_for_runs``, ``copy_thread``, ``prune``, ``get_delta_channel_history``)
over the sessions of a `nous_actor.Sessions` registry, on any store, or of a
``RaySessions`` (`nous_actor.cluster.ray`) on a store every process reaches. Swap

    checkpointer = SqliteSaver.from_conn_string("checkpoints.db")

for

    checkpointer = NousCheckpointSaver(sessions)                          # a registry you run
    checkpointer = NousCheckpointSaver.from_conn_string("checkpoints.db")  # or one opened for you

`Registry` is what the saver needs of a registry (``open``, ``aopen``, and a
``store`` or a ``store_factory``). A thread is one session (`thread_key` gives
its id); checkpoints and pending writes are its events; a checkpoint keeps only
what changed since its parent (a ``messages`` list its new tail), so storage
grows linearly with a thread; deletes and prunes are records, never erasures.
See ``docs/langgraph.md``.
"""

from __future__ import annotations

from nous_actor.integrations.langgraph.ids import thread_key, thread_of
from nous_actor.integrations.langgraph.registries import Registry
from nous_actor.integrations.langgraph.saver import NousCheckpointSaver

__all__ = ["NousCheckpointSaver", "Registry", "thread_key", "thread_of"]
