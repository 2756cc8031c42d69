"""Adapters that let other frameworks keep their history in nous_actor sessions.

Each adapter lives in a module of its own that imports its framework at the
top, behind an optional extra; `nous_actor` itself never imports them:

* `nous_actor.integrations.openai_agents`: the OpenAI Agents SDK's `Session`
  (`pip install 'nous-actor[openai-agents]'`).
"""
