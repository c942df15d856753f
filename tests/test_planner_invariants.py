"""Planner invariants that hold for every shape: unique ports per plan and node, CPU splits that fit,
a deterministic and frozen plan that leaves the recipe alone, and every gallery recipe's tasks
expanding (the harness: tests/support/planner_jobs.py; one shape at a time: tests/test_planner_shapes.py).
"""

from __future__ import annotations

import copy
import re

import pytest
from planner_jobs import (
    RECIPES,
    RUN,
    B,
    P,
    assert_tasks_match_instances,
    base,
    listens,
    make,
    port,
    rl,
    rl_multi_data,
    srun_strs,
)
from pydantic import ValidationError
from task_expand import task_functions

from slurmrl import ports
from slurmrl.plan import plan
from slurmrl.recipe.load import read_toml, validate

# ---- ports -------------------------------------------------------------------------------------


def test_port_base_differs_for_jobs_in_one_window():
    for start in (0, 1, 12345, 9_999_999):
        bases = [ports.base_for_job(j) for j in range(start, start + ports.SLOTS)]
        assert len(set(bases)) == ports.SLOTS
        assert min(bases) >= ports.BASE_MIN and max(bases) + ports.STRIDE <= 32768
    # the script computes the same base as the table
    for j in (0, 1, 271, 272, 123457):
        assert eval(ports.base_expr(), {"SLURM_JOB_ID": j}) == ports.base_for_job(j)


def _shapes() -> list[dict]:
    return [read_toml(r) for r in RECIPES] + [
        make("inference", inference={"tp": 1, "dp": 1}),
        make("inference", inference={"nodes": 2, "tp": 2, "dp": 2, "router": {"enabled": True}}),
        make("inference", inference={"mode": "pd", "prefill": {"replicas": 8, "tp": 1},
                                     "decode": {"replicas": 2, "tp": 4}}),
        make("inference", inference={"mode": "pd", "kv_connector": "MooncakeConnector",
                                     "prefill": {"replicas": 4, "tp": 2}, "decode": {"replicas": 8, "tp": 1}}),
        # workers spanning nodes, replicas of them, P/D sharing nodes, offload with P/D
        make("inference", inference={"nodes": 4, "tp": 1, "dp": 16}),
        make("inference", inference={"mode": "pd", "prefill": {"replicas": 2, "tp": 1, "dp": 16, "expert_parallel": True},
                                     "decode": {"replicas": 1, "tp": 2, "dp": 8, "expert_parallel": True}}),
        make("inference", inference={"mode": "pd", "kv_connector": "MooncakeConnector",
                                     "prefill": {"replicas": 2, "tp": 2, "dp": 8}, "decode": {"replicas": 1, "dp": 16}}),
        make("inference", inference={"mode": "pd", "share_nodes": True, "kv_offload": {"kind": "cpu", "cpu_gb": 8},
                                     "prefill": {"replicas": 6, "tp": 1, "nodes": 2},
                                     "decode": {"replicas": 2, "tp": 1, "dp": 2}}),
        make("inference", inference={"mode": "pd", "share_nodes": True,
                                     "kv_offload": {"kind": "mooncake", "cpu_gb": 8},
                                     "prefill": {"replicas": 1, "tp": 2, "dp": 4, "nodes_per_worker": 2},
                                     "decode": {"replicas": 1, "tp": 2, "dp": 4, "nodes_per_worker": 2}}),
        make("inference", inference={"mode": "pd", "kv_offload": {"kind": "mooncake", "cpu_gb": 8},
                                     "prefill": {"replicas": 2, "tp": 4}, "decode": {"replicas": 2, "tp": 8}}),
        make("inference", inference={"nodes": 2, "kv_offload": {"kind": "mooncake", "cpu_gb": 8}}),
        rl(placement={"colocate": True}, inference={"gpus_per_node": 6}, trainer={"gpus_per_node": 2}),
        rl(placement={"colocate": True}, inference={"gpus_per_node": 4, "tp": 2}),
        rl(gpus=1, cpus=8, placement={"colocate": True, "share_gpus": True}),
    ] + [rl_multi_data(p) for p in ("trainer", "inference", "own")]


SHAPES = _shapes()


def _ids():
    return [f"{i}-{d['name']}-{d['kind']}" for i, d in enumerate(SHAPES)]


