"""Evaluation during training ([eval]): the orchestrator samples a fixed set of evaluation prompts with
the weights the servers have, scores them with the environment, and writes one row per evaluation to
``RUN_DIR/metrics/eval.jsonl`` (and its W&B run, as ``eval/...`` against ``eval/step``).

- Which prompts: without ``eval.environment``, the held-out split of the training environment
  (``slurmrl.envs.heldout``), which training then never samples (``training_view``); with it, that
  environment's prompts drawn with ``eval.seed``. The same prompts at every evaluation.
- When: on the base model (step 0, ``eval.at_start``), then whenever the servers' weights reach the
  next multiple of ``eval.every`` (a row's ``step`` is the trainer step whose weights were
  evaluated: the orchestrator runs ahead of the trainer, so the weights it has are what counts), and
  on the final weights. After a requeue, evaluation goes on after the last row written.
- How: ``eval.samples_per_prompt`` completions per prompt at ``eval.temperature`` (0: greedy); a
  completion is correct when its reward is at least ``eval.correct_at``; pass@k (the unbiased
  estimator of Chen et al. 2021) for k = 1, 2, 4, ... and ``samples_per_prompt``.
- A chat environment (tasks of ``messages``): each completion is a conversation, run by the same
  multi-turn rollouts as training (``rollout_chat.ChatSampler.rollouts``: the environment's answers,
  tools, ``max_turns``, ``max_rollout_tokens``, ``env_timeout_s``) with eval's sampling
  (``eval.temperature``, ``eval.max_tokens`` per turn) and scored by the environment's ``reward``
  of the conversation; the row adds the rollouts' ``env/...`` counts. Chat turns carry no seed.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from slurmrl import envs
from slurmrl.contract.metrics import EnvStats, EvalRow
from slurmrl.envs.heldout import TrainSplit, heldout_tasks
from slurmrl.errors import UserError
from slurmrl.rundir.evals import last_eval
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.metrics import Metrics
from slurmrl.runtime.orchestrator.judge_client import attach as attach_judge
from slurmrl.runtime.orchestrator.members import Members
from slurmrl.runtime.orchestrator.rollout_chat import ChatSampler, Sampling, summarize
from slurmrl.runtime.vllm.client import VLLMError
from slurmrl.settings.eval import EvalSettings
from slurmrl.settings.orchestrator import OrchestratorSettings


def training_view(s: OrchestratorSettings, env):
    """What training samples from: ``env`` without its held-out split when [eval] evaluates on it."""
    return TrainSplit(env, s.eval.heldout_fraction) if s.eval is not None and s.eval.heldout else env


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k of the n samples (c of them correct) is correct."""
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n."""
    out = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return out if out[-1] == n else out + [n]


class Score(NamedTuple):
    """An evaluation's rewards: their mean and spread, and pass@k by k."""

    reward_mean: float
    reward_std: float
    pass_at: dict[int, float]


def score(rewards: list[list[float]], correct_at: float) -> Score:
    """The row's numbers for per-prompt reward lists (each of the same length n)."""
    flat = [r for rs in rewards for r in rs]
    n = len(rewards[0])
    correct = [sum(r >= correct_at for r in rs) for rs in rewards]
    return Score(statistics.fmean(flat), statistics.pstdev(flat),
                 {k: statistics.fmean(pass_at_k(n, c, k) for c in correct) for k in ks(n)})


