"""The optional extras: the error an entry module raises when its extra is missing.

Each extra's entry module imports the extra's package first, in a
``try``, and hands a failure to `missing_extra`, which raises the
`ImportError` that says what to install::

    try:
        import psycopg  # noqa: F401  (the postgres extra)
    except ImportError as exc:
        missing_extra("postgres", __name__, exc)

The entry modules: `nous_actor.store.postgres` (``postgres``),
`nous_actor.cluster.ray` (``ray``), `nous_actor.viewer` (``serve``),
`nous_actor.runtime.otel` (``otel``); the adapters
`nous_actor.integrations.openai_agents` (``openai-agents``),
`nous_actor.integrations.adk` (``adk``) and `nous_actor.integrations.langgraph`
(``langgraph``) word theirs the same way. Nothing else
of the library imports them (``import nous_actor`` never needs an extra).
"""

from __future__ import annotations

import importlib.util
from typing import Final, NoReturn

__all__ = ["EXTRAS", "missing_extra"]

EXTRAS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "postgres": ("psycopg 3", ("psycopg",)),
    "ray": ("Ray", ("ray",)),
    "openai-agents": ("the OpenAI Agents SDK", ("agents",)),
    "adk": ("Google ADK", ("google.adk",)),
    "langgraph": ("LangGraph", ("langgraph",)),
    "otel": ("the OpenTelemetry API", ("opentelemetry",)),
    "serve": ("Starlette and uvicorn", ("starlette", "uvicorn")),
}
"""extra -> (what it brings, in words; the top-level modules it provides)."""


def missing_extra(extra: str, module: str, exc: ImportError) -> NoReturn:
    """Raise the error for ``module`` failing to import its ``extra`` with ``exc``.

    Raises:
        ModuleNotFoundError: the extra's package is not installed (``exc`` names
            it); the message names the extra and the ``pip install`` that gets it.
        ImportError: the package is installed but does not import (a dependency
            of its own is missing or broken); the message says to reinstall the
            extra, and keeps ``exc``'s text.
    """
    what, provides = EXTRAS[extra]
    pip = f"pip install 'nous-actor[{extra}]'"
    for name in provides:
        if not _installed(name):
            raise ModuleNotFoundError(
                f"{module} needs {what}, which is not installed; install the {extra} extra: {pip}",
                name=name,
            ) from exc
    raise ImportError(
        f"{module} needs {what}, which is installed but does not import "
        f"({type(exc).__name__}: {exc}); reinstall the {extra} extra: {pip}",
        name=exc.name,
    ) from exc


def _installed(name: str) -> bool:
    """Whether the module ``name`` can be found (not whether it imports)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent missing, or a module without a spec
        return False
