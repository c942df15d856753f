"""Start-up cost paid once, and ready that means serving, on the local Slurm (issue 17 items 4, 5).

Two inference-debug jobs at once (2 servers + vllm-router each) with
- ``container.cache``: a registry image imported once into a shared cache folder by
  ``enroot import`` under a lock. enroot is tests/support/pyxis_double/enroot, a TEST DOUBLE (it writes a
  small file and logs each import; no enroot can run here), put on PATH by ``python.setup`` as a
  site's ``module load enroot`` would; the Pyxis test double records each step's flags;
- ``model.stage = "node-local"``: the tiny model's real directory, copied once per node.

Job A's servers are tests/support/ok_server.py (a test double answering a completion with one token) in
place of vLLM's program, with vLLM's flags left on its command line; job B's are
tests/support/no_tokens_server.py (a test double that passes /health and fails every completion).
Checks, one pair of jobs for all: one import between the two jobs (the other a cache hit, after
waiting for the lock), each step given the .sqsh; each node's copy made with its checksum and
named in the servers' --model; A ready through the router; B never ready, its FAILED naming the
failing completion and server. Real vLLM reading a node-local copy: tests/test_inference_cluster.py.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny
from slurmrl.runtime.steps.stage import MANIFEST

pytestmark = [pytest.mark.cluster]
ROOT = Path(__file__).resolve().parent.parent
VLLM_PROGRAM = re.compile(r"\S+ -m vllm\.entrypoints\.openai\.api_server \\\n")
IMAGE = "registry.example.org#team/llm-serving:1.0"


def render(cluster, tmp: Path, name: str, model: Path, cache: Path, stage: Path, double: str) -> Path:
    setup = [f"export PATH={ROOT}/tests/support/pyxis_double:$PATH", "export ENROOT_DOUBLE_SECONDS=4"]
    r = cluster.slurmrl(
        "render", str(ROOT / "recipes" / "inference-debug.toml"), "--set", f'name="{name}"',
        "--set", f'model.path="{model}"', "--set", 'model.stage="node-local"', "--set", f'model.stage_dir="{stage}"',
        "--set", f'python.executable="{sys.executable}"', "--set", f"python.setup={json.dumps(setup)}",
        "--set", f'container.image="{IMAGE}"', "--set", f'container.cache="{cache}"',
        "--set", "slurm.grace_seconds=5", "--set", "slurm.cpus_per_node=4", cwd=tmp)  # two jobs fit on two nodes
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = tmp / "runs" / name
    script = run_dir / "job.sbatch"
    text, n = VLLM_PROGRAM.subn(rf'{sys.executable} {ROOT}/tests/support/{double} "${{port}}" \\\n', script.read_text())
    assert n == 1, "no vLLM command line in the script"
    if double == "no_tokens_server.py":  # do not wait the router's 300 s for what will not come
        text, n = re.subn(r"^wait_ready router \d+$", "wait_ready router 25", text, flags=re.M)
        assert n == 1
    script.write_text(text)
    return run_dir


def phases(run_dir: Path) -> list[str]:
    return [what for _, what in RunDir(run_dir).read_phases(0)]


def test_image_imported_once_weights_staged_per_node_and_ready_means_serving(slurm_cluster, tmp_path):
    model = build_tiny(tmp_path / "tiny")
    cache, stage = tmp_path / "cache", tmp_path / "stage"
    good = render(slurm_cluster, tmp_path, "stage-good", model, cache, stage, "ok_server.py")
    bad = render(slurm_cluster, tmp_path, "stage-bad", model, cache, stage, "no_tokens_server.py")
    jobs = {}
    for run_dir in (good, bad):
        r = slurm_cluster.slurmrl("submit", str(run_dir), cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        jobs[run_dir] = json.loads((run_dir / "jobs.json").read_text())[-1]["job_id"]
    failed = RunDir(bad).failed_file(0)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            up = any("all components ready" in w for w in phases(good))
            if up and failed.exists():
                break
            assert not RunDir(good).failed_file(0).exists(), RunDir(good).failed_file(0).read_text()
            time.sleep(2)
        assert up, f"job A not ready: {phases(good)}"
        assert failed.exists(), f"job B neither ready nor failed: {phases(bad)}"

        for run_dir in (good, bad):  # the figures, in the test's output (-s)
            print(f"{run_dir.name}:", *phases(run_dir), sep="\n  ")
        print("FAILED:", failed.read_text())
        # 5: B never became ready; its FAILED names the completion that failed and the server that fails it
        reason = failed.read_text()
        assert reason.startswith("router not ready after 25s"), reason
        assert "completion of" in reason and "HTTP 500: engine dead (test double)" in reason, reason
        assert re.search(r"directly, http://n\d:\d+: HTTP 500: engine dead", reason), reason
        assert not any("all components ready" in w for w in phases(bad))
        assert not RunDir(bad).ready_file(0, "router", 0).exists()
        # A: both workers registered behind the router, one completion through it
        joined = " | ".join(phases(good))
        assert "router workers registered: 2 of 2" in joined and "router serving: a completion through" in joined

        # 4a: one import between the two jobs; the other found it in the cache
        sqsh = cache / "registry.example.org+team+llm-serving+1.0.sqsh"
        imports = (cache / "enroot-double.log").read_text().splitlines()
        assert len(imports) == 1 and imports[0].split()[3:] == [IMAGE, f"{sqsh}.partial"], imports
        assert sqsh.read_bytes().startswith(b"hsqs")
        image_lines = [w for run_dir in (good, bad) for w in phases(run_dir) if w.startswith("container image:")]
        assert sorted(w.split(",")[0].split(" ")[3] for w in image_lines) == ["hit", "miss"], image_lines
        # every step of both jobs was given the squashfs, none the registry image
        log = (slurm_cluster.state_dir / "log" / "pyxis_double.log").read_text().splitlines()
        for job in jobs.values():
            images = {line.split("--container-image=")[1] for line in log
                      if f"job={job} " in line and "--container-image=" in line}
            assert images == {str(sqsh)}, images

        # 4b: each node of each job has a checked copy; the servers were started on it
        for run_dir in (good, bad):
            staged = [w for w in phases(run_dir) if w.startswith("model staged on ")]
            assert len(staged) == 2 and len({w.split()[3] for w in staged}) == 2, staged  # one line per node
            for task in ("inference.0", "inference.1"):
                log_text = (RunDir(run_dir).log_dir(0) / f"{task}.log").read_text()
                argv = re.search(r"exec: (.*)", log_text).group(1)
                local = re.search(r"--model (\S+)", argv).group(1)
                assert local.startswith(f"{stage}/n") and local != str(model), argv
                manifest = json.loads((Path(local) / MANIFEST).read_text())
                assert set(manifest["sha256"]) == {p.name for p in model.iterdir()}
        misses = [w for run_dir in (good, bad) for w in phases(run_dir) if w.startswith("model staged on ")
                  and "cache miss" in w]
        nodes = {w.split()[3] for w in misses}
        assert len(misses) == len(nodes), misses  # one copy per node, whichever job made it
    finally:
        for run_dir in (good, bad):
            slurm_cluster.slurmrl("cancel", str(run_dir), cwd=tmp_path, timeout=180)
    for job in jobs.values():
        left = slurm_cluster.wait_no_job_processes(job)
        assert not left, "left after cancel:\n" + "\n".join(left)
