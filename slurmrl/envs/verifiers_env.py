"""An installed verifiers environment (https://github.com/PrimeIntellect-ai/verifiers, 0.1.x) as a chat
environment (``slurmrl.envs.chat``): ``orchestrator.environment = "verifiers:ENV_ID"``, loaded with
``verifiers.load_environment(ENV_ID, **orchestrator.environment_args)``.

What of the verifiers environment is used, and how:

- its dataset (``get_dataset()``): each task is one row, drawn at random; the row's ``prompt`` (the
  system prompt and few-shot examples included, as verifiers formats them) becomes the task's messages;
- its tool definitions (``tool_defs``, or a row's ``info["tool_defs"]``): the tools in every request;
- per rollout, its state (``begin``: ``init_state`` and ``setup_state``); after each model turn the turn
  goes into the state's trajectory, then its stop conditions (``is_completed``: ``max_turns``, a ToolEnv's
  turn without tool calls, ...) and ``env_response`` (a ToolEnv runs the tool calls there, its own way:
  errors formatted for the model, a StatefulToolEnv's injected arguments): its messages answer the turn;
- at the end, its cleanup handlers and its rubric (``score_rollout``: the weighted sum of the reward
  functions) give the reward. A reward function that raises is an environment error here (verifiers
  itself would log it and count 0 for that function): the rollout scores 0 and counts in ``env/errors``.

Not used: the environment's own ``rollout()`` loop and its sampling arguments. The orchestrator runs
the model turns itself against the job's servers (``slurmrl.runtime.orchestrator.rollout_chat``) so
that each sample is token-exact (the engine's token ids and logprobs; the environment's tokens masked)
and under the recipe's limits (``max_turns``, ``max_tokens``, ``max_rollout_tokens``, ``env_timeout_s``).
The state's OpenAI client (``state["client"]``) points at the same servers, for an environment that
asks the model itself; what it gets that way is the environment's, not the policy's sample.

Not supported (refused at load, named): an environment that is not a ``MultiTurnEnv`` (an ``EnvGroup``,
a ``verifiers.v1`` one), one that builds its conversations otherwise (its own ``get_prompt_messages``),
a rubric with group reward functions, rows whose prompt is text rather than messages.

verifiers' methods are coroutines: they run on one event loop of the adapter's own, in a thread, so a
rollout's state stays on one loop from ``begin`` to ``reward``. As in verifiers itself, a plain (not
async) tool function runs on that loop: one that blocks holds up every rollout's environment steps.
A rollout that fails before its reward skips the environment's cleanup handlers.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import signal
import threading
import time
from typing import ClassVar, Literal

import datasets
import verifiers as vf
from openai import AsyncOpenAI
from verifiers.envs.multiturn_env import MultiTurnEnv
from verifiers.types import Response, ResponseMessage, TrajectoryStep
from verifiers.utils.message_utils import normalize_messages

from slurmrl.envs import VERIFIERS

_FAILED_SCORES: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("slurmrl_failed_scores",
                                                                                   default=None)


class RewardFunctionError(RuntimeError):
    """A reward function of the rubric raised (verifiers logs it and scores it 0; here the rollout fails)."""


class EnvironmentStepError(RuntimeError):
    """The environment's ``env_response`` (or its stop conditions) raised a verifiers error."""


class _ScoreErrors(logging.Handler):
    """Collects the errors verifiers' rubric logs while the current task scores (the rubric catches what a
    reward function raises, logs it and goes on)."""

    def emit(self, record: logging.LogRecord) -> None:
        found = _FAILED_SCORES.get()
        if found is not None and record.levelno >= logging.ERROR:
            found.append(record.getMessage())


_SCORE_ERRORS = _ScoreErrors(logging.ERROR)
datasets.disable_progress_bars()  # verifiers formats its dataset with map(): no progress bars in the job's log