@pytest.mark.slow  # ~45 shapes, each task of each expanded in bash: ~100 s of CPU; the full suite runs it
@pytest.mark.parametrize("data", SHAPES, ids=_ids())
def test_ports_unique_per_plan_and_per_node(data):
    job = B(copy.deepcopy(data))
    p = job.plan
    offs = list(p.ports.values())
    assert len(offs) == len(set(offs)), p.ports
    assert all(0 <= o < ports.STRIDE for o in offs), p.ports
    for name, off in p.ports.items():
        assert ports.offset(name) == off
    # the script's port table is the plan's, and every port a task function names is in it
    table = dict(re.findall(r"^export PORT_([A-Z0-9_]+)=\$\(\(PORT_BASE \+ (\d+)\)\)$", job.script, re.M))
    assert table == {k.upper(): str(off) for k, off in p.ports.items()}
    assert set(re.findall(r"\bPORT_([A-Z0-9_]+)\b", task_functions(job.script))) <= set(table)
    per_node: dict[tuple[int, int], list[int]] = {}
    nixl: dict[tuple[int, int], list[range]] = {}
    internal: dict[tuple[int, int], list[int]] = {}
    for c in p.components:
        for i, e in job.tasks(c.name):
            assert e.env["PORT_BASE"] == str(base(p))
            key = (c.group, c.first_node + i.node)
            heard = listens(job, c, i, e)
            assert heard == {k: port(p, n) for k, n in i.ports.items()}, (c.name, i)
            per_node.setdefault(key, []).extend(heard.values())
            if "VLLM_NIXL_SIDE_CHANNEL_PORT" in e.env:  # one side channel per engine (data-parallel rank)
                nixl.setdefault(key, []).extend(v for k, v in heard.items() if k.startswith("kv"))
            if "VLLM_PORT" in e.env:  # where this vLLM's upward scan for its internal ports starts
                internal.setdefault(key, []).append(int(e.env["VLLM_PORT"]))
    for key, used in per_node.items():
        assert len(used) == len(set(used)), (key, used)  # engines of two servers never share a port
    for key, used in nixl.items():
        assert base(p) + ports.offset("nixl_0") <= min(used), used
        assert max(used) < base(p) + ports.offset("dprpc_0"), used  # stays inside the NIXL block
    for key, starts in internal.items():  # each vLLM server of a node its own VLLM_PORT..+VLLM_EACH
        starts.sort()
        assert all(b - a >= ports.VLLM_EACH for a, b in zip(starts, starts[1:])), (key, starts)
        assert base(p) + ports.offset("vllm_0") <= starts[0], starts
        assert starts[-1] + ports.VLLM_EACH <= base(p) + ports.STRIDE, starts


def test_nixl_ranges_do_not_overlap_with_mixed_tp():
    job = B(make("inference", inference={"mode": "pd", "prefill": {"replicas": 2, "tp": 4},
                                         "decode": {"replicas": 4, "tp": 2}}))
    for name in ("prefill", "decode"):
        tasks = job.tasks(name)
        starts = sorted(int(e.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for _, e in tasks)
        tp = int(tasks[0][1].after("--tensor-parallel-size"))
        assert tp == len(tasks[0][0].gpus)
        assert all(b - a >= tp for a, b in zip(starts, starts[1:])), starts


# ---- CPUs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("data", SHAPES, ids=_ids())
def test_cpu_split_fits_every_node(data):
    p = P(copy.deepcopy(data))
    limit = data["slurm"].get("cpus_per_node", 16)
    for g in p.groups:
        assert g.cpus_per_node <= limit
        for node in range(g.nodes):
            used = sum(
                c.tasks_per_node * c.cpus_per_task
                for c in p.components
                if c.group == g.index and c.first_node <= node < c.first_node + c.nodes
            )
            assert 0 < used <= g.cpus_per_node, (g.name, node, used, g.cpus_per_node)
    for c in p.components:
        assert c.cpus_per_task >= 1
        assert f"--cpus-per-task={c.cpus_per_task}" in srun_strs(c)


# ---- determinism and immutability --------------------------------------------------------------


@pytest.mark.parametrize("data", SHAPES, ids=_ids())
def test_plan_is_deterministic(data):
    a = P(copy.deepcopy(data)).model_dump_json()
    b = P(copy.deepcopy(data)).model_dump_json()
    assert a == b


def test_plan_is_frozen():
    p = P(rl(placement={"colocate": True}, inference={"gpus_per_node": 6}))
    with pytest.raises(ValidationError):
        p.name = "other"
    with pytest.raises(ValidationError):
        p.components[0].nodes = 99
    with pytest.raises(ValidationError):
        p.groups[0].directives[0].value = "x"
    with pytest.raises(ValidationError):
        p.components[0].task = p.components[1].task
    with pytest.raises((TypeError, AttributeError)):
        p.components[0].instances[0].gpus[0] = 3  # tuples
    with pytest.raises((TypeError, AttributeError)):
        p.components[0].task.command[0] = "x"  # tuples


def test_planning_does_not_change_the_recipe():
    r = validate(rl(placement={"colocate": True, "share_gpus": True}, slurm={"gpus_per_node": 1, "cpus_per_node": 8}))
    before = r.model_dump_json()
    plan(r, RUN)
    plan(r, RUN)
    assert r.model_dump_json() == before
    assert r.inference.gpu_memory_utilization is None


# ---- the gallery -------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_gallery_every_task_expands(recipe):
    """Every task function of every gallery recipe runs for every instance and execs its supervisor
    around a command; GPU slices and listening ports are the instance's."""
    job = B(read_toml(recipe))
    for c in job.plan.components:
        tasks = job.tasks(c.name)
        assert len(tasks) == c.nodes * c.tasks_per_node, c.name
        for i, e in tasks:
            assert e.supervisor[1:4] == ["-m", "slurmrl.runtime.steps.supervise", c.name] or (
                e.supervisor[0] == "uv" and "slurmrl.runtime.steps.supervise" in e.supervisor), (c.name, e.supervisor)
            assert e.command, c.name
            assert e.env["SLURM_NODEID"] == str(i.node) and e.env["SLURM_LOCALID"] == str(i.local)
        assert_tasks_match_instances(job, c.name)
