"""Plain SGLang servers (``inference.backend = "sglang"``) without a cluster: the shapes the planner
makes (replicas behind vllm-router, one server alone, a server spanning nodes, data-parallel
attention), what each task really execs (tests/support/task_expand.py), the combinations refused (one line
naming the field, exit 2), and every rendered server argv parsed by SGLang's own server-args parser.

The parser: sglang 0.5.23's ``sglang.srt.server_args`` imports on a CPU-only machine (the wheel
with ``--no-deps``, IPython, and what .venv already has: torch, msgspec, ...). It is not in .venv
(sglang pins versions vLLM's CPU build disagrees with): scripts/install.sh puts it in .venv-sglang,
which reads .venv's packages through a .pth. ``SLURMRL_SGLANG_PYTHON`` names another Python that
imports it; where none does, the parser test is skipped, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sglang_parsers
from sglang_plans import refusal, render, write
from task_expand import JOB_ID, expand

from slurmrl import ports
from slurmrl.app.build import Rendered

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"


def base(gpus: int = 4, **inference) -> dict:
    return {
        "name": "sg", "kind": "inference", "slurm": {"gpus_per_node": gpus, "cpus_per_node": 32},
        "model": {"path": "/models/m", "served_name": "m"},
        "inference": {"backend": "sglang", "auth": "none", **inference},
    }


def tasks(out: Rendered, name: str = "inference"):
    c = out.plan.component(name)
    return [(i, expand(out.script, out.plan, name, i.node, i.local)) for i in c.instances]


def port(out: Rendered, name: str) -> int:
    return ports.base_for_job(JOB_ID) + out.plan.ports[name]


def server_argv(e) -> list[str]:
    cmd = e.command
    i = cmd.index("sglang.launch_server")
    assert cmd[i - 1] == "-m"
    return cmd[i + 1:]


# ---- shapes ---------------------------------------------------------------------------------------


def test_replicas_are_one_server_per_tp_gpus_behind_the_router(tmp_path):
    out = render(tmp_path, base(nodes=2, tp=2, mem_fraction_static=0.85))
    found = tasks(out)
    assert len(found) == 4 and {i.gpus for i, _ in found} == {(0, 1), (2, 3)}
    for i, e in found:
        argv = server_argv(e)
        assert argv[:10] == ["--model-path", "/models/m", "--served-model-name", "m", "--host", "0.0.0.0",
                             "--port", str(port(out, f"server_{i.local}")), "--tp-size", "2"]
        assert argv[10:] == ["--mem-fraction-static", "0.85"]
        assert "--ready-completion" not in e.supervisor  # the router's completion reaches them
    router = out.plan.component("router")
    assert "--worker-urls" in router.task.command and "cache_aware" not in router.task.command


def test_one_server_alone_answers_a_completion_before_it_is_ready(tmp_path):
    out = render(tmp_path, base(tp=4))
    assert not any(c.name == "router" for c in out.plan.components)
    (_, e), = tasks(out)
    assert e.supervisor[e.supervisor.index("--ready-completion") + 1] == "m"
    assert "--dist-init-addr" not in e.command and "--dp-size" not in e.command


def test_a_server_spanning_nodes_runs_on_each_with_its_rank_and_the_first_node_address(tmp_path):
    out = render(tmp_path, RECIPES / "inference-sglang.toml")
    found = tasks(out)
    assert [i.node for i, _ in found] == [0, 1, 2, 3]
    hosts = out.plan.component("inference")
    for i, e in found:
        argv = server_argv(e)
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--node-rank") + 1] == str(i.node % 2)
        leader = f"g0n{i.node // 2 * 2}"  # task_expand's node names
        assert argv[argv.index("--dist-init-addr") + 1] == f"{leader}:{port(out, 'dprpc_0')}"
        assert argv[argv.index("--tp-size") + 1] == "16" and "--trust-remote-code" in argv
        assert argv[-2:] == ["--chunked-prefill-size", "8192"]
        ready = e.supervisor[e.supervisor.index("--ready") + 1]
        assert ready == ("started" if i.node % 2 else f"http://g0n{i.node}:{port(out, 'server_0')}")
        assert i.ports == ({"http": "server_0", "dist": "dprpc_0"} if i.node % 2 == 0 else {})
    assert hosts.health.nodes_per_server == 2
    # SGLang takes its ZeroMQ ports at --dist-init-addr's port + 1..6: inside the job's block
    assert out.plan.ports["dprpc_0"] + 6 < ports.STRIDE


def test_dp_attention_on_one_node_keeps_sglangs_ports_in_the_job_block(tmp_path):
    out = render(tmp_path, base(tp=4, dp=4, enable_dp_attention=True))
    (i, e), = tasks(out)
    argv = server_argv(e)
    assert i.gpus == (0, 1, 2, 3)
    assert argv[argv.index("--dp-size") + 1] == "4" and "--enable-dp-attention" in argv
    assert argv[argv.index("--dist-init-addr") + 1] == f"g0n0:{port(out, 'dprpc_0')}"


def test_dp_without_attention_multiplies_the_gpus(tmp_path):
    out = render(tmp_path, base(tp=2, dp=2, nodes=2))
    assert [i.gpus for i, _ in tasks(out)] == [(0, 1, 2, 3)] * 2


# ---- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize("change, field", [
    ({"auth": "job_secret"}, "inference.auth"),
    ({"mode": "pd"}, "inference.prefill"),  # no roles
    ({"mode": "pd", "prefill": {}, "decode": {}}, "inference.transfer_backend"),
    ({"tp": 4, "dp": 3, "enable_dp_attention": True}, "inference.dp"),
    ({"tp": 2, "dp": 2, "enable_dp_attention": True}, "inference.enable_dp_attention"),  # two servers per node
    ({"tp": 8, "dp": 2, "nodes": 4}, "inference.dp"),  # DP without attention across nodes
    ({"tp": 8, "nodes": 3}, "inference.nodes"),  # 3 nodes do not hold whole 2-node servers
    ({"tp": 3}, "inference.tp"),
    ({"router": {"policy": "kv_aware"}, "nodes": 2}, "inference.router.policy"),
    ({"router": {"policy": "cache_aware"}, "tp": 4}, "inference.router.policy"),  # one server: no router runs
    ({"gpus_per_node": 0}, "inference.gpus_per_node"),
])
def test_refused_with_one_line_naming_the_field(tmp_path, change, field):
    data = base()
    data["inference"] = {k: v for k, v in {**data["inference"], **change}.items() if v is not None}
    if data["inference"].get("auth") == "job_secret":
        del data["inference"]["auth"]  # the default
    msg = refusal(tmp_path, data)
    assert msg.startswith(f"{field}:"), msg


def test_rl_with_sglang_is_refused_on_the_backend(tmp_path):
    data = base()
    data.update(kind="rl", trainer={"nodes": 1}, orchestrator={"environment": "reverse_text"})
    msg = refusal(tmp_path, data)
    assert msg.startswith("inference.backend:") and "kind 'inference' only" in msg, msg


@pytest.mark.parametrize("key, value", [("vllm_extra", {"max_num_seqs": 8}), ("enforce_eager", True),
                                        ("kv_offload", {"kind": "cpu"})])
def test_a_vllm_key_is_the_loaders_unknown_key_and_the_cli_exits_2(tmp_path, key, value):
    data = base()
    data["inference"][key] = value
    msg = refusal(tmp_path, data)
    assert msg.startswith(f"inference.{key}: not a key of backend 'sglang' (a key of backend 'vllm'"), msg
    r = subprocess.run([sys.executable, "-m", "slurmrl", "validate", str(write(tmp_path, data))], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and f"inference.{key}" in r.stderr, r


# ---- SGLang's own parser ------------------------------------------------------------------------------

def test_every_rendered_server_argv_parses_with_sglangs_own_parser(tmp_path):
    cases = [RECIPES / "inference-sglang.toml", base(nodes=2, tp=2, mem_fraction_static=0.85),
             base(tp=4, dp=4, enable_dp_attention=True),
             {**base(tp=2, dp=2), "model": {"path": "/models/m", "served_name": "m", "dtype": "bfloat16",
                                             "max_model_len": 4096}},
             {**base(), "log": {"level": "debug"}}]
    argvs, want = [], []
    for k, case in enumerate(cases):
        d = tmp_path / str(k)
        d.mkdir()
        out = render(d, case)
        for _, e in tasks(out):
            argv = server_argv(e)
            argvs.append(argv)
            want.append(sglang_parsers.given(argv))
    result = sglang_parsers.parse_servers(argvs)
    assert result["version"] == "0.5.23", result["version"]  # the version these flags were checked against
    for argv, given, parsed in zip(argvs, want, result["parsed"], strict=True):
        for dest, value in given.items():
            assert str(parsed[dest]) == value, (dest, value, parsed.get(dest), argv)
        for flag in ("--trust-remote-code", "--enable-dp-attention"):
            assert parsed[flag[2:].replace("-", "_")] is (flag in argv)
