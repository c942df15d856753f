"""Every vllm-router policy, with its options, planned from the gallery recipes (issue 15 item 4).

- each policy renders its flags, and only the options it reads, set away from vllm-router's
  defaults: what the router task really execs (``task_expand``: the script's prologue and task
  function in bash, the URLs the servers' supervisors would write);
- kv_aware wires the KV-cache events: every server it reads publishes on its own port of the
  ``kv_events`` block, and the router subscribes to exactly that host and port, derived in shell
  from the server's URL;
- every option no policy in use reads is refused: one line naming the field, exit 2, through the CLI;
- the real vllm-router takes every rendered command line: its own parser (it is a Python entry
  point, ``vllm_router.launch_router``) and the Rust router's configuration from it, and it starts
  with the rendered kv_aware and cache_aware flags on 127.0.0.1 in front of tests/ok_server.py
  stand-ins, reads the KV events published where the servers would publish them, and routes a
  request. The vLLM side's flags go through vLLM's own server parser (marked ``vllm``: it imports vLLM).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from functools import cache
from pathlib import Path

import pytest
from task_expand import expand
from worker_ports import worker_order

from slurmrl import cli, ports
from slurmrl.app.build import Rendered, build

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
POLICIES = ("consistent_hash", "round_robin", "random", "power_of_two", "cache_aware", "kv_aware",
            "sticky_least_loaded")
SCRATCH = Path(tempfile.mkdtemp(prefix="slurmrl-router-"))  # the run dir (the prologue makes its secret there)
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)
ONE_NODE = ("inference.nodes=1",)  # inference-replicas on one node: 4 servers (tp 2 on 8 GPUs)


def q(text: str) -> str:
    return json.dumps(text)  # a TOML string for --set


@cache
def job(recipe: str, *sets: str) -> Rendered:
    return build(RECIPES / f"{recipe}.toml", list(sets), run_dir=SCRATCH)


_URLS: dict[tuple[int, str], tuple[str, ...]] = {}


def urls(out: Rendered, name: str) -> tuple[str, ...]:
    """The ready URLs of a server component, in task order (what the batch shell hands the router)."""
    key = (id(out), name)  # jobs are cached: one object per recipe
    if key not in _URLS:
        found = []
        for i in out.plan.component(name).instances:
            sup = expand(out.script, out.plan, name, i.node, i.local).supervisor
            found.append(sup[sup.index("--ready") + 1])
        _URLS[key] = tuple(found)
    return _URLS[key]


def pools(out: Rendered) -> dict[str, str]:
    names = [c.name for c in out.plan.components if c.role == "inference"]
    return {f"URLS_{n.upper()}": " ".join(urls(out, n)) for n in names}


def server(out: Rendered, name: str, node: int = 0, local: int = 0) -> list[str]:
    return expand(out.script, out.plan, name, node, local).command


def router(out: Rendered) -> list[str]:
    """What the router task execs: ``vllm-router ARGS``, or a Python module that runs vllm-router
    with ``ARGS`` (``python3 -m MODULE ARGS``)."""
    return expand(out.script, out.plan, "router", env=pools(out)).command


def router_args(argv: list[str]) -> list[str]:
    """vllm-router's own arguments in the router task's command (behind the secret's gate, when
    there is one: ``python -m slurmrl.runtime.gates.auth_gate ... -- ROUTER ARGS``)."""
    if "slurmrl.runtime.gates.auth_gate" in argv[:3]:
        argv = argv[argv.index("--") + 1:]
    if Path(argv[0]).name == "vllm-router":
        return argv[1:]
    assert argv[1] == "-m", argv[:4]
    return argv[3:]


def values(args: list[str], flag: str) -> list[str]:
    """Every value of a repeated ``flag VALUE``."""
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def value(args: list[str], flag: str) -> str:
    found = values(args, flag)
    assert len(found) == 1, (flag, args)
    return found[0]


def host_port(url: str) -> tuple[str, int]:
    host, _, port = url.split("://", 1)[1].rpartition(":")
    return host, int(port)


def event_endpoint(args: list[str]) -> tuple[str, int]:
    """(host, port) a server's ``--kv-events-config`` publishes on."""
    cfg = json.loads(value(args, "--kv-events-config"))
    assert cfg == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": cfg["endpoint"]}, cfg
    return host_port(cfg["endpoint"])


