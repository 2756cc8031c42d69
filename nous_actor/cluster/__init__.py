"""Sessions beyond one process: hosted on a cluster, journaled in a shared store.

`nous_actor.cluster.ray` (the ``ray`` extra) hosts sessions in Ray actors.
Nothing here is imported by ``import nous_actor``.
"""
