"""Every vllm-router policy, with its options, planned from the gallery recipes (issue 15 item 4).

- each policy renders its flags, and only the options it reads, set away from vllm-router's
  defaults: what the router task really execs;
- kv_aware wires the KV-cache events: every server it reads publishes on its own port of the
  ``kv_events`` block, and the router subscribes to exactly that host and port, derived in shell
  from the server's URL;
- every option no policy in use reads is refused: one line naming the field, exit 2, through the CLI.

The real vllm-router and vLLM's parser take the rendered lines: tests/test_router_live.py.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pytest
from router_jobs import (
    CACHE_OPTIONS,
    KV,
    KV_OPTIONS,
    ONE_NODE,
    PD_KV,
    POLICIES,
    RECIPES,
    ROOT,
    SCRATCH,
    event_endpoint,
    host_port,
    job,
    q,
    router,
    server,
    urls,
    value,
    values,
)

from slurmrl import cli, ports

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