CACHE_OPTIONS = {"--cache-threshold": "0.5", "--balance-abs-threshold": "8", "--balance-rel-threshold": "2.0",
                 "--eviction-interval-secs": "30", "--max-tree-size": "1000000"}
KV_OPTIONS = ("--router-temperature", "--kv-penalty-host", "--kv-penalty-external", "--kv-penalty-disk",
              "--kv-aware-session-affinity-ttl-secs", "--kv-event-block-size", "--kv-event-source", "--kv-event-model",
              "--pd-kv-events")


# ---- each policy's flags -----------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_renders_its_flag_and_no_option_it_does_not_set(policy):
    out = job("inference-replicas", *ONE_NODE, f"inference.router.policy={q(policy)}")
    args = router(out)
    assert value(args, "--policy") == policy
    assert args[-5:-4] == ["--worker-urls"] and args[-4:] == list(urls(out, "inference"))
    for flag in (*CACHE_OPTIONS, "--request-timeout-secs", "--max-payload-size", "--retry-max-retries"):
        assert flag not in args  # vllm-router's defaults are left to it
    kv = policy == "kv_aware"
    assert ("--kv-event-source" in args) is kv and ("--kv-event-model" in args) is kv
    assert ("--kv-events-config" in server(out, "inference")) is kv
    assert any(k.startswith("kv_events_") for k in out.plan.ports) is kv


def test_the_default_is_consistent_hash():
    assert value(router(job("inference-replicas", *ONE_NODE)), "--policy") == "consistent_hash"


def test_cache_aware_renders_the_options_that_differ_from_the_routers_defaults():
    sets = ["inference.router.policy='cache_aware'", "inference.router.cache_threshold=0.5",
            "inference.router.balance_abs_threshold=8", "inference.router.balance_rel_threshold=2",
            "inference.router.eviction_interval_secs=30", "inference.router.max_tree_size=1000000",
            "inference.router.retry_max_retries=2",
            "inference.router.request_timeout_secs=600"]
    args = router(job("inference-replicas", *ONE_NODE, *sets))
    for flag, v in {**CACHE_OPTIONS, "--retry-max-retries": "2", "--request-timeout-secs": "600"}.items():
        assert value(args, flag) == v
    assert not set(KV_OPTIONS) & set(args)
    # a value equal to vllm-router's default is not repeated
    args = router(job("inference-replicas", *ONE_NODE, "inference.router.policy='cache_aware'",
                      "inference.router.cache_threshold=0.3"))
    assert "--cache-threshold" not in args


def test_kv_aware_servers_publish_where_the_router_subscribes():
    out = job("inference-replicas", "inference.router.policy='kv_aware'")  # 4 nodes x 4 servers
    p = out.plan
    args = router(out)
    sources = dict(s.split("=", 1) for s in values(args, "--kv-event-source"))
    assert list(sources) == list(urls(out, "inference")) and len(sources) == 16
    assert value(args, "--kv-event-model") == out.recipe.model.served_model_name
    base = p.port_base or ports.base_for_job(7)  # task_expand's job
    for inst in p.component("inference").instances:
        cmd = server(out, "inference", inst.node, inst.local)
        host, port = event_endpoint(cmd)
        assert host == "*" and port == base + ports.offset(inst.ports["kv_events"])
        assert value(cmd, "--block-size") == "16"
        url = urls(out, "inference")[inst.rank]
        assert sources[url] == f"tcp://{host_port(url)[0]}:{port}"  # the server's own host, its own port
    assert {f"kv_events_{k}" for k in range(4)} <= set(p.ports)
    # the block size the router hashes by is the servers' block size
    out = job("inference-replicas", *ONE_NODE, "inference.router.policy='kv_aware'",
              "inference.router.kv_event_block_size=32", "inference.router.kv_event_model='llama'",
              "inference.router.router_temperature=0.5", "inference.router.kv_penalty_disk=0.1",
              "inference.router.kv_aware_session_affinity_ttl_secs=600")
    args = router(out)
    assert value(server(out, "inference"), "--block-size") == "32"
    assert [value(args, f) for f in ("--kv-event-block-size", "--kv-event-model", "--router-temperature",
                                     "--kv-penalty-disk", "--kv-aware-session-affinity-ttl-secs")] == \
        ["32", "llama", "0.5", "0.1", "600"]


