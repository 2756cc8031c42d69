"""Fixtures for tests/ (the shared setup is in the top-level conftest.py)."""

# The PostgreSQL server and its helpers (see tests/postgres_server.py).
from postgres_server import pg_server, pg_stores, pg_workers  # noqa: F401

# The Ray cluster and its helpers (see tests/ray_cluster.py).
from ray_cluster import ray_cluster, ray_scope  # noqa: F401
