"""Orchestrator: prompts -> rollouts (through the router) -> rewards -> advantages -> training batches.

A text environment's prompts are completed in one request each (``rollout_text``); a chat environment's
tasks (``messages``) are multi-turn conversations through the chat endpoint, each a token-exact
sample with the environment's tokens masked (``rollout_chat``). Which of the two, and how the servers
take up new weights (``weights``), is picked once as the orchestrator starts.

File protocol with the trainer (all in the run dir, every file written to a temporary name
and renamed, so a reader never sees half a file):

- ``rollouts/step-NNNNNN.json``: the batch for training step N, written here.
- ``weights/step-NNNNNN/`` with ``READY`` written last: the trainer's weights after step N.

Asynchronous with bounded staleness: the batch for step s is generated with the newest weights
the servers have loaded, v, and never when ``s - 1 - v > max_off_policy_steps``; then it waits
for the trainer. When newer weights appear, every inference server takes them up before the next batch
(``slurmrl.runtime.orchestrator.weights``: reloaded from the run dir; already broadcast by the trainer, whose
``weights/step-N/`` holds only its ``READY``; woken on them, with the hybrid engine; or a LoRA policy's
adapter hot-loaded under a new name). ``max_off_policy_steps = 0`` is synchronous RL.

Resumes after a requeue: batches already written are kept, the servers (restarted with the base
model) reload the newest published weights, and generation goes on from the next step.

    python -m slurmrl.runtime.orchestrator --config RUN_DIR/components/orchestrator.toml \
        --requests-url URL [URL ...] --admin-urls URL [URL ...]

``--requests-url``: where completions are asked for (the router; without one, every server, taken
in turn). ``--admin-urls``: every server, each reloads new weights. The job script passes both.

Servers that die: the orchestrator works on the live set of servers (``members``), not the list it started
with. A dead one is routed around and its requests are sent again, whole, to a live one; a weight update
skips it; one that comes back is loaded with the current weights before it is asked for a rollout. The
orchestrator fails (``Quorum``, exit 1, naming the dead servers and why) only when fewer than
``min_servers`` are live for longer than ``servers_grace_s``.
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
from pathlib import Path

from slurmrl import envs, heartbeat
from slurmrl.contract.metrics import EnvStats, JudgeStats, OrchestratorRow
from slurmrl.contract.programs import OrchestratorArgs
from slurmrl.contract.rollouts import RolloutBatch, Sample
from slurmrl.envs.protocol import refuse_chat_only
from slurmrl.errors import UserError
from slurmrl.rundir.metrics import last_row
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import write_ready
from slurmrl.runtime import step_files
from slurmrl.runtime.metrics import Metrics
from slurmrl.runtime.orchestrator import batch, evaluate, joiners, rollout_style, weights
from slurmrl.runtime.orchestrator.judge_client import JudgeError
from slurmrl.runtime.orchestrator.judge_client import attach as attach_judge
from slurmrl.runtime.orchestrator.members import Members, Quorum
from slurmrl.runtime.orchestrator.rollout_chat import ChatSampler
from slurmrl.runtime.orchestrator.rollout_text import Sampler
from slurmrl.runtime.vllm.client import VLLMError
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


def trainer_metrics(run_dir: Path) -> dict:
    """The trainer's newest row as written (the orchestrator's row carries it under ``trainer/``)."""
    try:
        row = last_row(RunDir(run_dir).metrics("trainer"))
    except UserError:  # a broken trainer file must not stop the rollouts; the trainer's own log says why
        return {}
    return row.to_json() if row else {}


def wait_for(predicate, what: str) -> float:
    """Block until predicate() (or a stop request: exit 143); returns seconds waited."""
    waited = step_files.wait_until(predicate, STOP, log, what)
    if waited is None:
        raise SystemExit(143)
    return waited


def judge_line(judged: JudgeStats, score_s: float) -> str:
    return (f"judge scored {judged.scored} samples in {score_s:.2f}s: {judged.requests} requests, "
            f"latency mean {judged.latency_mean_s:.3f}s max {judged.latency_max_s:.3f}s, "
            f"{judged.retries} retries, {judged.unparsed} replies without a score")


class Orchestrator:
    """One job's rollouts: its environment, samplers, rollout style and weight-update strategy (both picked
    once, here), its metrics and its evaluator; ``loaded`` is the trainer step whose weights the servers have."""

    def __init__(self, s: OrchestratorSettings, urls: list[str], admin_urls: list[str], judge_urls: Sequence[str]):
        from transformers import AutoTokenizer

        self.s, self.run_dir = s, s.root
        self.env = envs.load(s.environment, s.environment_args)
        self.judge = attach_judge(self.env, list(judge_urls), s.judge)  # the job's [judge], if it has one
        tok = AutoTokenizer.from_pretrained(s.model, trust_remote_code=s.trust_remote_code)
        self.members = Members(admin_urls, urls, min_servers=s.min_servers, grace_s=s.servers_grace_s,
                               events=RunDir(self.run_dir).events, log=log, stop=STOP,
                               live=RunDir(self.run_dir).live_set)  # a broadcasting trainer's group
        self.sampler, chat = Sampler(urls, tok, s, self.members), ChatSampler(urls, tok, s, self.env, self.members)
        self.metrics = Metrics(self.run_dir, "orchestrator", s.model_dump(mode="json"), log, tracking_settings=s.wandb)
        self.evaluator = evaluate.attach(s, self.env, self.judge, list(judge_urls), self.members, tok,  # [eval]
                                         self.metrics, log, chat)
        refuse_chat_only({"orchestrator.environment": self.env,
                          **({"eval.environment": self.evaluator.env} if self.evaluator else {})},
                         s.chat_only_set)  # a custom text environment's (the planner refuses a built-in one's)
        self.train_env = evaluate.training_view(s, self.env)  # without the held-out split [eval] evaluates on
        self.style = rollout_style.pick(self.train_env, self.sampler, chat)
        self.updates = weights.pick(s, self.members, [self.sampler, chat], log)
        self.members.admit = self.updates.admit  # a server that comes back gets the current weights first
        joiners.attach(self.members, self.run_dir)  # servers of other jobs (`submit --join`), polled with the monitor
        self.loaded, self.reload_s = 0, 0.0  # reload_s: seconds the servers took to take up the weights of this batch

    def start(self) -> int:
        """Wait for the trainer, say this program is ready; the number of batches already written."""
        done = written_batches(self.run_dir)
        if done:
            log(f"resuming after {done} written batches")
        # The trainer drops weights newer than its checkpoint when it resumes: read none before it is up.
        attempt = RunDir.attempt_from_env()
        wait_for(RunDir(self.run_dir).ready_file(attempt, "trainer", 0).exists, "the trainer to start")
        write_ready(RunDir(self.run_dir).ready_file(attempt, "orchestrator", 0), None, 1)
        self.members.start_monitor()
        self.updates.resume(done, latest_weights(self.run_dir)[0])
        return done

    def refresh_weights(self) -> None:
        newest, path = latest_weights(self.run_dir)
        self.reload_s = self.updates.take(newest, path) if newest > self.loaded else 0.0
        self.loaded = max(self.loaded, newest)

    def model(self) -> str:
        """The name requests ask for: the policy's adapter (LoRA), else the served model."""
        return self.sampler.adapter or self.s.served_model_name

    def evaluate_if_due(self) -> None:
        if self.evaluator is not None and self.evaluator.due(self.loaded):
            self.evaluator.run(self.loaded, self.model())

    def step(self, step: int, first: bool) -> None:
        """Batch ``step``: wait for the trainer to be close enough, new weights, rollouts, rewards, the batch, its row."""
        max_off = self.s.max_off_policy_steps
        waited = wait_for(lambda: latest_weights(self.run_dir)[0] >= step - 1 - max_off,
                          f"trainer step {step - 1 - max_off}")
        self.refresh_weights()
        self.members.readmit()  # servers that came back, on the weights just taken
        self.members.wait_for_quorum()
        self.evaluate_if_due()
        self.members.take()  # the figures of this batch's rollouts only
        tasks = self.train_env.prompts(random.Random(self.s.seed * 1_000_003 + step), self.s.prompts_per_step)
        t = time.perf_counter()
        groups = self.style.generate(tasks, step)
        gen_s = time.perf_counter() - t
        t = time.perf_counter()
        rewards = self.style.score(tasks, groups)
        score_s, judged = time.perf_counter() - t, self.judge.take_stats() if self.judge else None
        env_stats, samples = self.style.stats(), batch.scored(groups, rewards, self.s.advantage == "group_std")
        sleep_s = self.updates.hand_over()  # hybrid: the GPUs go to the trainer before it sees the batch
        batch.write(self.run_dir, RolloutBatch(step, self.loaded, tuple(samples)))
        self.metrics.log(self.row(step, rewards, samples, gen_s, waited, score_s, judged, env_stats, sleep_s).to_json())
        if first:
            RunDir(self.run_dir).add_phase(RunDir.attempt_from_env(), f"first rollout (step {step}, {gen_s:.1f}s)")
        log(f"step {step}/{self.s.max_steps} reward {statistics.fmean(rewards):.3f} "
            f"(policy {self.loaded}, generated in {gen_s:.1f}s, waited {waited:.1f}s)")
        if judged:
            log(judge_line(judged, score_s))

    def row(self, step: int, rewards: list[float], samples: list[Sample], gen_s: float, waited: float, score_s: float,
            judged: JudgeStats | None, env_stats: EnvStats | None, sleep_s: float | None) -> OrchestratorRow:
        """Batch ``step``'s metrics row (``time`` and the trainer's newest row read now)."""
        tokens = sum(len(x.completion_ids) for x in samples)
        served, resent, live = self.members.take()
        return OrchestratorRow(
            step=step, policy_step=self.loaded, off_policy_lag=step - 1 - self.loaded,
            reward_mean=statistics.fmean(rewards), reward_std=statistics.pstdev(rewards),
            reward_min=min(rewards), reward_max=max(rewards),
            samples=len(samples), tokens=tokens, generate_s=gen_s, wait_s=waited,
            tokens_per_s=tokens / gen_s if gen_s else 0.0, samples_per_s=len(samples) / gen_s if gen_s else 0.0,
            reload_s=self.reload_s, sleep_s=sleep_s, score_s=score_s, servers_live=live, resent=resent, judge=judged,
            env=env_stats, time=time.time(), served=served, trainer=trainer_metrics(self.run_dir))

    def finish(self) -> None:
        """The final weights' evaluation ([eval]), unless the last batch's was it."""
        max_steps = self.s.max_steps
        if self.evaluator is not None and self.evaluator.last != max_steps:
            wait_for(lambda: latest_weights(self.run_dir)[0] >= max_steps,
                     f"trainer step {max_steps} (the final evaluation)")
            self.refresh_weights()
            self.evaluator.run(self.loaded, self.model())


def run(s: OrchestratorSettings, urls: list[str], admin_urls: list[str], judge_urls: Sequence[str] = ()) -> int:
    o = Orchestrator(s, urls, admin_urls, judge_urls)
    done = o.start()
    for step in range(done + 1, s.max_steps + 1):
        heartbeat.beat()
        o.step(step, first=step == done + 1)
    o.finish()
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
    except Quorum as e:  # too few servers for too long: the job's FAILED reason
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
