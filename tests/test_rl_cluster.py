"""RL and SFT end to end on the local Slurm cluster: real vLLM, trainer, orchestrator, requeue.

One RL job does four checks (each would cost minutes on two cores): its reward must rise, a
`scontrol requeue` in the middle must not lose or repeat a step, its [collector] keeps every
/metrics in the run dir, is killed in the first attempt while the job goes on (critical = false),
and leaves what `slurmrl report` turns into a page; and of its two vLLM servers behind the router, one
server's engine is SIGKILLed at step 4: the orchestrator declares it dead and routes around it, its
supervisor restarts it in place (docs/slurm.md "Restarts"), the orchestrator reloads the newest weights
into it and readmits it, every prompt group whole and no sample older than the off-policy bound, and
`status` shows the restart and the events (dead, died, restarted, readmitted).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
from cluster_jobs import job_state, kill_server_and_hold_until_back, lines, requeue_and_complete, server_pid, wait_until
from live_components import vllm_plugin_on_path
from wandb_records import runs as wandb_runs

from slurmrl.app import report_data as rd
from slurmrl.contract import events
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.scrape import read_scrapes
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny

pytestmark = [pytest.mark.cluster, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parent.parent
STEPS = 36  # the orchestrator is held while the killed server restarts (cluster_jobs.kill_server_and_hold_until_back)
KILL_SERVER_AT = 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("model") / "tiny")


def kill_step(cluster, job_id: str, name: str) -> None:
    """SIGKILL to the tasks of the job's step named ``name`` (its srun then exits)."""
    steps = cluster.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"]).stdout.split("\n")
    ids = [line.split()[0] for line in steps if line.split()[1:] == [name]]
    assert len(ids) == 1, steps
    assert cluster.run(["scancel", "--signal=KILL", ids[0]]).returncode == 0


