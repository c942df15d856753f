"""Dynamo workers with data parallelism, without a cluster: what each rank's task really execs
(tests/support/task_expand.py) for DP local to a node and DP spanning nodes, the mocker's simulated ranks,
TRT-LLM's attention DP, and every rendered argv checked by the engines' own argument parsers
(Dynamo's in .venv-dynamo; vLLM's engine arguments in .venv, marked ``vllm``). The mocker's DP
shape runs for real in tests/test_dynamo_cluster.py.
"""

from __future__ import annotations

import json

import pytest
from dynamo_plans import RECIPES, base, engine_argv, parse, port, render, srun, tasks
from planner_jobs import B, assert_tasks_match_instances


def sup_gpus(e) -> str:
    return e.supervisor[e.supervisor.index("--gpus") + 1]


def ready_instances(out) -> int:
    (_, fe), = tasks(out, "frontend")
    return int(fe.supervisor[fe.supervisor.index("--ready-instances") + 1])


def test_vllm_dp_local_to_a_node_is_a_process_per_rank(tmp_path):
    out = render(tmp_path, base(nodes=1, tp=2, dp=2, expert_parallel=True, dynamo={"engine": "vllm"}))
    w = out.plan.component("inference")
    assert (w.nodes, w.tasks_per_node) == (1, 2)
    assert "--kill-on-bad-exit=1" in srun(w)  # a dead rank stalls its worker's others
    seen = []
    for inst, e in tasks(out, "inference"):
        assert e.command[:3] == ["python3", "-m", "dynamo.vllm"]
        assert e.after("--tensor-parallel-size") == "2" and e.after("--data-parallel-size") == "2"
        assert "--enable-expert-parallel" in e.command  # vLLM's attention DP: DP ranks, experts over EP
        assert e.after("--data-parallel-address") == "g0n0"
        assert e.after("--data-parallel-rpc-port") == str(port(out, "dprpc_0"))
        seen.append((e.after("--data-parallel-rank"), sup_gpus(e), e.env["DYN_SYSTEM_PORT"]))
    assert seen == [("0", "0:2", str(port(out, "server_0"))), ("1", "2:2", str(port(out, "server_1")))]
    assert [i.ports.get("dp_rpc") for i in w.instances] == ["dprpc_0", None]  # rank 0 serves it
    assert ready_instances(out) == 2  # every rank registers on its own


def test_two_dp_workers_on_one_node_have_their_own_rpc_ports(tmp_path):
    out = render(tmp_path, base(nodes=2, dp=2, dynamo={"engine": "vllm"}))
    got = [(inst.node, e.after("--data-parallel-rank"), e.after("--data-parallel-address"),
            e.after("--data-parallel-rpc-port"), sup_gpus(e)) for inst, e in tasks(out, "inference")]
    rpc0, rpc1 = str(port(out, "dprpc_0")), str(port(out, "dprpc_1"))
    assert got == [(0, "0", "g0n0", rpc0, "0:1"), (0, "1", "g0n0", rpc0, "1:1"),
                   (0, "0", "g0n0", rpc1, "2:1"), (0, "1", "g0n0", rpc1, "3:1"),
                   (1, "0", "g0n1", rpc0, "0:1"), (1, "1", "g0n1", rpc0, "1:1"),
                   (1, "0", "g0n1", rpc1, "2:1"), (1, "1", "g0n1", rpc1, "3:1")]
    assert ready_instances(out) == 8


def test_vllm_dp_spanning_nodes_ranks_count_across_the_workers_nodes(tmp_path):
    out = render(tmp_path, base(nodes=4, tp=2, dp=4, dynamo={"engine": "vllm"}))
    w = out.plan.component("inference")
    assert (w.nodes, w.tasks_per_node) == (4, 2)
    got = [(inst.node, e.after("--data-parallel-rank"), e.after("--data-parallel-address"), sup_gpus(e))
           for inst, e in tasks(out, "inference")]
    assert got == [(0, "0", "g0n0", "0:2"), (0, "1", "g0n0", "2:2"), (1, "2", "g0n0", "0:2"), (1, "3", "g0n0", "2:2"),
                   (2, "0", "g0n2", "0:2"), (2, "1", "g0n2", "2:2"), (3, "2", "g0n2", "0:2"), (3, "3", "g0n2", "2:2")]
    assert {e.after("--data-parallel-rpc-port") for _, e in tasks(out, "inference")} == {str(port(out, "dprpc_0"))}
    assert [bool(i.ports.get("dp_rpc")) for i in w.instances] == [True, False, False, False] * 2
    assert ready_instances(out) == 8


