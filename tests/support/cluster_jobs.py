"""Waiting on and reading the local cluster's jobs: their state, their run dirs' JSON lines, their status, the
nodes' addresses, and the servers they run; shared by the cluster tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import psutil

from slurmrl.contract import events
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready
from slurmrl.runtime.orchestrator.loop import latest_weights, written_batches


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def wait_until(predicate, timeout: float, what: str, run_dir: Path, poll: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll)
    logs = sorted((run_dir / "logs").rglob("*.log"))
    tail = "\n".join(f"== {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:]) for p in logs[-6:])
    raise AssertionError(f"timed out waiting for {what}\n{tail}")


def job_state(cluster, job_id: str) -> str:
    r = cluster.run(["sacct", "-X", "-n", "-P", "-o", "State", "-j", job_id])
    return r.stdout.split()[0] if r.stdout.split() else "UNKNOWN"


def requeue_and_complete(cluster, job_id: str, run_dir: Path, cwd: Path) -> None:
    """`scontrol requeue` the running job, wait for its second attempt, then for it to end COMPLETED. An RL job's
    orchestrator is held (``paused``) until the requeue is sent: its trainer, at most the off-policy bound behind,
    cannot finish every step first, however fast its steps are (in CI one did 6 steps between a poll and the
    requeue, and its second attempt had nothing to do)."""
    rl = (run_dir / "components" / "orchestrator.toml").exists()
    with paused(run_dir, "orchestrator") if rl else contextlib.nullcontext():
        rq = cluster.run(["scontrol", "requeue", job_id])
    assert rq.returncode == 0, rq.stderr
    wait_until(lambda: (run_dir / "logs" / "attempt-1").exists(), 300, "the second attempt", run_dir)
    wait_until(lambda: job_state(cluster, job_id) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"),
               1200, "the job to end", run_dir)
    logs = cluster.slurmrl("logs", str(run_dir), cwd=cwd).stdout[-4000:]
    assert job_state(cluster, job_id) == "COMPLETED", logs


def node_address(cluster, host: str) -> str:
    """The cluster's hosts file maps n1..n4 to addresses inside its network namespaces."""
    for line in (cluster.state_dir / "etc" / "hosts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and host in parts[1:]:
            return parts[0]
    raise KeyError(host)


def status(cluster, run_dir, cwd) -> dict:
    r = cluster.slurmrl("status", str(run_dir), "--json", cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def wait(predicate, what: str, timeout: float, run_dir: Path):
    deadline = time.monotonic() + timeout
    failed = RunDir(run_dir).failed_file(0)
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        assert not failed.exists(), f"the job failed while waiting for {what}: {failed.read_text()}"
        time.sleep(2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def server_pid(run_dir: Path, task: int, not_pid: int | None = None) -> int | None:
    """The pid of inference.<task>'s vLLM API server once its ready file says it is ready (not ``not_pid``)."""
    path = RunDir(run_dir).ready_file(0, "inference", task)
    if not path.exists():
        return None
    _, _, pid = read_ready(path)
    return pid if pid and pid != not_pid else None


def kill_engine(pid: int) -> str:
    """SIGKILL a vLLM server's engine (``pid``: its API server, from its ready file): its EngineCore process
    (vLLM V1), else the API server itself. Returns what was killed, in words."""
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                child.kill()
                return f"EngineCore (pid {child.pid})"
        except psutil.NoSuchProcess:
            continue
    os.kill(pid, signal.SIGKILL)
    return f"the API server (pid {pid})"


@contextlib.contextmanager
def paused(run_dir: Path, component: str):
    """The job's ``component`` (``python -m slurmrl.runtime.<component> --config RUN_DIR/components/<component>.toml``,
    found by its command line, never by name alone) stopped with SIGSTOP for the block, then SIGCONT: the test holds
    the job at a point whatever the machine's speed (fast steps must not end it before a server is back)."""
    config = (run_dir / "components" / f"{component}.toml").resolve()
    procs = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "-m" in cmd and cmd[cmd.index("-m") + 1:cmd.index("-m") + 2] == [f"slurmrl.runtime.{component}"] \
                and "--config" in cmd[:-1] and Path(cmd[cmd.index("--config") + 1]).resolve() == config:
            procs.append(p)
    assert procs, f"no {component} process of {run_dir} to pause"
    for p in procs:
        p.send_signal(signal.SIGSTOP)
    try:
        yield procs
    finally:
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGCONT)


def kill_server_and_hold_until_back(run_dir: Path, task: int, between_updates: bool = False) -> None:
    """SIGKILL inference.<task>'s engine (of a job with two servers); once the orchestrator has declared it dead
    and made a batch on the survivor alone (it routes around it), hold the orchestrator until the supervisor's
    restart of the server is ready, so that the job cannot end before the server is back, however fast its
    steps are (a trainer step of 0.1 s ran 36 steps within a vLLM restart). Readmitting it is then the
    orchestrator's, after this returns."""
    old = server_pid(run_dir, task)
    assert old, f"inference.{task} is not ready"
    if between_updates:  # a broadcast job: a death while weights are on the wire still fails it (docs/rl.md)
        def sent_all() -> bool:  # the orchestrator's own readers: the newest READY step, the batches written
            sent = latest_weights(run_dir)[0]
            return sent > 0 and sent >= written_batches(run_dir)

        with paused(run_dir, "orchestrator"):  # no new batch: the trainer sends the last one's weights, then waits
            wait_until(sent_all, 300, "the trainer to send every batch's weights", run_dir, poll=0.25)
            kill_engine(old)
    else:
        kill_engine(old)
    wait_until(lambda: ("dead", task) in [(e.kind, e.task) for e in events.read(RunDir(run_dir).events)], 300,
               f"the orchestrator to declare inference.{task} dead", run_dir, poll=0.25)
    rows = RunDir(run_dir).metrics("orchestrator")
    wait_until(lambda: any(r["servers_live"] == 1 for r in lines(rows)), 300, "a batch on the survivor alone", run_dir,
               poll=0.25)
    with paused(run_dir, "orchestrator"):
        wait_until(lambda: server_pid(run_dir, task, not_pid=old), 900, f"inference.{task} restarted and ready", run_dir)
