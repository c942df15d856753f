"""The real supervisor and its guard run on a command without Slurm, and the failure probes fed a stream
in chunks; shared by the tests of how a command's end is named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from slurmrl.rundir import ended
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.steps.probes import Probes, user_probes

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def probe(text: str, patterns: tuple[str, ...] = (), chunks: list[int] | None = None) -> tuple[Probes, list[str]]:
    fired: list[str] = []
    p = Probes(user_probes(patterns), on_fatal=fired.append)
    s = p.stream()
    data = text.encode()
    cuts = sorted({0, len(data), *(c % (len(data) + 1) for c in chunks or [])})
    for a, b in zip(cuts, cuts[1:]):
        s.feed(data[a:b])
    s.flush()
    return p, fired


def supervise(tmp_path: Path, name: str, command: list[str], *opts: str, stop_after: float | None = None,
              wait_for: str | None = None) -> tuple[int, str, ended.Ended | None]:
    run_dir = tmp_path / "run"
    env = {**os.environ, "SLURMRL_RUN_DIR": str(run_dir), "SLURMRL_ATTEMPT": "0", "SLURM_PROCID": "0",
           "PYTHONPATH": str(ROOT)}
    log = tmp_path / f"{name}.log"
    with open(log, "wb") as out:  # a file, as srun --output gives: the guard reads the output
        proc = subprocess.Popen([PY, "-m", "slurmrl.runtime.steps.supervise", name, *opts, "--", *command],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
        if stop_after is not None:
            deadline = time.monotonic() + 60
            # a line of its own: the supervisor's echo of the command line holds the same word
            while wait_for and wait_for not in log.read_text().splitlines() and time.monotonic() < deadline:
                time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    return code, log.read_text(), ended.read_ended(RunDir(run_dir).ended_file(0, name, 0))
