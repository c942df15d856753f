"""Planner tests, one deployment shape at a time: recipe -> plan -> job.sbatch, and what every task
of every component really execs (the harness: tests/support/planner_jobs.py). The invariants every shape
keeps (ports, CPUs, determinism, the gallery) are in tests/test_planner_invariants.py.
"""

from __future__ import annotations

import pytest
from planner_jobs import (
    JOB_ID,
    RUN,
    B,
    Job,
    P,
    assert_tasks_match_instances,
    gpus_of,
    kv_cfg,
    listens,
    make,
    pools,
    port,
    prefixed,
    ready_url,
    rl,
    rl_multi_data,
    srun_strs,
    values_after,
)

from slurmrl.plan.model import Plan, dump_settings

# ---- SFT ---------------------------------------------------------------------------------------


def test_sft_one_node_torchrun_uses_every_gpu():
    job = B(make("sft"))
    p = job.plan
    assert len(p.groups) == 1 and p.groups[0].nodes == 1
    t = p.component("trainer")
    e = job.run("trainer")
    assert e.supervisor[:4] == ["python3", "-m", "slurmrl.runtime.steps.supervise", "trainer"]
    assert e.command[0] == "torchrun"
    assert "--nnodes=1" in e.command
    assert "--nproc-per-node=8" in e.command
    assert f"--rdzv-endpoint=g0n0:{port(p, 'torch_rdzv')}" in e.command
    assert f"--rdzv-id={JOB_ID}" in e.command
    assert t.tasks_per_node == 1 and t.gpus_per_node == 8
    assert [i.gpus for i in t.instances] == [tuple(range(8))] and gpus_of(e) == tuple(range(8))
    assert "torch_rdzv" in p.ports
    # the trainer is what the job waits for; on TERM its workers get the grace period to checkpoint
    assert t.main and f"--shutdown-timeout={p.grace_seconds}" in e.command
    assert e.command[-2:] == ["--config", f"{RUN}/components/trainer.toml"]
    assert "checkpoint_every" in dump_settings(t.settings) and "components/trainer.toml" in job.out.files


def test_sft_multinode_nnodes_and_one_agent_per_node():
    job = B(make("sft", trainer={"nodes": 4, "batch_size": 64, "micro_batch_size": 2}))
    p = job.plan
    t = p.component("trainer")
    assert t.nodes == 4 and len(t.instances) == 4
    assert sorted(i.node for i in t.instances) == [0, 1, 2, 3]
    assert "--ntasks=4" in srun_strs(t) and "--nodes=4" in srun_strs(t)
    assert t.settings.world_size == 32
    endpoints = set()
    for inst, e in job.tasks("trainer"):
        assert "--nnodes=4" in e.command and "--nproc-per-node=8" in e.command, inst
        assert gpus_of(e) == tuple(range(8))
        endpoints.add((prefixed(e.command, "--rdzv-endpoint="), prefixed(e.command, "--rdzv-id=")))
    assert endpoints == {(f"g0n0:{port(p, 'torch_rdzv')}", str(JOB_ID))}  # every agent meets at node 0
    # only node 0 hosts the rendezvous
    assert [bool(i.ports) for i in t.instances] == [True, False, False, False]
    assert [bool(listens(job, t, i, e)) for i, e in job.tasks("trainer")] == [True, False, False, False]
    g = p.groups[0]
    assert g.nodes == 4 and ("--nodes", "4") in [(d.option, d.value) for d in g.directives]


def test_sft_trainer_gpus_per_node_limits_nproc():
    job = B(make("sft", trainer={"gpus_per_node": 4, "batch_size": 64, "micro_batch_size": 1}))
    e = job.run("trainer")
    assert "--nproc-per-node=4" in e.command
    assert gpus_of(e) == (0, 1, 2, 3)


# ---- RL colocated ------------------------------------------------------------------------------


def test_rl_colocated_six_plus_two():
    job = B(rl(placement={"colocate": True}, inference={"gpus_per_node": 6}, trainer={"gpus_per_node": 2}))
    p = job.plan
    assert len(p.groups) == 1
    inf, tr = p.component("inference"), p.component("trainer")
    assert [i.gpus for i in inf.instances] == [(0,), (1,), (2,), (3,), (4,), (5,)]
    assert [gpus_of(e) for _, e in job.tasks("inference")] == [(0,), (1,), (2,), (3,), (4,), (5,)]
    assert len({e.after("--port") for _, e in job.tasks("inference")}) == 6
    assert [i.gpus for i in tr.instances] == [(6, 7)]
    assert [gpus_of(e) for _, e in job.tasks("trainer")] == [(6, 7)]
    for c in (inf, tr):
        assert c.overlap, c.name
        assert c.gpus_per_node == 8, c.name
        assert "--overlap" in srun_strs(c)
        assert "--gpus-per-node=8" in srun_strs(c)
        assert_tasks_match_instances(job, c.name)
    assert "--nproc-per-node=2" in job.run("trainer").command
    # no GPU owned twice, by what the tasks take
    owned = [g for n in ("inference", "trainer") for _, e in job.tasks(n) for g in gpus_of(e)]
    assert len(owned) == len(set(owned)) == 8


