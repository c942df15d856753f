"""Rollouts of a chat environment (``slurmrl.envs.chat``): several model turns through vLLM's chat
endpoint, the environment's answer between them, one token-exact training sample per conversation.

Each model turn asks ``/v1/chat/completions`` (``vllm.client.Server.chat_completions``) with
``return_token_ids`` and ``logprobs``: the first turn's prompt is the server's rendering of the task's
messages (``prompt_token_ids`` in the answer); every later turn is served on the sequence so far, token
ids the orchestrator sends (``kv_transfer_params.prompt_token_ids``: vLLM then skips templating), so the
engine continues from exactly the tokens it sampled. The sample is

    prompt_ids                      the first turn's prompt, as the server tokenized it
    completion_ids                  turn 1's tokens, the environment's tokens, turn 2's tokens, ...
    completion_mask                 1 at the model's tokens, 0 at the environment's (never trained on)
    logprobs                        the engine's logprob at each model token, None at the environment's

The environment's tokens come from the chat template (``chat_tokens``); the model's are never
re-tokenized. A server that answers a later turn on other prompt tokens than it was sent fails the step.

Limits: ``max_turns`` model turns; ``max_tokens`` per turn (a turn cut there ends as if the model had
ended it, and the environment answers); ``max_rollout_tokens`` after the prompt (the model's and the
environment's together: the conversation ends where the next turn would not fit). Every environment
step (``begin``, ``respond``, ``call_tool``, ``reward``) runs under ``env_timeout_s`` in a thread of its
own; one that raises or runs past it ends its rollout with reward 0, counted in ``env/errors`` or
``env/timeouts`` (a step that never returns keeps its daemon thread; a tool that runs user code runs it
in a subprocess it can kill: ``slurmrl.envs.tools``). A rollout whose ``begin`` failed still asks for
its first turn (a sample needs the prompt's tokens), then ends.

Training and evaluation ([eval], ``evaluate``) run the same rollouts (``ChatSampler.rollouts``), each with
its own ``Sampling``: conversations per task, temperature, tokens per turn, the model name to ask for.
"""

from __future__ import annotations

import statistics
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from slurmrl import secret
from slurmrl.contract.metrics import EnvStats
from slurmrl.envs.chat import tool_replies, tools_of
from slurmrl.envs.protocol import Environment
from slurmrl.runtime.orchestrator.chat_tokens import ChatTokens, TemplateError
from slurmrl.runtime.orchestrator.members import Members, alone
from slurmrl.runtime.vllm.client import Server, VLLMError
from slurmrl.settings.limits import MAX_TOKENS
from slurmrl.settings.orchestrator import OrchestratorSettings


class StepTimeout(TimeoutError):
    """An environment step ran past ``env_timeout_s``."""


