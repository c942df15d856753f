"""RUN_DIR/benchmark/summary.json read back (``slurmrl.runtime.bench`` writes it after every point) as
the contract's typed summary (``slurmrl.contract.bench_summary.BenchSummary``: the status, the mode, the
target and one entry of numbers per point done, each number in its range or missing); a file that breaks
the contract is one line naming it and the key (``UserError``, exit 2)."""

from __future__ import annotations

from pathlib import Path

from slurmrl.contract.bench_summary import BenchSummary
from slurmrl.contract.reader import ContractError
from slurmrl.errors import UserError
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.read import read_json


def read_summary(run_dir: Path) -> BenchSummary | None:
    """The benchmark's summary, or None when the run has none (yet)."""
    path = RunDir(run_dir).benchmark_summary()
    data = read_json(path, missing=None)
    if data is None:
        return None
    try:
        return BenchSummary.from_json(data, str(path))
    except ContractError as e:
        raise UserError(None, str(e)) from None
