"""Preflight: `slurmrl submit --preflight` on the real local cluster, and the report checker.

Every recipe that fits the local cluster (4 nodes x 4 GPUs x 8 CPUs, partition debug) passes
preflight, and the probes' hosts, GPU positions and ports equal plan.json (checked here again,
independently of the checker). One recipe gets a container image so the Pyxis flags are checked
through the Pyxis test double.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmrl.app import preflight
from slurmrl.app.build import build
from slurmrl.contract.probe_report import ContainerObservation, ProbeReport
from slurmrl.plan import Plan
from slurmrl.rundir.paths import RunDir

ROOT = Path(__file__).resolve().parent.parent
PY_OVERRIDE = f'python.executable="{sys.executable}"'
PROBE_ENV = {"SLURMRL_PROBE_TIMEOUT": "30"}  # a missing peer fails in 30 s, not 300
CLUSTER = {"nodes": 4, "gpus": 4, "cpus": 8, "partitions": (None, "debug")}
IMAGE = "/images/probe.sqsh"


def fits_local_cluster(recipe: Path) -> bool:
    plan = build(recipe, [], preflight=True).plan
    for g in plan.groups:
        partition = next((d.value for d in g.directives if d.option == "--partition"), None)
        if (g.nodes > CLUSTER["nodes"] or g.gpus_per_node > CLUSTER["gpus"] or g.cpus_per_node > CLUSTER["cpus"]
                or partition not in CLUSTER["partitions"]):
            return False
    return True


FITTING = [p for p in sorted((ROOT / "recipes").glob("*.toml")) if fits_local_cluster(p)]


def test_the_debug_recipes_fit():
    names = {p.stem for p in FITTING}
    assert {"rl-debug", "inference-debug"} <= names, names


def slurmrl(cluster, *args: str, cwd: Path, env: dict | None = None, timeout: float = 240):
    return cluster.slurmrl(*args, cwd=cwd, env={**PROBE_ENV, **(env or {})}, timeout=timeout)


def hostnames(cluster, nodelist: str) -> list[str]:
    return cluster.run(["scontrol", "show", "hostnames", nodelist]).stdout.split()


def sacct_nodes(cluster, job_id: str, groups: int, timeout: float = 30) -> dict[int, list[str]]:
    """Hostnames per het group, straight from sacct (independent of slurmrl's watcher). Asks again
    until every group has a row with nodes: slurmdbd can lag the end of a het job by seconds
    (one ``<id>`` row, or ``None assigned``)."""
    deadline = time.monotonic() + timeout
    while True:
        out = cluster.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,NodeList"]).stdout
        found = {}
        for line in out.splitlines():
            jid, nodelist = line.split("|")
            group = int(jid.split("+")[1]) if "+" in jid else 0
            if nodelist and nodelist != "None assigned":
                found[group] = hostnames(cluster, nodelist)
        if set(found) >= set(range(groups)) or time.monotonic() > deadline:
            return found
        time.sleep(1)


@pytest.mark.cluster
@pytest.mark.parametrize("recipe", FITTING, ids=[p.stem for p in FITTING])
def test_preflight_matches_plan(slurm_cluster, tmp_path, recipe):
    overrides = ["--set", PY_OVERRIDE]
    with_container = recipe.stem == "rl-debug"
    if with_container:
        overrides += ["--set", f'container.image="{IMAGE}"']
    planned_recipe = build(recipe, []).recipe
    dataset = planned_recipe.trainer.dataset if planned_recipe.kind == "sft" else None
    if dataset and not Path(dataset).is_absolute():  # the trainer's probe looks for it where the job starts
        (tmp_path / dataset).write_text('{"prompt": "1+1=", "completion": "2"}\n')
    r = slurmrl(slurm_cluster, "submit", "--preflight", str(recipe), *overrides, "--timeout", "180", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "preflight ok" in r.stdout

    run_dir = tmp_path / "runs" / f"{build(recipe, []).recipe.name}-preflight"
    plan = Plan.model_validate_json((run_dir / "plan.json").read_text())
    job_id = str(json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"])
    hosts = sacct_nodes(slurm_cluster, job_id, len(plan.groups))
    reports = {}
    for f in (run_dir / "preflight").glob("*.json"):
        rep = json.loads(f.read_text())
        reports[(rep["component"], rep["rank"])] = rep
    expected = {(c.name, i.rank) for c in plan.components for i in c.instances}
    assert set(reports) == expected
    for c in plan.components:
        for inst in c.instances:
            rep = reports[(c.name, inst.rank)]
            assert rep["errors"] == []
            assert rep["env"]["SLURM_JOB_ID"] == job_id
            assert rep["host"] == hosts[c.group][c.first_node + inst.node], (c.name, inst.rank)
            # the allocation Slurm gave the step (preflight's fallback when sacct lags) is sacct's
            assert {int(g): hostnames(slurm_cluster, n) for g, n in rep["allocation"].items()} == hosts, (
                c.name, inst.rank)
            assert rep["gpu_positions"] == list(inst.gpus)
            assert len(rep["gpus"]) == len(inst.gpus)
            base = int(rep["env"]["SLURMRL_PORT_BASE"])
            assert rep["ports"] == {purpose: base + plan.ports[name] for purpose, name in inst.ports.items()}
            seen = rep["container"]  # slurmrl.runtime.steps.container.observe() in the step
            if with_container:  # the Pyxis test double: its marker, the run dir mounted, cwd / (no workdir)
                assert seen["test_double"] and seen["mounts"].get(str(run_dir)) == "rw" and seen["cwd"] == "/", seen
            else:
                assert not seen["test_double"] and not seen["enroot_lock"], seen
    # the table names every probe, and what it saw of the container
    for c in plan.components:
        assert c.name in r.stdout
    assert ("test double /:rw mounts 1/1" in r.stdout) == with_container


@pytest.mark.cluster
def test_preflight_names_a_component_without_its_container_flags(slurm_cluster, tmp_path):
    """A hand edit drops the container flags from one srun: submitted as is, preflight says which."""
    r = slurmrl(slurm_cluster, "submit", "--preflight", str(ROOT / "recipes/rl-debug.toml"), "--set", PY_OVERRIDE,
                "--set", f'container.image="{IMAGE}"', "--timeout", "180", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp_path / "runs" / "rl-debug-preflight"
    script = run_dir / "job.sbatch"
    text = script.read_text()
    launch = next(line for line in text.splitlines() if line.startswith("launch orchestrator "))
    flags = text.index('"${CONTAINER[@]}"', text.index(launch))
    script.write_text(text[:flags] + text[flags + len('"${CONTAINER[@]}"'):])

    r = slurmrl(slurm_cluster, "submit", "--preflight", str(run_dir), "--timeout", "180", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "edited by hand" in r.stdout
    assert "preflight FAILED: orchestrator.0: container flags missing" in r.stdout
    assert "preflight FAILED: trainer" not in r.stdout and "preflight FAILED: inference" not in r.stdout
    jobs = json.loads((run_dir / "jobs.json").read_text())
    assert [j["edited"] for j in jobs] == [False, True]
    # the first job's reports were set aside, not mixed with the second's
    assert (run_dir / "logs" / f"job-{jobs[0]['job_id']}" / "preflight").is_dir()


# ---- the checker on made-up reports (no cluster) ------------------------------------------

def _reports(run_dir: Path, plan: Plan, hosts: dict[int, list[str]], job_id: str = "7", base: int = 20000):
    (run_dir / "preflight").mkdir(parents=True)
    for c in plan.components:
        for inst in c.instances:
            rep = ProbeReport(  # as the probe writes it (slurmrl.runtime.steps.probe), outside any container
                component=c.name, rank=inst.rank, host=hosts[c.group][c.first_node + inst.node],
                node=inst.node, local=inst.local, gpus_seen=(), gpus=tuple(str(g) for g in inst.gpus),
                gpu_positions=inst.gpus, ports={p: base + plan.ports[n] for p, n in inst.ports.items()},
                container=ContainerObservation(enroot_lock=False, readonly_root=False, uid=1000, gid=1000),
                env={"SLURM_JOB_ID": job_id, "SLURMRL_PORT_BASE": str(base)}, allocation={}, errors=(), fabric=None)
            RunDir(run_dir).preflight_report(c.name, inst.rank).write_text(rep.dumps(indent=1))


@pytest.fixture
def rl_debug(tmp_path):
    out = build(ROOT / "recipes/rl-debug.toml", [PY_OVERRIDE], run_dir=tmp_path / "run", preflight=True)
    hosts = {0: ["n3"], 1: ["n1"]}
    _reports(out.run_dir, out.plan, hosts)
    return out.run_dir, out.plan, hosts


def problems(rows) -> dict[str, list[str]]:
    return {f"{r.component}.{r.rank}": r.problems for r in rows if r.problems}


def test_checker_accepts_matching_reports(rl_debug):
    run_dir, plan, hosts = rl_debug
    assert problems(preflight.check(run_dir, plan, "7", hosts)) == {}


def test_checker_names_each_mismatch(rl_debug):
    run_dir, plan, hosts = rl_debug
    (run_dir / "preflight" / "orchestrator.0.json").unlink()
    inf = json.loads((run_dir / "preflight" / "inference.0.json").read_text())
    inf["host"] = "n2"
    inf["gpus"] = ["0", "1"]
    inf["errors"] = ["port 20016 (http) cannot be bound: Address already in use"]
    (run_dir / "preflight" / "inference.0.json").write_text(json.dumps(inf))
    tr = json.loads((run_dir / "preflight" / "trainer.0.json").read_text())
    tr["ports"] = {"rdzv": 1}
    tr["env"]["SLURM_JOB_ID"] = "6"
    (run_dir / "preflight" / "trainer.0.json").write_text(json.dumps(tr))
    found = problems(preflight.check(run_dir, plan, "7", hosts))
    assert set(found) == {"orchestrator.0", "inference.0", "trainer.0"}
    assert "no report" in found["orchestrator.0"][0]
    # a report that breaks the contract: its row names the file and the key, in one line
    tr["ports"] = {"rdzv": "1"}
    (run_dir / "preflight" / "trainer.0.json").write_text(json.dumps(tr))
    (run_dir / "preflight" / "orchestrator.0.json").write_text("{")
    found = problems(preflight.check(run_dir, plan, "7", hosts))
    assert found["trainer.0"] == [f"unreadable report: {run_dir}/preflight/trainer.0.json: key 'ports.rdzv' must be "
                                  "a whole number, got str"]
    assert found["orchestrator.0"][0].startswith(f"unreadable report: {run_dir}/preflight/orchestrator.0.json: "
                                                 "not JSON: ")
    assert all("\n" not in p for p in found["trainer.0"] + found["orchestrator.0"])
    tr["ports"] = {"rdzv": 1}
    (run_dir / "preflight" / "trainer.0.json").write_text(json.dumps(tr))
    (run_dir / "preflight" / "orchestrator.0.json").unlink()
    found = problems(preflight.check(run_dir, plan, "7", hosts))
    text = " | ".join(found["inference.0"])
    assert "runs on n2, planned n1" in text and "sees 2 GPU(s)" in text and "Address already in use" in text
    text = " | ".join(found["trainer.0"])
    assert "report is from job 6, not 7" in text and "ports {'rdzv': 1}" in text


def test_checker_wants_container_flags_when_the_plan_has_them(tmp_path):
    out = build(ROOT / "recipes/rl-debug.toml", [PY_OVERRIDE, f'container.image="{IMAGE}"'],
                run_dir=tmp_path / "run", preflight=True)
    hosts = {0: ["n1"], 1: ["n2"]}
    _reports(out.run_dir, out.plan, hosts)
    found = problems(preflight.check(out.run_dir, out.plan, "7", hosts))
    assert all("container flags missing" in p[0] for p in found.values()) and len(found) == 3
    # what a step under the Pyxis test double observes passes (more cases: tests/test_container_check.py)
    for f in (out.run_dir / "preflight").glob("*.json"):
        rep = json.loads(f.read_text())
        rep["container"].update(test_double="tests/pyxis_double", mounts={"/": "rw", str(out.run_dir): "rw"}, cwd="/",
                                uid=0)
        f.write_text(json.dumps(rep))
    rows = preflight.check(out.run_dir, out.plan, "7", hosts)
    assert problems(rows) == {} and {r.container for r in rows} == {"test double /:rw mounts 1/1"}


def test_group_hosts_fill_groups_sacct_has_not_listed_from_the_probes(rl_debug, monkeypatch):
    run_dir, _, _ = rl_debug
    monkeypatch.setattr(preflight.tools, "hostnames", lambda nodes: nodes.split(","))  # test double: no scontrol
    for f in (run_dir / "preflight").glob("*.json"):
        rep = json.loads(f.read_text())
        rep["allocation"] = {"0": "n3", "1": "n1,n2", "2": "n5,n6"}
        f.write_text(json.dumps(rep))
    hosts = preflight.GroupHosts()
    hosts.hosts[0] = ["n4"]  # already known from sacct: kept
    hosts.hosts[2] = ["n5"]  # a snapshot as the job started or ended listed one node of two: the steps' list wins
    hosts.add_reports(preflight.read_reports(run_dir))
    assert hosts.hosts == {0: ["n4"], 1: ["n1", "n2"], 2: ["n5", "n6"]}


def test_preflight_without_slurm_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "slurmrl", "submit", "--preflight", str(ROOT / "recipes/rl-debug.toml")],
                       cwd=tmp_path, capture_output=True, text=True, env={"PATH": "/nonexistent"})
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "not found on PATH" in r.stderr
    assert not (tmp_path / "runs").exists()
