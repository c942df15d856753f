"""Planner unit tests, one deployment shape at a time: recipe dict -> validate -> plan."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from slurmrl import ports
from slurmrl.plan import plan
from slurmrl.plan.model import Plan, Sh
from slurmrl.recipe.load import read_toml, validate

RUN = "/runs/x"
RECIPES = sorted((Path(__file__).resolve().parent.parent / "recipes").glob("*.toml"))


def make(kind: str, gpus: int = 8, cpus: int = 64, **sections) -> dict:
    d = {"name": "x", "kind": kind, "slurm": {"gpus_per_node": gpus, "cpus_per_node": cpus}, "model": {"path": "m"}}
    if kind == "sft":
        d["trainer"] = {"dataset": "/d.jsonl", "batch_size": 64, "micro_batch_size": 1}
    for k, v in sections.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k] = {**d[k], **v}
        else:
            d[k] = v
    return d


def rl(gpus: int = 8, cpus: int = 64, **sections) -> dict:
    base = {
        "inference": {},
        "trainer": {"micro_batch_size": 1},
        "orchestrator": {"prompts_per_step": 8, "rollouts_per_prompt": 8},
    }
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    return make("rl", gpus, cpus, **base)


def P(d: dict) -> Plan:
    return plan(validate(d), RUN)


def args_of(inst) -> list[str]:
    return list(inst.args)


def arg_after(args, flag: str) -> str:
    assert flag in args, f"{flag} not in {args}"
    return args[args.index(flag) + 1]


def srun_strs(c) -> list[str]:
    return [a if isinstance(a, str) else a.sh for a in c.srun]


# ---- SFT ---------------------------------------------------------------------------------------


def test_sft_one_node_torchrun_uses_every_gpu():
    p = P(make("sft"))
    assert len(p.groups) == 1 and p.groups[0].nodes == 1
    t = p.component("trainer")
    argv = [a if isinstance(a, str) else a.sh for a in t.argv]
    assert "--nnodes=1" in argv
    assert "--nproc-per-node=8" in argv
    assert "--rdzv-endpoint=${NODES_G0[0]}:${PORT_TORCH_RDZV}" in argv
    rdzv = next(a for a in t.argv if isinstance(a, Sh) and a.sh.startswith("--rdzv-endpoint="))
    assert rdzv.sh == "--rdzv-endpoint=${NODES_G0[0]}:${PORT_TORCH_RDZV}"
    assert t.tasks_per_node == 1 and t.gpus_per_node == 8
    assert [i.gpus for i in t.instances] == [tuple(range(8))]
    assert "torch_rdzv" in p.ports
    assert t.main and t.checkpoints


def test_sft_multinode_nnodes_and_one_agent_per_node():
    p = P(make("sft", trainer={"nodes": 4, "batch_size": 64, "micro_batch_size": 2}))
    t = p.component("trainer")
    argv = [a if isinstance(a, str) else a.sh for a in t.argv]
    assert "--nnodes=4" in argv and "--nproc-per-node=8" in argv
    assert t.nodes == 4 and len(t.instances) == 4
    assert sorted(i.node for i in t.instances) == [0, 1, 2, 3]
    assert "--ntasks=4" in srun_strs(t) and "--nodes=4" in srun_strs(t)
    assert t.settings["world_size"] == 32
    # only node 0 hosts the rendezvous
    assert [bool(i.ports) for i in t.instances] == [True, False, False, False]
    g = p.groups[0]
    assert g.nodes == 4 and ("--nodes", "4") in [(d.option, d.value) for d in g.directives]


def test_sft_trainer_gpus_per_node_limits_nproc():
    p = P(make("sft", trainer={"gpus_per_node": 4, "batch_size": 64, "micro_batch_size": 1}))
    argv = [a for a in p.component("trainer").argv if isinstance(a, str)]
    assert "--nproc-per-node=4" in argv


# ---- RL colocated ------------------------------------------------------------------------------


def test_rl_colocated_six_plus_two():
    p = P(rl(placement={"colocate": True}, inference={"gpus_per_node": 6}, trainer={"gpus_per_node": 2}))
    assert len(p.groups) == 1
    inf, tr = p.component("inference"), p.component("trainer")
    assert [i.gpus for i in inf.instances] == [(0,), (1,), (2,), (3,), (4,), (5,)]
    assert len({i.ports["http"] for i in inf.instances}) == 6
    assert [i.gpus for i in tr.instances] == [(6, 7)]
    for c in (inf, tr):
        assert c.overlap, c.name
        assert c.gpus_per_node == 8, c.name
        assert "--overlap" in srun_strs(c)
        assert "--gpus-per-node=8" in srun_strs(c)
    assert "--nproc-per-node=2" in [a for a in tr.argv if isinstance(a, str)]
    # no GPU owned twice
    owned = [g for c in (inf, tr) for i in c.instances for g in i.gpus]
    assert len(owned) == len(set(owned)) == 8


def test_rl_colocated_trainer_defaults_to_leftover_gpus():
    p = P(rl(placement={"colocate": True}, inference={"gpus_per_node": 4}))
    assert p.component("trainer").instances[0].gpus == (4, 5, 6, 7)


def test_rl_single_shared_gpu():
    p = P(rl(gpus=1, cpus=8, placement={"colocate": True, "share_gpus": True}))
    inf, tr = p.component("inference"), p.component("trainer")
    assert [i.gpus for i in inf.instances] == [(0,)]
    assert [i.gpus for i in tr.instances] == [(0,)]
    assert inf.overlap and tr.overlap
    assert arg_after(args_of(inf.instances[0]), "--gpu-memory-utilization") == "0.45"
    assert p.warnings and any("gpu_memory_utilization" in w for w in p.warnings)


def test_rl_single_shared_gpu_keeps_explicit_memory_fraction():
    p = P(rl(gpus=1, cpus=8, placement={"colocate": True, "share_gpus": True},
             inference={"gpu_memory_utilization": 0.3}))
    assert arg_after(args_of(p.component("inference").instances[0]), "--gpu-memory-utilization") == "0.3"
    assert not any("gpu_memory_utilization" in w for w in p.warnings)


def test_rl_not_shared_has_no_memory_fraction():
    p = P(rl(placement={"colocate": True}, inference={"gpus_per_node": 4}))
    assert "--gpu-memory-utilization" not in args_of(p.component("inference").instances[0])
    assert p.warnings == ()


# ---- RL multi-node: orchestrator placement ---------------------------------------------------


def _rl_multi(placement: str) -> Plan:
    return P(_rl_multi_data(placement))


def test_rl_multinode_orchestrator_on_trainer():
    p = _rl_multi("trainer")
    assert [g.name for g in p.groups] == ["trainer", "inference"]
    o, t = p.component("orchestrator"), p.component("trainer")
    assert o.group == t.group == 0 and o.first_node == 0
    assert o.gpus_per_node == 0 and "--gpus-per-node=0" in srun_strs(o)
    assert "--het-group=0" in srun_strs(o)


def test_rl_multinode_orchestrator_on_inference():
    p = _rl_multi("inference")
    o, inf = p.component("orchestrator"), p.component("inference")
    assert o.group == inf.group == 1 and o.first_node == 0
    assert "--het-group=1" in srun_strs(o)


def test_rl_multinode_orchestrator_own_cpu_group():
    p = _rl_multi("own")
    assert len(p.groups) == 3
    g = p.groups[2]
    assert g.name == "orchestrator" and g.gpus_per_node == 0 and g.nodes == 1
    o = p.component("orchestrator")
    assert o.group == 2
    s = srun_strs(o)
    assert "--het-group=2" in s
    assert not any(x.startswith("--gpus") for x in s)  # the group has no GPUs to ask about
    opts = {d.option: d.value for d in g.directives}
    assert "--gpus-per-node" not in opts and "--gres" not in opts
    assert opts["--partition"] == "cpu"
    assert opts["--cpus-per-task"] == str(g.cpus_per_node)
    # GPU groups keep the GPU partition
    assert {d.option: d.value for d in p.groups[1].directives}["--partition"] == "gpu"
    # every srun of a het job names its group
    for c in p.components:
        assert f"--het-group={c.group}" in srun_strs(c), c.name


# ---- inference replicas ------------------------------------------------------------------------


@pytest.mark.parametrize("tp,dp,per_node", [(1, 1, 8), (2, 1, 4), (2, 2, 2), (4, 1, 2), (8, 1, 1), (1, 4, 2)])
def test_replicas_servers_per_node(tp, dp, per_node):
    p = P(make("inference", inference={"nodes": 2, "tp": tp, "dp": dp}))
    inf = p.component("inference")
    assert inf.tasks_per_node == per_node
    assert len(inf.instances) == 2 * per_node
    for node in (0, 1):
        on_node = [i for i in inf.instances if i.node == node]
        assert len({i.ports["http"] for i in on_node}) == per_node
        gpus = [g for i in on_node for g in i.gpus]
        assert sorted(gpus) == list(range(8))
        for i in on_node:
            assert len(i.gpus) == tp * dp
            assert arg_after(args_of(i), "--tensor-parallel-size") == str(tp)
            if dp > 1:
                assert arg_after(args_of(i), "--data-parallel-size") == str(dp)
    names = [c.name for c in p.components]
    assert ("router" in names) == (2 * per_node > 1)


def test_replicas_one_server_has_no_router():
    p = P(make("inference", inference={"tp": 8}))
    assert [c.name for c in p.components] == ["inference"]
    assert "router" not in p.ports


def test_replicas_router_enabled_explicitly_for_one_server():
    p = P(make("inference", inference={"tp": 8, "router": {"enabled": True}}))
    r = p.component("router")
    assert r.settings["workers"] == [{"group": 0, "node": 0, "port": "server_0"}]
    assert "router" in p.services


def test_replicas_router_disabled_explicitly():
    p = P(make("inference", inference={"nodes": 2, "router": {"enabled": False}}))
    assert "router" not in [c.name for c in p.components]


def test_replicas_router_lists_every_server():
    p = P(make("inference", inference={"nodes": 3, "tp": 2}))
    workers = p.component("router").settings["workers"]
    assert len(workers) == 12
    assert len({(w["node"], w["port"]) for w in workers}) == 12


# ---- wide-EP -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dp", [32, 1])
def test_wide_ep_one_task_per_node_headless_followers(dp):
    p = P(make("inference", cpus=96, inference={"mode": "wide_ep", "nodes": 4, "tp": 1, "dp": dp}))
    inf = p.component("inference")
    assert inf.tasks_per_node == 1 and len(inf.instances) == 4
    g = inf.group
    for i in inf.instances:
        a = args_of(i)
        assert i.gpus == tuple(range(8))
        assert arg_after(a, "--data-parallel-size") == "32"
        assert arg_after(a, "--data-parallel-size-local") == "8"
        assert arg_after(a, "--data-parallel-address") == f"{{host:{g}:0}}"
        assert "--enable-expert-parallel" in a
        if i.node == 0:
            assert "--headless" not in a
            assert "--data-parallel-start-rank" not in a
        else:
            assert "--headless" in a
            assert arg_after(a, "--data-parallel-start-rank") == str(i.node * 8)
    assert inf.health.first_node_only


def test_wide_ep_with_tp2():
    p = P(make("inference", cpus=96, inference={"mode": "wide_ep", "nodes": 2, "tp": 2}))
    inst = p.component("inference").instances
    assert arg_after(args_of(inst[1]), "--data-parallel-start-rank") == "4"
    assert arg_after(args_of(inst[0]), "--data-parallel-size") == "8"


# ---- P/D ---------------------------------------------------------------------------------------


def _kv_cfg(inst) -> dict:
    return json.loads(arg_after(args_of(inst), "--kv-transfer-config"))


def _pd(connector: str) -> Plan:
    return P(make("inference", inference={
        "mode": "pd", "kv_connector": connector,
        "prefill": {"replicas": 4, "tp": 2}, "decode": {"replicas": 4, "tp": 4, "nodes": 2},
    }))


def test_pd_nixl_separate_groups_and_router_lists():
    p = _pd("NixlConnector")
    assert [g.name for g in p.groups] == ["prefill", "decode"]
    pre, dec = p.component("prefill"), p.component("decode")
    assert pre.group != dec.group
    for c in (pre, dec):
        for i in c.instances:
            cfg = _kv_cfg(i)
            assert cfg["kv_connector"] == "NixlConnector"
            assert cfg["kv_role"] == "kv_both"
            assert i.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == f"{{port:nixl_{i.gpus[0]}}}"
    router = p.component("router").settings
    assert router["kv_connector"] == "NixlConnector"
    assert len(router["prefill"]) == 4 and {e["group"] for e in router["prefill"]} == {pre.group}
    assert len(router["decode"]) == 4 and {e["group"] for e in router["decode"]} == {dec.group}
    assert {e["node"] for e in router["decode"]} == {0, 1}
    assert "workers" not in router


def test_pd_p2pnccl_producer_consumer():
    p = _pd("P2pNcclConnector")
    pre, dec = p.component("prefill"), p.component("decode")
    for c, role in ((pre, "kv_producer"), (dec, "kv_consumer")):
        for i in c.instances:
            cfg = _kv_cfg(i)
            assert cfg["kv_connector"] == "P2pNcclConnector"
            assert cfg["kv_role"] == role
            assert cfg["kv_port"] == f"{{port:kv_{i.local}}}"
            assert cfg["kv_connector_extra_config"]["proxy_ip"] == f"{{host:{pre.group}:0}}"
            assert cfg["kv_connector_extra_config"]["http_port"] == f"{{port:{i.ports['http']}}}"
    r = p.component("router")
    assert r.group == pre.group and r.first_node == 0


# ---- KV offload --------------------------------------------------------------------------------


def test_kv_offload_cpu_splits_budget_per_server():
    p = P(make("inference", inference={"tp": 2, "kv_offload": {"kind": "cpu", "cpu_gb": 64}}))
    for i in p.component("inference").instances:
        a = args_of(i)
        assert arg_after(a, "--kv-offloading-backend") == "native"
        assert float(arg_after(a, "--kv-offloading-size")) == 16


def test_kv_offload_cpu_disk_connector():
    p = P(make("inference", inference={"nodes": 2, "tp": 4, "kv_offload": {
        "kind": "cpu_disk", "cpu_gb": 64, "disk_path": "/nvme/kv", "disk_gb": 500}}))
    for i in p.component("inference").instances:
        cfg = _kv_cfg(i)
        assert cfg["kv_connector"] == "OffloadingConnector"
        extra = cfg["kv_connector_extra_config"]
        assert extra["disk_path"] == "/nvme/kv"
        assert extra["cpu_bytes_to_use"] == 32 * 2**30
        assert extra["disk_bytes_to_use"] == 250 * 2**30


def test_kv_offload_mooncake_stages_and_clients():
    p = P(make("inference", inference={"nodes": 3, "tp": 2, "kv_offload": {"kind": "mooncake", "cpu_gb": 128}}))
    master, client, inf = (p.component(n) for n in ("mooncake-master", "mooncake-client", "inference"))
    assert master.stage < client.stage < inf.stage
    order = [s.components for s in p.stages]
    flat = [n for s in order for n in s]
    assert flat.index("mooncake-master") < flat.index("mooncake-client") < flat.index("inference")
    assert not (set(order[[i for i, s in enumerate(order) if "mooncake-client" in s][0]]) & {"inference"})
    assert client.tasks_per_node == 1 and client.nodes == inf.nodes == 3
    assert sorted(i.node for i in client.instances) == [0, 1, 2]
    assert master.nodes == 1 and master.group == inf.group and master.first_node == 0
    for i in inf.instances:
        assert _kv_cfg(i)["kv_connector"] == "MooncakeStoreConnector"
        assert i.env["MOONCAKE_MASTER"] == f"{{host:{inf.group}:0}}:{{port:mooncake_rpc}}"
    assert "mooncake-master" in p.services


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
        make("inference", inference={"mode": "pd", "kv_connector": "P2pNcclConnector",
                                     "prefill": {"replicas": 4, "tp": 2}, "decode": {"replicas": 8, "tp": 1}}),
        make("inference", inference={"nodes": 2, "kv_offload": {"kind": "mooncake", "cpu_gb": 8}}),
        rl(placement={"colocate": True}, inference={"gpus_per_node": 6}, trainer={"gpus_per_node": 2}),
        rl(placement={"colocate": True}, inference={"gpus_per_node": 4, "tp": 2},
           trainer={"weight_sync": "nccl"}),
        rl(gpus=1, cpus=8, placement={"colocate": True, "share_gpus": True}),
    ]


SHAPES = _shapes()


def _rl_multi_data(placement: str) -> dict:
    return rl(cpus=32, trainer={"nodes": 2, "micro_batch_size": 1},
              orchestrator={"placement": placement, "prompts_per_step": 16, "rollouts_per_prompt": 8},
              inference={"nodes": 2, "tp": 2},
              slurm={"gpus_per_node": 8, "cpus_per_node": 32, "partition": "gpu", "cpu_partition": "cpu"})


SHAPES += [_rl_multi_data(p) for p in ("trainer", "inference", "own")]


def _ids():
    return [f"{i}-{d['name']}-{d['kind']}" for i, d in enumerate(SHAPES)]


@pytest.mark.parametrize("data", SHAPES, ids=_ids())
def test_ports_unique_per_plan_and_per_node(data):
    p = P(copy.deepcopy(data))
    offs = list(p.ports.values())
    assert len(offs) == len(set(offs)), p.ports
    assert all(0 <= o < ports.STRIDE for o in offs), p.ports
    for name, off in p.ports.items():
        assert ports.offset(name) == off
    # every port name anything refers to is in the plan's table
    text = p.model_dump_json()
    for name in set(re.findall(r"\{port:([a-z0-9_]+)\}", text)):
        assert name in p.ports, name
    per_node: dict[tuple[int, int], list[int]] = {}
    nixl: dict[tuple[int, int], list[range]] = {}
    for c in p.components:
        for i in c.instances:
            key = (c.group, c.first_node + i.node)
            per_node.setdefault(key, []).extend(p.ports[n] for n in i.ports.values())
            if "VLLM_NIXL_SIDE_CHANNEL_PORT" in i.env:
                name = re.fullmatch(r"\{port:(nixl_\d+)\}", i.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]).group(1)
                tp = int(arg_after(args_of(i), "--tensor-parallel-size"))
                start = p.ports[name]
                nixl.setdefault(key, []).append(range(start, start + tp))
    for key, offs in per_node.items():
        assert len(offs) == len(set(offs)), (key, offs)
    for key, ranges in nixl.items():
        used = [o for r in ranges for o in r]
        assert len(used) == len(set(used)), (key, ranges)  # TP ranks of two servers never share a port
        others = set(per_node[key]) - {r.start for r in ranges}
        assert not (set(used) & others), (key, used, others)
        assert max(used) < ports.offset("dprpc_0"), used  # stays inside the NIXL block


def test_nixl_ranges_do_not_overlap_with_mixed_tp():
    p = P(make("inference", inference={"mode": "pd", "prefill": {"replicas": 2, "tp": 4},
                                       "decode": {"replicas": 4, "tp": 2}}))
    for name in ("prefill", "decode"):
        c = p.component(name)
        starts = sorted(p.ports[i.env["VLLM_NIXL_SIDE_CHANNEL_PORT"][len("{port:"):-1]] for i in c.instances)
        tp = len(c.instances[0].gpus)
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
    with pytest.raises((TypeError, AttributeError)):
        p.components[0].instances[0].gpus[0] = 3  # tuples


def test_planning_does_not_change_the_recipe():
    r = validate(rl(placement={"colocate": True, "share_gpus": True}, slurm={"gpus_per_node": 1, "cpus_per_node": 8}))
    before = r.model_dump_json()
    plan(r, RUN)
    plan(r, RUN)
    assert r.model_dump_json() == before
    assert r.inference.gpu_memory_utilization is None
