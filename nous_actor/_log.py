"""How the library logs: structlog when the application configured it, else quietly.

A library never configures logging. The events are structlog events with
stable names and key/value context; where they go is the application's
choice:

* If the application configured structlog (`structlog.configure(...)`), every
  event goes through that configuration, as from `structlog.get_logger`.
* Otherwise it goes to the standard library's `logging`, logger
  `nous_actor.<module>`, rendered `event key=value ...`. A program that
  configured nothing therefore sees nothing below a warning, and warnings on
  stderr only (the `logging` module's last resort), never its stdout.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import structlog

__all__ = ["get_logger"]

_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class _Logger:
    """The subset of a structlog logger the library uses: one method per level."""

    __slots__ = ("_bound", "_name", "_std")

    def __init__(self, name: str) -> None:
        self._name = name
        self._std = logging.getLogger(name)
        # structlog's logger for this module, bound under the configuration it was
        # bound for (that configuration's parts, kept to compare by identity).
        self._bound: tuple[tuple[object, ...], Any] | None = None

    def _structlog(self) -> Any:
        """This module's structlog logger under the current configuration: bound once
        per configuration, where binding one per line (`structlog.get_logger` and its
        lazy proxy) was most of the cost of a line the configuration filters out."""
        config = structlog.get_config()
        key = (
            config["processors"],
            config["wrapper_class"],
            config["logger_factory"],
            config["context_class"],
        )
        cached = self._bound
        if cached is not None and all(a is b for a, b in zip(cached[0], key, strict=True)):
            return cached[1]
        bound = structlog.get_logger(self._name).bind()
        self._bound = (key, bound)
        return bound

    def _emit(self, level: str, event: str, context: dict[str, Any]) -> None:
        if structlog.is_configured():
            getattr(self._structlog(), level)(event, **context)
            return
        number = _LEVELS[level]
        if self._std.isEnabledFor(number):
            rendered = " ".join(f"{k}={v!r}" for k, v in context.items())
            self._std.log(number, "%s %s", event, rendered)

    def debug(self, event: str, **context: Any) -> None:
        self._emit("debug", event, context)

    def info(self, event: str, **context: Any) -> None:
        self._emit("info", event, context)

    def warning(self, event: str, **context: Any) -> None:
        self._emit("warning", event, context)

    def error(self, event: str, **context: Any) -> None:
        self._emit("error", event, context)


def get_logger(name: str) -> _Logger:
    """The library's logger for module `name` (see the module docstring)."""
    return _Logger(name)