@pytest.mark.parametrize("prefill,decode", [(None, None), ("kv_aware", "power_of_two"), ("cache_aware", "kv_aware"),
                                            ("round_robin", "sticky_least_loaded"), ("random", None)])
def test_pd_policies(prefill, decode):
    sets = [f"inference.router.{k}_policy={q(v)}" for k, v in (("prefill", prefill), ("decode", decode)) if v]
    out = job("inference-pd", *sets)
    args = router(out)
    assert value(args, "--prefill-policy") == (prefill or "consistent_hash")
    assert value(args, "--decode-policy") == (decode or "consistent_hash")  # default: policy
    assert "--policy" not in args
    events = dict(s.split("=", 1) for s in values(args, "--pd-kv-events"))
    if prefill == "kv_aware":  # the router reads the prefill servers' KV events, in blocks of 16
        assert list(events) == list(urls(out, "prefill"))
        for inst in out.plan.component("prefill").instances:
            cmd = server(out, "prefill", inst.node, inst.local)
            url = urls(out, "prefill")[inst.rank]
            assert events[url] == f"tcp://{host_port(url)[0]}:{event_endpoint(cmd)[1]}"
            assert value(cmd, "--block-size") == "16"
    else:
        assert not events
    assert "--kv-events-config" not in server(out, "decode")  # decode's kv_aware reads load, not events
    assert not {"--kv-event-source", "--kv-event-model"} & set(args)


def test_kv_aware_ports_are_claimed_and_unique_per_node():
    out = job("inference-pd", "inference.router.prefill_policy='kv_aware'")
    p = out.plan
    offs = list(p.ports.values())
    assert len(offs) == len(set(offs)) and max(offs) < ports.STRIDE
    assert all(i.ports.get("kv_events") in p.ports for i in p.component("prefill").instances)
    assert not any("kv_events" in i.ports for i in p.component("decode").instances)
    claimed = out.script.split("PORT_OFFSETS=(", 1)[1].split(")", 1)[0].split()
    assert {str(p.ports[i.ports["kv_events"]]) for i in p.component("prefill").instances} <= set(claimed)


def test_the_port_table_stays_below_the_ephemeral_range():
    assert max(ports.offset(f"{b}_{ports.MAX_LOCAL - 1}") for b in ("server", "kv", "nixl", "dprpc", "kv_events")) \
        < ports.STRIDE
    assert ports.BASE_MIN + ports.SLOTS * ports.STRIDE <= 32768
    # a server's event port is its HTTP port plus one fixed distance
    d = ports.offset("kv_events_0") - ports.offset("server_0")
    assert all(ports.offset(f"kv_events_{k}") - ports.offset(f"server_{k}") == d for k in range(ports.MAX_LOCAL))


# ---- refusals ----------------------------------------------------------------------------------

