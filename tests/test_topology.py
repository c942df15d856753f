"""Topology (issue 17 item 6): slurm.switches / slurm.segment per het group as #SBATCH lines, what
the cluster's sbatch supports (refused before sbatch where it lacks an option), and one NVLink
domain per group from nvidia-smi's fabric report.

The nvidia-smi -q outputs below are recorded shapes (the Fabric block of driver 550+/570 as
published in NVIDIA and cloud-vendor issue threads: GB200 NVL with a ClusterUUID and CliqueId,
an H100 with N/A, a failed registration with a zero UUID). No GB200 is here: the parsing is
tested against these texts and is unverified on real GB200 hardware.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from slurmrl.contract.probe_report import ContainerObservation, NodeFabric, ProbeReport
from slurmrl.errors import UserError
from slurmrl.plan import plan
from slurmrl.recipe.load import load_recipe
from slurmrl.runtime.steps import fabric
from slurmrl.slurm import topology

ROOT = Path(__file__).resolve().parent.parent

GB200 = """
==============NVSMI LOG==============

Timestamp                                 : Mon Nov 23 20:00:00 2026
Driver Version                            : 570.86.15
CUDA Version                              : 12.8

Attached GPUs                             : 2
GPU 00000008:01:00.0
    Product Name                          : NVIDIA GB200
    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 32766
        ClusterUUID                       : {uuid}
        Health
            Bandwidth                     : Full
            Route Recovery in progress    : False
            Route Unhealthy               : False
            Access Timeout Recovery       : False
    Processes                             : None

GPU 00000009:01:00.0
    Product Name                          : NVIDIA GB200
    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 32766
        ClusterUUID                       : {uuid}
        Health
            Bandwidth                     : Full
    Processes                             : None
"""
RACK_A = "9e40b027-81c1-166b-824e-5ebeb44e0996"
RACK_B = "6f4a4bf1-07a0-79a1-939a-0a887f4bffa6"

H100 = """
Attached GPUs                             : 1
GPU 00000000:19:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    Fabric
        State                             : N/A
        Status                            : N/A
        CliqueId                          : N/A
        ClusterUUID                       : N/A
    Processes                             : None
"""

UNREGISTERED = """
GPU 00000008:01:00.0
    Fabric
        State                             : Completed
        Status                            : Insufficient Resources
        CliqueId                          : 0
        ClusterUUID                       : 00000000-0000-0000-0000-000000000000
"""

HELP_2205 = """Usage: sbatch [OPTIONS(0)...] [ : [OPTIONS(N)...]] script(0) [args(0)...]
      --switches=max-switches{@max-time-to-wait}
                              Optimum switches and max time to wait for optimum
  -t, --time=minutes          time limit
