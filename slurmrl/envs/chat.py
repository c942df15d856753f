"""Environments that speak messages: chat prompts, model turns through the chat endpoint, the
environment's answer after each turn, tools in the OpenAI tools schema.

A chat environment (``kind = "chat"``, ``slurmrl.envs.protocol.ChatEnvironment``) is one whose ``prompts(rng, n)`` gives tasks with ``messages`` (chat messages:
system + user) in place of ``prompt`` text, and optionally ``tools`` (a list in the OpenAI tools
schema, ``{"type": "function", "function": {"name", "description", "parameters"}}``; an
environment's ``tools`` attribute serves every task). The orchestrator asks vLLM's chat endpoint
for each model turn (the model's chat template applies; the servers parse tool calls with the
recipe's ``inference.tool_call_parser``) and after each turn:

- the assistant's ``tool_calls``, when the environment has ``call_tool(name, arguments) -> str``:
  each is answered by a ``tool`` message and the model goes on;
- otherwise ``respond(task, messages) -> list[dict]``: the environment's answer (game feedback, a
  user's next question) as messages; an empty list ends the conversation (as does an environment
  without ``respond``: one turn);

until ``orchestrator.max_turns`` or ``max_rollout_tokens``. Then ``reward(task, messages)`` scores
the conversation after the prompt (the assistant's and the environment's messages, in order).

Two more, optional: ``begin(task) -> dict``, called once per rollout before its first turn, gives the
rollout's own task (where an environment keeps per-rollout state; ``respond`` and ``reward`` get it);
``use_servers(urls, model, api_key)``, called once at start, names the servers the orchestrator samples
from (for an environment that asks the model itself, e.g. a verifiers environment's OpenAI client).

Each step (``begin``, ``respond``, ``call_tool``, ``reward``) runs under ``orchestrator.env_timeout_s``; one that
raises or takes longer scores its rollout 0 and is counted in the metrics; it never ends the job.
An environment class without ``prompts`` and ``reward`` (or ``rewards``), or without its ``kind``, fails at
load, named; so does a text environment with one of these hooks (``slurmrl.envs.protocol.HOOKS``).
"""

from __future__ import annotations

import json

from slurmrl.envs.protocol import Environment


def tools_of(env, task: dict) -> list[dict] | None:
    """The tools (OpenAI schema) offered in ``task``: its own, else the environment's."""
    tools = task.get("tools", Environment.of(env).tools)
    return list(tools) if tools else None


def tool_replies(env, message: dict) -> list[dict] | None:
    """``tool`` messages answering the assistant ``message``'s tool calls through the environment's
    ``call_tool``; None when there is nothing to answer that way. Raises what the tool raises."""
    calls = message.get("tool_calls") or []
    env = Environment.of(env)
    if not calls or not env.answers_tools:
        return None
    out = []
    for call in calls:
        fn = call.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            content = f"error: the arguments are not JSON: {fn.get('arguments')!r}"
        else:
            content = env.call_tool(fn.get("name", ""), args)
        out.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": content})
    return out


def answers(messages: list[dict]) -> list[str]:
    """The text of each assistant message in ``messages``."""
    return [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