KV = "inference.router.policy='kv_aware'"
PD_KV = "inference.router.prefill_policy='kv_aware'"
REFUSED = [
    # (id, recipe, overrides, field, text the line must hold)
    ("cache-option-without-cache-aware", "inference-replicas", ["inference.router.cache_threshold=0.5"],
     "inference.router.cache_threshold", "cache_aware"),
    ("cache-option-with-kv-aware", "inference-replicas", [KV, "inference.router.balance_abs_threshold=8"],
     "inference.router.balance_abs_threshold", "cache_aware"),
    ("eviction-without-cache-aware", "inference-replicas", ["inference.router.eviction_interval_secs=30"],
     "inference.router.eviction_interval_secs", "cache_aware"),
    ("temperature-without-kv-aware", "inference-replicas", ["inference.router.router_temperature=0.5"],
     "inference.router.router_temperature", "kv_aware"),
    ("penalty-with-cache-aware", "inference-replicas", ["inference.router.policy='cache_aware'",
                                                         "inference.router.kv_penalty_host=0.5"],
     "inference.router.kv_penalty_host", "kv_aware"),
    ("affinity-without-kv-aware", "inference-replicas", ["inference.router.kv_aware_session_affinity_ttl_secs=60"],
     "inference.router.kv_aware_session_affinity_ttl_secs", "kv_aware"),
    ("event-model-without-kv-aware", "inference-replicas", ["inference.router.kv_event_model='m'"],
     "inference.router.kv_event_model", "kv_aware"),
    ("block-size-without-kv-aware", "inference-replicas", ["inference.router.kv_event_block_size=32"],
     "inference.router.kv_event_block_size", "kv_aware"),
    ("prefill-policy-outside-pd", "inference-replicas", ["inference.router.prefill_policy='kv_aware'"],
     "inference.router.prefill_policy", "mode 'pd'"),
    ("decode-policy-outside-pd", "inference-replicas", ["inference.router.decode_policy='random'"],
     "inference.router.decode_policy", "mode 'pd'"),
    ("kv-aware-with-dp", "inference-replicas", [KV, "inference.tp=1", "inference.dp=2"],
     "inference.router.policy", "data-parallel"),
    ("kv-aware-wide-ep", "inference-wide-ep", [KV, "inference.router.enabled=true"], "inference.router.policy",
     "data-parallel"),
    ("kv-aware-other-block-size", "inference-replicas", [KV, "inference.extra_args=['--block-size', '32']"],
     "inference.extra_args", "kv_event_block_size"),
    ("retry-backoff-order", "inference-replicas", ["inference.router.retry_initial_backoff_ms=60000"],
     "inference.router.retry_initial_backoff_ms", "retry_max_backoff_ms"),
    ("pd-temperature", "inference-pd", [PD_KV, "inference.router.router_temperature=0.5"],
     "inference.router.router_temperature", "mode 'pd'"),
    ("pd-block-size", "inference-pd", [PD_KV, "inference.router.kv_event_block_size=32"],
     "inference.router.kv_event_block_size", "blocks of 16"),
    ("pd-event-model", "inference-pd", [PD_KV, "inference.router.kv_event_model='m'"],
     "inference.router.kv_event_model", "mode 'pd'"),
    ("pd-penalty-decode-only-kv-aware", "inference-pd", ["inference.router.decode_policy='kv_aware'",
                                                          "inference.router.kv_penalty_disk=0.1"],
     "inference.router.kv_penalty_disk", "prefill_policy = 'kv_aware'"),
    ("pd-affinity-prefill-only-kv-aware", "inference-pd", [PD_KV, "inference.router.decode_policy='round_robin'",
                                                            "inference.router.kv_aware_session_affinity_ttl_secs=60"],
     "inference.router.kv_aware_session_affinity_ttl_secs", "decode"),
    ("pd-policy-unused", "inference-pd", ["inference.router.policy='random'", PD_KV,
                                          "inference.router.decode_policy='round_robin'"],
     "inference.router.policy", "leave it out"),
    ("pd-prefill-block-size", "inference-pd", [PD_KV, "inference.prefill.extra_args=['--block-size=32']"],
     "inference.prefill.extra_args", "blocks of 16"),
]