def test_rl_reward_rises_and_a_requeue_loses_no_step(slurm_debug2, tmp_path, tiny):
    r = slurm_debug2.slurmrl(
        "submit", str(ROOT / "recipes" / "rl-debug.toml"),
        "--set", f'model.path="{tiny}"', "--set", f'python.executable="{sys.executable}"',
        "--set", f"trainer.max_steps={STEPS}", "--set", "trainer.checkpoint_every=4", "--set", "collector.interval=2",
        "--set", "inference.gpus_per_node=2", "--set", "inference.restart_backoff_s=1",  # two servers, one killed
        # [eval] on reverse_text's held-out split every 8 steps; [wandb] offline, the user's names
        "--set", "eval.every=8", "--set", "wandb.mode='offline'", "--set", "wandb.project='rl-cluster'",
        "--set", "wandb.tags=['ci']",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "rl-debug"
    job_id = json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]
    trainer_log = run_dir / "metrics" / "trainer.jsonl"
    phases = run_dir / "logs" / "attempt-0" / "phases"
    scraped = run_dir / "metrics" / "scrape" / "attempt-0"
    kinds = lambda: [(e.kind, e.task) for e in events.read(RunDir(run_dir).events)]  # noqa: E731
    try:
        # the collector has scraped the trainer, and inference.0 answering requests (its TTFT), before its kill
        wait_until(lambda: len(lines(trainer_log)) >= KILL_SERVER_AT and (scraped / "trainer.jsonl").exists()
                   and rd.hist_quantiles(read_scrapes(scraped / "inference.0.jsonl"), rd.TTFT) is not None
                   and server_pid(run_dir, 1), 900,
                   f"{KILL_SERVER_AT} trainer steps, and the trainer's and inference.0's /metrics scraped", run_dir)
        kill_step(slurm_debug2, job_id, "collector")  # not critical: logged, and the job goes on
        kill_server_and_hold_until_back(run_dir, 1)  # a server of an RL job: routed around, restarted, readmitted
        wait_until(lambda: "(critical = false: the job goes on)" in phases.read_text(), 120, "the collector's exit", run_dir)
        wait_until(lambda: ("readmitted", 1) in kinds() or job_state(slurm_debug2, job_id) != "RUNNING", 900,
                   "inference.1 readmitted", run_dir)
        assert ("readmitted", 1) in kinds(), (kinds(), job_state(slurm_debug2, job_id))
        text = slurm_debug2.slurmrl("status", str(run_dir), cwd=tmp_path).stdout
        assert "RUNNING" in text and "readmitted: inference.1 on " in text, text
        wait_until(lambda: len(lines(trainer_log)) >= 8, 900, "8 trainer steps", run_dir)
        assert not (run_dir / "logs" / "attempt-0" / "FAILED").exists()
        requeue_and_complete(slurm_debug2, job_id, run_dir, tmp_path)
    finally:
        slurm_debug2.slurmrl("cancel", str(run_dir), cwd=tmp_path, timeout=180)

    steps = [rec["step"] for rec in lines(trainer_log)]
    assert sorted(steps) == list(range(1, STEPS + 1)), f"steps lost or repeated: {steps}"
    rewards = {rec["step"]: rec["reward_mean"] for rec in lines(run_dir / "metrics" / "orchestrator.jsonl")}
    assert sorted(rewards) == list(range(1, STEPS + 1))
    first = sum(rewards[s] for s in range(1, 6)) / 5
    last = sum(rewards[s] for s in range(STEPS - 4, STEPS + 1)) / 5
    assert last > first + 0.1, f"reward did not rise: first 5 steps {first:.3f}, last 5 {last:.3f}"
    plot = slurm_debug2.slurmrl("plot", str(run_dir), cwd=tmp_path)
    assert plot.returncode == 0 and (run_dir / "reward.png").exists(), plot.stderr
    assert f"latest: batch {STEPS}: reward" in plot.stdout and f"trainer step {STEPS}: loss" in plot.stdout, plot.stdout

    # the metrics that debug RL (docs/rl.md), in the job's own files: every trainer step carries them,
    # and each batch's off-policy lag is the real difference between the trainer step that used it
    # and the policy step (weights) the orchestrator generated it with
    trainer = {rec["step"]: rec for rec in lines(trainer_log)}
    orch = {rec["step"]: rec for rec in lines(run_dir / "metrics" / "orchestrator.jsonl")}
    for step, rec in trainer.items():
        for key in ("entropy", "clip_frac", "kl_inference", "kl_inference_max", "grad_norm", "reward_std",
                    "reward_min", "reward_max", "cpu_rss_gib", "model_tflops_per_device"):
            assert isinstance(rec[key], float), (step, key, rec)
        assert rec.get("kl") is None and rec.get("mfu") is None  # rl-debug: no KL term, and a CPU has no known peak
        assert rec["off_policy_lag"] == step - 1 - rec["policy_step"] == orch[step]["off_policy_lag"], (step, rec)
        assert rec["policy_step"] == orch[step]["policy_step"] and rec["reward_mean"] == pytest.approx(
            orch[step]["reward_mean"])
        assert orch[step]["reload_s"] >= 0 and "sleep_s" not in orch[step]
    lags = [orch[s]["off_policy_lag"] for s in sorted(orch)]
    assert set(lags) <= {0, 1}, lags  # max_off_policy_steps = 1, the restarted server's samples too
    # the killed server: every batch whole on one server or two, both serving again after the readmission
    assert {x["samples"] for x in orch.values()} == {4 * 8}  # rl-debug's 4 groups of 8
    live = [orch[s]["servers_live"] for s in sorted(orch)]
    assert min(live) == 1 and live[-1] == 2, live
    got = kinds()
    assert got.index(("readmitted", 1)) > max(got.index(("dead", 1)), got.index(("died", 1)),
                                              got.index(("restarted", 1))), got
    st = slurm_debug2.slurmrl("status", str(run_dir), cwd=tmp_path)
    assert f"latest batch {STEPS}: reward" in st.stdout and "entropy" in st.stdout, st.stdout
    # [eval]: the base model, then every 8 steps of weights the servers had, and the final weights; the
    # requeued orchestrator went on after its last row (none repeated)
    evals = [rec["step"] for rec in lines(run_dir / "metrics" / "eval.jsonl")]
    assert evals[0] == 0 and evals[-1] == STEPS and evals == sorted(set(evals)) and len(evals) >= 4, evals
    assert f"latest eval step {STEPS}: reward" in st.stdout, st.stdout
    assert "evaluations (heldout split, metrics/eval.jsonl)" in plot.stdout, plot.stdout
    # [wandb]: the trainer's and the orchestrator's runs in one group (the run dir's name), across the requeue
    found = wandb_runs(run_dir)
    assert set(found) == {"rl-debug-trainer", "rl-debug-orchestrator"}, found
    assert {(r["project"], r["group"], tuple(r["tags"])) for r in found.values()} == {("rl-cluster", "rl-debug", ("ci",))}

    check_metrics_and_report(slurm_debug2, run_dir, tmp_path)


