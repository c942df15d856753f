"""Router: the real ``vllm-router`` (PyPI) in front of this job's vLLM servers.

Replicas mode: ``--worker-urls`` with ``consistent_hash`` (keyed on the session header) or
``round_robin``. P/D mode: ``--vllm-pd-disaggregation`` with ``--prefill``/``--decode`` pools.
Active health checks every few seconds take a dead server out of rotation; retries send a
failed request to another server.

    python -m slurmrl.runtime.router --config RUN_DIR/components/router.toml
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from slurmrl.runtime import component as rt
from slurmrl.runtime import supervised

HEALTH_INTERVAL_S = 5
KV_CONNECTOR_FLAG = {"NixlConnector": "nixl"}  # vllm-router knows nixl, mooncake, moriio


def url(ep: dict) -> str:
    host, port = rt.endpoint(ep)
    return f"http://{host}:{port}"


def router_binary() -> str:
    """``vllm-router`` next to this interpreter (a venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / "vllm-router"
    found = str(beside) if beside.exists() else shutil.which("vllm-router")
    if not found:
        raise SystemExit("slurmrl: router: vllm-router is not installed (pip install vllm-router)")
    return found


def router_argv(comp: rt.Component) -> list[str]:
    s = comp.settings
    ports = comp.instance["ports"]
    argv = [
        router_binary(), "--host", "0.0.0.0", "--port", str(rt.port(ports["http"])),
        "--prometheus-port", str(rt.port(ports["metrics"])), "--prometheus-host", "0.0.0.0",
        "--health-check-interval-secs", str(HEALTH_INTERVAL_S), "--health-failure-threshold", "1",
        "--worker-startup-timeout-secs", "1800",
    ]
    if "prefill" in s:
        argv += ["--vllm-pd-disaggregation", "--prefill-policy", s["policy"], "--decode-policy", s["policy"]]
        for ep in s["prefill"]:
            argv += ["--prefill", url(ep)]
        for ep in s["decode"]:
            argv += ["--decode", url(ep)]
        if s.get("kv_connector") in KV_CONNECTOR_FLAG:
            argv += ["--kv-connector", KV_CONNECTOR_FLAG[s["kv_connector"]]]
    else:
        argv += ["--policy", s["policy"], "--worker-urls", *[url(ep) for ep in s["workers"]]]
    return argv + list(s.get("extra_args", []))


def main() -> int:
    args = rt.config_arg(__doc__.splitlines()[0])
    comp = rt.load(args.config)
    health = f"http://127.0.0.1:{rt.port(comp.instance['ports']['http'])}/health"
    return supervised.run(
        comp, router_argv(comp), supervised.child_env(comp), lambda: supervised.http_ok(health), "vllm-router"
    )


if __name__ == "__main__":
    supervised.exit_with(main())
