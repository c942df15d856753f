"""NVIDIA Dynamo on the local Slurm cluster: etcd (Debian's etcd-server), Dynamo's OpenAI frontend
and `dynamo.mocker` workers (ai-dynamo 1.4.2 in .venv-dynamo, from scripts/install.sh) on the
network-namespace nodes, from recipes/inference-dynamo-debug.toml.

Two jobs run at once and every check shares them: aggregated (two workers on n1/n2-like nodes) and
disaggregated (one prefill worker, two decode workers, two het groups). Both serve an OpenAI chat
completion, streamed and not, through the frontend (Dynamo's frontend has no API-key option, so
these recipes run with inference.auth = "none"); `slurmrl status` shows the frontend and the
model, `slurmrl logs` a component's log; a worker killed with SIGKILL leaves the job serving on the
other (the recipe's policy for workers: `--kill-on-bad-exit=0`, the job goes on); `slurmrl cancel`
ends both and no process of either job is left on any node. Last, leftovers of an earlier job
(a /dev/shm/moe_* file; GPU memory in use, reported by a stand-in nvidia-smi) fail a preflight
with a line naming the node and what is left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from dynamo_jobs import DYNAMO_PY, READY_S, RECIPE, Job, chat, mocker_setup, reachable

from slurmrl.rundir.ready import read_ready

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parent.parent
PD = ['name="inference-dynamo-debug-pd"', "inference.prefill={replicas=1}", "inference.decode={replicas=2, nodes=1}"]


def pd_recipe(cwd: Path) -> Path:
    """The recipe in P/D mode: [inference] loses its nodes (P/D sizes each role; a nodes left set would
    be a knob that does nothing, refused), prefill and decode come from PD."""
    text = RECIPE.read_text()
    aggregated = '[inference]\nbackend = "dynamo"\nnodes = 2\n'
    assert aggregated in text
    path = cwd / "inference-dynamo-debug-pd.toml"
    path.write_text(text.replace(aggregated, '[inference]\nbackend = "dynamo"\nmode = "pd"\n'))
    return path


def status(cluster, run_dir: Path, cwd: Path) -> dict:
    r = cluster.slurmrl("status", str(run_dir), "--json", cwd=cwd)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):
    cwd, common = mocker_setup(tmp_path_factory, "dynamo")
    started: dict[str, Job] = {}
    try:  # a submission that fails still cancels the jobs already submitted
        started["agg"] = Job(slurm_cluster, cwd, common)
        started["pd"] = Job(slurm_cluster, cwd, common + PD, pd_recipe(cwd))
        deadline = time.monotonic() + READY_S
        for job in started.values():
            job.wait_ready(deadline)
        yield started
    finally:
        for job in started.values():
            job.cancel()


def test_aggregated_job_serves_chat_through_the_frontend(slurm_cluster, jobs):
    job = jobs["agg"]
    st = status(slurm_cluster, job.run_dir, job.cwd)
    assert st["state"] == "RUNNING"
    assert st["serving"]["components"] == ["frontend"] and st["serving"]["router"] is True
    assert reachable(slurm_cluster, st["serving_url"]) == job.base and st["model"] == "tiny"
    assert st["secret_file"] is None  # the frontend cannot check the secret: said so, not pretended
    text = slurm_cluster.slurmrl("status", str(job.run_dir), cwd=job.cwd).stdout
    assert "(frontend)" in text and "model: tiny" in text and "auth: none" in text
    replies = [chat(job.base) for _ in range(4)]
    for reply in replies:
        assert reply["usage"]["completion_tokens"] == 8
        assert reply["choices"][0]["message"]["content"].strip()  # the mocker's tokens decode to text
    chunks = chat(job.base, stream=True)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks).strip()
    # both workers served (round robin), each request id in a worker's log
    ids = [r["id"].removeprefix("chatcmpl-") for r in replies]
    logs = [job.log("inference.0"), job.log("inference.1")]
    assert all(any(i in log for log in logs) for i in ids)
    assert all(any(i in log for i in ids) for log in logs)
    # the same namespace for every process of the job, its etcd data in the run dir
    assert (job.run_dir / "dynamo" / "etcd-attempt-0").is_dir()
    logs = slurm_cluster.slurmrl("logs", str(job.run_dir), "--component", "frontend", cwd=job.cwd)
    assert logs.returncode == 0 and "dynamo.frontend" in logs.stdout, logs.stdout[-2000:] + logs.stderr


def test_disaggregated_job_sends_every_request_to_prefill_and_decode(slurm_cluster, jobs):
    job = jobs["pd"]
    st = status(slurm_cluster, job.run_dir, job.cwd)
    assert [p["name"] for p in st["parts"]] == ["prefill", "decode"]
    assert {c["name"]: c["ready"] for c in st["components"]}["decode"] == [0, 1]
    reply = chat(job.base)
    assert reply["usage"]["completion_tokens"] == 8 and reply["choices"][0]["message"]["content"].strip()
    chunks = chat(job.base, stream=True)
    assert chunks and all(c["object"] == "chat.completion.chunk" for c in chunks)
    rid = reply["id"].removeprefix("chatcmpl-")
    assert rid in job.log("prefill.0")
    assert rid in job.log("decode.0") + job.log("decode.1")


def test_a_killed_worker_leaves_the_job_serving(slurm_cluster, jobs):
    job = jobs["agg"]
    _, _, pid = read_ready(job.ready_dir() / "inference.1")
    os.kill(pid, signal.SIGKILL)
    # its lease expires (ETCD_LEASE_TTL=5 in the recipe) and the frontend drops it
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{job.base}/health", timeout=10) as r:
            alive = {i["instance_id"] for i in json.loads(r.read())["instances"] if i["endpoint"] == "generate"}
        if len(alive) == 1:
            break
        time.sleep(1)
    assert len(alive) == 1
    for _ in range(4):
        assert chat(job.base)["usage"]["completion_tokens"] == 8
    st = status(slurm_cluster, job.run_dir, job.cwd)
    assert st["state"] == "RUNNING" and not st["failed"]


def test_cancel_ends_every_process_of_both_jobs(slurm_cluster, jobs):
    for job in jobs.values():
        r = job.cancel()
        assert r.returncode == 0 and "CANCELLED" in r.stdout, r.stdout + r.stderr
    for job in jobs.values():
        left = slurm_cluster.wait_no_job_processes(job.job_id)
        assert not left, f"job {job.job_id} left:\n" + "\n".join(left)
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{job.base}/health", timeout=5)


def test_leftovers_of_an_earlier_job_fail_preflight_naming_the_node(slurm_cluster, tmp_path, jobs):
    """After the jobs above (their nodes are free again). The stand-in nvidia-smi (a test double:
    no GPU here) reports GPU 1 with 40000 MiB in use; the job's PATH reaches its steps."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text('#!/bin/bash\necho "0, 3"\necho "1, 40000"\n')
    (fake / "nvidia-smi").chmod(0o755)
    leftover = Path(f"/dev/shm/moe_slurmrl_test_{os.getpid()}")
    leftover.write_text("")
    try:
        r = slurm_cluster.slurmrl(
            "submit", "--preflight", str(RECIPE), "--set", f'python.executable="{DYNAMO_PY}"', "--timeout", "600",
            cwd=tmp_path, env={"PATH": f"{fake}:{os.environ['PATH']}"}, timeout=700)
    finally:
        leftover.unlink()
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(x for x in r.stdout.splitlines() if "leftovers of an earlier job" in x)
    assert line.startswith("preflight FAILED: job ")
    named = re.findall(rf"(n\d): 1 file\(s\) {leftover};GPU 1: 40000 MiB in use", line)
    assert len(set(named)) == 2, line  # both nodes of the job, each named with what is left on it