E2E = ("vllm:e2e_request_latency_seconds",)


def check_latency_against_the_orchestrator(run: RunDir) -> None:
    """The report's latency points against the orchestrator's own timings (issue 36): a window's mean
    TTFT and end-to-end latency are no longer than the longest batch the orchestrator generated
    (``generate_s`` of its steps and evaluations), and a window in which requests finished overlaps
    one of its batches (after the attempt's first: each attempt's readiness check completes before it,
    and the collector may have scraped before that), so that a gap is a window in which nothing was served."""
    rows = [*lines(run.metrics("orchestrator")), *lines(run.eval_metrics)]
    batches = sorted((r["time"] - r["generate_s"], r["time"]) for r in rows if isinstance(r.get("generate_s"), float))
    longest, slack = max(b - a for a, b in batches), 3.0
    for attempt in (0, 1):
        server = read_scrapes(run.scrape_file(attempt, "inference.0"))
        # each attempt's server answers the readiness check's completion before the orchestrator's first batch
        first = min(a for a, _ in batches if a >= server.times[0])
        ttft, e2e = rd.hist_mean(server, rd.TTFT), rd.hist_mean(server, E2E)
        assert any(math.isfinite(m) for _, m in e2e), attempt
        for t, mean in [*ttft, *e2e]:  # a window (start, t] and the mean of the requests it observed
            if math.isnan(mean):
                continue
            assert mean <= longest + slack, (attempt, t, mean, longest)
            start = server.times[server.times.index(t) - 1]
            if start > first:
                assert any(start < b + slack and t > a - slack for a, b in batches), (attempt, start, t, batches)
    print(f"latency windows checked against {len(batches)} batches (longest {longest:.1f} s)")


def check_metrics_and_report(cluster, run_dir: Path, cwd: Path) -> None:
    """What the [collector] kept in both attempts, and the report of it."""
    run = RunDir(run_dir)
    assert "collector exited with code" in (run_dir / "logs" / "attempt-0" / "phases").read_text()
    for attempt in (0, 1):
        got = {f.name: read_scrapes(f) for f in run.scrape_files(attempt)}
        assert {"inference.0.jsonl", "trainer.jsonl", "orchestrator.jsonl"} <= set(got), (attempt, sorted(got))
        server = got["inference.0.jsonl"]
        assert rd.rate(rd.summed(server, rd.GENERATION)) and rd.hist_quantiles(server, rd.TTFT), attempt
        assert got["trainer.jsonl"].series("slurmrl_trainer_step_time_s"), attempt
        assert got["orchestrator.jsonl"].series("slurmrl_orchestrator_generate_s"), attempt
    files = [f for a in (0, 1) for f in run.scrape_files(a)]
    seconds = sum(s.times[-1] - s.times[0] for s in (read_scrapes(f) for f in files if f.name == "inference.0.jsonl"))
    print(f"scraped: {sum(f.stat().st_size for f in files)} bytes in {len(files)} files over {seconds:.0f} s "
          f"of the server's scrapes ({', '.join(f'{f.parent.name}/{f.name} {f.stat().st_size}' for f in files)})")
    check_latency_against_the_orchestrator(run)
    r = cluster.slurmrl("report", str(run_dir), cwd=cwd)
    assert r.returncode == 0, r.stderr
    page = run.report_page().read_text()
    for panel in ("phases", "throughput", "latency", "queue-kv", "step-split", "curves", "weight-sync"):
        assert f'<section id="panel-{panel}"><h2>' in page and (run.report_dir() / f"{panel}.png").is_file(), panel
    status = cluster.slurmrl("status", str(run_dir), cwd=cwd)
    assert f"report: {run.report_page()}" in status.stdout and "collector (critical = false)" in status.stdout, status.stdout