def test_rl_colocated_trainer_defaults_to_leftover_gpus():
    job = B(rl(placement={"colocate": True}, inference={"gpus_per_node": 4}))
    assert job.plan.component("trainer").instances[0].gpus == (4, 5, 6, 7)
    e = job.run("trainer")
    assert gpus_of(e) == (4, 5, 6, 7) and "--nproc-per-node=4" in e.command


def test_rl_single_shared_gpu():
    job = B(rl(gpus=1, cpus=8, placement={"colocate": True, "share_gpus": True}))
    p = job.plan
    inf, tr = p.component("inference"), p.component("trainer")
    assert [i.gpus for i in inf.instances] == [(0,)]
    assert [i.gpus for i in tr.instances] == [(0,)]
    assert gpus_of(job.run("inference")) == gpus_of(job.run("trainer")) == (0,)
    assert inf.overlap and tr.overlap
    assert job.run("inference").after("--gpu-memory-utilization") == "0.45"
    assert p.warnings and any("gpu_memory_utilization" in w for w in p.warnings)


def test_rl_single_shared_gpu_keeps_explicit_memory_fraction():
    job = B(rl(gpus=1, cpus=8, placement={"colocate": True, "share_gpus": True},
               inference={"gpu_memory_utilization": 0.3}))
    assert job.run("inference").after("--gpu-memory-utilization") == "0.3"
    assert not any("gpu_memory_utilization" in w for w in job.plan.warnings)


def test_rl_not_shared_has_no_memory_fraction():
    job = B(rl(placement={"colocate": True}, inference={"gpus_per_node": 4}))
    for _, e in job.tasks("inference"):
        assert "--gpu-memory-utilization" not in e.command
    assert job.plan.warnings == ()


# ---- RL multi-node: orchestrator placement ---------------------------------------------------


def _rl_multi(placement: str) -> Plan:
    return P(rl_multi_data(placement))


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


@pytest.mark.parametrize("placement", ["trainer", "inference", "own"])
def test_rl_multinode_orchestrator_reaches_router_and_every_server(placement):
    """Wherever it runs, the orchestrator sends requests to the router and admin calls to every server;
    the trainer's agents meet on the trainer group's first node."""
    job = B(rl_multi_data(placement))
    p = job.plan
    servers = [f"http://g1n{i.node}:{port(p, i.ports['http'])}" for i in p.component("inference").instances]
    assert len(servers) == 8
    e = job.run("orchestrator")
    assert values_after(e.command, "--requests-url") == [f"http://g1n0:{port(p, 'router')}"]
    assert values_after(e.command, "--admin-urls") == servers
    assert values_after(job.run("router").command, "--worker-urls") == servers
    for _, t in job.tasks("trainer"):
        assert prefixed(t.command, "--rdzv-endpoint=") == f"g0n0:{port(p, 'torch_rdzv')}"


# ---- inference replicas ------------------------------------------------------------------------


@pytest.mark.parametrize("tp,dp,per_node", [(1, 1, 8), (2, 1, 4), (2, 2, 2), (4, 1, 2), (8, 1, 1), (1, 4, 2)])
def test_replicas_servers_per_node(tp, dp, per_node):
    job = B(make("inference", inference={"nodes": 2, "tp": tp, "dp": dp}))
    p = job.plan
    inf = p.component("inference")
    assert inf.tasks_per_node == per_node
    assert len(inf.instances) == 2 * per_node
    for node in (0, 1):
        on_node = [(i, e) for i, e in job.tasks("inference") if i.node == node]
        assert len(on_node) == per_node
        assert len({e.after("--port") for _, e in on_node}) == per_node
        gpus = [g for _, e in on_node for g in gpus_of(e)]
        assert sorted(gpus) == list(range(8))
        for i, e in on_node:
            assert len(i.gpus) == tp * dp and gpus_of(e) == i.gpus
            assert e.after("--tensor-parallel-size") == str(tp)
            if dp > 1:
                assert e.after("--data-parallel-size") == str(dp)
            else:
                assert "--data-parallel-size" not in e.command
        if dp > 1:
            assert len({e.after("--data-parallel-rpc-port") for _, e in on_node}) == per_node
    assert_tasks_match_instances(job, "inference")
    names = [c.name for c in p.components]
    assert ("router" in names) == (2 * per_node > 1)


