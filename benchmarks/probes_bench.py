"""How much do the failure probes cost a task's output? Prints figures; asserts nothing.

Every line a task writes passes through its guard, which runs the failure probes on it
(slurmrl.runtime.steps.probes). This feeds a log shaped like vLLM's and a trainer's (log lines,
some long, a traceback now and then, a progress bar without newlines) through ``ProbeStream`` in
64 KiB chunks, as the guard's pump reads them, and prints MB/s and lines/s, and the same for a
plain ``bytes.split`` of the lines (the floor of any line reader).

    .venv/bin/python benchmarks/probes_bench.py [--mib 64]
"""

from __future__ import annotations

import argparse
import time

from slurmrl.runtime.steps.probes import Probes, user_probes

LINES = [
    "INFO 11-25 12:00:01 [loggers.py:123] Engine 000: Avg prompt throughput: 1234.5 tokens/s, Avg generation "
    "throughput: 987.6 tokens/s, Running: 64 reqs, Waiting: 0 reqs, GPU KV cache usage: 42.1%",
    "(APIServer pid=4242) INFO:     10.0.0.1:51234 - \"POST /v1/completions HTTP/1.1\" 200 OK",
    "[rank0]: step 120 loss 1.2345 reward 0.51 kl 0.0012 grad_norm 0.98 tokens/s 45678",
    "Traceback (most recent call last):",
    '  File "/opt/venv/lib/python3.12/site-packages/vllm/entrypoints/openai/serving_completion.py", line 200, in x',
    "    raise ValueError(\"prompt too long\")",
    "ValueError: prompt too long",
    "Loading safetensors checkpoint shards: " + "#" * 3000,
]


def log(mib: int) -> bytes:
    block = ("\n".join(LINES) + "\n").encode()
    return block * (mib * (1 << 20) // len(block) + 1)


def run(data: bytes, chunk: int = 1 << 16) -> float:
    probes = Probes(user_probes(["quota exceeded", r"reward server \d+ down"]))
    stream = probes.stream()
    started = time.perf_counter()
    for i in range(0, len(data), chunk):
        stream.feed(data[i:i + chunk])
    stream.flush()
    return time.perf_counter() - started


def floor(data: bytes, chunk: int = 1 << 16) -> float:
    started = time.perf_counter()
    partial = b""
    for i in range(0, len(data), chunk):
        lines = (partial + data[i:i + chunk]).split(b"\n")
        partial = lines.pop()
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64, help="MiB of log to feed")
    args = ap.parse_args()
    data = log(args.mib)
    lines = data.count(b"\n")
    took, base = run(data), floor(data)
    mb = len(data) / 1e6
    print(f"log: {mb:.1f} MB, {lines} lines (vLLM/trainer-shaped, a traceback per {len(LINES)} lines)")
    print(f"probes:      {mb / took:8.1f} MB/s  {lines / took:12.0f} lines/s  ({took:.2f} s)")
    print(f"line split:  {mb / base:8.1f} MB/s  {lines / base:12.0f} lines/s  ({base:.2f} s; the floor)")


if __name__ == "__main__":
    main()
