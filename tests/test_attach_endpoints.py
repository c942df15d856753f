"""Operating a running job on the real local Slurm cluster: where it serves (`status` and
`status --json`: endpoints, serving URL, model, the secret's path), its start-up phases, and
`slurmrl attach` into a component's node and container.

Two jobs, each shared by the tests of this module (module-scoped fixtures, cancelled at the end):
- inference-debug (a plain job: two servers on two nodes, vllm-router in front) with a Pyxis
  container (tests/support/pyxis_double applies its mounts and workdir) and a container name; the
  servers are tests/support/ok_server.py, put in place of the vLLM program in job.sbatch with vLLM's
  flags left on its command line (ok_server reads only the port), so the script still runs the
  servers with the job's auth middleware as far as `status` can tell;
- rl-debug (a het job: trainer + orchestrator in group 0, inference in group 1) with the stand-in
  python of test_status_logs_cancel.py (the probe in place of each component; the trainer holds).
The last test cancels the het job and checks what `status` and `attach` say about an ended job.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from pathlib import Path

import pytest
from polling import wait_for
from status_jobs import FAKE_PYTHON

from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready
from slurmrl.secret import headers

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parent.parent
UP_TIMEOUT_S = 240  # the cluster is shared: a job may wait for nodes
CONTAINER_NAME = "attach-test"
VLLM_PROGRAM = re.compile(r"\S+ -m vllm\.entrypoints\.openai\.api_server \\\n")


def status_json(cluster, run_dir: Path) -> dict:
    r = cluster.slurmrl("status", str(run_dir), "--json", cwd=run_dir.parent)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def job_id_of(run_dir: Path) -> str:
    return str(json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"])


def hosts_of(cluster, nodelist: str) -> list[str]:
    return cluster.run(["scontrol", "show", "hostnames", nodelist]).stdout.split()


def reachable(cluster, url: str) -> str:
    """``url`` with its node name replaced by the node's address: node names resolve inside the
    cluster's network namespaces (its hosts file), not on this machine."""
    host = url.split("//")[1].split(":")[0]
    for line in (cluster.state_dir / "etc" / "hosts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and host in parts[1:]:
            return url.replace(f"//{host}:", f"//{parts[0]}:")
    raise KeyError(host)


def attach(cluster, run_dir: Path, *args: str):
    return cluster.slurmrl("attach", str(run_dir), *args, cwd=run_dir.parent, timeout=60)


@pytest.fixture(scope="module")
def serving_job(slurm_cluster, tmp_path_factory):
    """inference-debug, servers and router ready: (run dir, status --json)."""
    tmp = tmp_path_factory.mktemp("serving")
    r = slurm_cluster.slurmrl(
        "render", str(ROOT / "recipes" / "inference-debug.toml"),
        "--set", f'python.executable="{sys.executable}"', "--set", "slurm.grace_seconds=3",
        "--set", 'container.image="/images/attach-test.sqsh"', "--set", f'container.name="{CONTAINER_NAME}"',
        "--set", 'container.workdir="/tmp"', cwd=tmp,
    )
    assert r.returncode == 0, r.stderr
    run_dir = tmp / "runs" / "inference-debug"
    script = run_dir / "job.sbatch"
    text, n = VLLM_PROGRAM.subn(rf'{sys.executable} {ROOT}/tests/support/ok_server.py "${{port}}" \\\n', script.read_text())
    assert n == 1, "no vLLM command line in the script"
    script.write_text(text)
    r = slurm_cluster.slurmrl("submit", str(run_dir), cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = job_id_of(run_dir)
    try:
        def up():
            assert not RunDir(run_dir).failed_file(0).exists(), RunDir(run_dir).failed_file(0).read_text()
            rep = status_json(slurm_cluster, run_dir)
            up = "all components ready" in [p["what"] for p in rep["phases"]]
            return rep if rep["state"] == "RUNNING" and up else None

        yield run_dir, wait_for(up, "the router to be ready", UP_TIMEOUT_S)
    finally:
        slurm_cluster.run(["scancel", job_id])


@pytest.fixture(scope="module")
def het_job(slurm_cluster, tmp_path_factory):
    """rl-debug as a het job whose trainer holds: (run dir, status --json once all is ready)."""
    tmp = tmp_path_factory.mktemp("het")
    fake = tmp / "fake-python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    r = slurm_cluster.slurmrl("submit", str(ROOT / "recipes" / "rl-debug.toml"),
                              "--set", f'python.executable="{fake}"', "--set", "slurm.grace_seconds=3",
                              cwd=tmp, env={"SLURMRL_PROBE_TIMEOUT": "30", "SLURMRL_TEST_HOLD": "trainer"})
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp / "runs" / "rl-debug"
    job_id = job_id_of(run_dir)
    try:
        def up():
            assert not RunDir(run_dir).failed_file(0).exists(), RunDir(run_dir).failed_file(0).read_text()
            rep = status_json(slurm_cluster, run_dir)
            comps = {c["name"]: c for c in rep["components"]}
            ok = (rep["state"] == "RUNNING" and len(rep["parts"]) == 2 and all(p["nodes"] for p in rep["parts"])
                  and comps["trainer"]["ready"] == [0] and comps["inference"]["ready"] == [0]
                  and "all components ready" in [p["what"] for p in rep["phases"]])
            return rep if ok else None

        yield run_dir, wait_for(up, "the het job to be up", UP_TIMEOUT_S)
    finally:
        slurm_cluster.run(["scancel", job_id])


# ---- where the job serves, and its phases ----------------------------------------------------------

def test_status_prints_the_router_url_model_and_secret_path_first(slurm_cluster, serving_job):
    run_dir, rep = serving_job
    router = read_ready(RunDir(run_dir).ready_file(0, "router", 0))[0]
    r = slurm_cluster.slurmrl("status", str(run_dir), cwd=run_dir.parent)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"job {rep['job_id']}: RUNNING")
    # right under the job's state: the router's URL (not the servers'), the model, the secret's path
    assert lines[1] == f"serving: {router} (router)   model: tiny-model", r.stdout
    secret = run_dir / "secret"
    assert f"the secret is in {secret}" in lines[2]
    assert lines[3].startswith("  try:  curl -H")
    assert f"$(cat {secret})" in lines[3] and f"{router}/v1/models" in lines[3]
    assert secret.read_text().strip() not in r.stdout  # the path, never the secret
    # the servers' own URLs are not offered as the serving URL when there is a router
    servers = [read_ready(f)[0] for f in RunDir(run_dir).ready_tasks(0, "inference").values()]
    assert not any(s in ln for s in servers for ln in lines[1:4])

    # the phases of the current attempt, each with its clock time and seconds since allocation
    at = lines.index("  phases of attempt 0 (time, seconds since allocation):")
    phases = [ln.split(None, 2) for ln in lines[at + 1:] if re.match(r"    \d\d:\d\d:\d\d ", ln)]
    assert phases[0][1] == "+0s" and phases[0][2].startswith(f"allocation: job {rep['job_id']} attempt 0")
    whats = [p[2] for p in phases]
    assert any(w.startswith("ports from ") for w in whats)
    assert any(w.startswith("inference ready (2 task(s)") for w in whats)
    assert f"router ready (1 task(s): {router})" in whats and "all components ready" in whats
    assert all(re.fullmatch(r"\+\d+s", p[1]) for p in phases)


