"""The orchestrator picks its rollout style and its weight-update strategy once, as it starts: one factory
each (``rollout_style.pick``, ``weights.pick``) is the only place that asks what kind of environment or which
weight-sync mode the job has; the strategies against a loopback vLLM double (tests/support/sleep_mode_double.py)."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest
from sleep_mode_double import SleepModeDouble

from slurmrl import envs
from slurmrl.runtime.orchestrator import rollout_style, weights
from slurmrl.runtime.orchestrator.members import alone
from slurmrl.runtime.orchestrator.rollout_chat import ChatRollouts
from slurmrl.runtime.orchestrator.rollout_text import TextRollouts
from slurmrl.settings.orchestrator import OrchestratorSettings

ROOT = Path(__file__).resolve().parent.parent
ORCHESTRATOR = ROOT / "slurmrl" / "runtime" / "orchestrator"


NCCL = {"mode": "broadcast", "backend": "nccl", "timeout_s": 600}  # orchestrator.toml's [weight_sync]
IPC = {"mode": "broadcast", "backend": "ipc", "timeout_s": 600}


def settings(**over) -> OrchestratorSettings:
    base = {"run_dir": "/run", "environment": "reverse_text", "model": "m", "served_model_name": "m", "max_steps": 2}
    return OrchestratorSettings(**{**base, **over})


class Adapter:
    adapter: str | None = None


@pytest.mark.parametrize("over, kind", [
    ({}, weights.FilesystemReload), ({"weight_sync": NCCL}, weights.Broadcast),
    ({"weight_sync": IPC}, weights.Broadcast), ({"hybrid": True}, weights.HybridReload),
    ({"lora": True}, weights.AdapterHotLoad),
])
def test_the_weight_update_strategy_is_the_jobs_mode(over, kind):
    assert type(weights.pick(settings(**over), alone(["http://x"], 1.0), [Adapter()], print)) is kind


def reads(path: Path, names: set[str]) -> list[int]:
    """The lines where ``path`` reads one of the settings' ``names`` (an attribute of any object)."""
    return [n.lineno for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute) and n.attr in names]


def test_only_the_factories_look_at_the_mode_or_the_environments_kind():
    found = [(p.name, line) for p in sorted(ORCHESTRATOR.glob("*.py")) for line in reads(p, {"weight_sync", "hybrid", "lora"})]
    pick = next(n for n in ast.walk(ast.parse((ORCHESTRATOR / "weights.py").read_text()))
                if isinstance(n, ast.FunctionDef) and n.name == "pick")
    assert len(found) == 4 and all(name == "weights.py" and pick.lineno <= line <= (pick.end_lineno or 0)
                                   for name, line in found), found
    kinds = [(p.name, line) for p in sorted(ORCHESTRATOR.glob("*.py")) for line in reads(p, {"chat"})
             if p.name not in ("rollout_chat.py", "evaluate.py")]  # the chat rollouts' own sampler; [eval]'s pick
    assert [name for name, _ in kinds] == ["rollout_style.py"], kinds


def test_the_rollout_style_is_the_environments_kind():
    class Sampler:
        pass

    for name, kind in (("reverse_text", TextRollouts), ("arithmetic", TextRollouts), ("guess_number", ChatRollouts)):
        env = envs.load(name)
        assert type(rollout_style.pick(env, Sampler(), Sampler())) is kind, name  # type: ignore[arg-type]
        assert env.chat == (kind is ChatRollouts)  # the kind the environment declares
    rng = random.Random(0)
    assert envs.load("reverse_text").prompts(rng, 1)


def test_each_strategy_takes_up_weights_its_own_way(job_secret, tmp_path):
    said: list[str] = []
    with SleepModeDouble(job_secret) as a:
        plain = weights.pick(settings(), alone([a.url], 1.0), [], said.append)
        assert plain.take(3, tmp_path / "step-000003") >= 0 and plain.hand_over() is None
        assert a.events == [("pause",), ("reload_weights", str(tmp_path / "step-000003")), ("reset_prefix_cache",),
                            ("resume",)]
        assert said[-1].startswith("servers now on weights of step 3 (")
        a.events.clear()
        sent = weights.pick(settings(weight_sync=NCCL), alone([a.url], 1.0), [], said.append)
        assert sent.take(4, tmp_path / "step-000004") == 0.0 and a.events == [] and sent.hand_over() is None
        assert said[-1] == "servers now on weights of step 4 (broadcast by the trainer, nccl)"
        turns = weights.pick(settings(hybrid=True), alone([a.url], 1.0), [], said.append)
        turns.resume(2, 2)  # every batch written was trained on: the servers stay awake
        assert a.events == [] and not a.sleeping
        assert turns.hand_over() >= 0 and a.sleeping
        turns.take(5, tmp_path / "step-000005")
        assert a.events[1:] == [("wake_up", ("weights",)), ("reload_weights", str(tmp_path / "step-000005")),
                                ("wake_up", ("kv_cache",))] and not a.sleeping
        turns.resume(3, 1)  # batches 2..3 still to train on after a requeue: the GPUs go to the trainer first
        assert a.sleeping and said[-1] == "servers asleep: the trainer steps on batches 2..3 first"


def test_a_failed_update_says_so(job_secret, tmp_path):
    from slurmrl.runtime.vllm.client import VLLMError

    with SleepModeDouble("another job's secret") as other:
        with pytest.raises(VLLMError) as e:
            weights.pick(settings(), alone([other.url], 1.0), [], print).take(1, tmp_path)
    assert str(e.value).startswith("weight update failed: ") and other.url in str(e.value)