def test_replicas_one_server_has_no_router():
    p = P(make("inference", inference={"tp": 8}))
    assert [c.name for c in p.components] == ["inference"]
    assert "router" not in p.ports


def test_replicas_router_enabled_explicitly_for_one_server():
    job = B(make("inference", inference={"tp": 8, "router": {"enabled": True}}))
    p = job.plan
    assert values_after(job.run("router").command, "--worker-urls") == [f"http://g0n0:{port(p, 'server_0')}"]
    assert "router" in p.services


def test_replicas_router_disabled_explicitly():
    p = P(make("inference", inference={"nodes": 2, "router": {"enabled": False}}))
    assert "router" not in [c.name for c in p.components]


def test_replicas_router_lists_every_server():
    job = B(make("inference", inference={"nodes": 3, "tp": 2}))
    inf = job.plan.component("inference")
    workers = values_after(job.run("router").command, "--worker-urls")
    assert len(workers) == 12 and len(set(workers)) == 12
    # each server's own address: its node's host and the --port it was started with
    assert workers == [f"http://{job.host(inf, i)}:{e.after('--port')}" for i, e in job.tasks("inference")]
    assert {w.rsplit(":", 1)[0] for w in workers} == {"http://g0n0", "http://g0n1", "http://g0n2"}
    assert job.urls["URLS_INFERENCE"].split() == workers
    assert_tasks_match_instances(job, "router")


# ---- wide-EP -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dp", [32, 1])
def test_wide_ep_one_task_per_node_headless_followers(dp):
    job = B(make("inference", cpus=96, inference={"mode": "wide_ep", "nodes": 4, "tp": 1, "dp": dp}))
    p = job.plan
    inf = p.component("inference")
    assert inf.tasks_per_node == 1 and len(inf.instances) == 4
    g = inf.group
    for i, e in job.tasks("inference"):
        a = e.command
        assert i.gpus == tuple(range(8)) and gpus_of(e) == i.gpus
        assert e.after("--data-parallel-size") == "32"
        assert e.after("--data-parallel-size-local") == "8"
        assert e.after("--data-parallel-address") == f"g{g}n0"  # the head node, on every node
        assert e.after("--data-parallel-rpc-port") == str(port(p, "dprpc_0"))
        assert "--enable-expert-parallel" in a
        if i.node == 0:
            assert "--headless" not in a
            assert "--data-parallel-start-rank" not in a
            assert ready_url(e) == f"http://g{g}n0:{e.after('--port')}"
        else:
            assert "--headless" in a
            assert e.after("--data-parallel-start-rank") == str(i.node * 8)
            assert ready_url(e) is None  # headless: serves no API, writes no URL
    assert inf.health.first_node_only
    # the router is given only the API the head node serves
    assert values_after(job.run("router").command, "--worker-urls") == [f"http://g{g}n0:{port(p, 'server_0')}"]


def test_wide_ep_with_tp2():
    job = B(make("inference", cpus=96, inference={"mode": "wide_ep", "nodes": 2, "tp": 2}))
    (i0, e0), (i1, e1) = job.tasks("inference")
    assert e1.after("--data-parallel-start-rank") == "4"
    assert e0.after("--data-parallel-size") == e1.after("--data-parallel-size") == "8"
    assert e0.after("--data-parallel-size-local") == "4" and e0.after("--tensor-parallel-size") == "2"
    assert gpus_of(e0) == gpus_of(e1) == tuple(range(8))


# ---- P/D ---------------------------------------------------------------------------------------


def _pd(connector: str) -> Job:
    return B(make("inference", inference={
        "mode": "pd", "kv_connector": connector,
        "prefill": {"replicas": 4, "tp": 2}, "decode": {"replicas": 4, "tp": 4, "nodes": 2},
    }))


def test_pd_nixl_separate_groups_and_router_lists():
    job = _pd("NixlConnector")
    p = job.plan
    assert [g.name for g in p.groups] == ["prefill", "decode"]
    pre, dec = p.component("prefill"), p.component("decode")
    assert pre.group != dec.group
    for c in (pre, dec):
        for i, e in job.tasks(c.name):
            cfg = kv_cfg(e)
            assert cfg["kv_connector"] == "NixlConnector"
            assert cfg["kv_role"] == "kv_both"
            # NIXL's side channel: one port per first GPU position, on the task's own host
            assert e.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(port(p, f"nixl_{i.gpus[0]}"))
            assert e.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == job.host(c, i)
        assert_tasks_match_instances(job, c.name)
    r = job.run("router").command
    assert "--vllm-pd-disaggregation" in r
    assert r[r.index("--kv-connector") + 1] == "nixl"
    prefill, decode = pools(r, "--prefill"), pools(r, "--decode")
    assert prefill == [f"http://{job.host(pre, i)}:{e.after('--port')}" for i, e in job.tasks("prefill")]
    assert decode == [f"http://{job.host(dec, i)}:{e.after('--port')}" for i, e in job.tasks("decode")]
    assert len(prefill) == 4 and {u.split(":")[1] for u in prefill} == {f"//g{pre.group}n0"}
    assert len(decode) == 4 and {u.split(":")[1] for u in decode} == {f"//g{dec.group}n0", f"//g{dec.group}n1"}
    assert "--worker-urls" not in r