"""
HELP_2411 = HELP_2205 + """      --segment=segment_size  assign the job's nodes in segments of this size
"""


def node(text: str) -> NodeFabric:
    return fabric.summary(fabric.fabric(text))


def test_fabric_blocks_are_parsed_per_gpu():
    gpus = fabric.fabric(GB200.format(uuid=RACK_A))
    assert [(g.gpu, g.state, g.status, g.clique, g.cluster_uuid) for g in gpus] == [
        ("00000008:01:00.0", "Completed", "Success", "32766", RACK_A),
        ("00000009:01:00.0", "Completed", "Success", "32766", RACK_A)]
    assert {g.domain for g in gpus} == {f"{RACK_A}/32766"}
    assert [g.domain for g in fabric.fabric(H100)] == [None]  # no NVLink fabric: no domain
    assert [g.domain for g in fabric.fabric(UNREGISTERED)] == [None]  # zero UUID, failed registration
    assert fabric.fabric("No devices were found\n") == []


def test_one_domain_per_group_is_checked():
    a1, a2, b = node(GB200.format(uuid=RACK_A)), node(GB200.format(uuid=RACK_A)), node(GB200.format(uuid=RACK_B))
    assert topology.check_domains({"inference": {"n1": a1, "n2": a2}}) == []
    split = topology.check_domains({"inference": {"n1": a1, "n2": b}})
    assert split == [f"slurm.nvlink_domain: inference: its nodes are in 2 NVLink domains "
                     f"(n1: {RACK_A}/32766, n2: {RACK_B}/32766)"]
    none = topology.check_domains({"decode": {"n1": a1, "h1": node(H100)}})
    assert none == ["slurm.nvlink_domain: decode: h1 is in no single NVLink domain (none)"]
    assert topology.check_domains({"inference": {"n1": None, "n2": None}}) == []  # no nvidia-smi: not judged
    err = topology.check_domains({"inference": {"n1": NodeFabric(error="nvidia-smi -q exited with 9: x")}})
    assert err == ["slurm.nvlink_domain: inference: n1: nvidia-smi -q exited with 9: x"]


def test_sbatch_support_is_read_from_its_help():
    old = topology.parse_support(HELP_2205, "slurm-wlm 22.05.8\n")
    assert old.options == {"--switches": True, "--segment": False}
    assert old.line() == "topology: sbatch 22.05.8: --switches yes, --segment no"
    new = topology.parse_support(HELP_2411, "slurm 24.11.1\n")
    assert new.options == {"--switches": True, "--segment": True}
    script = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --segment=2\n#SBATCH --switches=1@10:00\n"
    assert topology.asked(script) == ["--segment", "--switches"]
    topology.refuse_unsupported(script, new)
    with pytest.raises(UserError) as e:
        topology.refuse_unsupported(script, old)
    assert e.value.field == "slurm.segment" and "Slurm 22.05.8" in str(e.value)
    topology.refuse_unsupported("#SBATCH --nodes=1\n", old)  # asks for nothing: no sbatch call


def test_switches_and_segment_go_to_their_groups_only():
    r = load_recipe(ROOT / "recipes" / "rl-multinode.toml")
    names = [g.name for g in plan(r, "/runs/x").groups]
    assert {"trainer", "inference"} <= set(names)
    r = r.model_copy(update={"slurm": r.slurm.model_copy(update={
        "switches": {"inference": "1@30:00"}, "segment": {"trainer": 1}, "nvlink_domain": ["inference"]})})
    p = plan(r, "/runs/x")
    by = {g.name: {d.option: d.value for d in g.directives} for g in p.groups}
    assert by["inference"]["--switches"] == "1@30:00" and "--segment" not in by["inference"]
    assert by["trainer"]["--segment"] == "1" and "--switches" not in by["trainer"]
    assert p.nvlink_domain == (names.index("inference"),)


def test_the_local_slurm_takes_switches_and_refuses_segment(slurm_cluster, tmp_path):
    """Real sbatch 22.05 of the local cluster: --switches passes `sbatch --test-only`, and submit
    refuses --segment in one line before sbatch runs. On the cluster worker, with the cluster up (it
    read a slurm.conf that might be left from a cluster whose daemons were gone)."""
    conf = slurm_cluster.state_dir / "etc" / "slurm.conf"
    env = {**os.environ, "SLURM_CONF": str(conf), "PYTHONPATH": str(ROOT)}
    recipe = str(ROOT / "recipes" / "inference-debug.toml")
    common = ["--set", f'python.executable="{sys.executable}"', "--set", 'model.path="/m"']
    r = subprocess.run([sys.executable, "-m", "slurmrl", "render", recipe, *common,
                        "--set", 'slurm.switches.inference="1@0:30"'], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    script = tmp_path / "runs" / "inference-debug" / "job.sbatch"
    assert "#SBATCH --switches=1@0:30\n" in script.read_text()
    t = subprocess.run(["sbatch", "--test-only", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert t.returncode == 0 and "to start at" in t.stderr, t.stderr
    shutil.rmtree(tmp_path / "runs")
    s = subprocess.run([sys.executable, "-m", "slurmrl", "submit", recipe, *common,
                        "--set", "slurm.segment.inference=2"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert s.returncode == 2, s.stdout + s.stderr
    assert s.stderr.startswith("slurmrl: error: slurm.segment: this cluster's sbatch (Slurm 22.05.8) has no "
                               "--segment option") and len(s.stderr.splitlines()) == 1, s.stderr
    assert not (tmp_path / "runs").exists() and not s.stdout  # nothing written, nothing submitted


def test_the_preflight_reads_each_nodes_fabric_from_the_probes_reports():
    r = load_recipe(ROOT / "recipes" / "inference-debug.toml")
    r = r.model_copy(update={"slurm": r.slurm.model_copy(update={"nvlink_domain": ["inference"]})})
    p = plan(r, "/runs/x", preflight=True)
    reports = {(c.name, i.rank): ProbeReport(
        component=c.name, rank=i.rank, host=f"n{c.first_node + i.node + 1}", node=i.node, local=i.local, gpus_seen=(),
        gpus=(), gpu_positions=i.gpus, ports={}, container=ContainerObservation(uid=0, gid=0), env={}, allocation={},
        errors=(), fabric=None) for c in p.components for i in c.instances}
    notes, problems = topology.nvlink_report(p, reports)
    assert notes == ["topology: slurm.nvlink_domain inference: no nvidia-smi on its nodes; not checked"] and not problems
    racks = {"n1": RACK_A, "n2": RACK_B}
    reports = {k: replace(rep, fabric=node(GB200.format(uuid=racks[rep.host]))) for k, rep in reports.items()}
    # what the probe wrote, read back through its file's contract
    reports = {k: ProbeReport.from_json(json.loads(rep.dumps(indent=1)), "f.json") for k, rep in reports.items()}
    notes, problems = topology.nvlink_report(p, reports)
    assert problems == [f"slurm.nvlink_domain: inference: its nodes are in 2 NVLink domains "
                        f"(n1: {RACK_A}/32766, n2: {RACK_B}/32766)"], problems
    racks["n2"] = RACK_A
    reports = {k: replace(rep, fabric=node(GB200.format(uuid=racks[rep.host]))) for k, rep in reports.items()}
    notes, problems = topology.nvlink_report(p, reports)
    assert notes == [f"topology: slurm.nvlink_domain inference: 2 node(s), domain(s) {RACK_A}/32766"] and not problems
