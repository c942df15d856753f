"""trainer.weight_sync by broadcast as the job script shows it: every server's command line names
the backend, the trainer's gets each component's servers with their worker count, where it hosts
the transfer group (the port table's weight_broadcast) and the group's size; in P/D both roles.
The task functions run in real bash (tests/support/task_expand.py), so the argv is what srun would start."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from task_expand import expand

from slurmrl import ports
from slurmrl.app.build import build

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
RL_PD = """
name = "rl-pd"
kind = "rl"
[slurm]
gpus_per_node = 8
[model]
path = "Qwen/Qwen3-4B"
[inference]
mode = "pd"
[inference.prefill]
replicas = 2
tp = 2
[inference.decode]
replicas = 1
tp = 4
[trainer]
weight_sync = "nccl"
[orchestrator]
"""


def built(run_dir: Path, recipe: str, sets: list[str]):
    return build(RECIPES / f"{recipe}.toml", sets, run_dir=str(run_dir))  # its prologue writes there


def argv_after(argv: list[str], flag: str) -> list[str]:
    """The words after ``flag`` up to the next ``--`` option."""
    rest = argv[argv.index(flag) + 1:]
    return rest[: next((i for i, w in enumerate(rest) if w.startswith("--")), len(rest))]


def test_nccl_servers_and_trainer_lines(tmp_path):
    out = built(tmp_path, "rl-nccl", [])
    urls = "http://g1n0:1 http://g1n0:2 http://g1n0:3 http://g1n0:4"
    for local in range(4):
        server = expand(out.script, out.plan, "inference", local=local).command
        assert json.loads(argv_after(server, "--weight-transfer-config")[0]) == {"backend": "nccl"}
    trainer = expand(out.script, out.plan, "trainer", env={"URLS_INFERENCE": urls}).command
    assert argv_after(trainer, "--weight-servers") == ["2", *urls.split()]  # tp=2: two workers per server
    assert argv_after(trainer, "--weight-world-size") == ["9"]  # the trainer + 4 servers x 2
    host, port = argv_after(trainer, "--weight-master")[0].rsplit(":", 1)
    assert host == "g0n0" and int(port) == ports.base_for_job(7) + ports.offset("weight_broadcast")
    assert "weight_broadcast" in out.plan.ports
    for role in ("orchestrator", "trainer"):  # the orchestrator reloads nothing itself; one spelling for both
        settings = tomllib.loads(out.files[f"components/{role}.toml"])
        assert settings["weight_sync"] == {"mode": "broadcast", "backend": "nccl", "timeout_s": 600}


def test_pd_broadcasts_to_both_roles_with_their_own_worker_counts(tmp_path):
    (tmp_path / "rl-pd.toml").write_text(RL_PD)
    out = build(tmp_path / "rl-pd.toml", [], run_dir=str(tmp_path))
    env = {"URLS_PREFILL": "http://p0 http://p1", "URLS_DECODE": "http://d0"}
    for role in ("prefill", "decode"):
        assert "--weight-transfer-config" in expand(out.script, out.plan, role, env=env).command
    trainer = expand(out.script, out.plan, "trainer", env=env).command
    groups = [argv_after(trainer[i:], "--weight-servers") for i, w in enumerate(trainer) if w == "--weight-servers"]
    assert sorted(groups) == [["2", "http://p0", "http://p1"], ["4", "http://d0"]]
    assert argv_after(trainer, "--weight-world-size") == ["9"]  # 1 + 2 x 2 + 1 x 4


@pytest.mark.parametrize("backend", ["gloo", "filesystem"])
def test_backend_name_is_the_only_difference(backend, tmp_path):
    nccl = built(tmp_path, "rl-nccl", []).script
    other = built(tmp_path, "rl-nccl", [f'trainer.weight_sync="{backend}"']).script
    changed = [(a, b) for a, b in zip(nccl.splitlines(), other.splitlines()) if a != b]
    if backend == "gloo":
        assert changed == [("        --weight-transfer-config '{\"backend\":\"nccl\"}'",
                            "        --weight-transfer-config '{\"backend\":\"gloo\"}'")]
    else:
        assert "--weight-" not in other and "PORT_WEIGHT_BROADCAST" not in other


def test_the_trainer_refuses_a_broadcast_without_its_servers(tmp_path):
    """The trainer's own parser: a broadcast setting without the script's --weight-* words is one line."""
    import subprocess
    import sys

    out = built(tmp_path, "rl-nccl", [])
    cfg = tmp_path / "trainer.toml"
    cfg.write_text(out.files["components/trainer.toml"])
    p = subprocess.run([sys.executable, "-m", "slurmrl.runtime.trainer", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--weight-servers" in p.stderr.strip().splitlines()[-1], p.stderr


def test_ipc_handles_travel_pickled_to_servers_that_accept_them(tmp_path):
    import base64
    import pickle

    from slurmrl.runtime.vllm.client import http_safe

    sets = ['trainer.weight_sync="ipc"', "placement.colocate=true", "placement.share_gpus=true",
            "inference.nodes=1", "trainer.nodes=1", "inference.gpus_per_node=8", "trainer.gpus_per_node=8"]
    out = built(tmp_path, "rl-nccl", sets)
    server = expand(out.script, out.plan, "inference")
    assert server.env["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    nccl = built(tmp_path, "rl-nccl", [])
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in expand(nccl.script, nccl.plan, "inference").env
    info = {"names": ["w"], "ipc_handles": [{"gpu-uuid": ("handle", 3)}]}
    sent = http_safe(info)
    assert "ipc_handles" not in sent and pickle.loads(base64.b64decode(sent["ipc_handles_pickled"])) == info["ipc_handles"]
    assert http_safe({"names": ["w"]}) == {"names": ["w"]}
