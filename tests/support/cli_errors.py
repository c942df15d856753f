"""The one-line error a bad input gets from the CLI."""

from __future__ import annotations

import subprocess


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurmrl: error: "), r.stderr
    return lines[0]
