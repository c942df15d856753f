"""vLLM knobs MoE users set (expert-parallel load balancing, dual-batch overlap, router replay,
a free-form `vllm_extra` table) and the multi-node worker command line, as vLLM's own parser reads
them: a flag vLLM does not have fails here, not on a GPU cluster."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from task_expand import expand

from slurmrl.app.build import build
from slurmrl.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
KNOBS = ["inference.enable_eplb=true", "inference.enable_dbo=true",
         "inference.vllm_extra={seed=96, enable_chunked_prefill=false, cpu_offload_gb=4.5, "
         "compilation_config={cudagraph_mode='FULL_DECODE_ONLY'}}"]


def command(recipe: str, sets: list[str], name: str, node: int = 0) -> list[str]:
    with tempfile.TemporaryDirectory() as run_dir:  # the script's prologue writes its secret there
        out = build(RECIPES / f"{recipe}.toml", sets, run_dir=run_dir)
        return expand(out.script, out.plan, name, node).command


def test_knobs_reach_every_server_of_both_roles_once():
    for node in (0, 1):
        cmd = command("inference-pd-wide-ep", KNOBS, "decode", node)
        for flag in ("--enable-eplb", "--enable-dbo", "--no-enable-chunked-prefill"):
            assert cmd.count(flag) == 1, (flag, cmd)
        assert cmd[cmd.index("--seed") + 1] == "96" and cmd[cmd.index("--cpu-offload-gb") + 1] == "4.5"
        assert json.loads(cmd[cmd.index("--compilation-config") + 1]) == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    assert "--enable-eplb" in command("inference-pd-wide-ep", KNOBS, "prefill")


VLLM_PARSE = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.engine.arg_utils import AsyncEngineArgs
out = []
for argv in json.load(sys.stdin):  # one vLLM import for every command line
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    validate_parsed_serve_args(args)
    e = AsyncEngineArgs.from_cli_args(args)
    kv = e.kv_transfer_config
    if kv is not None and kv.kv_connector == "MultiConnector":  # each child as vLLM builds it
        from vllm.config.kv_transfer import KVTransferConfig
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        for child in kv.kv_connector_extra_config["connectors"]:
            KVConnectorFactory.get_connector_class(KVTransferConfig(**child))
    out.append({"headless": getattr(args, "headless", None), "dp": e.data_parallel_size,
                "dp_local": e.data_parallel_size_local, "start": e.data_parallel_start_rank,
                "address": e.data_parallel_address, "ep": e.enable_expert_parallel, "eplb": e.enable_eplb,
                "dbo": e.enable_dbo, "seed": e.seed, "kv": e.kv_transfer_config is not None,
                "weights": e.weight_transfer_config.backend if e.weight_transfer_config else None})
print(json.dumps(out))
"""


def vllm_reads(vllm_python, argvs: list[list[str]]) -> list[dict]:
    p = vllm_python.run(VLLM_PARSE, input=json.dumps(argvs))
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.vllm
def test_vllm_parses_a_multi_node_worker_leader_and_follower(vllm_python):
    argvs = []
    for node in (0, 1):
        cmd = command("inference-pd-wide-ep", KNOBS, "decode", node)
        argvs.append(cmd[cmd.index("serve") + 1:])  # python -m slurmrl.runtime.vllm.cli serve ARGS: vLLM's serve
    # P/D on shared nodes with KV offload: NIXL and the offload connector under vLLM's MultiConnector
    shared = command("inference-pd", ["inference.share_nodes=true", "inference.prefill={replicas=2, tp=2}",
                                      "inference.decode={replicas=1, tp=4}", 'inference.kv_offload.kind="cpu"',
                                      "inference.kv_offload.cpu_gb=30"], "decode")
    assert json.loads(shared[shared.index("--kv-transfer-config") + 1])["kv_connector"] == "MultiConnector"
    argvs.append(shared[shared.index("vllm.entrypoints.openai.api_server") + 1:])
    got = dict(enumerate(vllm_reads(vllm_python, argvs)))
    assert got[2]["kv"]
    lead, follow = got[0], got[1]
    assert lead["headless"] is False and follow["headless"] is True
    assert (lead["dp"], lead["dp_local"], lead["start"]) == (16, 8, None)
    assert (follow["dp"], follow["dp_local"], follow["start"]) == (16, 8, 8)
    assert lead["address"] == follow["address"] == "g1n0"  # the worker's first node
    assert all(g["ep"] and g["eplb"] and g["dbo"] and g["kv"] and g["seed"] == 96 for g in (lead, follow)), json.dumps(got)


@pytest.mark.vllm
def test_vllm_parses_the_weight_transfer_config(vllm_python):
    """trainer.weight_sync by broadcast: each backend's server command line, read by vLLM's parser (one import)."""
    argvs = []
    for backend in ("nccl", "ipc", "gloo"):
        sets = [f'trainer.weight_sync="{backend}"']
        if backend == "ipc":  # trainer and server on one GPU
            sets += ["placement.colocate=true", "placement.share_gpus=true", "inference.nodes=1", "trainer.nodes=1",
                     "inference.gpus_per_node=8", "trainer.gpus_per_node=8"]
        cmd = command("rl-nccl", sets, "inference")
        argvs.append(cmd[cmd.index("vllm.entrypoints.openai.api_server") + 1:])
    assert [got["weights"] for got in vllm_reads(vllm_python, argvs)] == ["nccl", "ipc", "gloo"]


TOOL_PARSE = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.tool_parsers import ToolParserManager
args = make_arg_parser(FlexibleArgumentParser()).parse_args(json.load(sys.stdin))
validate_parsed_serve_args(args)
ToolParserManager.get_tool_parser(args.tool_call_parser)  # raises for a name vLLM does not have
print(json.dumps({"auto": args.enable_auto_tool_choice, "parser": args.tool_call_parser}))
"""


def test_the_recipes_tool_call_parser_reaches_every_policy_server_once():
    cmd = command("rl-guess-number", [], "inference")
    assert cmd.count("--enable-auto-tool-choice") == 1 and cmd[cmd.index("--tool-call-parser") + 1] == "hermes"
    assert "--tool-call-parser" not in command("rl-debug", [], "inference")
    with pytest.raises(UserError, match="tool_call_parser is set by slurmrl; use inference.tool_call_parser"):
        command("rl-debug", ["inference.vllm_extra={tool_call_parser='hermes'}"], "inference")


@pytest.mark.vllm
def test_vllm_parses_the_tool_call_flags(vllm_python):
    cmd = command("rl-guess-number", [], "inference")
    p = vllm_python.run(TOOL_PARSE, input=json.dumps(cmd[cmd.index("vllm.entrypoints.openai.api_server") + 1:]))
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"auto": True, "parser": "hermes"}
