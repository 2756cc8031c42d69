"""The shipped SessionMachine: a session driven by several caller threads equals the pure Log."""

from __future__ import annotations

from hypothesis import settings

from nous_actor.testing import SessionMachine

TestSessionMachine = SessionMachine.TestCase
TestSessionMachine.settings = settings(
    settings.default, stateful_step_count=25, max_examples=min(settings.default.max_examples, 40)
)
