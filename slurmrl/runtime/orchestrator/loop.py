"""Orchestrator: prompts -> rollouts (through the router) -> rewards -> advantages -> training batches.

A text environment's prompts are completed in one request each (``Sampler``); a chat environment's
tasks (``messages``) are multi-turn conversations through the chat endpoint, each a token-exact
sample with the environment's tokens masked (``rollout_chat``).

File protocol with the trainer (all in the run dir, every file written to a temporary name
and renamed, so a reader never sees half a file):

- ``rollouts/step-NNNNNN.json``: the batch for training step N, written here.
- ``weights/step-NNNNNN/`` with ``READY`` written last: the trainer's weights after step N.

Asynchronous with bounded staleness: the batch for step s is generated with the newest weights
the servers have loaded, v, and never when ``s - 1 - v > max_off_policy_steps``; then it waits
for the trainer. When newer weights appear, every inference server reloads them (``slurmrl.runtime.vllm.client``)
before the next batch (with ``trainer.weight_sync`` by broadcast the trainer has already sent them
to every server and ``weights/step-N/`` holds only its ``READY``: generation waits for that alone); a LoRA policy's weights are an adapter, which every server hot-loads under
a new name (the previous one unloaded) and the requests name (``slurmrl.runtime.orchestrator.adapters``).
``max_off_policy_steps = 0`` is synchronous RL.

Resumes after a requeue: batches already written are kept, the servers (restarted with the base
model) reload the newest published weights, and generation goes on from the next step.

    python -m slurmrl.runtime.orchestrator --config RUN_DIR/components/orchestrator.toml \
        --requests-url URL [URL ...] --admin-urls URL [URL ...]

``--requests-url``: where completions are asked for (the router; without one, every server, taken
in turn). ``--admin-urls``: every server, each reloads new weights. The job script passes both.
"""

from __future__ import annotations

import argparse
import random
import signal
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from slurmrl import envs, heartbeat
from slurmrl.contract.programs import Orchestrator as OrchestratorArgs
from slurmrl.envs.protocol import refuse_chat_only
from slurmrl.errors import UserError
from slurmrl.rundir.metrics import last_row
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import write_ready
from slurmrl.runtime import step_files
from slurmrl.runtime.metrics import Metrics
from slurmrl.runtime.orchestrator import adapters, evaluate, hybrid
from slurmrl.runtime.orchestrator.judge_client import JudgeError
from slurmrl.runtime.orchestrator.judge_client import attach as attach_judge
from slurmrl.runtime.orchestrator.rollout_chat import ChatSampler
from slurmrl.runtime.vllm.client import Server, VLLMError, reload_weights
from slurmrl.settings.orchestrator import OrchestratorSettings, load

STOP = threading.Event()


def log(msg: str) -> None:
    print(f"slurmrl: orchestrator: {msg}", flush=True)


def latest_weights(run_dir: Path) -> tuple[int, Path | None]:
    """Newest trainer step whose weights are complete (READY marker)."""
    return step_files.latest(RunDir(run_dir).weights, "READY")


def written_batches(run_dir: Path) -> int:
    """How many consecutive batches (from step 1) are already on disk."""
    n = 0
    while step_files.rollout_path(run_dir, n + 1).exists():
        n += 1
    return n


class Sampler:
    """Completions with token ids and inference logprobs, over the OpenAI-compatible API."""

    def __init__(self, urls: list[str], tokenizer, s: OrchestratorSettings):
        self.servers, self.tok, self.s = [Server(u, timeout=600.0) for u in urls], tokenizer, s
        self.adapter: str | None = None  # a LoRA policy: the adapter the servers serve the current policy as
        self.pool = ThreadPoolExecutor(max_workers=max(4, s.prompts_per_step))

    def _one(self, index: int, task: dict, step: int) -> list[dict]:
        prompt_ids = self.tok(task["prompt"], add_special_tokens=False)["input_ids"]
        body = {
            "model": self.adapter or self.s.served_model_name, "prompt": prompt_ids, "n": self.s.rollouts_per_prompt,
            "max_tokens": self.s.max_tokens, "temperature": self.s.temperature,
            "logprobs": 0, "return_tokens_as_token_ids": True,
            "seed": self.s.seed * 1_000_003 + step * 1_009 + index,  # reproducible sampling
        }
        server = self.servers[index % len(self.servers)]
        try:
            out = server.completions(body, headers={"X-Session-ID": f"step{step}-prompt{index}"})
        except VLLMError as e:
            raise VLLMError(f"sampling failed: {e}", e.answer) from None
        samples = []
        for choice in out["choices"]:
            lp = choice["logprobs"]
            samples.append({
                "prompt_ids": prompt_ids,
                "completion_ids": [int(t.split(":", 1)[1]) for t in lp["tokens"]],
                "logprobs": lp["token_logprobs"],
                "text": choice["text"],
                # return_routed_experts: the experts each token went to (base64 .npy), for the trainer's replay
                **({"routed_experts": choice["routed_experts"]} if choice.get("routed_experts") else {}),
            })
        return samples

    def sample(self, tasks: list[dict], step: int) -> list[list[dict]]:
        futures = [self.pool.submit(self._one, i, t, step) for i, t in enumerate(tasks)]
        return [f.result() for f in futures]


