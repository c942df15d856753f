"""A job's vLLM servers by hand: live weight reload and LoRA adapters (``slurmrl.runtime.vllm.client``
does the requests).

Weight reload uses vLLM's development endpoints (the server runs with VLLM_SERVER_DEV_MODE=1,
which the planner sets for RL jobs): ``POST /pause?mode=wait``, ``POST /collective_rpc``
(``reload_weights`` from a checkpoint folder), ``POST /reset_prefix_cache``, ``POST /resume``.
All servers are updated in parallel; a server that fails is reported by URL.

    python -m slurmrl.runtime.vllm.admin --run-dir RUN_DIR --url http://n2:10016 reload /ckpt/step-10
    python -m slurmrl.runtime.vllm.admin --url ... lora-load NAME PATH | lora-unload NAME
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from slurmrl import secret
from slurmrl.runtime.vllm.client import VLLMError, load_lora, reload_weights, unload_lora


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Reload weights or LoRA adapters on running vLLM servers.")
    ap.add_argument("--url", action="append", required=True, help="server base URL (repeat for each server)")
    ap.add_argument("--run-dir", help=f"the job's run dir, for its secret (default: ${secret.ENV}, as in a job step)")
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
    except VLLMError as e:
        print(f"slurmrl admin: {e}", file=sys.stderr)
        return 1
    for url, secs in out.items():
        print(f"{url}: {args.action} ok in {secs:.3f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
