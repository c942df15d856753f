"""The hybrid engine (placement.colocate = "hybrid"): what `plan` refuses and says, the vLLM line
as vLLM's own parser reads it, and the step sequence (generate -> sleep -> train -> publish ->
wake -> reload) driven by the real orchestrator.

vLLM's sleep mode needs CUDA: the CPU build here refuses --enable-sleep-mode (checked below), so
the servers are a loopback test double (tests/support/sleep_mode_double.py) that keeps vLLM's sleep-mode
state rules; the run on a GPU is not verified here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from sleep_mode_double import SleepModeDouble
from task_expand import expand

from slurmrl import cli
from slurmrl.app.build import build
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import write_ready

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "rl-hybrid.toml"


# ---- plan --------------------------------------------------------------------------------------
@pytest.mark.parametrize("sets, field, words", [
    (["placement.share_gpus=false"], "placement.share_gpus", "same GPUs"),
    (["orchestrator.max_off_policy_steps=1"], "orchestrator.max_off_policy_steps", "set 0"),
    (["inference.admin_endpoints=false"], "inference.admin_endpoints", "/sleep"),
    (["inference.vllm_extra={enable_sleep_mode=true}"], "inference.vllm_extra", "placement.colocate"),
])
def test_plan_refuses_what_the_hybrid_engine_cannot_do(sets, field, words, capsys):
    args = [a for s in sets for a in ("--set", s)]
    assert cli.main(["plan", str(RECIPE), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"error: {field}" in err and words in err, err


def test_plan_says_sleep_mode_needs_cuda(capsys):
    assert cli.main(["plan", str(RECIPE)]) == 0
    out = capsys.readouterr().out.splitlines()
    said = [line for line in out if "--enable-sleep-mode" in line]
    assert len(said) == 1 and said[0].startswith("warning:") and "needs CUDA" in said[0], out
    assert cli.main(["validate", str(RECIPE)]) == 0  # a warning, not an error: on stderr, one line
    err = capsys.readouterr().err.splitlines()
    assert len([line for line in err if "needs CUDA" in line]) == 1, err


# ---- the rendered line -------------------------------------------------------------------------
def server_task(sets: list[str] | None = None):
    with tempfile.TemporaryDirectory() as run_dir:
        out = build(RECIPE, sets or [], run_dir=run_dir)
        return expand(out.script, out.plan, "inference"), out.plan


def test_servers_start_with_sleep_mode_and_admin_routes_and_the_programs_know():
    task, plan = server_task()
    assert task.command.count("--enable-sleep-mode") == 1
    assert task.env["VLLM_SERVER_DEV_MODE"] == "1"  # /sleep, /wake_up, /is_sleeping
    settings = {c.name: c.settings for c in plan.components}
    assert settings["orchestrator"].hybrid is True and settings["trainer"].hybrid is True
    plain, plan1 = server_task(['placement.colocate=true', "orchestrator.max_off_policy_steps=1"])
    assert "--enable-sleep-mode" not in plain.command
    assert plan1.component("orchestrator").settings.hybrid is False


VLLM_PARSE = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.platforms import current_platform
args = make_arg_parser(FlexibleArgumentParser()).parse_args(json.load(sys.stdin))
validate_parsed_serve_args(args)
e = AsyncEngineArgs.from_cli_args(args)
print(json.dumps({"sleep": e.enable_sleep_mode, "here": current_platform.is_sleep_mode_available(),
                  "platform": type(current_platform).__name__}))
"""


@pytest.mark.vllm
def test_vllm_parses_the_sleep_mode_line_and_its_cpu_build_has_no_sleep_mode(vllm_python):
    task, _ = server_task()
    cmd = task.command
    argv = cmd[cmd.index("vllm.entrypoints.openai.api_server") + 1:]
    p = vllm_python.run(VLLM_PARSE, input=json.dumps(argv))
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["sleep"] is True
    # why the sequence below runs against a double: this machine's vLLM cannot sleep
    assert out["here"] is False, out


# ---- the sequence against the double -----------------------------------------------------------
def test_sleep_then_wake_reloads_into_woken_weights_before_the_kv_cache(job_secret):
    from slurmrl.runtime.orchestrator import hybrid

    with SleepModeDouble(job_secret) as a, SleepModeDouble(job_secret) as b:
        hybrid.sleep([a.url, b.url])
        assert a.sleeping and b.sleeping and a.weights is None
        hybrid.wake_and_reload([a.url, b.url], "/run/weights/step-000001")
        for d in (a, b):
            assert d.events == [("sleep", 2, "wait"), ("wake_up", ("weights",)),
                                ("reload_weights", "/run/weights/step-000001"), ("wake_up", ("kv_cache",))]
            assert not d.sleeping and d.weights == "/run/weights/step-000001"
        # awake (a server restarted with the base model after a requeue): the usual pause-reload-resume
        a.events.clear()
        hybrid.wake_and_reload([a.url], "/run/weights/step-000002")
        assert a.events == [("pause",), ("reload_weights", "/run/weights/step-000002"), ("reset_prefix_cache",),
                            ("resume",)]


def test_a_server_that_refuses_is_named(job_secret, monkeypatch):
    from slurmrl.runtime.orchestrator import hybrid
    from slurmrl.runtime.vllm import client

    with SleepModeDouble("another job's secret") as other, SleepModeDouble(job_secret) as good:
        with pytest.raises(client.VLLMError) as e:
            hybrid.sleep([good.url, other.url])
        assert other.url in str(e.value) and "401" in str(e.value) and good.url not in str(e.value)


