"""SGLang's prefill/decode disaggregation on its own (``backend = "sglang"``, ``mode = "pd"``) without a
cluster: the het groups, what each server and sglang-router really exec (tests/support/task_expand.py, with
the URLs the batch shell exports), the settings refused (one line naming the field), and every
rendered line parsed by its program's own parser (tests/support/sglang_parsers.py: SGLang's ServerArgs,
sglang-router's parse_router_args). SGLang's P/D needs GPUs and RDMA/NVLink NICs: it has not run here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sglang_parsers
from sglang_plans import refusal, render
from task_expand import JOB_ID, expand

from slurmrl import ports

ROOT = Path(__file__).resolve().parent.parent
GALLERY = ROOT / "recipes" / "inference-sglang-pd.toml"


def base(**inference) -> dict:
    return {
        "name": "sgpd", "kind": "inference", "slurm": {"gpus_per_node": 8, "cpus_per_node": 32},
        "model": {"path": "/models/m", "served_name": "m"},
        "inference": {"backend": "sglang", "auth": "none", "mode": "pd", "transfer_backend": "mooncake",
                      "prefill": {"replicas": 2, "tp": 4}, "decode": {"replicas": 1, "tp": 8}, **inference},
    }


def port(name: str, out) -> int:
    return ports.base_for_job(JOB_ID) + out.plan.ports[name]


def urls(out, name: str) -> str:
    """What the batch shell exports for component ``name``: each server's first-node URL."""
    c = out.plan.component(name)
    group = out.plan.groups[c.group].index
    return " ".join(f"http://g{group}n{i.node}:{port(i.ports['http'], out)}" for i in c.instances if "http" in i.ports)


def argv_after(e, module: str) -> list[str]:
    i = e.command.index(module)
    assert e.command[i - 1] == "-m"
    return e.command[i + 1:]


def every_server(out):
    for name in ("prefill", "decode"):
        for i in out.plan.component(name).instances:
            yield name, i, expand(out.script, out.plan, name, i.node, i.local)


def router_argv(out) -> list[str]:
    e = expand(out.script, out.plan, "router", env={"URLS_PREFILL": urls(out, "prefill"),
                                                     "URLS_DECODE": urls(out, "decode")})
    return argv_after(e, "sglang_router.launch_router")


def test_the_gallery_recipe_pairs_prefill_servers_with_a_decode_server_over_two_nodes(tmp_path):
    out = render(tmp_path, GALLERY)
    assert [(g.name, g.nodes) for g in out.plan.groups] == [("prefill", 2), ("decode", 2)]
    for name, i, e in every_server(out):
        argv = argv_after(e, "sglang.launch_server")
        assert argv[argv.index("--disaggregation-mode") + 1] == name
        assert argv[argv.index("--disaggregation-transfer-backend") + 1] == "nixl"
        assert "--skip-server-warmup" in argv
        if name == "prefill":  # one TP8 server per node, its bootstrap server on the node's kv_0
            assert argv[argv.index("--tp-size") + 1] == "8" and "--nnodes" not in argv
            assert argv[argv.index("--disaggregation-bootstrap-port") + 1] == str(port("kv_0", out))
            assert i.ports["bootstrap"] == "kv_0" and argv[-2:] == ["--chunked-prefill-size", "16384"]
        else:  # one TP16 server with 16 attention-DP ranks over both decode nodes
            assert "--disaggregation-bootstrap-port" not in argv
            assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == str(i.node)
            assert argv[argv.index("--dist-init-addr") + 1] == f"g1n0:{port('dprpc_0', out)}"
            assert argv[argv.index("--dp-size") + 1] == "16" and "--enable-dp-attention" in argv
    argv = router_argv(out)
    boot = port("kv_0", out)
    server = port("server_0", out)
    assert argv[argv.index("--pd-disaggregation") + 1:][:4] == ["--prefill-policy", "round_robin", "--decode-policy",
                                                                "round_robin"]
    tail = argv[argv.index("--decode-policy") + 2:]
    assert tail == ["--prefill", f"http://g0n0:{server}", str(boot), "--prefill", f"http://g0n1:{server}", str(boot),
                    "--decode", f"http://g1n0:{server}"]
    assert any("P/D over nixl has not run" in w for w in out.plan.warnings), out.plan.warnings
    r = out.plan.component("router")
    assert r.group == 0 and r.instances[0].ports == {"http": "router", "metrics": "router_metrics"}


