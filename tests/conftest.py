"""Fixtures for tests/ (the shared setup is in the top-level conftest.py)."""