def test_pd_mooncake_producer_consumer_and_bootstrap_ports():
    job = _pd("MooncakeConnector")
    p = job.plan
    pre, dec = p.component("prefill"), p.component("decode")
    for c, role in ((pre, "kv_producer"), (dec, "kv_consumer")):
        for i, e in job.tasks(c.name):
            cfg = kv_cfg(e)
            assert cfg == {"kv_connector": "MooncakeConnector", "kv_role": role,
                           "kv_connector_extra_config": {"mooncake_protocol": "rdma"}}
            if c is pre:
                assert e.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == str(port(p, f"kv_{i.local}"))
            else:
                assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in e.env
            assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in e.env
        assert_tasks_match_instances(job, c.name)
    cmd = job.run("router").command
    assert cmd[cmd.index("--kv-connector") + 1] == "mooncake"
    # each --prefill URL is followed by that server's bootstrap port
    pairs = [(cmd[k + 1], cmd[k + 2]) for k, a in enumerate(cmd) if a == "--prefill"]
    want = [(f"http://{job.host(pre, i)}:{e.after('--port')}", e.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"])
            for i, e in job.tasks("prefill")]
    assert pairs == want and len(pools(cmd, "--decode")) == 4


# ---- KV offload --------------------------------------------------------------------------------


def test_kv_offload_cpu_splits_budget_per_server():
    job = B(make("inference", inference={"tp": 2, "kv_offload": {"kind": "cpu", "cpu_gb": 64}}))
    tasks = job.tasks("inference")
    assert len(tasks) == 4
    for _, e in tasks:
        assert e.after("--kv-offloading-backend") == "native"
        assert float(e.after("--kv-offloading-size")) == 16


def test_kv_offload_cpu_disk_connector():
    job = B(make("inference", inference={"nodes": 2, "tp": 4, "kv_offload": {
        "kind": "cpu_disk", "cpu_gb": 64, "disk_path": "/nvme/kv", "disk_gb": 500}}))
    tasks = job.tasks("inference")
    assert len(tasks) == 4
    for _, e in tasks:
        cfg = kv_cfg(e)
        assert cfg["kv_connector"] == "OffloadingConnector"
        extra = cfg["kv_connector_extra_config"]
        assert extra["disk_path"] == "/nvme/kv"
        assert extra["cpu_bytes_to_use"] == 32 * 2**30
        assert extra["disk_bytes_to_use"] == 250 * 2**30


def test_kv_offload_mooncake_stages_and_clients():
    job = B(make("inference", inference={"nodes": 3, "tp": 2, "kv_offload": {"kind": "mooncake", "cpu_gb": 128}}))
    p = job.plan
    master, client, inf = (p.component(n) for n in ("mooncake-master", "mooncake-client", "inference"))
    assert master.stage < client.stage < inf.stage
    order = [s.components for s in p.stages]
    flat = [n for s in order for n in s]
    assert flat.index("mooncake-master") < flat.index("mooncake-client") < flat.index("inference")
    assert not (set(order[[i for i, s in enumerate(order) if "mooncake-client" in s][0]]) & {"inference"})
    assert client.tasks_per_node == 1 and client.nodes == inf.nodes == 3
    assert sorted(i.node for i in client.instances) == [0, 1, 2]
    assert master.nodes == 1 and master.group == inf.group and master.first_node == 0
    head = f"g{inf.group}n0"
    rpc, meta = port(p, "mooncake_rpc"), port(p, "mooncake_metadata")
    for _, e in job.tasks("inference"):
        assert kv_cfg(e)["kv_connector"] == "MooncakeStoreConnector"
        assert e.env["MOONCAKE_MASTER"] == f"{head}:{rpc}"
        assert e.env["MOONCAKE_METADATA_SERVER"] == f"http://{head}:{meta}/metadata"
    # one client per inference node, each pointing at the master and naming its own host
    for i, e in job.tasks("mooncake-client"):
        assert prefixed(e.command, "--master_server_address=") == f"{head}:{rpc}"
        assert prefixed(e.command, "--metadata_server=") == f"http://{head}:{meta}/metadata"
        assert prefixed(e.command, "--local_hostname=") == job.host(client, i)
        assert "--global_segment_size=128 GB" in e.command
    for name in ("mooncake-master", "mooncake-client", "inference"):
        assert_tasks_match_instances(job, name)
    assert "mooncake-master" in p.services
