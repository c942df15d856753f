"""vllm-router in P/D mode, wired by slurmrl's router runtime, in front of real vLLM servers.

Real KV transfer (NIXL) needs GPUs; here one plain vLLM CPU server stands in for the prefill pool
and one for the decode pool, started on the ports the P/D plan gives them. What is tested is
the part slurmrl owns: the router runtime turns the plan into a working `--vllm-pd-disaggregation`
router whose requests reach both pools and come back answered.
"""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request

import pytest

from live_components import LiveComponent, free_port_base, post_json
from slurmrl.runtime.tiny_model import build as build_tiny

pytestmark = pytest.mark.vllm

RECIPE = """
name = "pd"
kind = "inference"
[slurm]
gpus_per_node = 1
cpus_per_node = 8
[model]
path = "{model}"
served_name = "tiny"
[inference]
mode = "pd"
[inference.prefill]
replicas = 1
[inference.decode]
replicas = 1
"""


def served(url: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)", text, re.M))


def test_router_in_pd_mode_uses_both_pools(tmp_path):
    from slurmrl.render import render

    model = build_tiny(tmp_path / "tiny")
    recipe = tmp_path / "pd.toml"
    recipe.write_text(RECIPE.format(model=model))
    out = render(recipe, run_dir=tmp_path / "run")
    base = free_port_base()
    urls = [f"http://127.0.0.1:{base + 16}", f"http://127.0.0.1:{base + 17}"]  # prefill, decode
    # the batch shell hands the router its pools from the servers' ready files (URLS_PREFILL,
    # URLS_DECODE); here two stand-in servers on one host play them
    pools = {"URLS_PREFILL": urls[0], "URLS_DECODE": urls[1]}
    logs = []
    servers = []
    try:
        for url in urls:
            log = open(tmp_path / f"{url.rsplit(':', 1)[1]}.log", "wb")
            logs.append(log)
            servers.append(subprocess.Popen(
                [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                 "--served-model-name", "tiny", "--port", url.rsplit(":", 1)[1], "--dtype", "float32",
                 "--max-model-len", "256", "--enforce-eager"],
                env={**__import__("os").environ, "VLLM_CPU_KVCACHE_SPACE": "1"}, stdout=log, stderr=subprocess.STDOUT,
            ))
        probe = LiveComponent(out.run_dir, "router", base, groups=2, extra_env=pools)
        try:
            probe.wait_http(f"http://127.0.0.1:{base}/health", timeout=600)
            before = [served(u) for u in urls]
            body = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "ignore_eos": True}
            for _ in range(3):
                assert post_json(f"http://127.0.0.1:{base}/v1/completions", body)["usage"]["completion_tokens"] == 4
            delta = [served(u) - b for u, b in zip(urls, before)]
            assert delta[0] >= 3 and delta[1] >= 3, f"requests per pool (prefill, decode): {delta}"
        finally:
            probe.stop()
    finally:
        for p in servers:
            p.terminate()
        for p in servers:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in logs:
            log.close()