def test_several_prefill_servers_on_a_node_take_their_own_bootstrap_ports(tmp_path):
    out = render(tmp_path, base())
    found = [(i, argv_after(e, "sglang.launch_server")) for n, i, e in every_server(out) if n == "prefill"]
    assert [i.gpus for i, _ in found] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [a[a.index("--disaggregation-bootstrap-port") + 1] for _, a in found] == \
        [str(port("kv_0", out)), str(port("kv_1", out))]
    argv = router_argv(out)
    pools = argv[argv.index("--decode-policy") + 2:]
    assert pools[:6] == ["--prefill", f"http://g0n0:{port('server_0', out)}", str(port("kv_0", out)),
                         "--prefill", f"http://g0n0:{port('server_1', out)}", str(port("kv_1", out))]
    # no policy given: sglang-router's default, not [inference.router]'s (vllm-router's consistent_hash)
    assert argv[argv.index("--prefill-policy") + 1] == argv[argv.index("--decode-policy") + 1] == "cache_aware"


@pytest.mark.parametrize("change, field", [
    ({"transfer_backend": None}, "inference.transfer_backend"),
    ({"prefill": {"tp": 4, "expert_parallel": True}}, "inference.prefill.expert_parallel"),
    ({"tp": 4}, "inference.tp"),
    ({"dp": 2}, "inference.dp"),
    ({"router": {"enabled": False}}, "inference.router.enabled"),
    ({"router": {"policy": "kv_aware"}}, "inference.router.policy"),
    ({"router": {"decode_policy": "consistent_hash"}}, "inference.router.decode_policy"),
    ({"router": {"policy": "round_robin", "cache_threshold": 0.5}}, "inference.router.cache_threshold"),
    ({"router": {"router_temperature": 0.5}}, "inference.router.router_temperature"),
    ({"decode": {"tp": 4, "dp": 3, "enable_dp_attention": True}}, "inference.decode.dp"),
    ({"decode": {"tp": 4, "dp": 4, "enable_dp_attention": True, "replicas": 2}}, "inference.decode.enable_dp_attention"),
    ({"prefill": {"tp": 8, "dp": 2}}, "inference.prefill.dp"),  # plain DP does not span nodes
    ({"prefill": {"tp": 16, "replicas": 1, "nodes": 3}}, "inference.prefill.nodes"),
    ({"transfer_backend": "nccl"}, "inference.transfer_backend"),
])
def test_refused_with_one_line_naming_the_field(tmp_path, change, field):
    data = base()
    data["inference"] = {k: v for k, v in {**data["inference"], **change}.items() if v is not None}
    msg = refusal(tmp_path, data)
    assert msg.startswith(f"{field}:"), msg


def test_a_role_of_mode_pd_is_refused_in_mode_replicas(tmp_path):
    data = base(mode="replicas")
    del data["inference"]["prefill"], data["inference"]["decode"]
    assert refusal(tmp_path, data).startswith("inference.transfer_backend:")


def test_every_rendered_line_parses_with_the_programs_own_parsers(tmp_path):
    cases = [GALLERY, base(), base(router={"policy": "cache_aware", "cache_threshold": 0.4, "request_timeout_secs": 60,
                                          "extra_args": ["--log-level", "debug"]})]
    servers, routers = [], []
    for k, case in enumerate(cases):
        d = tmp_path / str(k)
        d.mkdir()
        out = render(d, case)
        servers += [argv_after(e, "sglang.launch_server") for _, _, e in every_server(out)]
        routers.append(router_argv(out))
    parsed = sglang_parsers.parse_servers(servers)
    assert parsed["version"] == "0.5.23", parsed["version"]
    for argv, got in zip(servers, parsed["parsed"], strict=True):
        for dest, value in sglang_parsers.given(argv).items():
            assert str(got[dest]) == value, (dest, value, got.get(dest), argv)
        assert got["skip_server_warmup"] is True and got["enable_dp_attention"] is ("--enable-dp-attention" in argv)
    parsed = sglang_parsers.parse_router(routers)
    assert parsed["version"] == "0.3.2", parsed["version"]
    for argv, got in zip(routers, parsed["parsed"], strict=True):
        assert got["pd_disaggregation"] is True and got["worker_urls"] == []
        prefill = [(argv[j + 1], int(argv[j + 2])) for j, a in enumerate(argv) if a == "--prefill"]
        assert [tuple(p) for p in got["prefill_urls"]] == prefill and len(prefill) == 2
        assert got["decode_urls"] == [argv[j + 1] for j, a in enumerate(argv) if a == "--decode"]
        assert (got["prefill_policy"], got["decode_policy"]) == (argv[argv.index("--prefill-policy") + 1],
                                                                 argv[argv.index("--decode-policy") + 1])
        assert got["port"] == int(argv[argv.index("--port") + 1])
        assert got["worker_startup_timeout_secs"] == int(argv[argv.index("--worker-startup-timeout-secs") + 1])
    assert parsed["parsed"][2]["cache_threshold"] == 0.4 and parsed["parsed"][2]["request_timeout_secs"] == 60
    assert parsed["parsed"][2]["log_level"] == "debug"