def test_status_json_has_endpoints_serving_url_model_and_phases(slurm_cluster, serving_job):
    run_dir, rep = serving_job
    ready = {(c, t): read_ready(f)[0] for c in ("inference", "router")
             for t, f in RunDir(run_dir).ready_tasks(0, c).items()}
    assert sorted(ready) == [("inference", 0), ("inference", 1), ("router", 0)]
    assert rep["endpoints"] == [{"component": c, "task": t, "url": u} for (c, t), u in ready.items()]
    assert rep["serving_url"] == ready[("router", 0)]
    assert rep["model"] == "tiny-model"
    assert rep["secret_file"] == str(run_dir / "secret")
    phases = rep["phases"]
    assert phases[0]["since_allocation"] == 0 and phases[0]["what"].startswith("allocation: ")
    assert [p["time"] for p in phases] == sorted(p["time"] for p in phases)
    assert all(p["since_allocation"] == p["time"] - phases[0]["time"] for p in phases)
    assert "all components ready" in [p["what"] for p in phases]
    # the serving URL answers with the secret from the path status gives
    url = reachable(slurm_cluster, rep["serving_url"])
    req = urllib.request.Request(f"{url}/v1/models", headers=headers(rep["secret_file"]))
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def test_status_of_a_job_without_a_router_serves_at_each_server(slurm_cluster, het_job):
    run_dir, rep = het_job
    server = read_ready(RunDir(run_dir).ready_file(0, "inference", 0))[0]
    assert rep["endpoints"] == [{"component": "inference", "task": 0, "url": server}]
    assert rep["serving_url"] == server and rep["serving"]["router"] is False
    r = slurm_cluster.slurmrl("status", str(run_dir), cwd=run_dir.parent)
    assert r.stdout.splitlines()[1].startswith(f"serving: {server} (inference, no router)"), r.stdout


# ---- attach -----------------------------------------------------------------------------------------

