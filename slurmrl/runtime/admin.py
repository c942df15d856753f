"""Admin client for a job's vLLM servers: live weight reload and LoRA adapters.

Weight reload uses vLLM's development endpoints (the server runs with VLLM_SERVER_DEV_MODE=1,
which the planner sets for RL jobs): ``POST /pause?mode=wait``, ``POST /collective_rpc``
(``reload_weights`` from a checkpoint folder), ``POST /reset_prefix_cache``, ``POST /resume``.
All servers are updated in parallel; a server that fails is reported by URL.

    python -m slurmrl.runtime.admin --run-dir RUN_DIR --url http://n2:10016 reload /ckpt/step-10
    python -m slurmrl.runtime.admin --url ... lora-load NAME PATH | lora-unload NAME
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from slurmrl import secret


class AdminError(RuntimeError):
    pass


def post(url: str, body: dict | None = None, timeout: float = 300.0) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json", **secret.headers()})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read()
    except urllib.error.HTTPError as e:
        raise AdminError(f"{url}: HTTP {e.code}: {e.read()[:300].decode(errors='replace')}") from None
    except OSError as e:
        raise AdminError(f"{url}: {e}") from None


def reload_one(base: str, weights_dir: str) -> float:
    t = time.perf_counter()
    post(f"{base}/pause?mode=wait")
    try:
        post(f"{base}/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": weights_dir}})
        post(f"{base}/reset_prefix_cache")
    finally:
        post(f"{base}/resume")
    return time.perf_counter() - t


def _each(urls: list[str], fn) -> dict[str, float]:
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(urls)))) as pool:
        futures = {u: pool.submit(fn, u.rstrip("/")) for u in urls}
    errors = []
    out = {}
    for u, f in futures.items():
        try:
            out[u] = f.result()
        except AdminError as e:
            errors.append(str(e))
    if errors:
        raise AdminError("; ".join(errors))
    return out


def reload_weights(urls: list[str], weights_dir: str) -> dict[str, float]:
    """Reload every server from ``weights_dir`` (safetensors); returns seconds per server."""
    return _each(urls, lambda base: reload_one(base, weights_dir))


def load_lora(urls: list[str], name: str, path: str) -> dict[str, float]:
    def one(base):
        t = time.perf_counter()
        post(f"{base}/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        return time.perf_counter() - t

    return _each(urls, one)


def unload_lora(urls: list[str], name: str) -> dict[str, float]:
    def one(base):
        t = time.perf_counter()
        post(f"{base}/v1/unload_lora_adapter", {"lora_name": name})
        return time.perf_counter() - t

    return _each(urls, one)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Reload weights or LoRA adapters on running vLLM servers.")
    ap.add_argument("--url", action="append", required=True, help="server base URL (repeat for each server)")
    ap.add_argument("--run-dir", help="the job's run dir, for its secret (default: $SLURMRL_SECRET_FILE, as in a job step)")
    sub = ap.add_subparsers(dest="action", required=True)
    sub.add_parser("reload").add_argument("weights_dir")
    p = sub.add_parser("lora-load")
    p.add_argument("name")
    p.add_argument("path")
    sub.add_parser("lora-unload").add_argument("name")
    args = ap.parse_args(argv)
    if args.run_dir:
        os.environ[secret.ENV] = str(Path(args.run_dir) / secret.FILE)
    try:
        if args.action == "reload":
            out = reload_weights(args.url, args.weights_dir)
        elif args.action == "lora-load":
            out = load_lora(args.url, args.name, args.path)
        else:
            out = unload_lora(args.url, args.name)
    except AdminError as e:
        print(f"slurmrl admin: {e}", file=sys.stderr)
        return 1
    for url, secs in out.items():
        print(f"{url}: {args.action} ok in {secs:.3f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
