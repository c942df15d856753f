"""A planned stop leaves no traceback from wandb (real wandb, offline).

On a planned stop Slurm's TERM reaches every process of the step, wandb's service process too.
wandb's own exit hook then printed a ConnectionResetError traceback and turned the trainer's exit
143 into 1; Metrics.close tears wandb down itself, whatever state its service is in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import signal, sys, time
from pathlib import Path
import psutil
from slurmrl.runtime.metrics import Metrics

m = Metrics(Path(sys.argv[1]), "trainer", {"lr": 1e-5}, print)
assert m.wandb is not None, "wandb did not start"
m.log({"step": 1, "loss": 1.0})
if sys.argv[2] == "term-service":
    for child in psutil.Process().children(recursive=True):  # what scancel's TERM does to the service
        child.send_signal(signal.SIGTERM)
        psutil.wait_procs([child], timeout=10)
Metrics.close_all(143)
print("closed")
sys.exit(143)
"""


@pytest.mark.parametrize("case", ["term-service", "service-alive"])
def test_a_planned_stop_ends_wandb_without_a_traceback(tmp_path, case):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), case], capture_output=True, text=True,
                       env=env, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 143, out
    assert "Traceback" not in out and "closed" in out, out
    assert (case == "term-service") == ("its service had already stopped" in out), out
    assert list((tmp_path / "wandb").glob("offline-run-*")), "the offline run is kept"
    assert (tmp_path / "metrics" / "trainer.jsonl").read_text().count("\n") == 1


def test_wandb_prints_no_advertisement_in_the_orchestrators_log(tmp_path):
    """The orchestrator imports openai: wandb then suggested installing its Weave product in the log."""
    script = ("import sys, openai\nfrom pathlib import Path\nfrom slurmrl.runtime import tracking\n"
              "run = tracking.start(None, Path(sys.argv[1]), 'orchestrator', {}, print)\n"
              "assert run is not None\nrun.finish()\nprint('done')")
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_SILENT", "WANDB_DISABLE_WEAVE")}
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120,
                       env={**env, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"})
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "done" in out, out
    assert "wandb" in out.lower()  # wandb speaks (the offline run's lines): only its advertisement is gone
    assert "Weave" not in out and "pip install" not in out, out