def test_attach_runs_on_the_components_node(slurm_cluster, serving_job):
    run_dir, rep = serving_job
    hosts = hosts_of(slurm_cluster, rep["parts"][0]["nodes"])
    assert len(hosts) == 2
    r = attach(slurm_cluster, run_dir, "inference", "--node", "1", "--", "hostname")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == hosts[1]  # n2 when the job got n1 and n2
    assert f"inference node 1 on {hosts[1]}: srun --overlap --jobid={rep['job_id']} --nodes=1 -w {hosts[1]}" in r.stderr
    # --task: the host the task's ready file names
    url = read_ready(RunDir(run_dir).ready_file(0, "inference", 1))[0]
    r = attach(slurm_cluster, run_dir, "inference", "--task", "1", "--", "hostname")
    assert r.returncode == 0 and r.stdout.strip() == url.split("//")[1].split(":")[0] == hosts[1]
    # default: the component's first node
    r = attach(slurm_cluster, run_dir, "router", "--", "hostname")
    assert r.returncode == 0 and r.stdout.strip() == hosts[0]


def test_attach_runs_inside_the_job_and_its_container(slurm_cluster, serving_job):
    run_dir, rep = serving_job
    r = attach(slurm_cluster, run_dir, "inference", "--node", "1", "--", "cat", "/proc/self/environ")
    assert r.returncode == 0, r.stderr
    env = dict(kv.split("=", 1) for kv in r.stdout.split("\0") if "=" in kv)
    assert env["SLURM_JOB_ID"] == rep["job_id"]
    assert env["SLURM_JOB_NAME"] == "attach"  # a step of its own, named so in squeue and sacct
    assert "SLURMRL_PYXIS_TEST_DOUBLE" in env  # the Pyxis flags reached the step
    # the container's workdir, and the container name, so Pyxis joins the running container
    r = attach(slurm_cluster, run_dir, "inference", "--node", "1", "--", "pwd")
    assert r.returncode == 0 and r.stdout.strip() == "/tmp"
    log = (slurm_cluster.state_dir / "log" / "pyxis_double.log").read_text()
    host = hosts_of(slurm_cluster, rep["parts"][0]["nodes"])[1]
    assert (f"ctx=remote host={host} job={rep['job_id']} step={env['SLURM_STEP_ID']} "
            f"--container-name={CONTAINER_NAME}") in log


def test_attach_into_each_group_of_a_het_job(slurm_cluster, het_job):
    run_dir, rep = het_job
    groups = {p["name"]: hosts_of(slurm_cluster, p["nodes"]) for p in rep["parts"]}
    for component, group, hosts in (("trainer", 0, groups["trainer"]), ("inference", 1, groups["inference"])):
        r = attach(slurm_cluster, run_dir, component, "--", "bash", "-c", 'echo "$(hostname) ${SLURM_JOB_ID}"')
        assert r.returncode == 0, r.stderr
        # the leader's job id with --het-group: Slurm 22.05 refuses a het component's own id
        assert f"--jobid={rep['job_id']} --het-group={group} " in r.stderr
        assert r.stdout.split() == [hosts[0], rep["job_id"]]


def test_attach_errors_are_one_line(slurm_cluster, serving_job):
    run_dir, _ = serving_job
    for args, message in (
        (["nosuch", "--", "hostname"], "nosuch: no such component in this job; it has: inference, router"),
        (["inference", "--node", "2", "--", "hostname"], "--node: inference runs on 2 node(s): --node is 0-1, not 2"),
        (["router", "--node", "1", "--", "hostname"], "--node: router runs on 1 node(s): --node is 0, not 1"),
        (["inference", "--task", "5", "--", "hostname"], "--task: inference has no task 5 (its tasks: 0-1)"),
        (["inference", "--nodes", "1", "--", "hostname"], "--nodes: unknown option"),
    ):
        r = attach(slurm_cluster, run_dir, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"slurmrl: error: {message}"), r.stderr


def test_an_ended_job_has_no_endpoints_and_cannot_be_attached(slurm_cluster, het_job):
    """Runs last: it cancels the shared het job."""
    run_dir, rep = het_job
    r = slurm_cluster.slurmrl("cancel", str(run_dir), cwd=run_dir.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    after = status_json(slurm_cluster, run_dir)
    assert after["done"] and after["endpoints"] == [] and after["serving_url"] is None
    assert after["phases"] == rep["phases"] or after["phases"][: len(rep["phases"])] == rep["phases"]
    text = slurm_cluster.slurmrl("status", str(run_dir), cwd=run_dir.parent).stdout
    assert "serving:" not in text and "phases of attempt 0" in text
    r = attach(slurm_cluster, run_dir, "trainer", "--", "hostname")
    assert r.returncode == 2
    assert r.stderr == f"slurmrl: error: job {rep['job_id']} has ended ({after['state']}); attach needs a running job\n"
