"""The router-policy tests' shared harness (tests/test_router_policies.py, tests/test_router_live.py):
gallery recipes rendered with overrides, and what the router's and each server's task really execs
(``task_expand``: the script's prologue and task function in bash, the URLs the servers'
supervisors would write).
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from functools import cache
from pathlib import Path

from task_expand import expand

from slurmrl.app.build import Rendered, build

ROOT = Path(__file__).resolve().parents[2]
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


KV = "inference.router.policy='kv_aware'"
PD_KV = "inference.router.prefill_policy='kv_aware'"