def to_openai(message) -> dict:
    """A verifiers message (or a dict) as an OpenAI chat message: tool calls as ``{"id", "type",
    "function": {"name", "arguments"}}``, no empty fields."""
    d = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else \
        {k: v for k, v in dict(message).items() if v is not None}
    if d.get("tool_calls"):
        d["tool_calls"] = [{"id": c["id"], "type": "function",
                            "function": {"name": c["name"], "arguments": c["arguments"]}} for c in d["tool_calls"]]
    return d


def openai_tool(tool) -> dict:
    """A verifiers ``Tool`` (``name``, ``description``, ``parameters``) in the OpenAI tools schema."""
    fn = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    if getattr(tool, "strict", None) is not None:
        fn["strict"] = tool.strict
    return {"type": "function", "function": fn}


def load(env_id: str, args: dict):
    """``verifiers.load_environment(env_id, **args)``, keeping the process's SIGINT/SIGTERM handlers
    (verifiers' environments install their own, which would end the orchestrator without its planned stop)."""
    module = env_id.replace("-", "_").split("/")[-1]
    saved = [(s, signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)]
    try:
        return vf.load_environment(env_id, **args)
    except (ValueError, RuntimeError) as e:  # verifiers wraps the cause; the cause says what went wrong, where
        cause = e.__cause__
        if isinstance(cause, ModuleNotFoundError) and cause.name == module:
            raise SystemExit(f"slurmrl: environment '{VERIFIERS}{env_id}': no verifiers environment {env_id!r} is "
                             f"installed (no module {module!r} in the job's Python: install its package there)") from None
        if cause is not None:
            raise cause from None
        raise
    finally:
        if threading.current_thread() is threading.main_thread():
            for s, handler in saved:
                if handler is not None:
                    signal.signal(s, handler)


