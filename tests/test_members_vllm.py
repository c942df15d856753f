"""The orchestrator program over two real vLLM (CPU build) servers on loopback, with a stand-in trainer that
publishes real weights (the tiny model's safetensors): one server is SIGKILLed after the first batch and
restarted in place (same port) two steps later. The job's steps all complete with whole groups, the
weight updates skip the dead server, the restarted one reloads the newest weights before its first
rollout request (its own access log shows the order) and then takes rollouts; the events say so."""

from __future__ import annotations

import json
import re
import shutil
import threading
from pathlib import Path

import pytest
from member_servers import GROUPS, N, orchestrate, prepare, until
from orchestrator_servers import kill_tree, serve, stop, wait_health
from supervised_processes import free_port

from slurmrl.contract import events
from slurmrl.rundir.paths import RunDir

ACCESS = re.compile(r'"(POST|GET) (/[a-z_/0-9]+)[^"]*" 200')


def publish_weights(run_dir: Path, model: Path, step: int) -> None:
    out = run_dir / "weights" / f"step-{step:06d}"
    shutil.copytree(model, out)
    (out / "READY").write_text("")


def routes(log: Path) -> list[str]:
    """The routes a vLLM server answered 200, in order (uvicorn's access log)."""
    return [m.group(2) for m in ACCESS.finditer(log.read_text(errors="replace"))]


@pytest.mark.vllm
def test_real_servers_one_killed_and_restarted_in_place(job_secret, tmp_path):
    run_dir, config = prepare(tmp_path, max_steps=4, max_off_policy_steps=0)
    model = tmp_path / "tiny"
    logs = tmp_path / "logs"
    logs.mkdir()
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs = [serve(model, p, logs / f"server{i}.log") for i, p in enumerate(ports)]
    problems: list[str] = []

    def trainer() -> None:  # stand-in: real weights after each batch; kills server 1, restarts it in place
        try:
            for n in range(1, 4):
                until(lambda: (run_dir / "rollouts" / f"step-{n:06d}.json").exists(), f"batch {n}", 600)
                if n == 1:
                    kill_tree(procs[1])  # SIGKILL: its engine and API server go at once
                if n == 2:
                    procs.append(serve(model, ports[1], logs / "server1-again.log"))
                    wait_health(urls[1], procs[-1], logs / "server1-again.log")
                    until(lambda: any("answers again" in x for x in log_lines()), "the probes to see it", 60)
                publish_weights(run_dir, model, n)
        except AssertionError as e:
            problems.append(str(e))

    def log_lines() -> list[str]:
        return (tmp_path / "orchestrator.out").read_text().splitlines() if (tmp_path / "orchestrator.out").exists() \
            else []

    try:
        for i, p in enumerate(procs):
            wait_health(urls[i], p, logs / f"server{i}.log")
        t = threading.Thread(target=trainer, daemon=True)
        t.start()
        p = orchestrate(run_dir, config, urls, 900, out=tmp_path / "orchestrator.out")
        t.join(60)
        out = (tmp_path / "orchestrator.out").read_text()
        assert p.returncode == 0 and not problems, (problems, out[-4000:])
    finally:
        for proc in procs:
            stop(proc)
    batches = [json.loads((run_dir / "rollouts" / f"step-{n:06d}.json").read_text()) for n in range(1, 5)]
    assert [len(x["samples"]) for x in batches] == [GROUPS * N] * 4
    assert [x["policy_step"] for x in batches] == [0, 1, 2, 3]
    rows = [json.loads(x) for x in (run_dir / "metrics" / "orchestrator.jsonl").read_text().splitlines()]
    served = [{k[len("served/"):]: v for k, v in r.items() if k.startswith("served/")} for r in rows]
    assert [sum(x.values()) for x in served] == [GROUPS * N] * 4
    assert set(served[1]) == {urls[0]} and served[3].get(urls[1], 0) > 0
    again = routes(logs / "server1-again.log")
    first = again.index("/v1/completions")
    assert "/collective_rpc" in again[:first] and again.index("/resume") < first, again
    got = events.read(RunDir(run_dir).events)
    assert [(e.kind, e.task) for e in got] == [("dead", 1), ("readmitted", 1)]
