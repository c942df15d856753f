"""Inference members on loopback: rollout_double.py servers behind the real vllm-router, and what the
membership code needs to reach them; shared by the member tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from polling import wait_for
from supervised_processes import free_port

from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import write_ready
from slurmrl.rundir.tomlw import dumps
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny
from slurmrl.runtime.orchestrator.members import Members
from slurmrl.runtime.vllm.client import Server
from slurmrl.settings.orchestrator import OrchestratorSettings

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


ROUTER = ROOT / ".venv" / "bin" / "vllm-router"


DEADLINE_S = 30.0


def until(predicate, what: str, deadline_s: float = DEADLINE_S):
    """``polling.wait_for`` with this module's deadline and a short poll (test doubles on loopback)."""
    return wait_for(predicate, what, deadline_s, poll=0.1)


class Double:
    """One tests/support/rollout_double.py process on loopback."""

    def __init__(self, tmp: Path, name: str, delay: float = 0.0, port: int | None = None):
        self.port, self.delay, self.log = port or free_port(), delay, tmp / f"{name}.jsonl"
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Double:
        self.proc = subprocess.Popen([sys.executable, str(HERE / "rollout_double.py"), str(self.port), str(self.log),
                                      str(self.delay)], cwd=HERE)
        until(lambda: Server(self.url).health(timeout=1.0), f"{self.url} to answer")
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def seen(self) -> list[dict]:
        return [json.loads(x) for x in self.log.read_text().splitlines()] if self.log.exists() else []


@pytest.fixture
def doubles(tmp_path):
    made: list[Double] = []

    def make(name: str, delay: float = 0.0, port: int | None = None) -> Double:
        made.append(Double(tmp_path, name, delay, port).start())
        return made[-1]

    yield make
    for d in made:
        d.kill()


class Tokens:
    """Test double of a tokenizer: one id per character (the doubles do not read the prompt)."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) for c in text]}


def settings(tmp_path: Path, **over) -> OrchestratorSettings:
    base = {"run_dir": str(tmp_path), "model": "m", "served_model_name": "m", "max_steps": 2, "prompts_per_step": 6,
            "rollouts_per_prompt": 4}
    return OrchestratorSettings(**{**base, **over})


def members(servers: list[str], front: list[str], tmp_path: Path, said: list[str], **over) -> Members:
    kw = {"min_servers": 1, "grace_s": 20.0, "probe_s": 0.5, **over}
    return Members(servers, front, events=tmp_path / "events.jsonl", log=said.append, **kw)


TASKS = [{"prompt": f"p{i}"} for i in range(6)]


GROUPS, N = 4, 4


def prepare(tmp_path: Path, **over) -> tuple[Path, Path]:
    model = build_tiny(tmp_path / "tiny")
    run_dir = tmp_path / "run"
    s = OrchestratorSettings(run_dir=str(run_dir), model=str(model), served_model_name=str(model), prompts_per_step=GROUPS,
                             rollouts_per_prompt=N, **over)
    config = RunDir(run_dir).component_config("orchestrator")
    config.parent.mkdir(parents=True)
    config.write_text(dumps(s.model_dump(mode="json")))
    write_ready(RunDir(run_dir).ready_file(0, "trainer", 0), None, 1)  # no trainer: the test publishes
    return run_dir, config


def orchestrate(run_dir: Path, config: Path, urls: list[str], timeout: float,
                out: Path | None = None) -> subprocess.CompletedProcess:
    """The orchestrator program to its end; its output captured, or written to ``out`` as it comes."""
    argv = [sys.executable, "-m", "slurmrl.runtime.orchestrator", "--config", str(config), "--requests-url", *urls,
            "--admin-urls", *urls]
    env = {**os.environ, "SLURMRL_ATTEMPT": "0", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    if out is None:
        return subprocess.run(argv, env=env, capture_output=True, text=True, cwd=run_dir, timeout=timeout)
    with out.open("w") as f:
        return subprocess.run(argv, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=run_dir, timeout=timeout)


