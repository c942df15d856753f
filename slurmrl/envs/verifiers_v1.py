"""A verifiers v1 taskset (https://github.com/PrimeIntellect-ai/verifiers, 0.4: ``verifiers.v1``, the
tasksets prime-rl trains on) as a chat environment: ``orchestrator.environment = "verifiers-v1:TASKSET_ID"``,
``orchestrator.environment_args`` its taskset config (``--env.taskset.*`` in verifiers' own CLI).

verifiers 0.4 cannot share the job's virtualenv with verifiers 0.1.x (the same distribution) nor with its
``openai`` (0.4 asks ``<3``; 0.1.14, through ``openai-agents``, ``>=3``), and it brings MCP, sandbox and
Anthropic clients slurmrl never calls. So the taskset lives in a virtualenv of its own,
``.venv-verifiers`` beside ``.venv`` (``scripts/install.sh``; another one named by
``SLURMRL_VERIFIERS_V1_PYTHON``, exported where the job is submitted), in a child process of the orchestrator
(``slurmrl.envs.verifiers_v1_worker``) that answers the messages of ``slurmrl.contract.envwire``.

What crosses: the task's opening messages (its system prompt and prompt, as verifiers' null harness
sends them) one way, the conversation's text to score the other way. The model's turns are sampled
by the orchestrator (``slurmrl.runtime.orchestrator.rollout_chat``) from the job's servers, so each
sample is token-exact (the engine's token ids and logprobs) and under the recipe's limits
(``max_tokens``, ``max_rollout_tokens``, ``env_timeout_s``; one model turn: the adapter answers none, as
verifiers' null harness with no tools). The reward is the task's own scoring (``Task.score``: its
``@vf.reward`` functions, weighted); one that raises fails that rollout (an environment error, scored 0).

Not supported (refused at load, in one line): an infinite taskset, tasks that need a container or tool
servers, judges, reward functions that need a runtime.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
from pathlib import Path
from typing import ClassVar, Literal

from slurmrl.contract import envwire
from slurmrl.contract.job_env import VERIFIERS_V1_PYTHON
from slurmrl.envs import VERIFIERS_V1

PREFIX = VERIFIERS_V1  # verifiers-v1:TASKSET_ID
PYTHON_VAR = VERIFIERS_V1_PYTHON
ROOT = Path(__file__).resolve().parents[2]  # the directory holding the slurmrl package (and, installed from a checkout, .venv-verifiers)
WORKER = Path(__file__).with_name("verifiers_v1_worker.py")
INSTALL = "bash scripts/install.sh (it makes .venv-verifiers with verifiers 0.4)"


class EnvironmentFailed(RuntimeError):
    """The v1 environment answered a request with a failure (a reward function raised, ...)."""


def python() -> Path:
    """The environment's Python: ``$SLURMRL_VERIFIERS_V1_PYTHON``, else ``.venv-verifiers/bin/python``."""
    named = os.environ.get(PYTHON_VAR)
    return Path(named) if named else ROOT / ".venv-verifiers" / "bin" / "python"


class VerifiersV1Env:
    """A v1 taskset on the chat protocol: ``prompts``, ``reward``, ``split_key`` (one model turn per task)."""

    kind: ClassVar[Literal["chat"]] = "chat"

    def __init__(self, taskset_id: str, **args):
        self.name = f"{PREFIX}{taskset_id}"
        exe = python()
        if not exe.exists():
            raise SystemExit(f"slurmrl: environment {self.name!r} needs verifiers 0.4 in a virtualenv of its own: "
                             f"{exe} does not exist (run {INSTALL}, or set {PYTHON_VAR})")
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen([str(exe), "-P", str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, "PYTHONPATH": path})
        self.lock = threading.Lock()
        try:
            loaded = self.ask(envwire.Load(taskset_id, dict(args)), envwire.Loaded)
        except EnvironmentFailed as e:
            self.close()
            raise SystemExit(f"slurmrl: environment {self.name!r}: {e}") from None
        assert isinstance(loaded, envwire.Loaded)
        self.count, self.taskset, self.version = loaded.count, loaded.taskset, loaded.version
        self.cache: dict[int, dict] = {}

    def ask(self, msg: envwire.Message, want: type) -> envwire.Message:
        """Send ``msg``, read the answer: a ``want``, else ``EnvironmentFailed`` with the environment's line."""
        with self.lock:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            try:
                self.proc.stdin.write(envwire.to_json(msg) + "\n")
                self.proc.stdin.flush()
                line = self.proc.stdout.readline()
            except (BrokenPipeError, ValueError):
                line = ""
            if not line:
                code = self.proc.wait()
                raise EnvironmentFailed(f"its process ({python()}) exited with code {code} (its error is in this log)")
        reply = envwire.from_json(line)
        if isinstance(reply, envwire.Failed):
            raise EnvironmentFailed(reply.error)
        if not isinstance(reply, want):
            raise EnvironmentFailed(f"answered {msg.op!r} with {reply.op!r}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tasks(self, indices: list[int]) -> list[dict]:
        missing = sorted({i for i in indices if i not in self.cache})
        if missing:
            reply = self.ask(envwire.Tasks(missing), envwire.TaskList)
            assert isinstance(reply, envwire.TaskList)
            for t in reply.tasks:
                self.cache[t.index] = {"messages": t.messages, "index": t.index, "key": t.key}
        return [{**self.cache[i], "messages": list(self.cache[i]["messages"])} for i in indices]

    def prompts(self, rng: random.Random, n: int) -> list[dict]:
        return self.tasks([rng.randrange(self.count) for _ in range(n)])

    def split_key(self, task: dict) -> str:
        return f"{self.name}:{task['key']}"

    def scores(self, task: dict, messages: list[dict]) -> envwire.Scored:
        """The task's scoring of ``messages`` (the conversation after the prompt): the reward and each function's."""
        reply = self.ask(envwire.Score(task["index"], [dict(m) for m in messages]), envwire.Scored)
        assert isinstance(reply, envwire.Scored)
        return reply

    def reward(self, task: dict, messages: list[dict]) -> float:
        return self.scores(task, messages).reward