def advantages(rewards: list[float]) -> list[float]:
    """Group-relative: reward minus the group mean, over the group std (0 when all equal)."""
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards)
    return [(r - mean) / (std + 1e-4) if std > 1e-8 else 0.0 for r in rewards]


def trainer_metrics(run_dir: Path) -> dict:
    try:
        row = last_row(RunDir(run_dir).metrics("trainer"))
    except UserError:  # a broken trainer file must not stop the rollouts; the trainer's own log says why
        return {}
    return {f"trainer/{k}": v for k, v in row.to_json().items()} if row else {}


def wait_for(predicate, what: str) -> float:
    """Block until predicate() (or a stop request: exit 143); returns seconds waited."""
    waited = step_files.wait_until(predicate, STOP, log, what)
    if waited is None:
        raise SystemExit(143)
    return waited


def run(s: OrchestratorSettings, urls: list[str], admin_urls: list[str], judge_urls: Sequence[str] = ()) -> int:
    from transformers import AutoTokenizer

    run_dir = s.root
    env = envs.load(s.environment, s.environment_args)
    judge = attach_judge(env, list(judge_urls), s.judge)  # the job's [judge], if it has one
    tok = AutoTokenizer.from_pretrained(s.model, trust_remote_code=s.trust_remote_code)
    sampler, chat_sampler = Sampler(urls, tok, s), ChatSampler(urls, tok, s, env)
    metrics = Metrics(run_dir, "orchestrator", s.model_dump(mode="json"), log, tracking_settings=s.wandb)
    evaluator = evaluate.attach(s, env, judge, list(judge_urls), sampler.servers, tok, metrics, log,  # [eval]
                                chat_sampler)
    refuse_chat_only({"orchestrator.environment": env, **({"eval.environment": evaluator.env} if evaluator else {})},
                     s.chat_only_set)  # a custom text environment's (the planner refuses a built-in one's)
    train_env = evaluate.training_view(s, env)  # without the held-out split [eval] evaluates on
    max_steps, max_off = s.max_steps, s.max_off_policy_steps
    done = written_batches(run_dir)
    loaded = 0
    if done:
        log(f"resuming after {done} written batches")
    # The trainer drops weights newer than its checkpoint when it resumes: read none before it is up.
    attempt = RunDir.attempt_from_env()
    wait_for(RunDir(run_dir).ready_file(attempt, "trainer", 0).exists, "the trainer to start")
    write_ready(RunDir(run_dir).ready_file(attempt, "orchestrator", 0), None, 1)
    if s.hybrid and done > latest_weights(run_dir)[0]:
        # resumed with batches the trainer has yet to step on: the (restarted, awake) servers give it the GPUs first
        hybrid.sleep(admin_urls)
        log(f"servers asleep: the trainer steps on batches {latest_weights(run_dir)[0] + 1}..{done} first")

    reload_s = 0.0  # seconds the servers took to take up new weights before this batch

    def refresh_weights() -> None:
        nonlocal loaded, reload_s
        reload_s = 0.0
        newest, path = latest_weights(run_dir)
        if newest > loaded and s.weight_sync.by_broadcast:  # the trainer has sent them to every server itself
            log(f"servers now on weights of step {newest} (broadcast by the trainer, {s.weight_sync.describe()})")
            loaded = newest
        elif newest > loaded:
            assert path is not None, "latest_weights names the folder of each step it finds"
            t = time.perf_counter()
            try:
                if adapters.is_adapter(path):  # a LoRA policy: hot-load the adapter under a new name, unload the old
                    sampler.adapter = chat_sampler.adapter = adapters.swap(admin_urls, path, newest, sampler.adapter)
                elif s.hybrid:  # the servers sleep while the trainer steps: wake the weights, load, wake the KV cache
                    hybrid.wake_and_reload(admin_urls, str(path))
                else:
                    reload_weights(admin_urls, str(path))
            except VLLMError as e:
                raise VLLMError(f"weight update failed: {e}", e.answer) from None
            log(f"servers now on weights of step {newest}{f' (adapter {sampler.adapter})' if sampler.adapter else ''} "
                f"({time.perf_counter() - t:.2f}s)")
            loaded = newest
            reload_s = time.perf_counter() - t

    for step in range(done + 1, max_steps + 1):
        heartbeat.beat()
        waited = wait_for(lambda: latest_weights(run_dir)[0] >= step - 1 - max_off, f"trainer step {step - 1 - max_off}")
        refresh_weights()
        if evaluator is not None and evaluator.due(loaded):
            evaluator.run(loaded, sampler.adapter or s.served_model_name)
        rng = random.Random(s.seed * 1_000_003 + step)
        tasks = train_env.prompts(rng, s.prompts_per_step)
        chat = train_env.chat  # a chat environment: multi-turn rollouts, scored as they end
        t = time.perf_counter()
        groups = chat_sampler.sample(tasks, step) if chat else sampler.sample(tasks, step)
        gen_s = time.perf_counter() - t
        samples, rewards = [], []
        t = time.perf_counter()
        scored = iter([g["reward"] for group in groups for g in group] if chat else
                      envs.rewards(env, [task for task, group in zip(tasks, groups) for _ in group],
                                   [g["text"] for group in groups for g in group]))
        score_s, judged = time.perf_counter() - t, judge.take_stats() if judge else {}
        env_stats = chat_sampler.take_stats() if chat else {}
        for task, group in zip(tasks, groups):
            rs = [next(scored) for _ in group]
            for g, r, a in zip(group, rs, advantages(rs)):
                samples.append({**{k: g[k] for k in ("prompt_ids", "completion_ids", "logprobs", "routed_experts",
                                                     "completion_mask") if k in g},
                                "reward": r, "advantage": a})
            rewards += rs
        # hybrid: the GPUs go to the trainer before it sees the batch
        sleep_s = max(hybrid.sleep(admin_urls).values()) if s.hybrid else None
        step_files.write_json_atomic(step_files.rollout_path(run_dir, step),
                                {"step": step, "policy_step": loaded, "samples": samples})
        tokens = sum(len(x["completion_ids"]) for x in samples)
        metrics.log({
            "step": step, "policy_step": loaded, "off_policy_lag": step - 1 - loaded,
            "reward_mean": statistics.fmean(rewards), "reward_std": statistics.pstdev(rewards),
            "reward_min": min(rewards), "reward_max": max(rewards),
            "samples": len(samples), "tokens": tokens, "generate_s": gen_s, "wait_s": waited,
            "tokens_per_s": tokens / gen_s if gen_s else 0.0, "samples_per_s": len(samples) / gen_s if gen_s else 0.0,
            "reload_s": reload_s, **({"sleep_s": sleep_s} if s.hybrid else {}),
            "score_s": score_s, **judged, **env_stats, "time": time.time(), **trainer_metrics(run_dir),
        })
        if step == done + 1:
            RunDir(run_dir).add_phase(RunDir.attempt_from_env(), f"first rollout (step {step}, {gen_s:.1f}s)")
        log(f"step {step}/{max_steps} reward {statistics.fmean(rewards):.3f} "
            f"(policy {loaded}, generated in {gen_s:.1f}s, waited {waited:.1f}s)")
        if judged:
            log(f"judge scored {judged['judge/scored']} samples in {score_s:.2f}s: {judged['judge/requests']} requests, "
                f"latency mean {judged['judge/latency_mean_s']:.3f}s max {judged['judge/latency_max_s']:.3f}s, "
                f"{judged['judge/retries']} retries, {judged['judge/unparsed']} replies without a score")
    if evaluator is not None and evaluator.last != max_steps:  # the final weights
        wait_for(lambda: latest_weights(run_dir)[0] >= max_steps, f"trainer step {max_steps} (the final evaluation)")
        refresh_weights()
        evaluator.run(loaded, sampler.adapter or s.served_model_name)
    return 0


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    a = OrchestratorArgs.parse(argv, description=__doc__.splitlines()[0])  # the planner writes the same dataclass
    return argparse.Namespace(config=a.config, requests_url=list(a.requests_url), admin_urls=list(a.admin_urls),
                              judge_urls=list(a.judge_urls))


def main() -> int:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: STOP.set())
    args = arguments()
    s = load(args.config)
    code = 1
    try:
        code = run(s, args.requests_url, args.admin_urls, args.judge_urls)
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr, flush=True)  # e.g. an environment that does not load: say which and why
    except VLLMError as e:
        if STOP.is_set():  # a planned stop: the servers it was talking to may be stopping too
            log(f"stopped while talking to a server ({e}); exit 143")
            code = 143
        else:
            print(f"slurmrl: orchestrator: {e}", file=sys.stderr, flush=True)
    except JudgeError as e:
        if STOP.is_set():  # a planned stop: the judge may be stopping too
            log(f"stopped while scoring ({e}); exit 143")
            code = 143
        else:
            print(f"slurmrl: orchestrator: scoring failed: {e}", file=sys.stderr, flush=True)
    except OSError as e:
        if not STOP.is_set():
            raise
        # a planned stop: the servers it was talking to may be stopping too
        log(f"stopped while talking to a server ({e.__class__.__name__}); exit 143")
        code = 143
    finally:
        Metrics.close_all(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
