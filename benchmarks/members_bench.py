"""What a dead inference server costs the orchestrator (slurmrl.runtime.orchestrator.members). Prints figures;
asserts nothing.

SERVERS server processes on loopback (tests/support/rollout_double.py: each completion takes DELAY s), optionally
behind the real vllm-router (``--router``); the orchestrator's text sampler takes STEPS steps of PROMPTS
groups of N rollouts. At step KILL_AT one server is SIGKILLed (``--fault stop``: SIGSTOPped, a hung server
whose sockets stay open) while the step's requests are in flight. Per
step: seconds, groups short (goal 0), rollouts served, requests re-sent; and for the kill: seconds from the
SIGKILL to the server declared dead (no request is sent to it after that: the sampler picks admitted
servers only, and the router is told ``/remove_worker``), and to the router no longer listing it.

    .venv/bin/python benchmarks/members_bench.py
    .venv/bin/python benchmarks/members_bench.py --router --servers 4 --steps 6 --kill-at 3
    .venv/bin/python benchmarks/members_bench.py --fault stop
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from slurmrl.runtime.orchestrator.members import Members
from slurmrl.runtime.orchestrator.rollout_text import Sampler
from slurmrl.runtime.vllm.client import Server
from slurmrl.settings.orchestrator import OrchestratorSettings

ROOT = Path(__file__).resolve().parent.parent
DOUBLE = ROOT / "tests" / "support" / "rollout_double.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(predicate, deadline_s: float = 60.0) -> float:
    """Seconds until ``predicate()`` (inf past the deadline)."""
    t = time.monotonic()
    while time.monotonic() - t < deadline_s:
        if predicate():
            return time.monotonic() - t
        time.sleep(0.02)
    return float("inf")


class Tokens:
    """A tokenizer stand-in: one id per character (the doubles do not read prompts)."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) for c in text]}


def start(args, tmp: Path) -> tuple[list[subprocess.Popen], list[str], str | None]:
    procs, urls = [], []
    for i in range(args.servers):
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, str(DOUBLE), str(port), str(tmp / f"s{i}.jsonl"),
                                       str(args.delay)], cwd=DOUBLE.parent))
        urls.append(f"http://127.0.0.1:{port}")
    for u in urls:
        until(lambda: Server(u).health(timeout=1.0))
    router = None
    if args.router:
        port = free_port()
        procs.append(subprocess.Popen([str(ROOT / ".venv" / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port",
                                       str(port), "--worker-urls", *urls, "--policy", "round_robin",
                                       "--prometheus-port", str(free_port()), "--health-check-interval-secs", "5",
                                       "--health-failure-threshold", "1"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        router = f"http://127.0.0.1:{port}"
        until(lambda: len(Server(router).list_workers() or []) == len(urls))
    return procs, urls, router


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--kill-at", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--delay", type=float, default=0.5, help="seconds each completion takes")
    ap.add_argument("--router", action="store_true", help="the real vllm-router in front of the servers")
    ap.add_argument("--fault", choices=("kill", "stop"), default="kill", help="SIGKILL, or SIGSTOP (a hung server)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="members-bench-"))
    procs, urls, router = start(args, tmp)
    try:
        live = Members(urls, [router] if router else urls, min_servers=1, grace_s=60.0, events=tmp / "events.jsonl",
                       log=lambda msg: print(f"  {msg}", flush=True))
        live.start_monitor()
        s = OrchestratorSettings(run_dir=str(tmp), model="m", served_model_name="m", max_steps=args.steps,
                                 prompts_per_step=args.prompts, rollouts_per_prompt=args.n)
        sampler = Sampler([router] if router else urls, Tokens(), s, live)
        tasks = [{"prompt": f"p{i}"} for i in range(args.prompts)]
        victim = urls[-1]
        print(f"{args.servers} servers{' behind vllm-router' if router else ''}, {args.prompts} groups x {args.n}, "
              f"{args.delay}s per completion; SIG{args.fault.upper()} of {victim} at step {args.kill_at}")
        for step in range(1, args.steps + 1):
            killed: dict = {}
            if step == args.kill_at:
                def kill() -> None:
                    time.sleep(args.delay / 2)  # the step's requests are in flight
                    procs[len(urls) - 1].send_signal(signal.SIGKILL if args.fault == "kill" else signal.SIGSTOP)
                    killed["t"] = time.monotonic()
                    killed["dead_s"] = until(lambda: live.members[victim].state == "dead")
                    if router:
                        killed["router_s"] = until(lambda: victim not in (Server(router).list_workers() or [victim]))
                k = threading.Thread(target=kill)
                k.start()
            t = time.monotonic()
            groups = sampler.sample(tasks, step)
            took = time.monotonic() - t
            if step == args.kill_at:
                k.join()
            served, resent, n_live = live.take()
            short = sum(len(g) != args.n for g in groups)
            print(f"step {step}: {took:.2f}s, groups short {short}, rollouts served {sum(served.values())}, "
                  f"re-sent requests {resent}, servers live {n_live}")
            if killed:
                line = f"  SIG{args.fault.upper()} -> declared dead (no request sent to it): {killed['dead_s']:.2f}s"
                if router:
                    line += f"; -> off the router's list: {killed['router_s']:.2f}s"
                print(line)
        live.stop.set()
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


if __name__ == "__main__":
    main()
