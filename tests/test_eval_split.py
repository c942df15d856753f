"""The held-out split of an environment (slurmrl.envs.heldout), the evaluation's numbers and schedule
(slurmrl.runtime.orchestrator.evaluate), and eval rows in `slurmrl status` and `slurmrl plot`."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from slurmrl import cli, envs
from slurmrl.envs.heldout import TrainSplit, heldout_tasks, is_heldout, task_key
from slurmrl.recipe.load import load_recipe
from slurmrl.recipe.roles import orchestrator_settings
from slurmrl.rundir.evals import last_eval, read_evals
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.metrics import Metrics
from slurmrl.runtime.orchestrator.evaluate import Evaluator, attach, ks, pass_at_k, score, training_view
from slurmrl.settings.eval import EvalSettings
from slurmrl.settings.wandb import WandbSettings

ROOT = Path(__file__).resolve().parent.parent
ENVS = [("reverse_text", {}), ("arithmetic", {}), ("arithmetic", {"few_shot": 2}),
        ("reverse_text", {"alphabet": "abcdef", "max_len": 5})]


@pytest.mark.parametrize("name,args", ENVS)
def test_heldout_split_is_disjoint_from_every_training_draw(name, args):
    env = envs.load(name, args)
    held = heldout_tasks(env, 64, 0.1, seed=0)
    held_keys = {task_key(env, t) for t in held}
    assert held and len(held_keys) == len(held)  # distinct tasks
    train = TrainSplit(env, 0.1)
    seen = set()
    for seed in range(60):  # 60 steps of 64 prompts: far more than each small task space
        tasks = train.prompts(random.Random(seed), 64)
        assert len(tasks) == 64
        seen |= {task_key(env, t) for t in tasks}
    assert seen and not seen & held_keys
    # and the training draws cover the rest: nothing but the held-out part is lost (small spaces)
    if name == "arithmetic":
        assert len(seen) + len(held_keys) == 100


def test_split_is_deterministic_across_processes_and_seeds():
    env = envs.load("arithmetic", {})
    a = [t["prompt"] for t in heldout_tasks(env, 8, 0.1, seed=0)]
    assert a == [t["prompt"] for t in heldout_tasks(env, 8, 0.1, seed=0)]
    code = ("from slurmrl import envs; from slurmrl.envs.heldout import heldout_tasks; "
            "print([t['prompt'] for t in heldout_tasks(envs.load('arithmetic', {}), 8, 0.1, seed=0)])")
    for hash_seed in ("1", "2"):  # Python's own str hash differs per process; the split must not
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": hash_seed}).stdout
        assert out.strip() == repr(a)
    # which tasks are held out does not depend on the seed; only which of them are drawn first
    keys = lambda seed: {task_key(env, t) for t in heldout_tasks(env, 100, 0.1, seed=seed)}  # noqa: E731
    assert keys(0) == keys(7)


def test_arithmetic_holds_out_questions_not_prompts():
    env = envs.load("arithmetic", {"few_shot": 2})
    held = heldout_tasks(env, 100, 0.1, seed=3)
    assert all(is_heldout(t["prompt"].rsplit("\n", 1)[-1], 0.1) for t in held)
    # the same question with other solved examples before it is still held out of training
    questions = {t["prompt"].rsplit("\n", 1)[-1] for t in held}
    train = TrainSplit(env, 0.1)
    assert not any(t["prompt"].rsplit("\n", 1)[-1] in questions for t in train.prompts(random.Random(1), 500))


def test_fraction_is_roughly_kept():
    keys = [f"task {i}" for i in range(20000)]
    share = sum(is_heldout(k, 0.1) for k in keys) / len(keys)
    assert 0.09 < share < 0.11
    assert sum(is_heldout(k, 0.3) for k in keys) > sum(is_heldout(k, 0.1) for k in keys)
    assert all(is_heldout(k, 0.3) for k in keys if is_heldout(k, 0.1))  # nested: a larger split keeps the smaller


class OneTask:
    """A custom environment with a single task (what the split must refuse to empty)."""

    kind = "text"

    def prompts(self, rng, n):
        return [{"prompt": "the only one", "target": "x"} for _ in range(n)]

    def reward(self, task, completion):
        return 1.0


def test_an_environment_the_split_cannot_serve_fails_naming_it():
    env = OneTask()
    if is_heldout("the only one", 0.5):
        with pytest.raises(SystemExit, match="OneTask.*training tasks outside the held-out split"):
            TrainSplit(env, 0.5).prompts(random.Random(0), 4)
    else:
        with pytest.raises(SystemExit, match="OneTask: no task .* falls in the held-out split"):
            heldout_tasks(env, 4, 0.5, seed=0)


def test_training_view_wraps_only_for_a_heldout_eval():
    env = envs.load("reverse_text", {})
    plain = orchestrator_settings(load_recipe(ROOT / "recipes" / "rl-debug.toml", []), "/runs/x")
    assert training_view(plain, env) is env
    held = orchestrator_settings(load_recipe(ROOT / "recipes" / "rl-debug.toml", ["eval.every=2"]), "/runs/x")
    assert isinstance(training_view(held, env), TrainSplit)
    other = orchestrator_settings(load_recipe(ROOT / "recipes" / "rl-debug.toml",
                                              ["eval.every=2", "eval.environment='arithmetic'"]), "/runs/x")
    assert training_view(other, env) is env


def test_pass_at_k():
    assert ks(1) == [1] and ks(4) == [1, 2, 4] and ks(6) == [1, 2, 4, 6]
    assert pass_at_k(4, 0, 1) == 0 and pass_at_k(4, 4, 1) == 1 and pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1 and pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)
    row = score([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], correct_at=1.0)
    assert row.pass_at[1] == pytest.approx(0.125) and row.pass_at[4] == pytest.approx(0.5) and list(row.pass_at) == [1, 2, 4]
    assert row.reward_mean == pytest.approx(0.125)
    assert score([[0.8], [0.6]], correct_at=0.7).pass_at[1] == pytest.approx(0.5)


def settings(**kw) -> EvalSettings:
    return EvalSettings(**{"every": 5, "environment": "reverse_text", "heldout": True, "max_tokens": 8, **kw})


def test_schedule_and_resume_from_the_rows_written(tmp_path):
    off = WandbSettings(mode="disabled")
    m = Metrics(tmp_path, "orchestrator", {}, print, tracking_settings=off).beside(RunDir(tmp_path).eval_metrics, "eval/")
    ev = Evaluator(settings(), None, [], [], None, m, print)
    assert ev.due(0) and ev.next == 0
    ev.last, ev.next = 0, ev.after(0)
    assert not ev.due(4) and ev.due(5) and ev.due(7) and ev.after(7) == 10
    assert not Evaluator(settings(at_start=False), None, [], [], None, m, print).due(0)
    m.log({"step": 0, "reward_mean": 0.1, "pass@1": 0.0})
    m.log({"step": 6, "reward_mean": 0.4, "pass@1": 0.25})
    again = Evaluator(settings(), None, [], [], None, m, print)  # a requeued orchestrator
    assert again.last == 6 and again.next == 10 and not again.due(9)


def write_run(run: Path) -> None:
    (run / "metrics").mkdir(parents=True)
    (run / "metrics" / "orchestrator.jsonl").write_text("".join(
        json.dumps({"step": s, "reward_mean": s / 10, "off_policy_lag": 0}) + "\n" for s in range(1, 7)))
    rows = [{"step": 0, "reward_mean": 0.125, "pass@1": 0.0, "pass@4": 0.25, "prompts": 6, "samples_per_prompt": 4,
             "split": "heldout"},
            {"step": 3, "reward_mean": 0.5, "pass@1": 0.25, "pass@4": 0.5, "prompts": 6, "samples_per_prompt": 4,
             "split": "heldout"},
            {"step": 6, "reward_mean": 0.75, "pass@1": 0.5, "pass@4": 0.75, "prompts": 6, "samples_per_prompt": 4,
             "split": "heldout"}]
    RunDir(run).eval_metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 7, "rew')


def test_reader_plot_and_status_show_eval_rows(tmp_path, capsys):
    from slurmrl.app.status_read import latest_training
    from slurmrl.app.status_text import training_lines

    run = tmp_path / "run"
    write_run(run)
    found = read_evals(RunDir(run).eval_metrics)
    assert [e.step for e in found] == [0, 3, 6]  # the cut last line is left out
    assert found[1].pass_at == {1: 0.25, 4: 0.5} and found[1].reward_mean == 0.5
    assert last_eval(RunDir(run).eval_metrics).step == 6
    assert cli.main(["plot", str(run)]) == 0
    out = capsys.readouterr().out
    assert "evaluations (heldout split, metrics/eval.jsonl):" in out
    table = out.split("metrics/eval.jsonl):\n", 1)[1].splitlines()
    assert table[0].split() == ["eval", "step", "reward", "pass@1", "pass@4"]
    assert table[3].split() == ["6", "0.750", "0.500", "0.750"]
    assert (run / "reward.png").stat().st_size > 0
    lines = training_lines(latest_training(run))
    assert lines[-1] == "  latest eval step 6: reward 0.750, pass@1 0.500, pass@4 0.750 (6 prompts x 4)"


def test_eval_curves_are_drawn_over_the_training_reward():
    import matplotlib.pyplot as plt

    from slurmrl.charts import reward_figure

    fig = reward_figure([(1, 0.1), (2, 0.2)], "run", None, {"eval reward (mean)": [(0, 0.05), (2, 0.3)]})
    try:
        lines = fig.axes[0].get_lines()
        assert [line.get_label() for line in lines] == ["training reward", "eval reward (mean)"]
        assert list(lines[1].get_xdata()) == [0, 2] and list(lines[1].get_ydata()) == [0.05, 0.3]
    finally:
        plt.close(fig)


def test_chat_tasks_are_split_on_the_whole_task():
    """guess_number's tasks all have the same messages: the split keys on the whole task (the secret too), holds
    out some secrets, and training never draws one of them."""
    env = envs.load("guess_number", {"low": 1, "high": 40})
    held = heldout_tasks(env, 64, 0.1, seed=0)
    secrets = {t["secret"] for t in held}
    assert held and len(secrets) == len(held) and len(secrets) < 40  # distinct tasks, not all of them
    assert all(t["messages"] == held[0]["messages"] for t in held)
    train = TrainSplit(env, 0.1)
    drawn = {t["secret"] for seed in range(40) for t in train.prompts(random.Random(seed), 64)}
    assert not drawn & secrets and len(drawn) + len(secrets) == 40


def chat_settings(tmp_path, *sets: str):
    return orchestrator_settings(load_recipe(ROOT / "recipes" / "rl-guess-number.toml", ["eval.every=2", *sets]),
                                 str(tmp_path))


def test_eval_of_a_chat_environment_runs_conversations(tmp_path):
    """A chat environment's held-out split is evaluated by training's multi-turn sampler; another chat environment
    gets its own over the same servers; a text eval environment has none."""
    from slurmrl.runtime.orchestrator.members import alone
    from slurmrl.runtime.orchestrator.rollout_chat import ChatSampler

    s = chat_settings(tmp_path)
    env = envs.load(s.environment, s.environment_args)
    metrics = Metrics(tmp_path, "orchestrator", {}, print, enabled=False)
    servers = alone(["http://127.0.0.1:9"], 1.0)
    chat = ChatSampler(servers.front, None, s, env, servers)
    ev = attach(s, env, None, [], servers, None, metrics, print, chat)
    assert ev is not None and ev.chat is chat
    assert ev.tasks and all("messages" in t for t in ev.tasks)
    assert {t["secret"] for t in ev.tasks} == {t["secret"] for t in heldout_tasks(env, 32, 0.1, 0)}
    other = chat_settings(tmp_path, "eval.environment='guess_number'", "eval.environment_args={low=1, high=100}")
    ev = attach(other, env, None, [], servers, None, metrics, print, chat)
    assert ev.chat is not chat and ev.chat.env is ev.env and ev.chat.servers[0].base == "http://127.0.0.1:9"
    assert ev.chat.members is servers  # one live set: a dead server is routed around in evaluations too
    assert len(ev.tasks) == 32 and max(t["secret"] for t in ev.tasks) > 10
    text = chat_settings(tmp_path, "eval.environment='arithmetic'")
    assert attach(text, env, None, [], servers, None, metrics, print, chat).chat is None


def test_rollout_stats_summarize():
    from slurmrl.runtime.orchestrator.rollout_chat import summarize

    assert summarize([]) is None
    stats = [{"turns": 3, "failed": "", "cut": True, "env_tokens": 10},
             {"turns": 1, "failed": "error", "cut": False, "env_tokens": 0},
             {"turns": 2, "failed": "timeout", "cut": False, "env_tokens": 5}]
    assert summarize(stats).to_json() == {"env/turns_mean": 2.0, "env/errors": 1, "env/timeouts": 1, "env/cut": 1,
                                          "env/tokens": 15}
