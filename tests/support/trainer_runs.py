"""The trainer run in-process on a tiny model: its run dir, its metrics, a reference log-prob."""

from __future__ import annotations

import json
import os
import random
import runpy
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

from slurmrl.rundir.paths import RunDir

ROOT = Path(__file__).resolve().parents[2]


torch = pytest.importorskip("torch")


# ---- helpers ----------------------------------------------------------------------------
def env_for(run_dir: Path) -> dict:
    return {
        **os.environ,
        "SLURM_NODEID": "0", "SLURM_LOCALID": "0", "SLURMRL_RUN_DIR": str(run_dir), "SLURMRL_ATTEMPT": "0",
        "SLURMRL_TRAINER_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled",
        "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false",
    }


class Forked:
    """``python -m slurmrl.runtime.trainer`` in a fork of this (warm) interpreter: the same entry
    point through runpy, without paying torch's and transformers' import again per start (on two
    cores that is most of a start). Popen-like: poll, wait, send_signal, kill, returncode."""

    def __init__(self, argv: list[str], env: dict, log_path: Path, cwd: Path):
        self.returncode = None
        self.pid = os.fork()
        if self.pid:
            return
        code = 1
        try:  # the child: never returns into pytest
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            torch.set_num_threads(1)
            sys.argv = [argv[2], *argv[3:]]
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            os._exit(code)

    def _reap(self, flags: int) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, flags)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self):
        return self._reap(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("trainer", timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Trainer:
    def __init__(self, run_dir: Path, ranks: int = 1, tag: str = "a"):
        cfg = run_dir / "components" / "trainer.toml"
        self.log_path = run_dir / "logs" / f"trainer-{tag}.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(self.log_path, "wb")
        if ranks == 1:
            argv = [sys.executable, "-m", "slurmrl.runtime.trainer", "--config", str(cfg)]
            self.proc = Forked(argv, env_for(run_dir), self.log_path, run_dir)
        else:  # the real launcher, as the job script starts it
            argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                    "-m", "slurmrl.runtime.trainer", "--config", str(cfg)]
            self.proc = subprocess.Popen(argv, env=env_for(run_dir), stdout=self.log, stderr=subprocess.STDOUT,
                                         cwd=run_dir)

    def tail(self, n: int = 6000) -> str:
        return self.log_path.read_bytes()[-n:].decode(errors="replace")

    def wait(self, timeout: float = 120) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"trainer did not finish in {timeout}s:\n{self.tail()}") from None
        finally:
            self.log.close()
        return code

    def until(self, predicate, what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"trainer exited ({self.proc.returncode}) before {what}:\n{self.tail()}")
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError(f"no {what} after {timeout}s:\n{self.tail()}")


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics" / "trainer.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def run_dir_for(tmp: Path, recipe: str, name: str, overrides: list[str], world_size: int = 1) -> Path:
    """A run dir with the ``components/trainer.toml`` the planner writes for ``recipe`` (render's
    format: TrainerSettings' JSON dump as TOML)."""
    from slurmrl.plan import rules
    from slurmrl.recipe.load import load_recipe
    from slurmrl.recipe.recipe import global_batch
    from slurmrl.recipe.roles import trainer_settings
    from slurmrl.rundir.tomlw import dumps

    recipe = load_recipe(ROOT / "recipes" / recipe, overrides)
    rules.check(recipe)
    run_dir = tmp / name
    s = trainer_settings(recipe, str(run_dir), world_size, global_batch(recipe))
    path = RunDir(run_dir).component_config("trainer")
    path.parent.mkdir(parents=True)
    path.write_text(dumps(s.model_dump(mode="json")))
    return run_dir


def logprob_fn(model_dir: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    @torch.no_grad()
    def fn(prompt: list[int], completion: list[int]) -> list[float]:
        ids = torch.tensor([prompt + completion])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]

    return fn


FAVOURED = "a"  # RL: completions holding this character get a positive advantage


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from slurmrl.runtime.fixtures.tiny_model import build

    return build(tmp_path_factory.mktemp("model") / "tiny", seed=0)


@pytest.fixture(scope="module")
def tokenizer(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


# ---- RL ---------------------------------------------------------------------------------
def write_rollouts(run_dir: Path, steps, tokenizer, base_logp) -> None:
    rng = random.Random(1)
    prompt = tokenizer("reverse ab:", add_special_tokens=False)["input_ids"]
    for step in steps:
        samples = []
        for _ in range(8):
            text = "".join(rng.choice("abcd") for _ in range(4))
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            adv = 1.0 if FAVOURED in text else -1.0
            samples.append({"prompt_ids": prompt, "completion_ids": ids, "logprobs": base_logp(prompt, ids),
                            "advantage": adv, "reward": float(adv > 0)})
        path = run_dir / "rollouts" / f"step-{step:06d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({"step": step, "policy_step": max(0, step - 2), "samples": samples}))
        tmp.rename(path)