def plan_cli(recipe: str, sets: list[str]) -> tuple[int, str, str]:
    argv = ["plan", str(RECIPES / f"{recipe}.toml")]
    for s in sets:
        argv += ["--set", s]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("recipe,sets,field,text", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_an_option_no_policy_in_use_reads_is_refused(recipe, sets, field, text):
    rc, out, err = plan_cli(recipe, sets)
    assert rc == 2 and out == "", err
    assert err.startswith(f"slurmrl: error: {field}: ") and err.count("\n") == 1, err
    assert text in err, err


@pytest.mark.parametrize("recipe,sets", [
    ("inference-replicas", [KV, "inference.router.router_temperature=0.5", "inference.router.kv_penalty_host=0.5",
                            "inference.router.kv_aware_session_affinity_ttl_secs=60"]),
    ("inference-replicas", ["inference.router.policy='cache_aware'", "inference.router.cache_threshold=0.9"]),
    ("inference-replicas", [KV, "inference.extra_args=['--block-size', '16']"]),
    ("inference-pd", [PD_KV, "inference.router.kv_penalty_host=0.5", "inference.router.decode_policy='kv_aware'",
                      "inference.router.kv_aware_session_affinity_ttl_secs=60"]),
    ("inference-pd", ["inference.router.decode_policy='cache_aware'", "inference.router.max_tree_size=4096",
                      "inference.router.retry_jitter_factor=0"]),
])
def test_an_option_a_policy_in_use_reads_is_planned(recipe, sets):
    rc, out, err = plan_cli(recipe, sets)
    assert rc == 0 and err == "", err


def test_a_refusal_through_the_real_command():
    p = subprocess.run([sys.executable, "-m", "slurmrl", "plan", str(RECIPES / "inference-replicas.toml"),
                        "--set", "inference.router.policy='round_robin'",
                        "--set", "inference.router.kv_penalty_host=0.5"],
                       capture_output=True, text=True, cwd=SCRATCH, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       timeout=120)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert p.stderr.startswith("slurmrl: error: inference.router.kv_penalty_host: ") and p.stderr.count("\n") == 1


# ---- the real vllm-router takes the rendered command lines -------------------------------------

PARSED = [
    *[("inference-replicas", (*ONE_NODE, f"inference.router.policy={q(p)}")) for p in POLICIES],
    ("inference-replicas", (*ONE_NODE, "inference.router.policy='cache_aware'", "inference.router.cache_threshold=1",
                            "inference.router.balance_abs_threshold=1000000",
                            "inference.router.balance_rel_threshold=1000", "inference.router.eviction_interval_secs=86400",
                            "inference.router.max_tree_size=4294967296")),
    ("inference-replicas", (*ONE_NODE, KV, "inference.router.router_temperature=100",
                            "inference.router.kv_penalty_host=1",
                            "inference.router.kv_penalty_external=0", "inference.router.kv_penalty_disk=1",
                            "inference.router.kv_aware_session_affinity_ttl_secs=31536000",
                            "inference.router.kv_event_block_size=1024", "inference.router.kv_event_model='a b'")),
    ("inference-replicas", (*ONE_NODE, "inference.router.request_timeout_secs=604800",
                            "inference.router.max_payload_size=17179869184", "inference.router.retry_max_retries=100",
                            "inference.router.retry_initial_backoff_ms=3600000",
                            "inference.router.retry_max_backoff_ms=3600000",
                            "inference.router.retry_backoff_multiplier=100", "inference.router.retry_jitter_factor=1")),
    ("inference-pd", ()),
    ("inference-pd", (PD_KV, "inference.router.decode_policy='kv_aware'", "inference.router.kv_penalty_external=0.25",
                      "inference.router.kv_aware_session_affinity_ttl_secs=1")),
    ("inference-pd", ("inference.router.prefill_policy='cache_aware'", "inference.router.decode_policy='power_of_two'",
                      "inference.router.cache_threshold=0")),
    ("inference-pd", ("inference.router.policy='sticky_least_loaded'",)),
]


def parse_with_the_router(args: list[str]):
    """vllm-router's own argument parsing and checks, then the Rust router's configuration
    (``Router.from_args`` builds it; ``start`` would serve)."""
    launch = pytest.importorskip("vllm_router.launch_router")
    from vllm_router.router import Router

    parsed = launch.parse_router_args(router_args(args))  # argparse: exits 2 on a bad argument
    parsed._validate_router_args()
    Router.from_args(dataclasses.replace(parsed))  # from_args rewrites what it is given
    return parsed


@pytest.mark.parametrize("recipe,sets", PARSED, ids=[f"{i}-{r}" for i, (r, _) in enumerate(PARSED)])
def test_the_router_parses_the_rendered_arguments(recipe, sets):
    out = job(recipe, *sets)
    args = router(out)
    parsed = parse_with_the_router(args)
    r, inf = out.recipe.inference.router, out.recipe.inference
    if inf.mode == "pd":
        assert parsed.vllm_pd_disaggregation and [u for u, _ in parsed.prefill_urls] == list(urls(out, "prefill"))
        assert parsed.decode_urls == list(urls(out, "decode"))
        prefill, decode = r.prefill_policy or r.policy, r.decode_policy or r.policy
        assert (parsed.prefill_policy, parsed.decode_policy) == (prefill, decode)
        assert len(parsed.pd_kv_events) == (len(urls(out, "prefill")) if prefill == "kv_aware" else 0)
    else:
        assert parsed.worker_urls == list(urls(out, "inference")) and parsed.policy == r.policy
        assert len(parsed.kv_event_source) == (len(parsed.worker_urls) if r.policy == "kv_aware" else 0)
    for name in ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold", "eviction_interval_secs",
                 "max_tree_size", "router_temperature", "kv_penalty_host", "kv_penalty_external", "kv_penalty_disk",
                 "kv_aware_session_affinity_ttl_secs", "request_timeout_secs", "max_payload_size", "retry_max_retries",
                 "retry_initial_backoff_ms", "retry_max_backoff_ms", "retry_backoff_multiplier", "retry_jitter_factor"):
        assert getattr(parsed, name) == getattr(r, name), name  # what the recipe says, or the same default
    if inf.mode != "pd" and r.policy == "kv_aware":
        assert parsed.kv_event_block_size == r.kv_event_block_size
        assert parsed.kv_event_model == (r.kv_event_model or out.recipe.model.served_model_name)


