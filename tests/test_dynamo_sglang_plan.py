"""Dynamo's SGLang workers (``[inference.dynamo] engine = "sglang"``) without a cluster: the worker
shapes (aggregated, data-parallel attention, spanning nodes, prefill/decode), what each task really
execs (tests/support/task_expand.py), the settings refused (one line naming the field), and every rendered
``dynamo.sglang`` line parsed by Dynamo 1.4.2's own parser and SGLang's ServerArgs
(tests/support/sglang_parsers.py). dynamo.sglang needs GPUs: it has not run here (the mocker stands in for
the DP shape on the local Slurm: tests/test_dynamo_dp_cluster.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sglang_parsers
from sglang_plans import refusal, render
from task_expand import JOB_ID, expand

from slurmrl import ports

ROOT = Path(__file__).resolve().parent.parent
GALLERY = ROOT / "recipes" / "inference-dynamo-sglang.toml"


def base(dynamo: dict | None = None, model: dict | None = None, **inference) -> dict:
    return {
        "name": "dsg", "kind": "inference", "slurm": {"gpus_per_node": 8, "cpus_per_node": 32},
        "model": {"path": "/models/m", "served_name": "m", **(model or {})},
        "inference": {"backend": "dynamo", "auth": "none", **inference,
                      "dynamo": {"engine": "sglang", **(dynamo or {})}},
    }


def pd(**dynamo) -> dict:
    return base({"transfer_backend": "nixl", **dynamo}, mode="pd", prefill={"replicas": 2, "tp": 4},
                decode={"replicas": 1, "tp": 8, "dp": 8})


def port(out, name: str) -> int:
    return ports.base_for_job(JOB_ID) + out.plan.ports[name]


def workers(out):
    """(component, instance, argv after ``dynamo.sglang``, env) of every worker task."""
    for c in out.plan.components:
        if c.role != "dynamo-worker":
            continue
        for i in c.instances:
            e = expand(out.script, out.plan, c.name, i.node, i.local)
            k = e.command.index("dynamo.sglang")
            assert e.command[k - 1] == "-m"
            yield c.name, i, e.command[k + 1:], e.env


def frontend_instances(out) -> int:
    sup = expand(out.script, out.plan, "frontend").supervisor
    return int(sup[sup.index("--ready-instances") + 1])


def test_the_gallery_runs_one_dynamo_sglang_per_node_of_each_two_node_worker(tmp_path):
    out = render(tmp_path, GALLERY)
    found = list(workers(out))
    assert [i.node for _, i, _, _ in found] == [0, 1, 2, 3]
    for _, i, argv, env in found:
        assert argv[:4] == ["--model-path", "/models/DeepSeek-R1", "--served-model-name", "deepseek-ai/DeepSeek-R1"]
        assert argv[argv.index("--tp-size") + 1] == "16" and argv[argv.index("--dp-size") + 1] == "16"
        assert "--enable-dp-attention" in argv and "--trust-remote-code" in argv
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == str(i.node % 2)
        assert argv[argv.index("--dist-init-addr") + 1] == f"g0n{i.node // 2 * 2}:{port(out, 'dprpc_0')}"
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.8"
        assert argv[-2:] == ["--chunked-prefill-size", "16384"]
        assert env["DYN_SYSTEM_PORT"] == str(port(out, "server_0")) and env["DYN_NAMESPACE"] == f"job{JOB_ID}"
        assert i.ports == ({"system": "server_0", "dist": "dprpc_0"} if i.node % 2 == 0 else {"system": "server_0"})
        assert "--disaggregation-mode" not in argv
    assert frontend_instances(out) == 2 and out.plan.warnings == ()  # a worker's second node registers nothing
    # SGLang takes --dist-init-addr's port + 1..6 as well: inside the job's block
    assert out.plan.ports["dprpc_0"] + 6 < ports.STRIDE


def test_workers_within_a_node_are_one_task_each_on_their_own_gpus(tmp_path):
    out = render(tmp_path, base(nodes=2, tp=2))
    found = list(workers(out))
    assert len(found) == 8 and {i.gpus for _, i, _, _ in found} == {(0, 1), (2, 3), (4, 5), (6, 7)}
    for _, i, argv, env in found:
        assert "--dist-init-addr" not in argv and "--dp-size" not in argv
        assert env["DYN_SYSTEM_PORT"] == str(port(out, f"server_{i.local}"))
    assert frontend_instances(out) == 8


def test_attention_dp_on_one_node_keeps_sglangs_ports_in_the_job_block(tmp_path):
    out = render(tmp_path, base({"attention_dp": True}, tp=8, dp=4))
    (_, i, argv, _), = workers(out)
    assert i.gpus == tuple(range(8)) and "--enable-dp-attention" in argv
    # the node's name: Dynamo gives a prefill worker's bootstrap host as this address's host
    assert argv[argv.index("--dist-init-addr") + 1] == f"g0n0:{port(out, 'dprpc_0')}"


def test_prefill_workers_serve_bootstrap_on_their_kv_port_and_decode_uses_attention_dp(tmp_path):
    out = render(tmp_path, pd(attention_dp=True))
    assert [(g.name, g.nodes) for g in out.plan.groups] == [("prefill", 1), ("decode", 1)]
    for name, i, argv, _ in workers(out):
        assert argv.count("--disaggregation-mode") == 1 and argv[argv.index("--disaggregation-mode") + 1] == name
        assert argv[argv.index("--disaggregation-transfer-backend") + 1] == "nixl"
        if name == "prefill":
            assert argv[argv.index("--disaggregation-bootstrap-port") + 1] == str(port(out, f"kv_{i.local}"))
            assert i.ports["bootstrap"] == f"kv_{i.local}" and "--dp-size" not in argv
        else:
            assert "--disaggregation-bootstrap-port" not in argv and "--enable-dp-attention" in argv
    assert frontend_instances(out) == 3
    assert any("P/D over nixl has not run" in w for w in out.plan.warnings), out.plan.warnings


@pytest.mark.parametrize("recipe, field", [
    (pd(transfer_backend=None), "inference.dynamo.transfer_backend"),
    (base({"transfer_backend": "nixl"}), "inference.dynamo.transfer_backend"),
    (base({"engine": "vllm", "mem_fraction_static": 0.8}), "inference.dynamo.mem_fraction_static"),
    (base({"attention_dp": True}), "inference.dynamo.attention_dp"),  # dp = 1
    (base({"attention_dp": True}, tp=4, dp=3), "inference.dp"),
    (base({"attention_dp": True}, tp=4, dp=4), "inference.dynamo.attention_dp"),  # two workers per node
    (base(tp=8, dp=2, nodes=2), "inference.dp"),  # plain DP does not span nodes
    (base({"dp_launch": "per_node"}, tp=2, dp=2), "inference.dynamo.dp_launch"),
    (base(gpu_memory_utilization=0.9), "inference.gpu_memory_utilization"),
    (base(enforce_eager=True), "inference.enforce_eager"),
    (base(tp=16, nodes=3), "inference.nodes"),
    (base(tp=16, nodes=2, model={"stage": "local"}), "model.stage"),
])
def test_refused_with_one_line_naming_the_field(tmp_path, recipe, field):
    msg = refusal(tmp_path, recipe)
    assert msg.startswith(f"{field}:"), msg


def test_every_rendered_worker_line_parses_with_dynamos_own_parser(tmp_path):
    cases = [GALLERY, base(nodes=2, tp=2), base({"attention_dp": True, "transfer_backend": None}, tp=8, dp=4),
             pd(attention_dp=True), base(model={"dtype": "bfloat16", "max_model_len": 4096}, tp=2, dp=2)]
    argvs = []
    for k, case in enumerate(cases):
        d = tmp_path / str(k)
        d.mkdir()
        argvs += [argv for _, _, argv, _ in workers(render(d, case))]
    result = sglang_parsers.parse_dynamo(argvs)
    assert (result["version"], result["sglang"]) == ("1.4.2", "0.5.23"), result
    for argv, got in zip(argvs, result["parsed"], strict=True):
        for dest, value in sglang_parsers.given(argv).items():
            assert str(got[dest]) == value, (dest, value, got.get(dest), argv)
        assert got["enable_dp_attention"] is ("--enable-dp-attention" in argv)
        assert got["trust_remote_code"] is ("--trust-remote-code" in argv)
        assert got["disaggregation_mode"] == (argv[argv.index("--disaggregation-mode") + 1]
                                              if "--disaggregation-mode" in argv else "null")