class VerifiersEnv:
    """A verifiers ``MultiTurnEnv`` (``SingleTurnEnv``, ``ToolEnv``, ``StatefulToolEnv``, ...) on the chat
    protocol: ``prompts``, ``tools``, ``begin``, ``respond``, ``reward``, ``split_key``, ``use_servers``."""

    kind: ClassVar[Literal["chat"]] = "chat"

    def __init__(self, env_id: str, **args):
        self.env_id = env_id
        self.env = load(env_id, args)
        name = f"'{VERIFIERS}{env_id}' ({type(self.env).__name__})"
        if not isinstance(self.env, MultiTurnEnv):
            raise SystemExit(f"slurmrl: environment {name} is not a verifiers MultiTurnEnv (SingleTurnEnv, ToolEnv, "
                             "StatefulToolEnv, ...): slurmrl runs those only")
        if type(self.env).get_prompt_messages is not MultiTurnEnv.get_prompt_messages:
            raise SystemExit(f"slurmrl: environment {name} builds its conversations itself (get_prompt_messages); "
                             "slurmrl's rollouts append each turn and the environment's answer, token-exact")
        if self.env.rubric.has_group_rewards:
            raise SystemExit(f"slurmrl: environment {name}'s rubric has group reward functions; slurmrl scores each "
                             "rollout as it ends (score_rollout)")
        self.rows = self.env.get_dataset()
        if not len(self.rows):
            raise SystemExit(f"slurmrl: environment {name} has an empty dataset")
        if any(m["role"] not in ("system", "user", "assistant", "tool") for m in self.task(0)["messages"]):
            raise SystemExit(f"slurmrl: environment {name}'s prompts are text, not chat messages")
        self.tools = [openai_tool(t) for t in self.env.tool_defs or []] or None
        self.client = None
        self.model = ""
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="verifiers-loop").start()

    def run(self, coro):
        """Run ``coro`` on the adapter's event loop; its result (or what it raised)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def use_servers(self, urls: list[str], model: str, api_key: str | None) -> None:
        """The job's servers (the router, else the first server) as the states' OpenAI client."""
        self.client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=f"{urls[0].rstrip('/')}/v1",
                                                                 api_key=api_key or "EMPTY"))
        self.model = model

    def task(self, row: int) -> dict:
        data = self.rows[row]
        task = {"messages": [to_openai(m) for m in normalize_messages(data["prompt"], field_name="prompt")],
                "row": row, "example_id": data.get("example_id", row)}
        info = data.get("info")
        if isinstance(info, dict) and info.get("tool_defs"):
            task["tools"] = [openai_tool(t) for t in self.env._normalize_tool_defs(info["tool_defs"]) or []]
        return task

    def prompts(self, rng: random.Random, n: int) -> list[dict]:
        return [self.task(rng.randrange(len(self.rows))) for _ in range(n)]

    def split_key(self, task: dict) -> str:
        return f"{self.env_id}:{task['example_id']}"

    def begin(self, task: dict) -> dict:
        """The rollout's own task: ``task`` with the verifiers state of this rollout (``state``)."""
        if self.client is None:
            raise RuntimeError("verifiers environment without servers: the orchestrator calls use_servers first")
        return {**task, "state": self.run(self._begin(dict(self.rows[task["row"]])))}

    async def _begin(self, row: dict):
        state = await self.env.init_state(row, self.client, self.model, None)
        await self.env.setup_state(state)
        return state

    def respond(self, task: dict, messages: list[dict]) -> list[dict]:
        try:
            replies = self.run(self._respond(task["state"], messages))
        except vf.Error as e:  # e.g. a ToolEnv's stop error: verifiers' own errors say little without their cause
            cause = f" ({type(e.__cause__).__name__}: {e.__cause__})" if e.__cause__ is not None else ""
            raise EnvironmentStepError(f"{type(e).__name__}{f': {e}' if str(e) else ''}{cause}") from e
        return [to_openai(m) for m in replies]

    async def _respond(self, state, messages: list[dict]) -> list:
        full = await self.record(state, messages)
        if await self.env.is_completed(state):
            return []
        replies = normalize_messages(await self.env.env_response(full, state), field_name="env_response")
        if state.get("final_env_response") is not None:  # the environment ends the rollout (the rubric sees it)
            return []
        return replies

    def reward(self, task: dict, messages: list[dict]) -> float:
        return self.run(self._reward(task["state"], messages))

    async def _reward(self, state, messages: list[dict]) -> float:
        await self.record(state, messages)
        state["is_completed"] = True
        await self.env.cleanup(state)  # renders state["completion"], then the environment's own cleanup
        logger = logging.getLogger("verifiers")
        if _SCORE_ERRORS not in logger.handlers:  # verifiers.setup_logging() clears the handlers
            logger.addHandler(_SCORE_ERRORS)
        failed: list[str] = []
        token = _FAILED_SCORES.set(failed)
        try:
            if self.env.score_rollouts:
                await self.env.rubric.score_rollout(state)
            else:
                await self.env.rubric.dummy_score_rollout(state)
        finally:
            _FAILED_SCORES.reset(token)
        await self.env.rubric.cleanup(state)
        if failed:
            raise RewardFunctionError("; ".join(failed))
        return float(state["reward"] or 0.0)

    async def record(self, state, messages: list[dict]) -> list:
        """Put the model turns of ``messages`` (the conversation after the prompt) that the state's trajectory
        lacks into it, as verifiers' own loop would; the whole conversation as verifiers messages."""
        full = list(state["prompt"]) + normalize_messages(messages, field_name="messages")
        turns = [k for k, m in enumerate(full) if k >= len(state["prompt"]) and m.role == "assistant"]
        for k in turns[len(state["trajectory"]):]:
            msg = full[k]
            response = Response(id=f"slurmrl-{state['trajectory_id']}-{k}", created=int(time.time()),
                                model=self.model, message=ResponseMessage(
                                    content=msg.content, tool_calls=msg.tool_calls, finish_reason=None,
                                    is_truncated=False))
            step = TrajectoryStep(prompt=full[:k], completion=[msg], response=response, tokens=None, reward=None,
                                  advantage=None, is_truncated=False, trajectory_id=state["trajectory_id"], extras={})
            await self.env.add_trajectory_step(state, step)
        return full
