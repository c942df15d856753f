"""Metric rows (``slurmrl.contract.metrics``): the writers' rows are byte for byte what the files always held,
any row a run wrote reads back (null, NaN, missing and unknown keys included), and every key the trainer
writes is a field of its row."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmrl.contract.metrics import EnvStats, EvalRow, JudgeStats, OrchestratorRow, TrainerRow, finite, whole

ROOT = Path(__file__).resolve().parent.parent
# lines as the orchestrator wrote them before the rows were typed (key order included)
ORCH_LINE = ('{"step": 3, "policy_step": 2, "off_policy_lag": 0, "reward_mean": 0.5, "reward_std": 0.25, '
             '"reward_min": 0.0, "reward_max": 1.0, "samples": 16, "tokens": 400, "generate_s": 1.5, "wait_s": 0.0, '
             '"tokens_per_s": 266.6, "samples_per_s": 10.6, "reload_s": 0.2, "sleep_s": 0.1, "score_s": 0.01, '
             '"judge/requests": 2, "judge/scored": 16, "judge/retries": 0, "judge/unparsed": 1, '
             '"judge/latency_mean_s": 0.05, "judge/latency_max_s": 0.07, "env/turns_mean": 2.5, "env/errors": 0, '
             '"env/timeouts": 1, "env/cut": 0, "env/tokens": 40, "time": 1790000000.5, "trainer/kind": "rl", '
             '"trainer/loss": NaN, "trainer/kl": null, "trainer/step": 2}')
EVAL_LINE = ('{"step": 4, "environment": "guess_number", "split": "heldout", "prompts": 8, "samples_per_prompt": 4, '
             '"temperature": 0.0, "reward_mean": 0.25, "reward_std": 0.5, "pass@1": 0.25, "pass@2": 0.4, "pass@4": 0.5, '
             '"completion_chars_mean": 12.5, "env/turns_mean": 3.0, "env/errors": 0, "env/timeouts": 0, "env/cut": 1, '
             '"env/tokens": 9, "generate_s": 2.0, "eval_s": 2.5, "judge/requests": 1, "judge/scored": 32, '
             '"judge/retries": 0, "judge/unparsed": 0, "judge/latency_mean_s": 0.1, "judge/latency_max_s": 0.1, '
             '"time": 1790000001.0}')


def values(line: str) -> tuple[dict, int]:
    data = json.loads(line)
    return {k: v for k, v in data.items() if k != "step"}, data["step"]


@pytest.mark.parametrize("kind, line", [(OrchestratorRow, ORCH_LINE), (EvalRow, EVAL_LINE)])
def test_a_written_line_reads_back_and_writes_the_same_bytes(kind, line):
    row = kind.from_json(*values(line))
    assert json.dumps(row.to_json()) == line and not row.extra


def test_the_orchestrators_row_has_the_keys_it_always_had():
    row = OrchestratorRow(step=1, policy_step=0, off_policy_lag=0, reward_mean=1.0, reward_std=0.0, reward_min=1.0,
                          reward_max=1.0, samples=2, tokens=8, generate_s=1.0, wait_s=0.0, tokens_per_s=8.0,
                          samples_per_s=2.0, reload_s=0.0, score_s=0.0, time=5.0)
    assert list(row.to_json()) == ["step", "policy_step", "off_policy_lag", "reward_mean", "reward_std", "reward_min",
                                   "reward_max", "samples", "tokens", "generate_s", "wait_s", "tokens_per_s",
                                   "samples_per_s", "reload_s", "score_s", "time"]  # no sleep_s without the hybrid engine
    judged = OrchestratorRow(**{**row.__dict__, "judge": JudgeStats(1, 2, 0, 0, 0.5, 0.5), "sleep_s": 0.25})
    assert list(judged.to_json())[14:17] == ["sleep_s", "score_s", "judge/requests"]


def test_any_row_a_run_wrote_reads():
    """Null, NaN, infinities, text where a number belongs, missing and unknown keys: read, never a crash."""
    row = OrchestratorRow.from_json({"reward_mean": math.nan, "reward_std": None, "reward_min": "x",
                                     "reward_max": math.inf, "eval/reward": 0.5, "off_policy_lag": True}, 7)
    assert row.step == 7 and math.isnan(row.reward_mean) and row.reward_std is None and row.reward_min is None
    assert row.reward_max == math.inf and row.off_policy_lag is None and row.extra == {"eval/reward": 0.5}
    assert row.judge is None and row.env is None and row.trainer == {} and row.generate_s is None
    assert finite(row.reward_mean) is None and finite(10**400) is None and whole(4.0) == 4 and whole(4.5) is None
    t = TrainerRow.from_json({"loss": 0.5, "kind": 3, "new_key": [1]}, 2)
    assert t.loss == 0.5 and t.kind is None and t.extra == {"new_key": [1]}
    e = EvalRow.from_json({"pass@1": 0.5, "pass@x": 1, "pass@8": None, "split": "all"}, 0)
    assert e.pass_at == {1: 0.5, 8: None} and e.split == "all" and e.reward_mean is None


numbers = st.none() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, width=64)


@given(st.fixed_dictionaries({k: numbers for k in ("reward_mean", "wait_s", "score_s", "time")}),
       st.booleans(), st.booleans(), st.dictionaries(st.sampled_from(["loss", "kl", "step"]), numbers))
def test_orchestrator_rows_survive_json(fields, judged, env, trainer):
    row = OrchestratorRow(step=3, **fields, judge=JudgeStats(1, 2, 3, 4, 0.5, 0.75) if judged else None,
                          env=EnvStats(2.0, 0, 1, 0, 5) if env else None, trainer=trainer)
    data = json.loads(json.dumps(row.to_json()))
    assert OrchestratorRow.from_json({k: v for k, v in data.items() if k != "step"}, data["step"]) == row


@given(st.dictionaries(st.integers(1, 64), st.floats(0, 1)), numbers)
def test_eval_rows_survive_json(pass_at, reward):
    row = EvalRow(step=2, environment="arithmetic", split="all", reward_mean=reward, pass_at=dict(sorted(pass_at.items())),
                  completion_chars_mean=1.0, generate_s=0.5, eval_s=0.75, time=1.0)
    data = json.loads(json.dumps(row.to_json()))
    assert EvalRow.from_json(data, 2) == row


def trainer_record_keys() -> set[str]:
    """The keys ``trainer.loop`` names in the ``TrainerRow`` it writes (read from its source with ``ast``)."""
    tree = ast.parse((ROOT / "slurmrl" / "runtime" / "trainer" / "loop.py").read_text())
    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "TrainerRow":
            keys |= {k.arg for k in node.keywords if k.arg is not None}
    return keys


def test_every_key_the_trainer_writes_is_a_field_of_its_row():
    torch = pytest.importorskip("torch")
    from slurmrl.runtime.trainer import rl_metrics

    stats = rl_metrics.RLStats(torch.device("cpu"))
    written = {**stats.finish(1), **rl_metrics.reward_stats([0.0, 1.0]), **rl_metrics.memory(torch.device("cpu")),
               **rl_metrics.Flops(10, 1, 1e12).record(100, 0, 1.0),
               **{k: 0.0 for k in trainer_record_keys() - {"step"}}, "tokens": 1, "target_tokens": 1, "samples": 1,
               "policy_step": 0, "epoch": 0}
    assert {"grad_norm", "sync_share", "off_policy_lag", "kind"} <= set(written)
    row = TrainerRow.from_json(written, 1)
    measured = {k: v for k, v in written.items() if v is not None}  # what a step did not measure is left out
    assert TrainerRow(step=1, **written).to_json() == {"step": 1, **measured}
    assert row.extra == {} and row.mfu is not None and row.ratio_mean is not None
    cuda = {k: 1.0 for k in ("cuda_mem_allocated_gib", "cuda_mem_reserved_gib", "cuda_mem_peak_gib")}
    assert TrainerRow.from_json(cuda, 1).extra == {}