class Evaluator:
    """The job's [eval]: which prompts, when the next evaluation is due, and running one."""

    def __init__(self, e: EvalSettings, env, tasks: list[dict], members: Members, tokenizer, metrics: Metrics,
                 log, judge=None, chat: ChatSampler | None = None):
        self.e, self.env, self.tasks, self.members, self.tok = e, env, tasks, members, tokenizer
        self.metrics, self.log, self.judge = metrics, log, judge
        self.chat = chat  # a chat environment's: its rollouts (over ``env``) are the completions
        self.pool = ThreadPoolExecutor(max_workers=max(1, min(len(tasks), 16)))
        self.next = 0 if e.at_start else e.every
        self.last: int | None = None  # the step of the newest evaluation
        try:
            last = last_eval(metrics.path)
        except UserError as err:  # a broken file must not stop training; the next rows are appended
            log(f"eval: {err}; evaluating as if none was written")
            last = None
        if last is not None:
            self.last, self.next = last.step, self.after(last.step)
            log(f"eval: resuming after the evaluation of step {last.step}; next at step {self.next}")

    def after(self, step: int) -> int:
        return (step // self.e.every + 1) * self.e.every

    def due(self, policy_step: int) -> bool:
        return policy_step >= self.next

    def _one(self, index: int, task: dict, model: str) -> list[str]:
        body = {
            "model": model, "prompt": self.tok(task["prompt"], add_special_tokens=False)["input_ids"],
            "n": self.e.samples_per_prompt, "max_tokens": self.e.max_tokens, "temperature": self.e.temperature,
            "seed": self.e.seed * 1_000_003 + index,
        }
        try:  # a server that fails is routed around, as training's requests are
            out = self.members.send(index, lambda server: server.completions(body), lambda out: len(out["choices"]))
        except VLLMError as err:
            raise VLLMError(f"evaluation sampling failed: {err}", err.answer) from None
        return [c["text"] for c in out["choices"]]

    def _texts(self, model: str) -> list[list[str]]:
        return [f.result() for f in [self.pool.submit(self._one, i, task, model) for i, task in enumerate(self.tasks)]]

    def _conversations(self, policy_step: int, model: str) -> tuple[list[list[float]], list[int], EnvStats | None]:
        """A chat environment's evaluation: rewards by task, each conversation's assistant characters, env stats."""
        assert self.chat is not None
        e = self.e
        groups, stats = self.chat.rollouts(self.tasks, f"eval of step {policy_step}",
                                           Sampling(e.samples_per_prompt, e.temperature, e.max_tokens, model))
        chars = [sum(len(m.get("content") or "") for m in x["messages"] if m.get("role") == "assistant")
                 for group in groups for x in group]
        return [[x["reward"] for x in group] for group in groups], chars, summarize(stats)

    def run(self, policy_step: int, model: str) -> EvalRow:
        """Evaluate the weights of ``policy_step`` (served as ``model``); writes and returns the row."""
        t = time.perf_counter()
        if self.chat is not None:  # rollouts are scored as they end
            rewards, chars, env_stats = self._conversations(policy_step, model)
            gen_s = time.perf_counter() - t
        else:
            texts = self._texts(model)
            gen_s = time.perf_counter() - t
            flat = iter(envs.rewards(self.env, [task for task, group in zip(self.tasks, texts) for _ in group],
                                     [x for group in texts for x in group]))
            rewards = [[next(flat) for _ in group] for group in texts]
            chars, env_stats = [len(x) for group in texts for x in group], None
        s = score(rewards, self.e.correct_at)
        row = EvalRow(
            step=policy_step, environment=self.e.environment, split="heldout" if self.e.heldout else "all",
            prompts=len(self.tasks), samples_per_prompt=self.e.samples_per_prompt, temperature=self.e.temperature,
            reward_mean=s.reward_mean, reward_std=s.reward_std, pass_at=dict(s.pass_at),
            completion_chars_mean=statistics.fmean(chars), env=env_stats, generate_s=gen_s,
            eval_s=time.perf_counter() - t, judge=self.judge.take_stats() if self.judge is not None else None,
            time=time.time())
        self.metrics.log(row.to_json())
        self.last, self.next = policy_step, self.after(policy_step)
        self.log(f"eval of step {policy_step}: reward {s.reward_mean:.3f}, pass@1 {s.pass_at[1]:.3f} "
                 f"({len(self.tasks)} prompts x {self.e.samples_per_prompt}, {row.eval_s:.1f}s)")
        return row


def attach(s: OrchestratorSettings, env, judge, judge_urls: list[str], members: Members, tokenizer,
           metrics: Metrics, log, chat: ChatSampler | None = None) -> Evaluator | None:
    """The job's evaluator (None without [eval]): ``env`` is the training environment (its judge attached),
    ``chat`` training's multi-turn sampler over it (the held-out split of a chat environment reuses it; another
    chat environment gets its own, over the same servers)."""
    e = s.eval
    if e is None:
        return None
    eval_env = env if e.heldout else envs.load(e.environment, e.environment_args, "eval.environment")
    eval_chat = None
    if eval_env.chat:  # conversations, through the chat endpoint
        eval_chat = chat if chat is not None and chat.env is eval_env else \
            ChatSampler(members.front, tokenizer, s, eval_env, members)
    if e.heldout:
        tasks, eval_judge = heldout_tasks(env, e.prompts, e.heldout_fraction, e.seed), judge
    else:
        eval_judge = attach_judge(eval_env, judge_urls, s.judge) if eval_env.has("use_judge") else None
        tasks = eval_env.prompts(random.Random(e.seed), e.prompts)
    if len(tasks) < e.prompts:
        log(f"eval: the held-out split of {e.environment} has {len(tasks)} distinct tasks; evaluating on those "
            f"(eval.prompts = {e.prompts})")
    out = metrics.beside(RunDir(s.root).eval_metrics, "eval/")
    return Evaluator(e, eval_env, tasks, members, tokenizer, out, log, eval_judge, eval_chat)