def test_disaggregated_dp_ranks_get_their_own_nixl_ports(tmp_path):
    out = render(tmp_path, base(mode="pd", dynamo={"engine": "vllm"}, prefill={"replicas": 1, "dp": 2},
                                decode={"replicas": 1, "tp": 2}))
    # vLLM listens on VLLM_NIXL_SIDE_CHANNEL_PORT + its data-parallel rank: each rank on its first GPU's port
    listens = [int(e.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) + int(e.after("--data-parallel-rank"))
               for _, e in tasks(out, "prefill")]
    assert listens == [port(out, "nixl_0"), port(out, "nixl_1")]
    assert [i.ports["kv"] for i in out.plan.component("prefill").instances] == ["nixl_0", "nixl_1"]
    assert [e.after("--data-parallel-rank") for _, e in tasks(out, "prefill")] == ["0", "1"]
    assert "--data-parallel-size" not in tasks(out, "decode")[0][1].command
    assert ready_instances(out) == 3
    out = render(tmp_path, base(mode="pd", dynamo={"engine": "vllm"}, prefill={"replicas": 2, "dp": 2},
                                decode={"replicas": 1}))
    listens = [int(e.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) + int(e.after("--data-parallel-rank"))
               for _, e in tasks(out, "prefill")]
    assert listens == [port(out, f"nixl_{k}") for k in range(4)]  # two workers' ranks: no port twice


def test_mocker_simulates_the_ranks_in_one_process(tmp_path):
    out = render(tmp_path, base(nodes=1, dp=2, dynamo={"speedup_ratio": 10}))
    got = [(e.after("--data-parallel-size"), sup_gpus(e)) for _, e in tasks(out, "inference")]
    assert got == [("2", "0:2"), ("2", "2:2")]  # two workers of tp x dp = 2 GPUs
    assert all("--data-parallel-rank" not in e.command for _, e in tasks(out, "inference"))
    assert ready_instances(out) == 2


def test_trtllm_attention_dp_is_over_its_tp_ranks(tmp_path):
    out = render(tmp_path, base(nodes=2, tp=8, dynamo={"engine": "trtllm", "engine_config": "/e.yaml",
                                                      "attention_dp": True}))
    e = tasks(out, "inference")[0][1]
    assert "--enable-attention-dp" in e.command and e.after("--tensor-parallel-size") == "8"


def dp_lines(tmp_path) -> list[tuple[str, list[str]]]:
    """(module, argv) of every Dynamo worker of the DP gallery recipe and a few DP variants."""
    found = []
    cases = [RECIPES / "inference-dynamo-dp.toml", base(nodes=1, dp=2, dynamo={"speedup_ratio": 0}),
             base(nodes=4, tp=2, dp=4, expert_parallel=True, dynamo={"engine": "vllm"}),
             base(nodes=4, tp=2, dp=4, dynamo={"engine": "vllm", "dp_launch": "per_node"}),
             base(nodes=1, tp=4, dynamo={"engine": "trtllm", "engine_config": "/e.yaml", "attention_dp": True})]
    for i, case in enumerate(cases):
        d = tmp_path / str(i)
        d.mkdir()
        out = render(d, case, ["model.max_model_len=4096"])
        for c in out.plan.components:
            if c.role == "dynamo-worker":
                found += [engine_argv(e) for _, e in tasks(out, c.name)]
    return found


def test_rendered_dp_lines_parse_with_dynamos_parsers(tmp_path):
    lines = dp_lines(tmp_path)
    assert {m for m, _ in lines} == {"dynamo.vllm", "dynamo.mocker", "dynamo.trtllm"}
    results = parse(lines)
    for (module, argv), r in zip(lines, results):
        assert r["ok"], (module, argv, r)
    # the DP flags are vLLM's engine arguments: Dynamo's own groups leave them for vLLM's parser
    left = [r["left"] for (m, _), r in zip(lines, results) if m == "dynamo.vllm"]
    assert all(("--data-parallel-rank" in a or "--data-parallel-hybrid-lb" in a) and "--data-parallel-rpc-port" in a
               for a in left)
    mocker = next(a for m, a in lines if m == "dynamo.mocker")
    bad = parse([("dynamo.mocker", [*mocker, "--data-parallel-rank", "1"])])
    assert not bad[0]["ok"]  # the mocker has no per-rank flag: its ranks live in one process