def within(seconds: float, fn, *args):
    """``fn(*args)`` in a daemon thread; its result, what it raised, or ``StepTimeout`` after ``seconds``."""
    box: dict = {}

    def run() -> None:
        try:
            box["out"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - the environment's failure is the rollout's, never the job's
            box["err"] = e

    t = threading.Thread(target=run, daemon=True, name="env-step")
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise StepTimeout(f"{getattr(fn, '__name__', 'step')} took longer than {seconds:g} s")
    if "err" in box:
        raise box["err"]
    return box.get("out")


@dataclass(frozen=True)
class Sampling:
    """What one call of ``ChatSampler.rollouts`` samples with: ``n`` conversations per task at ``temperature``,
    at most ``max_tokens`` per model turn, asking for ``model`` (the served policy, or its LoRA adapter)."""

    n: int
    temperature: float
    max_tokens: int
    model: str


def summarize(stats: list[dict]) -> EnvStats | None:
    """Rollouts' metrics (``env/...``): turns per rollout, environment steps that raised or ran past their limit,
    rollouts a token limit ended, the environment's tokens; None without rollouts."""
    if not stats:
        return None
    return EnvStats(turns_mean=statistics.fmean(x["turns"] for x in stats),
                    errors=sum(x["failed"] == "error" for x in stats),
                    timeouts=sum(x["failed"] == "timeout" for x in stats),
                    cut=sum(x["cut"] for x in stats), tokens=sum(x["env_tokens"] for x in stats))


class ChatSampler:
    """Multi-turn rollouts against the servers at ``urls`` (the router, else every server in turn)."""

    def __init__(self, urls: list[str], tokenizer, s: OrchestratorSettings, env, members: Members | None = None):
        self.servers, self.tok, self.s = [Server(u, timeout=600.0) for u in urls], tokenizer, s
        self.members = members or alone(urls, s.servers_grace_s)  # a conversation goes to a live server
        self.env = env = Environment.of(env)
        self.tokens = ChatTokens(tokenizer)
        self.adapter: str | None = None  # a LoRA policy: the adapter the servers serve the current policy as
        self.pool = ThreadPoolExecutor(max_workers=min(256, max(4, s.prompts_per_step * s.rollouts_per_prompt)))
        self._stats: list[dict] = []
        self._lock = threading.Lock()
        env.use_servers(urls, s.served_model_name, secret.read())  # for an environment that asks the model itself

    def env_step(self, fn, *args):
        return within(self.s.env_timeout_s, fn, *args)

    def training(self) -> Sampling:
        """Training's sampling: ``rollouts_per_prompt`` at the orchestrator's temperature, the current policy."""
        s = self.s
        return Sampling(s.rollouts_per_prompt, s.temperature, s.max_tokens, self.adapter or s.served_model_name)

    def turn(self, server: Server, convo: list[dict], tools, sent: list[int] | None, max_tokens: int,
             session: str, p: Sampling) -> dict:
        # no per-request seed: vLLM's CPU build fails a seeded request whose prefill is split into chunks
        # ("CPU Generator does not use offset"), which many concurrent conversations cause
        body: dict = {"model": p.model, "messages": convo, "max_tokens": max_tokens,
                      "temperature": p.temperature, "logprobs": True, "return_token_ids": True}
        if tools:
            body["tools"] = tools
        if sent is not None:  # the sequence so far, exactly: the engine continues from its own tokens
            body["kv_transfer_params"] = {"prompt_token_ids": sent}
        try:
            out = server.chat_completions(body, headers={"X-Session-ID": session})
        except VLLMError as e:
            raise VLLMError(f"sampling failed: {e}", e.answer) from None
        if sent is not None and out.get("prompt_token_ids") != sent:
            raise VLLMError(f"{server.base}: a later turn was served on other tokens than sent (does the router "
                            "pass kv_transfer_params.prompt_token_ids through?)")
        return out

    def rollout(self, index: int, j: int, task: dict, what: str, p: Sampling) -> tuple[dict, dict]:
        """One conversation (the ``j``-th of task ``index``; ``what`` names its batch in logs and session ids):
        its sample (with ``reward`` and ``messages``) and its stats for ``summarize``. A server that fails
        for a reason that may pass costs the conversation so far: it starts over, whole, on a live server."""
        return self.members.send(index * p.n + j, lambda server: self.converse(server, index, j, task, what, p),
                                 lambda _: 1)

    def converse(self, server: Server, index: int, j: int, task: dict, what: str, p: Sampling) -> tuple[dict, dict]:
        """``rollout`` on ``server``."""
        s, env = self.s, self.env
        failed = ""
        if env.has("begin"):  # the rollout's own task (its per-rollout state)
            try:
                task = self.env_step(env.begin, task)
            except Exception as e:  # noqa: BLE001
                failed = self.failed(e, what, index, j)
        convo = [dict(m) for m in task["messages"]]
        first = len(convo)
        tools = tools_of(env, task)
        budget = s.max_rollout_tokens or MAX_TOKENS
        prompt_ids: list[int] = []
        ids: list[int] = []
        mask: list[int] = []
        lps: list[float | None] = []
        turns, cut = 0, False
        for turn in range(s.max_turns):
            left = budget - len(ids)
            if left <= 0:
                cut = True
                break
            out = self.turn(server, convo, tools, prompt_ids + ids if turns else None, min(p.max_tokens, left),
                            f"{what.replace(' ', '')}-prompt{index}-rollout{j}", p)
            if not turns:
                prompt_ids = list(out["prompt_token_ids"])
            turns += 1
            choice = out["choices"][0]
            toks = [int(t) for t in choice["token_ids"]]
            ids += toks
            mask += [1] * len(toks)
            lps += [c["logprob"] for c in (choice.get("logprobs") or {}).get("content") or []][: len(toks)]
            lps += [None] * (len(ids) - len(lps))
            msg = {"role": "assistant", "content": choice["message"].get("content") or ""}
            if choice["message"].get("tool_calls"):
                msg["tool_calls"] = choice["message"]["tool_calls"]
            convo.append(msg)
            if failed:  # begin failed: this turn only gave the sample its prompt
                break
            if len(ids) >= budget:  # the conversation's token budget is spent
                cut = True
                break
            if turn + 1 == s.max_turns:
                break
            try:
                replies = self.env_step(self.answer, task, convo, first, msg)
            except Exception as e:  # noqa: BLE001 - an environment step that raises costs its rollout only
                failed = self.failed(e, what, index, j)
                break
            if not replies:
                break
            try:
                between = self.tokens.between(convo, replies, tools,
                                              self.tok.decode(toks[-1:]) if choice.get("finish_reason") == "stop" else "")
            except TemplateError as e:
                raise SystemExit(f"slurmrl: orchestrator: {e}") from None
            if len(ids) + len(between) >= budget:
                cut = True
                break
            ids += between
            mask += [0] * len(between)
            lps += [None] * len(between)
            convo += replies
        reward = 0.0
        if not failed:
            try:
                reward = self.env_step(env.reward, task, convo[first:])
            except Exception as e:  # noqa: BLE001
                failed = self.failed(e, what, index, j)
        return ({"prompt_ids": prompt_ids, "completion_ids": ids, "completion_mask": mask, "logprobs": lps,
                 "reward": 0.0 if failed else reward, "messages": convo[first:]},
                {"turns": turns, "failed": failed, "cut": cut, "env_tokens": mask.count(0)})

    @staticmethod
    def failed(e: Exception, what: str, index: int, j: int) -> str:
        """Say why an environment step failed; ``timeout`` or ``error`` (the metric it counts in)."""
        kind = "timeout" if isinstance(e, TimeoutError) else "error"
        print(f"slurmrl: orchestrator: {what} prompt {index} rollout {j}: environment {kind}, reward 0: "
              f"{type(e).__name__}: {e}", flush=True)
        return kind

    def answer(self, task: dict, convo: list[dict], first: int, msg: dict) -> list[dict]:
        """The environment's messages after the model's turn ``msg``: tool results, else ``respond``'s."""
        replies = tool_replies(self.env, msg)
        return self.env.respond(task, convo[first:]) if replies is None else replies

    def rollouts(self, tasks: list[dict], what: str, p: Sampling) -> tuple[list[list[dict]], list[dict]]:
        """``p.n`` rollouts of every task, each scored (``reward``) by the environment, by task; and every
        rollout's stats (``summarize``)."""
        futures = [[self.pool.submit(self.rollout, i, j, t, what, p) for j in range(p.n)] for i, t in enumerate(tasks)]
        done = [[f.result() for f in group] for group in futures]
        return [[x for x, _ in group] for group in done], [st for group in done for _, st in group]

    def sample(self, tasks: list[dict], step: int) -> list[list[dict]]:
        """Training's rollouts of step ``step``: every task's group, each scored (``reward``) by the environment."""
        groups, stats = self.rollouts(tasks, f"step {step}", self.training())
        with self._lock:
            self._stats += stats
        return groups

    def take_stats(self) -> EnvStats | None:
        """The metrics (``summarize``) of training's rollouts since the last call."""
        with self._lock:
            stats, self._stats = self._stats, []
        return summarize(stats)


class ChatRollouts:
    """A chat environment's rollouts: conversations, each scored by the environment as it ends."""

    def __init__(self, sampler: ChatSampler):
        self.sampler = sampler

    def generate(self, tasks: list[dict], step: int) -> list[list[dict]]:
        return self.sampler.sample(tasks, step)

    def score(self, tasks: list[dict], groups: list[list[dict]]) -> list[float]:
        return [g["reward"] for group in groups for g in group]

    def stats(self) -> EnvStats | None:
        return self.sampler.take_stats()
