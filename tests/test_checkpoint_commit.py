"""Checkpoints are complete or absent, and every rank resumes the one rank 0 chose.

Real processes: two trainer ranks (torchrun, gloo on the CPU, FSDP2 as the trainer makes the
model) save through ``state.save_checkpoint`` (tests/support/checkpoint_ranks.py). The test hook
SLURMRL_TEST_CHECKPOINT_PAUSE_S makes a save slow enough to be killed (SIGKILL, by the process
group of the torchrun this test started) in the middle of its writes, or to outlast the grace
after a stop.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from slurmrl.runtime.trainer import commit

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from slurmrl.runtime.fixtures.tiny_model import build

    return build(tmp_path_factory.mktemp("model") / "tiny", seed=0)


def ranks(*args: str, n: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
            str(ROOT / "tests" / "support" / "checkpoint_ranks.py"), *args]


def save(model_dir: Path, root: Path, steps: str, grace: float = 0, pause: float = 0, pause_ranks: str = "",
         stop: bool = False, stage: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(ranks("save", str(model_dir), str(root), steps, str(grace), str(pause), pause_ranks,
                                "1" if stop else "0", *([str(stage)] if stage else [])),
                          env=ENV, capture_output=True, text=True, timeout=300)


def resume(root: Path, view: Path, out: Path) -> list[dict]:
    out.mkdir(exist_ok=True)
    r = subprocess.run(ranks("resume", str(root), str(view), str(out)), env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [json.loads((out / f"choice-rank{k}.json").read_text()) for k in range(2)]


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the torchrun this test started and its ranks (started in sessions of their own), by pid."""
    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)
    proc.communicate()


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_sigkill_during_a_save_resumes_from_the_previous_complete_checkpoint(model_dir, tmp_path):
    root = tmp_path / "checkpoints"
    proc = subprocess.Popen(ranks("save", str(model_dir), str(root), "1,2", "0", "30", "0,1", "0"), env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    partial = root / ".step-000002.tmp"
    try:
        deadline = time.monotonic() + 240
        # killed once step 2's folder holds some of its files (the hook pauses after each one)
        while time.monotonic() < deadline and proc.poll() is None and not (partial / "model").is_dir():
            time.sleep(0.2)
        assert (partial / "model").is_dir() and proc.poll() is None, proc.communicate()[0] if proc.poll() else ""
    finally:
        kill_tree(proc)
    assert names(root) == [".step-000002.tmp", "step-000001"]
    assert (root / "step-000001" / commit.MARKER).exists()
    assert not (partial / commit.MARKER).exists()
    (root / "step-000003").mkdir()  # a folder without its marker (a writer that renamed first): never loaded
    (root / "step-000003" / "state.json").write_text('{"step": 3}')
    choices = resume(root, root, tmp_path / "out")
    assert choices == [{"step": 1, "name": "step-000001"}] * 2
    assert names(root) == ["step-000001"]  # the incomplete ones are cleaned away
    state = json.loads((root / "step-000001" / "state.json").read_text())
    assert state["step"] == 1 and (root / "step-000001" / "rng-rank1.pt").exists()


def test_every_rank_resumes_rank_0s_choice(tmp_path):
    root, view = tmp_path / "checkpoints", tmp_path / "stale-view"
    for folder, step in ((root, 4), (view, 6), (view, 4)):
        (folder / f"step-{step:06d}").mkdir(parents=True)
        (folder / f"step-{step:06d}" / commit.MARKER).write_text(f"{step}\n")
    choices = resume(root, view, tmp_path / "out")
    assert choices == [{"step": 4, "name": "step-000004"}] * 2  # not rank 1's own view (step 6)


def test_a_save_in_progress_finishes_within_the_grace_after_a_stop(model_dir, tmp_path):
    root = tmp_path / "checkpoints"
    r = save(model_dir, root, "1", grace=60, pause=2, pause_ranks="1", stop=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert names(root) == ["step-000001"] and (root / "step-000001" / commit.MARKER).exists()


def test_a_save_that_cannot_finish_within_the_grace_is_dropped_whole(model_dir, tmp_path):
    root = tmp_path / "checkpoints"
    r = save(model_dir, root, "1,2", grace=3, pause=20, pause_ranks="1", stop=True)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert "checkpoint of step 2 dropped whole: rank(s) 1 not done 3s (slurm.grace_seconds) after the stop" in out
    assert names(root) == ["step-000001"]  # the previous one stays; nothing of step 2


# ---- node-local staging (trainer.checkpoint_stage_dir): the copy to the run dir in the background ----
def staged(stage: Path) -> list[Path]:
    return sorted(p for p in stage.rglob("*") if p.is_file())


def test_a_staged_checkpoint_becomes_visible_whole_and_leaves_no_staged_part(model_dir, tmp_path):
    root, stage = tmp_path / "checkpoints", tmp_path / "node-local"
    r = save(model_dir, root, "1,2", stage=stage)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "checkpoint of step 2 copied from the node-local stage" in r.stdout
    assert names(root) == ["step-000001", "step-000002"]
    for step in ("step-000001", "step-000002"):
        assert (root / step / commit.MARKER).exists() and (root / step / "rng-rank1.pt").exists()
        assert (root / step / "optimizer.pt").exists() and (root / step / "model" / "config.json").exists()
    assert staged(stage) == []  # each part removed once copied


def test_sigkill_during_the_background_copy_resumes_from_the_previous_complete_checkpoint(model_dir, tmp_path):
    root, stage = tmp_path / "checkpoints", tmp_path / "node-local"
    proc = subprocess.Popen(ranks("save", str(model_dir), str(root), "1,2", "0", "30", "0,1", "0", str(stage)),
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    partial = root / ".step-000002.tmp"
    try:
        deadline = time.monotonic() + 240
        # killed once the copy of step 2 has put some of its files in the run dir (paused after each one)
        while time.monotonic() < deadline and proc.poll() is None and not any(partial.rglob("*.json")):
            time.sleep(0.2)
        assert any(partial.rglob("*.json")) and proc.poll() is None, proc.communicate()[0] if proc.poll() else ""
    finally:
        kill_tree(proc)
    assert names(root) == [".step-000002.tmp", "step-000001"] and not (partial / commit.MARKER).exists()
    assert staged(stage)  # the staged part of step 2, never copied whole
    choices = resume(root, root, tmp_path / "out")
    assert choices == [{"step": 1, "name": "step-000001"}] * 2
    assert names(root) == ["step-000001"]


def test_a_staged_copy_that_cannot_finish_within_the_grace_is_dropped_whole(model_dir, tmp_path):
    root, stage = tmp_path / "checkpoints", tmp_path / "node-local"
    r = save(model_dir, root, "1,2", grace=3, pause=20, pause_ranks="0,1", stop=True, stage=stage)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert "checkpoint of step 2 dropped whole: " in out and "3s (slurm.grace_seconds) after the stop" in out, out[-3000:]
    assert names(root) == ["step-000001"]  # the previous one stays; nothing of step 2