@pytest.mark.vllm
def test_rendered_dp_lines_parse_with_vllms_parser(tmp_path, vllm_python):
    check = ("import json, sys\nfrom vllm.engine.arg_utils import AsyncEngineArgs\n"
             "try:\n    from vllm.utils import FlexibleArgumentParser\n"
             "except ImportError:\n    from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
             "p = FlexibleArgumentParser(add_help=False)\nAsyncEngineArgs.add_cli_args(p, async_args_only=False)\n"
             "for argv in json.loads(sys.argv[1]):\n    a = p.parse_args(argv)\n"
             "    print(json.dumps([a.data_parallel_size, a.data_parallel_rank, a.data_parallel_address,"
             " a.data_parallel_rpc_port, a.data_parallel_start_rank, a.data_parallel_size_local,"
             " a.data_parallel_hybrid_lb]))\n")
    lines = [(m, a) for m, a in dp_lines(tmp_path) if m == "dynamo.vllm"]
    rest = [r["left"] for r in parse(lines)]
    ok = vllm_python.run(check, json.dumps(rest))
    assert ok.returncode == 0, ok.stderr[-3000:]
    parsed = [json.loads(line) for line in ok.stdout.strip().splitlines()[-len(rest):]]
    per_rank = [p for p in parsed if p[1] is not None]
    per_node = [p for p in parsed if p[1] is None]
    assert per_rank and per_node
    assert all(0 <= p[1] < p[0] for p in per_rank)  # one rank each, below the size
    assert all(p[6] and 0 <= p[4] and p[4] + p[5] <= p[0] for p in per_node)  # hybrid LB: the node's ranks
    assert all(isinstance(p[3], int) and p[2].startswith("g0n") for p in parsed)


def test_vllm_dp_per_node_is_one_process_per_node_of_a_worker(tmp_path):
    """vLLM's hybrid load balancing: each node's process runs its node's ranks from its start rank."""
    out = render(tmp_path, base(nodes=4, tp=2, dp=4, dynamo={"engine": "vllm", "dp_launch": "per_node"}))
    w = out.plan.component("inference")
    assert (w.nodes, w.tasks_per_node) == (4, 1) and "--kill-on-bad-exit=1" in srun(w)
    got = [(inst.node, e.after("--data-parallel-size-local"), e.after("--data-parallel-start-rank"),
            e.after("--data-parallel-address"), sup_gpus(e)) for inst, e in tasks(out, "inference")]
    assert got == [(0, "2", "0", "g0n0", "0:4"), (1, "2", "2", "g0n0", "0:4"),
                   (2, "2", "0", "g0n2", "0:4"), (3, "2", "2", "g0n2", "0:4")]
    for _, e in tasks(out, "inference"):
        assert "--data-parallel-hybrid-lb" in e.command and "--data-parallel-rank" not in e.command
        assert e.after("--data-parallel-size") == "4" and e.after("--data-parallel-rpc-port") == str(port(out, "dprpc_0"))
    assert ready_instances(out) == 4  # one Dynamo instance per node's process
    out = render(tmp_path, base(nodes=1, dp=2, dynamo={"engine": "vllm", "dp_launch": "per_node"}))
    got = [(e.after("--data-parallel-start-rank"), e.after("--data-parallel-rpc-port"), sup_gpus(e))
           for _, e in tasks(out, "inference")]
    assert got == [("0", str(port(out, "dprpc_0")), "0:2"), ("0", str(port(out, "dprpc_1")), "2:2")]
    assert "--kill-on-bad-exit=0" in srun(out.plan.component("inference"))  # a worker per task: the others serve
    assert ready_instances(out) == 2


def test_dp_per_node_with_pd_gives_each_rank_its_own_nixl_port(tmp_path):
    out = render(tmp_path, base(mode="pd", dynamo={"engine": "vllm", "dp_launch": "per_node"},
                                prefill={"replicas": 1, "dp": 8}, decode={"replicas": 1}))
    for inst, e in tasks(out, "prefill"):  # vLLM adds each rank's index: the node's ranks on its GPUs' ports
        start = int(e.after("--data-parallel-start-rank"))
        assert start == 4 * inst.node
        listens = [int(e.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) + start + k for k in range(4)]
        assert listens == [port(out, f"nixl_{g}") for g in range(4)]


@pytest.mark.parametrize("case", [
    base(nodes=2, dp=2, dynamo={"engine": "vllm"}),
    base(nodes=4, tp=2, dp=4, dynamo={"engine": "vllm", "dp_launch": "per_node"}),
    base(mode="pd", dynamo={"engine": "vllm"}, prefill={"replicas": 2, "dp": 2}, decode={"replicas": 1, "tp": 2}),
    base(mode="pd", dynamo={"engine": "vllm", "dp_launch": "per_node"}, prefill={"replicas": 1, "dp": 8},
         decode={"replicas": 1, "dp": 2}),
], ids=["per-rank-local", "per-node-spanning", "pd-per-rank", "pd-per-node"])
def test_every_rank_listens_where_its_instance_says(case):
    """The planner's invariant (tests/support/planner_jobs.py): each task's GPU slice and the ports it
    listens on (system, DP RPC on rank 0, a NIXL side channel per rank) are its instance's."""
    job = B(case)
    for c in job.plan.components:
        assert_tasks_match_instances(job, c.name)
