"""Adapters that let other frameworks keep their history in nous_actor sessions.

Each adapter is a package of its own, behind an optional extra, whose ``framework``
module alone imports its framework (and says how to install it when it is
missing); `nous_actor` itself never imports them:

* `nous_actor.integrations.openai_agents`: the OpenAI Agents SDK's `Session`
  (`pip install 'nous-actor[openai-agents]'`).
* `nous_actor.integrations.adk`: Google ADK's session service
  (`pip install 'nous-actor[adk]'`).
* `nous_actor.integrations.langgraph`: LangGraph's checkpointer
  (`pip install 'nous-actor[langgraph]'`).
"""
