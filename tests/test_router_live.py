"""The real vllm-router takes every rendered command line: its own parser (it is a Python entry
point, ``vllm_router.launch_router``) and the Rust router's configuration from it, and it starts
with the rendered kv_aware and cache_aware flags on 127.0.0.1 in front of tests/support/ok_server.py
stand-ins, reads the KV events published where the servers would publish them, and routes a
request. The vLLM side's flags go through vLLM's own server parser (marked ``vllm``: it imports vLLM).
Rendering and refusals: tests/test_router_policies.py.
"""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from live_components import free_loopback_base
from router_jobs import (
    KV,
    ONE_NODE,
    PD_KV,
    POLICIES,
    ROOT,
    event_endpoint,
    host_port,
    job,
    q,
    router,
    router_args,
    server,
    urls,
)
from task_expand import expand

from slurmrl import ports

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
    return free_loopback_base(offsets, range(40000, 50000, ports.STRIDE))


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
            procs.append(subprocess.Popen([sys.executable, str(ROOT / "tests" / "support" / "ok_server.py"), str(host_port(u)[1]),
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
