"""``python -m slurmrl.runtime.gates.router_key ARGS`` runs ``vllm-router ARGS`` in this process with the
job's secret as the key it sends to the servers.

In P/D mode vllm-router (0.1.17) does not pass the client's ``Authorization`` header on to the
prefill and decode servers: it sends ``Bearer $OPENAI_API_KEY`` (an empty ``Bearer`` when that is
unset; its ``--api-key`` is not used there, measured), and servers that require the job's secret
answer 401. This module puts the secret from ``$SLURMRL_SECRET_FILE`` into its own environment
(readable only by the job's user, unlike a command line) and runs vllm-router's own ``main()``.
"""

from __future__ import annotations

import os
import sys

from slurmrl import secret


def main() -> None:
    value = secret.read()
    if value is None:
        raise SystemExit(f"slurmrl: ${secret.ENV} names no readable secret; the job script creates it")
    os.environ["OPENAI_API_KEY"] = value
    from vllm_router.launch_router import main as router_main

    sys.argv = ["vllm-router", *sys.argv[1:]]
    router_main()


if __name__ == "__main__":
    main()