def run_orchestrator(tmp_path, job_secret: str, steps: int, written: int = 0):
    """The real orchestrator (its process, its settings from the planner) against two sleep-mode
    doubles, and a stand-in trainer in this test that checks every server sleeps whenever it steps
    on a batch, then publishes weights. ``written``: batches an earlier attempt left (a resume).
    Returns (run dir, the doubles, what the stand-in found wrong)."""
    from slurmrl.recipe.load import load_recipe
    from slurmrl.recipe.roles import orchestrator_settings
    from slurmrl.rundir.tomlw import dumps
    from slurmrl.runtime.fixtures.tiny_model import build_no_weights

    model = build_no_weights(tmp_path / "tok")
    recipe = load_recipe(RECIPE, [f'model.path="{model}"', f"trainer.max_steps={steps}",
                                  "orchestrator.prompts_per_step=2", "orchestrator.rollouts_per_prompt=2"])
    run_dir = tmp_path / "run"
    config = RunDir(run_dir).component_config("orchestrator")
    config.parent.mkdir(parents=True)
    config.write_text(dumps(orchestrator_settings(recipe, str(run_dir)).model_dump(mode="json")))
    write_ready(RunDir(run_dir).ready_file(0, "trainer", 0), None, 1)
    for n in range(1, written + 1):
        batch = run_dir / "rollouts" / f"step-{n:06d}.json"
        batch.parent.mkdir(parents=True, exist_ok=True)
        batch.write_text(json.dumps({"step": n, "policy_step": n - 1, "samples": []}))
    with SleepModeDouble(job_secret) as a, SleepModeDouble(job_secret) as b:
        problems: list[str] = []

        def trainer() -> None:  # stand-in: no model, only the file protocol
            for n in range(1, steps + 1):
                batch = run_dir / "rollouts" / f"step-{n:06d}.json"
                deadline = time.monotonic() + 120
                while not batch.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                if n <= written:  # left by the last attempt: the orchestrator puts the servers to sleep first
                    while not (a.sleeping and b.sleeping) and time.monotonic() < deadline:
                        time.sleep(0.05)
                if not (a.sleeping and b.sleeping):
                    problems.append(f"batch {n} there while a server was awake")
                out = run_dir / "weights" / f"step-{n:06d}"
                out.mkdir(parents=True)
                (out / "READY").write_text("")

        t = threading.Thread(target=trainer, daemon=True)
        t.start()
        log = tmp_path / "orchestrator.log"
        p = subprocess.run(
            [sys.executable, "-m", "slurmrl.runtime.orchestrator", "--config", str(config),
             "--requests-url", a.url, b.url, "--admin-urls", a.url, b.url],
            env={**os.environ, "SLURMRL_ATTEMPT": "0", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)},
            stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=run_dir, timeout=300,
        )
        t.join(30)
        assert p.returncode == 0, log.read_text()[-3000:]
    return run_dir, (a, b), problems


SLEEP = ("sleep", 2, "wait")


def wake(weights: str) -> list[tuple]:
    return [("wake_up", ("weights",)), ("reload_weights", weights), ("wake_up", ("kv_cache",))]


def test_orchestrator_drives_generate_sleep_train_publish_wake_reload(tmp_path, job_secret):
    steps = 3
    run_dir, doubles, problems = run_orchestrator(tmp_path, job_secret, steps)
    assert not problems, problems
    w = [str(run_dir / "weights" / f"step-{n:06d}") for n in (1, 2)]
    for d in doubles:
        kinds = [e[0] for e in d.events]
        # per step: completions, sleep; then wake weights, reload the trainer's newest, wake the KV cache
        calls = [e for e in d.events if e[0] != "completions"]
        assert calls == [SLEEP, *wake(w[0]), SLEEP, *wake(w[1]), SLEEP], d.events
        assert kinds[0] == "completions" and kinds[-1] == "sleep"
        # each step's completions came from the previous step's weights
        served = [e[1] for e in d.events if e[0] == "completions"]
        assert served[0] == "base" and set(served) <= {"base", *w} and served[-1] == w[1]
    rows = [json.loads(x) for x in (run_dir / "metrics" / "orchestrator.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["policy_step"] for r in rows] == [0, 1, 2] and all(r["off_policy_lag"] == 0 for r in rows)
    assert all(r["sleep_s"] >= 0 for r in rows) and rows[0]["reload_s"] == 0 and rows[1]["reload_s"] > 0


@pytest.mark.slow  # over ~7 s on two cores: the full suite runs it, the fast tier does not
def test_a_resumed_orchestrator_puts_the_restarted_servers_to_sleep_before_the_trainer_catches_up(
        tmp_path, job_secret):
    """After a requeue the servers restart awake, while batch 1 (written by the last attempt) still
    waits for the trainer: the servers sleep before anything else, then wake on its weights."""
    run_dir, doubles, problems = run_orchestrator(tmp_path, job_secret, steps=2, written=1)
    assert not problems, problems
    w1 = str(run_dir / "weights" / "step-000001")
    for d in doubles:
        assert d.events[0] == SLEEP, d.events
        assert [e for e in d.events if e[0] != "completions"] == [SLEEP, *wake(w1), SLEEP], d.events
        assert [e[1] for e in d.events if e[0] == "completions"] == [w1]  # step 2's prompt (one per server), on step 1's weights
