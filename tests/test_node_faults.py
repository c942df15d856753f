"""Node faults on the real local Slurm (issue 42 items 1-3): a node lost mid-run requeues the job
without it, and it resumes exactly; an application failure is not requeued and says so; the node
check ends what a killed earlier job left on a node and leaves a running job's processes alone."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from cluster_jobs import job_state, lines, paused, wait_until
from status_jobs import FAKE_PYTHON, cancel_until_gone, status_json

from slurmrl.contract import attempt_end, events
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny
from slurmrl.runtime.steps import attempts

ROOT = Path(__file__).resolve().parent.parent
STEPS = 30  # the trainer is held until the fault lands (cluster_jobs.paused)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("model") / "tiny")


def sft_data(path: Path) -> Path:
    with path.open("w") as f:
        for i in range(64):
            word = "abcab"[i % 3:] + "c"
            f.write(json.dumps({"prompt": f"say {word}:", "completion": f" {word}\n"}) + "\n")
    return path


def job_line(cluster, job_id: str) -> str:
    return cluster.run(["scontrol", "show", "job", "-o", job_id]).stdout


def only_job_on(cluster, node: str, job_id: str) -> bool:
    jobs = cluster.run(["squeue", "-h", "-w", node, "-o", "%A"]).stdout.split()
    return jobs == [job_id]


def steps_done(run_dir: Path) -> list[int]:
    path = run_dir / "metrics" / "trainer.jsonl"
    return [r["step"] for r in lines(path)] if path.exists() else []


@pytest.mark.cluster
def test_a_node_lost_mid_run_requeues_the_job_without_it(slurm_debug2, tmp_path, tiny):
    cluster = slurm_debug2
    r = cluster.slurmrl("submit", str(ROOT / "recipes" / "sft-debug.toml"),
                        "--set", f'model.path="{tiny}"', "--set", f'python.executable="{sys.executable}"',
                        "--set", f'trainer.dataset="{sft_data(tmp_path / "sft.jsonl")}"', "--set", "trainer.nodes=2",
                        "--set", f"trainer.max_steps={STEPS}", "--set", "trainer.checkpoint_every=5", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "sft-debug"
    job_id = json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]
    down = None
    try:
        wait_until(lambda: len(steps_done(run_dir)) >= 3, 600, "three steps", run_dir, poll=0.25)
        nodes = cluster.run(["scontrol", "show", "hostnames",
                             cluster.run(["squeue", "-h", "-j", job_id, "-o", "%N"]).stdout.strip()]).stdout.split()
        assert len(nodes) == 2, nodes
        # not the batch host (its shell records the end), and only once no other job uses it: the fault
        # must end no one else's job on this shared cluster. The trainer's ranks are held meanwhile (SIGSTOP),
        # so that the fault lands mid-run however fast the steps are; they go on the moment the node is down
        with paused(run_dir, "trainer"):
            wait_until(lambda: only_job_on(cluster, nodes[1], job_id), 300, f"{nodes[1]} to hold only this job",
                       run_dir)
            down = nodes[1]
            failed_at = time.time()
            assert cluster.run(["scontrol", "update", f"nodename={down}", "state=down",
                                "reason=slurmrl-test"]).returncode == 0
        wait_until(lambda: f"ExcNodeList={down}" in job_line(cluster, job_id), 120, "the exclusion", run_dir)
        # the node comes back at once: the exclusion, not its state, keeps the next attempt off it
        cluster.run(["scontrol", "update", f"nodename={down}", "state=resume"])
        down = None
        wait_until(lambda: (run_dir / "logs" / "attempt-1").is_dir(), 600, "attempt 1", run_dir)
        line = job_line(cluster, job_id)
        assert f"ExcNodeList={nodes[1]}" in line, line
        wait_until(lambda: job_state(cluster, job_id) in ("COMPLETED", "FAILED", "CANCELLED"), 900, "the end", run_dir)
        assert job_state(cluster, job_id) == "COMPLETED", cluster.slurmrl("logs", str(run_dir), cwd=tmp_path).stdout[-3000:]
    finally:
        if down:
            cluster.run(["scontrol", "update", f"nodename={down}", "state=resume"])
        cancel_until_gone(cluster, job_id)
    # the node check's all-reduce ran over both nodes of attempt 0, and of attempt 1
    for a in (0, 1):
        for t in (0, 1):
            log = (run_dir / "logs" / f"attempt-{a}" / f"nodes.g0.{t}.log").read_text()
            assert "health: all-reduce over 2 node(s) ok (gloo, " in log and "health: ok (" in log, log
    # attempt 1 ran without the node; every step once, none skipped
    assert nodes[1] not in (run_dir / "logs" / "attempt-1" / "phases").read_text()
    assert steps_done(run_dir) == list(range(1, STEPS + 1))
    started = int((run_dir / "logs" / "attempt-1" / "phases").read_text().split()[0])
    resumed = min(r["time"] for r in lines(run_dir / "metrics" / "trainer.jsonl") if r["time"] >= started)
    print(f"node down -> next step of the resumed job: {resumed - failed_at:.0f} s")  # a figure, not asserted
    # the run dir says why attempt 0 ended and which node it keeps out; status shows both
    evs = events.read(RunDir(run_dir).events)
    ended = [e for e in evs if e.kind == "attempt_ended"]
    assert [(e.attempt, e.detail["class"], e.detail["requeued"]) for e in ended] == [(0, "node", True)], evs
    assert [(e.kind, e.node) for e in evs if e.kind == "excluded"] == [("excluded", nodes[1])]
    text = cluster.slurmrl("status", str(run_dir), cwd=tmp_path).stdout
    assert f"attempt 0 ended: node ({nodes[1]})" in text and "requeued" in text, text
    # why: Slurm's reason while the node was down, or (back in service at once: its slurmd answers) srun's words
    assert f"excluded {nodes[1]} since" in text and ("slurmrl-test" in text or "srun: node failure" in text), text
    assert status_json(cluster, run_dir)["excluded"][nodes[1]]["attempt"] == 0


@pytest.fixture
def fake_python(tmp_path) -> Path:
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    return fake


def submit_stand_in(cluster, tmp_path: Path, recipe: str, fake: Path, sets: list[str], **env: str) -> tuple[Path, str]:
    """Submit ``recipe`` with the stand-in python (test_status_logs_cancel.FAKE_PYTHON); its run dir and job id."""
    args = [x for s in [f'python.executable="{fake}"', *sets] for x in ("--set", s)]
    r = cluster.slurmrl("submit", str(ROOT / "recipes" / f"{recipe}.toml"), *args, cwd=tmp_path,
                        env={"SLURMRL_PROBE_TIMEOUT": "30", **env})
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / recipe
    return run_dir, json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]


@pytest.mark.cluster
def test_an_application_failure_is_not_requeued_and_says_so(slurm_debug2, tmp_path, fake_python):
    cluster = slurm_debug2
    run_dir, job_id = submit_stand_in(cluster, tmp_path, "rl-debug", fake_python, ["slurm.grace_seconds=3"],
                                      SLURMRL_TEST_FAIL="orchestrator")
    try:
        wait_until(lambda: job_state(cluster, job_id) in ("FAILED", "COMPLETED", "CANCELLED"), 300, "the end", run_dir)
    finally:
        cancel_until_gone(cluster, job_id)
    assert job_state(cluster, job_id) == "FAILED"
    assert "Restarts=0" in job_line(cluster, job_id)
    end = (run_dir / "logs" / "attempt-0" / "END").read_text()
    assert end.split()[1:3] == ["application", "no"], end
    ended = [e for e in events.read(RunDir(run_dir).events) if e.kind == "attempt_ended"]
    assert [(e.detail["class"], e.detail["requeued"]) for e in ended] == [("application", False)]
    text = cluster.slurmrl("status", str(run_dir), cwd=tmp_path).stdout
    assert "attempt 0 ended: application" in text and "not requeued" in text, text
    # the node check ran first on every node, and says the GPU parts were skipped here
    for log in (run_dir / "logs" / "attempt-0").glob("nodes.g*.log"):
        assert "health: GPU checks skipped" in log.read_text() and "health: ok" in log.read_text()


def leftover_job(cluster, node: str, run_dir: Path, mark: Path, seconds: int) -> str:
    """A job on ``node`` whose process carries a slurmrl job's environment; with ``mark``, it leaves a
    detached sleep behind (its pid in ``mark``) and ends at once."""
    shm = f"/dev/shm/slurmrl-test-{mark.stem}-{os.getpid()}"  # a shared-memory file it holds open
    script = (f"setsid -f bash -c 'exec 3>{shm}; echo $$ > {mark}; exec sleep {seconds}'; sleep 1"
              if mark.name.startswith("left") else f"exec 3>{shm}; echo $$ > {mark}; exec sleep {seconds}")
    r = cluster.run(["sbatch", "--parsable", f"--nodelist={node}", "-N1", "-n1", "-c1", "--mem=100",
                     f"--output={run_dir}/leftover-%j.out", f"--wrap={script}"],
                    env={"SLURMRL_RUN_DIR": str(run_dir), "SLURMRL_ATTEMPT": "0"})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.cluster
def test_the_node_check_ends_a_dead_jobs_leftover_and_not_a_running_jobs(slurm_debug2, tmp_path, fake_python):
    cluster = slurm_debug2
    node = "n8"
    old = tmp_path / "old-run"
    old.mkdir()
    left_mark, running_mark = tmp_path / "left.pid", tmp_path / "running.pid"
    jobs = [leftover_job(cluster, node, old, left_mark, 900), leftover_job(cluster, node, old, running_mark, 900)]
    left = running = None
    try:
        wait_until(lambda: left_mark.exists() and running_mark.exists(), 300, "both jobs' processes", old)
        wait_until(lambda: job_state(cluster, jobs[0]) == "COMPLETED", 120, "the first job to end", old)
        left, running = int(left_mark.read_text()), int(running_mark.read_text())
        assert alive(left) and alive(running)  # the leftover outlived its job
        run_dir, job_id = submit_stand_in(cluster, tmp_path, "sft-debug", fake_python,
                                          [f'slurm.extra_directives=["--nodelist={node}"]', "slurm.cpus_per_node=2"],
                                          SLURMRL_TEST_FAIL="trainer")
        jobs.append(job_id)
        wait_until(lambda: job_state(cluster, jobs[2]) in ("FAILED", "COMPLETED", "CANCELLED"), 300, "the job", run_dir)
        log = (run_dir / "logs" / "attempt-0" / "nodes.g0.0.log").read_text()
        assert f"{node}: cleanup: ended pid {left} of job {jobs[0]} attempt 0 ({old})" in log, log
        assert not alive(left)
        assert alive(running) and f"pid {running} " not in log
        left_shm, running_shm = (Path(f"/dev/shm/slurmrl-test-{m.stem}-{os.getpid()}") for m in (left_mark, running_mark))
        assert f"{node}: cleanup: removed {left_shm}" in log and not left_shm.exists()
        assert running_shm.exists()  # a running job's
        phases = (run_dir / "logs" / "attempt-0" / "phases").read_text()
        assert phases.index("nodes checked") < phases.index("ports from")  # before anything else started
    finally:
        for job_id in jobs:
            cancel_until_gone(cluster, job_id)
        for pid in (left, running):
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)
        for m in (left_mark, running_mark):
            Path(f"/dev/shm/slurmrl-test-{m.stem}-{os.getpid()}").unlink(missing_ok=True)


@pytest.mark.cluster
def test_a_run_dirs_excluded_nodes_stay_out_of_its_next_jobs_and_again(slurm_debug2, tmp_path, fake_python):
    cluster = slurm_debug2
    env = {"SLURMRL_PROBE_TIMEOUT": "30", "SLURMRL_TEST_FAIL": "trainer"}
    r = cluster.slurmrl("render", str(ROOT / "recipes" / "sft-debug.toml"), "--set", f'python.executable="{fake_python}"',
                        "--set", 'slurm.exclude="n8"', cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "sft-debug"
    # what a job of this run dir recorded when n7 failed under it
    events.append(RunDir(run_dir).events, attempt_end.excluded_event(0, "1", "n7", "Slurm: Not responding", time.time()))
    jobs = []
    try:
        for how in (["submit", str(run_dir)], ["submit", "--again", str(run_dir)]):
            r = cluster.slurmrl(*how, cwd=tmp_path, env=env)
            assert r.returncode == 0, r.stdout + r.stderr
            assert "excluded node(s) n7" in r.stdout
            where = run_dir if len(how) == 2 else tmp_path / "runs" / "sft-debug-again-1"
            jobs.append(json.loads((where / "jobs.json").read_text())[-1]["job_id"])
            line = job_line(cluster, jobs[-1])
            assert "ExcNodeList=n[7-8]" in line or "ExcNodeList=n8,n7" in line, line  # the recipe's and the run's
            assert "excluded n7 since" in cluster.slurmrl("status", str(where), cwd=tmp_path).stdout
            wait_until(lambda: job_state(cluster, jobs[-1]) in ("FAILED", "COMPLETED", "CANCELLED"), 300, "the end", where)
            assert "Not responding" in attempts.excluded_nodes(where)["n7"]
    finally:
        for job_id in jobs:
            cancel_until_gone(cluster, job_id)


HOLDING = "import os, time\nprint(f'holding: pid {os.getpid()}', flush=True)\ntime.sleep(600)\n"


def holding_pid(log: Path) -> int | None:
    text = log.read_text() if log.exists() else ""
    found = [line.split("pid ")[1] for line in text.splitlines() if line.startswith("holding: pid ")]
    return int(found[-1]) if found else None


@pytest.mark.cluster
def test_a_sigbus_requeues_without_the_node_and_a_cancel_is_recorded_as_a_cancel(slurm_debug2, tmp_path, fake_python):
    """Attempt 0: the trainer (the real supervisor and guard around a program that holds) gets a real
    SIGBUS, by pid: a node fault, requeued without the node; attempt 1 is cancelled: a cancel."""
    cluster = slurm_debug2
    program = tmp_path / "hold.py"
    program.write_text(HOLDING)
    run_dir, job_id = submit_stand_in(cluster, tmp_path, "sft-debug", fake_python, ["slurm.cpus_per_node=2"],
                                      SLURMRL_TEST_RAISE="trainer", SLURMRL_TEST_PROGRAM=str(program))
    log = [run_dir / "logs" / f"attempt-{a}" / "trainer.0.log" for a in (0, 1)]
    try:
        wait_until(lambda: holding_pid(log[0]), 600, "the trainer", run_dir)
        node = cluster.run(["squeue", "-h", "-j", job_id, "-o", "%N"]).stdout.strip()
        os.kill(holding_pid(log[0]) or 0, signal.SIGBUS)
        wait_until(lambda: holding_pid(log[1]), 600, "attempt 1's trainer", run_dir)
        assert f"ExcNodeList={node}" in job_line(cluster, job_id)
        text = cluster.slurmrl("status", str(run_dir), cwd=tmp_path).stdout
        # slurm.max_requeues = 3: the node fault's requeue is one of them
        assert "(attempt 1, 2 requeue(s) left," in text.splitlines()[0], text
        assert f"attempt 0 ended: node ({node}), requeued: node(s) {node} bad" in text, text
        assert f"excluded {node} since" in text and "killed by the kernel for a hardware error (SIGBUS" in text, text
        assert cluster.slurmrl("cancel", str(run_dir), cwd=tmp_path).returncode == 0
        wait_until(lambda: len([e for e in events.read(RunDir(run_dir).events) if e.kind == "attempt_ended"]) == 2,
                   60, "the end recorded", run_dir)
    finally:
        cancel_until_gone(cluster, job_id)
    assert node not in (run_dir / "logs" / "attempt-1" / "phases").read_text()
    evs = events.read(RunDir(run_dir).events)
    ended = [(e.attempt, e.detail["class"], e.detail["requeued"], e.job_id) for e in evs if e.kind == "attempt_ended"]
    assert ended == [(0, "node", True, job_id), (1, "cancel", False, job_id)], evs
    assert [(e.kind, e.node) for e in evs if e.kind == "excluded"] == [("excluded", node)]
    assert "attempt 1 ended: cancel, not requeued: cancelled: got SIGTERM from Slurm" in cluster.slurmrl(
        "status", str(run_dir), cwd=tmp_path).stdout