# ---- the real router on 127.0.0.1 --------------------------------------------------------------

LOOPBACK = {0: ["127.0.0.1"]}  # the one node of group 0 is this machine


def free_base(offsets: list[int]) -> int:
    for base in worker_order(range(40000, 50000, ports.STRIDE)):
        socks = []
        try:
            for off in offsets:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + off))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free block of ports on 127.0.0.1")


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer: {log.read_text()[-3000:]}")


def plain(log: Path) -> str:
    """The router's log without its terminal colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())


def publish_kv_events(sock, seq: int) -> None:
    """One batch as vLLM's ZmqEventPublisher sends it: (topic, sequence, msgpack KVEventBatch)."""
    import msgspec

    stored = {"type": "BlockStored", "block_hashes": [seq + 1], "parent_block_hash": None,
              "token_ids": list(range(16)), "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None}
    sock.send_multipart([b"", seq.to_bytes(8, "big"), msgspec.msgpack.encode([time.time(), [stored], 0])])


@pytest.mark.parametrize("policy", ["kv_aware", "cache_aware"])
def test_the_router_starts_with_the_rendered_flags_and_routes(policy, tmp_path):
    zmq = pytest.importorskip("zmq")
    options = {
        "kv_aware": ["inference.router.router_temperature=0.5", "inference.router.kv_penalty_host=0.5",
                     "inference.router.kv_aware_session_affinity_ttl_secs=600"],
        "cache_aware": ["inference.router.cache_threshold=0.5", "inference.router.balance_abs_threshold=8",
                        "inference.router.eviction_interval_secs=30", "inference.router.max_tree_size=100000"],
    }[policy]
    out = job("inference-replicas", *ONE_NODE, "slurm.gpus_per_node=4", f"inference.router.policy={q(policy)}",
              *options, "inference.router.retry_max_retries=2", "inference.router.extra_args=['--log-level', 'debug']")
    p = out.plan
    servers = p.component("inference").instances
    assert len(servers) == 2
    base = free_base(list(p.ports.values()))
    table = {f"PORT_{k.upper()}": str(base + off) for k, off in p.ports.items()}  # the job claimed this block
    commands, worker_urls = [], []  # what each server task would exec, and the URL its supervisor reports
    for inst in servers:
        e = expand(out.script, p, "inference", inst.node, inst.local, env=table, hosts=LOOPBACK)
        commands.append(e.command)
        worker_urls.append(e.supervisor[e.supervisor.index("--ready") + 1])
    args = expand(out.script, p, "router", env={**table, "URLS_INFERENCE": " ".join(worker_urls)},
                  hosts=LOOPBACK).command
    # loopback only: the rendered router listens on every address, here on 127.0.0.1
    for flag in ("--host", "--prometheus-host"):
        args[args.index(flag) + 1] = "127.0.0.1"
    args = [str(Path(sys.executable).parent / "vllm-router"), *router_args(args)]
    procs, socks = [], []
    ctx = zmq.Context()
    try:
        for u in worker_urls:
            procs.append(subprocess.Popen([sys.executable, str(ROOT / "tests" / "ok_server.py"), str(host_port(u)[1]),
                                           "127.0.0.1"]))
        if policy == "kv_aware":  # the KV events each server's vLLM would publish, where its command line says
            for cmd in commands:
                s = ctx.socket(zmq.PUB)
                s.bind(f"tcp://127.0.0.1:{event_endpoint(cmd)[1]}")
                socks.append(s)
        log = tmp_path / "router.log"
        with open(log, "wb") as f:
            procs.append(subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT))
        # vllm-router itself, where it listens behind the secret's gate (router_args took the gate off)
        router_url = f"http://127.0.0.1:{table.get('PORT_ROUTER_UPSTREAM', table['PORT_ROUTER'])}"
        wait_http(f"{router_url}/health", procs[-1], log)
        body = json.dumps({"model": out.recipe.model.served_model_name, "prompt": "hello", "max_tokens": 2}).encode()
        req = urllib.request.Request(f"{router_url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            answered = json.loads(r.read())["port"]
        assert answered in [host_port(u)[1] for u in worker_urls]
        # a chat environment's later turn: the router passes the sequence's token ids on untouched
        chat = {"model": out.recipe.model.served_model_name, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2, "logprobs": True, "return_token_ids": True,
                "kv_transfer_params": {"prompt_token_ids": [1, 2, 3, 5, 8]}}
        req = urllib.request.Request(f"{router_url}/v1/chat/completions", data=json.dumps(chat).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            received = json.loads(r.read())["received"]
        assert received["kv_transfer_params"] == {"prompt_token_ids": [1, 2, 3, 5, 8]}, received
        assert received["return_token_ids"] is True and received["logprobs"] is True, received
        text = plain(log)
        assert f"policy: {'KvAware' if policy == 'kv_aware' else 'CacheAware'}" in text, text[-3000:]
        if policy == "kv_aware":  # the router subscribed to every server's own event port
            seq, deadline = 0, time.monotonic() + 30
            while time.monotonic() < deadline:
                for s in socks:
                    publish_kv_events(s, seq)
                seq += 1
                text = plain(log)
                if all(f"live sequence advanced source={u} " in text for u in worker_urls):
                    break
                time.sleep(0.2)
            else:
                raise AssertionError(f"the router read no KV events: {text[-3000:]}")
    finally:
        for s in socks:
            s.close(linger=0)
        ctx.term()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


# ---- the vLLM side: vLLM's own server parser takes the KV-event flags -------------------------

VLLM_PARSE = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.engine.arg_utils import AsyncEngineArgs
args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
validate_parsed_serve_args(args)
e = AsyncEngineArgs.from_cli_args(args)
k = e.kv_events_config
print(json.dumps({"enable": k.enable_kv_cache_events, "publisher": k.publisher, "endpoint": k.endpoint,
                  "topic": k.topic, "block_size": e.block_size}))
"""


@pytest.mark.vllm
def test_vllm_parses_the_kv_event_flags(vllm_python):
    out = job("inference-replicas", *ONE_NODE, KV, "inference.router.kv_event_block_size=32")
    inst = out.plan.component("inference").instances[1]
    cmd = server(out, "inference", inst.node, inst.local)
    argv = cmd[cmd.index("vllm.entrypoints.openai.api_server") + 1:]
    p = vllm_python.run(VLLM_PARSE, *argv)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    port = ports.base_for_job(7) + ports.offset(inst.ports["kv_events"])
    assert got == {"enable": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": "",
                   "block_size": 32}