def test_sft_loss_falls_on_one_and_two_nodes(slurm_cluster, tmp_path, tiny):
    """Both jobs at once (3 of the cluster's 4 nodes): one on a node, one on two (torchrun across nodes)."""
    data = tmp_path / "sft.jsonl"
    with data.open("w") as f:
        for i in range(64):
            word = "abcab"[i % 3:] + "c"
            f.write(json.dumps({"prompt": f"say {word}:", "completion": f" {word}\n"}) + "\n")
    runs = {}
    for nodes in (1, 2):
        cwd = tmp_path / f"n{nodes}"
        cwd.mkdir()
        r = slurm_cluster.slurmrl(
            "submit", str(ROOT / "recipes" / "sft-debug.toml"),
            "--set", f'model.path="{tiny}"', "--set", f'python.executable="{sys.executable}"',
            "--set", f'trainer.dataset="{data}"', "--set", f"trainer.nodes={nodes}",
            cwd=cwd,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        run_dir = cwd / "runs" / "sft-debug"
        runs[nodes] = (cwd, run_dir, json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"])
    try:
        for nodes, (cwd, run_dir, job_id) in runs.items():
            wait_until(lambda: job_state(slurm_cluster, job_id) in ("COMPLETED", "FAILED", "CANCELLED"), 600,
                       f"the {nodes}-node SFT job to end", run_dir)
            assert job_state(slurm_cluster, job_id) == "COMPLETED", f"{nodes}-node SFT job"
    finally:
        for cwd, run_dir, _ in runs.values():
            slurm_cluster.slurmrl("cancel", str(run_dir), cwd=cwd, timeout=120)
    for nodes, (_, run_dir, _) in runs.items():
        losses = [rec["loss"] for rec in lines(run_dir / "metrics" / "trainer.jsonl")]
        assert len(losses) == 30, nodes
        assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5, (nodes, losses)


BROADCAST_STEPS = 40  # the restart is held for (kill_server_and_hold_until_back); then the readmission and the requeue
KILL_AT = 2


def test_rl_by_broadcast_through_vllms_routes_survives_a_dead_server_and_a_requeue(slurm_debug2, tmp_path, tiny):
    """trainer.weight_sync = "gloo": the same job with two servers, its weights sent by the trainer through
    vLLM's weight-transfer routes (slurmrl's gloo engine, loaded in the servers by the vLLM plugin) instead
    of the run dir. At step 2 one server's engine is SIGKILLed: the trainer's next update forms the group
    again over the survivor, the server is restarted in place and readmitted only after an update reached
    it (status: 1 restart; events: dead, restarted, readmitted). Then a requeue: no weights are written
    (only each step's READY mark), every step is synced and timed, and the restarted servers get the newest
    checkpoint by broadcast before any rollout."""
    vllm_plugin_on_path(tmp_path / "plugin")  # the job's steps inherit PYTHONPATH from sbatch
    r = slurm_debug2.slurmrl(
        "submit", str(ROOT / "recipes" / "rl-debug.toml"), "--set", 'name="rl-broadcast"',
        "--set", f'model.path="{tiny}"', "--set", f'python.executable="{sys.executable}"',
        "--set", f"trainer.max_steps={BROADCAST_STEPS}", "--set", "trainer.checkpoint_every=2",
        "--set", 'trainer.weight_sync="gloo"', "--set", "trainer.weight_sync_timeout=300",
        "--set", "inference.gpus_per_node=2", "--set", "inference.restart_backoff_s=1",
        cwd=tmp_path, env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "rl-broadcast"
    job_id = json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]
    trainer_log = run_dir / "metrics" / "trainer.jsonl"
    kinds = lambda: [(e.kind, e.task) for e in events.read(RunDir(run_dir).events)]  # noqa: E731
    try:
        ready = run_dir / "weights" / f"step-{KILL_AT:06d}" / "READY"  # killed between two updates, not in one
        wait_until(lambda: ready.exists() and server_pid(run_dir, 1), 900, f"the update of step {KILL_AT}", run_dir)
        kill_server_and_hold_until_back(run_dir, 1, between_updates=True)
        wait_until(lambda: ("readmitted", 1) in kinds() or job_state(slurm_debug2, job_id) != "RUNNING", 900,
                   "inference.1 readmitted", run_dir)
        assert ("readmitted", 1) in kinds(), (kinds(), job_state(slurm_debug2, job_id))
        st = slurm_debug2.slurmrl("status", str(run_dir), "--json", cwd=tmp_path)
        shown = json.loads(st.stdout.strip().splitlines()[-1])
        assert [c["restarts"] for c in shown["components"] if c["name"] == "inference"] == [1], shown["components"]
        requeue_and_complete(slurm_debug2, job_id, run_dir, tmp_path)
    finally:
        slurm_debug2.slurmrl("cancel", str(run_dir), cwd=tmp_path, timeout=180)

    got = kinds()
    assert got.index(("readmitted", 1)) > max(got.index(("dead", 1)), got.index(("restarted", 1))), got
    trainer = {rec["step"]: rec for rec in lines(trainer_log)}
    assert sorted(trainer) == list(range(1, BROADCAST_STEPS + 1)), f"steps lost or repeated: {sorted(trainer)}"
    # a step whose sync the requeue cut short (its servers stop first) is kept by its checkpoint (no READY mark)
    synced = {step: rec for step, rec in trainer.items() if rec["sync_s"] > 0}
    assert len(trainer) - len(synced) <= 1, trainer
    for step, rec in trainer.items():
        assert rec["publish_s"] == 0 and (step not in synced or 0 < rec["sync_share"] < 1), (step, rec)
    marks = sorted((run_dir / "weights").glob("step-*/*"))
    assert marks and {p.name for p in marks} == {"READY"}, marks  # no safetensors: nothing published
    orch = [rec for rec in lines(run_dir / "metrics" / "orchestrator.jsonl")]
    assert all(x["reload_s"] == 0 for x in orch), orch
    assert {x["samples"] for x in orch} == {4 * 8}  # every batch whole: rl-debug's 4 groups of 8
    assert max(x["off_policy_lag"] for x in orch) <= 1  # rl-debug's max_off_policy_steps, the restarted server too
    assert min(x["servers_live"] for x in orch) == 1 and orch[-1]["servers_live"] == 2
    assert max(x["policy_step"] for x in orch) >= BROADCAST_STEPS - 2
    attempt0 = "\n".join(p.read_text(errors="replace") for p in (run_dir / "logs" / "attempt-0").glob("trainer*.log"))
    assert "weight transfer group of 2 over 1 server(s)" in attempt0, attempt0[-3000:]  # formed over the survivor
    log = "\n".join(p.read_text(errors="replace") for p in (run_dir / "logs" / "attempt-1").glob("trainer*.log"))
    assert "servers on the weights of checkpoint" in log, log[-3000:]
    server_log = "\n".join(p.read_text(errors="replace") for p in (run_dir / "logs").rglob("inference*.log"))
    assert "GlooWeightTransferEngine" in server_log


def test_a_multi_turn_chat_environment_trains_token_exact(slurm_cluster, tmp_path, tiny):
    """rl-guess-number on the tiny model, 3 steps: conversations through the chat endpoint of a server
    started with the recipe's tool-call parser, every sample token-exact with the environment's tokens
    masked, and the trainer's loss on the model's tokens only; [eval] plays the held-out game (guess_number's
    one held-out secret) greedily on the base model, every 2 steps and the final weights."""
    steps = 3
    r = slurm_cluster.slurmrl(
        "submit", str(ROOT / "recipes" / "rl-guess-number.toml"),
        "--set", f'model.path="{tiny}"', "--set", f'python.executable="{sys.executable}"',
        "--set", "model.max_model_len=512", "--set", 'inference.env.VLLM_CPU_KVCACHE_SPACE="1"',
        "--set", f"trainer.max_steps={steps}", "--set", f"trainer.checkpoint_every={steps}", "--set", "trainer.lr=2e-3",
        "--set", "orchestrator.prompts_per_step=2", "--set", "orchestrator.rollouts_per_prompt=4",
        "--set", "trainer.micro_batch_size=8",
        "--set", "orchestrator.max_turns=2", "--set", "orchestrator.max_tokens=4", "--set", "eval.every=2",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "rl-guess-number"
    job_id = json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]
    try:
        wait_until(lambda: job_state(slurm_cluster, job_id) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"),
                   900, "the job to end", run_dir)
        logs = slurm_cluster.slurmrl("logs", str(run_dir), cwd=tmp_path).stdout[-4000:]
        assert job_state(slurm_cluster, job_id) == "COMPLETED", logs
    finally:
        slurm_cluster.slurmrl("cancel", str(run_dir), cwd=tmp_path, timeout=180)
    assert "--tool-call-parser" in (run_dir / "job.sbatch").read_text()
    trainer = {rec["step"]: rec for rec in lines(run_dir / "metrics" / "trainer.jsonl")}
    orch = {rec["step"]: rec for rec in lines(run_dir / "metrics" / "orchestrator.jsonl")}
    assert sorted(trainer) == sorted(orch) == list(range(1, steps + 1))
    masked = 0
    for step in range(1, steps + 1):
        batch = json.loads((run_dir / "rollouts" / f"step-{step:06d}.json").read_text())["samples"]
        assert len(batch) == 8
        for x in batch:
            ids, mask, lps = x["completion_ids"], x["completion_mask"], x["logprobs"]
            assert len(ids) == len(mask) == len(lps) and mask[0] == 1
            assert all((lp is None) == (m == 0) for lp, m in zip(lps, mask))
            masked += mask.count(0)
        assert orch[step]["env/errors"] == orch[step]["env/timeouts"] == 0
        assert orch[step]["env/tokens"] == sum(x["completion_mask"].count(0) for x in batch)
        # the trainer's loss targets are the model's tokens, none of the environment's
        assert trainer[step]["target_tokens"] == sum(sum(x["completion_mask"]) for x in batch)
    assert masked > 0  # a second turn happened: the environment answered
    evals = lines(run_dir / "metrics" / "eval.jsonl")
    assert evals[0]["step"] == 0 and evals[-1]["step"] == steps, evals  # (step 2 too, when the servers had its weights)
    for rec in evals:  # one held-out task, one greedy conversation of up to 2 turns, scored by the environment
        assert rec["split"] == "heldout" and rec["prompts"] == 1 and rec["temperature"] == 0, rec
        assert rec["env/errors"] == rec["env/timeouts"] == 0 and 1 <= rec["env/turns_mean"] <= 2, rec
        assert 0 <= rec["reward_mean"] <= 1 and rec["pass@1"] == float(rec["reward_mean"] == 1), rec
