"""Per-step metrics of a runtime (trainer, orchestrator): one JSON line per step in
``metrics/<role>.jsonl``, and W&B if it can (``slurmrl.runtime.tracking``: the recipe's [wandb];
any failure to import or start it leaves only the JSONL).

A second file of the same runtime (the orchestrator's ``metrics/eval.jsonl``) is ``Metrics.beside``:
its own JSONL, logged into the same W&B run under its own prefix and its own step axis.
"""

from __future__ import annotations

import json
from pathlib import Path

from slurmrl.rundir.paths import RunDir
from slurmrl.runtime import exposition, tracking
from slurmrl.settings.wandb import WandbSettings


class Metrics:
    opened: list[Metrics] = []  # for close_all() on a runtime's exit path

    def __init__(self, run_dir: Path, role: str, config: dict, log, enabled: bool = True, wandb_prefix: str = "",
                 tracking_settings: WandbSettings | None = None):
        self.path = RunDir(run_dir).metrics(role)
        self.enabled, self.wandb, self.prefix, self._log = enabled, None, wandb_prefix, log
        self.own_axis = False  # True: W&B plots this file's keys against its own `<prefix>step`
        self.exposition: exposition.Exposition | None = None
        if not enabled:
            return
        self.exposition = exposition.from_env(role, log)  # /metrics for the [collector], when the plan asks
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.wandb = tracking.start(tracking_settings, Path(run_dir), role, config, log)
        if self.wandb is not None:
            Metrics.opened.append(self)

    def beside(self, path: Path, prefix: str) -> Metrics:
        """Another JSONL file of this runtime, logged into this one's W&B run as ``<prefix>KEY`` against
        ``<prefix>step`` (its steps need not follow this run's); closing this run closes it."""
        other = Metrics.__new__(Metrics)
        other.path, other.enabled, other.wandb, other.prefix, other._log = path, self.enabled, self.wandb, prefix, self._log
        other.own_axis, other.exposition = True, None
        if self.enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
        if self.wandb is not None:
            try:
                self.wandb.define_metric(f"{prefix}step")
                self.wandb.define_metric(f"{prefix}*", step_metric=f"{prefix}step")
            except Exception:  # never let metrics stop training
                pass
        return other

    def truncate_after(self, step: int) -> int:
        """Drop lines of steps after ``step`` (they are redone after a resume); returns how many."""
        if not self.enabled or not self.path.exists():
            return 0
        keep, dropped = [], 0
        for line in self.path.read_text().splitlines():
            try:
                ok = json.loads(line)["step"] <= step
            except (ValueError, KeyError, TypeError):
                ok = False
            if ok:
                keep.append(line)
            else:
                dropped += 1
        if dropped:
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text("".join(k + "\n" for k in keep))
            tmp.replace(self.path)
        return dropped

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.exposition is not None:
            self.exposition.update(record)
        if self.wandb is not None:
            numbers = {self.prefix + k: v for k, v in record.items() if isinstance(v, (int, float))}
            try:
                if self.own_axis:  # the run's step belongs to the other file: join its current row, never move it
                    self.wandb.log(numbers, commit=False)
                else:
                    self.wandb.log(numbers, step=record["step"])
            except Exception:  # never let metrics stop training
                pass

    @classmethod
    def close_all(cls, exit_code: int) -> None:
        while cls.opened:
            cls.opened.pop().close(exit_code)

    def close(self, exit_code: int = 0) -> None:
        """Finish the wandb run and tear its service down now. On a planned stop Slurm's TERM
        reaches every process of the step, wandb's service process too; its own exit hook would
        then print a ConnectionResetError traceback and turn exit 143 into 1. Tearing down here
        unregisters that hook whatever happens; the offline files are complete either way."""
        if self.wandb is None:
            return
        import wandb

        run, self.wandb, failed = self.wandb, None, None
        for finish in (lambda: run.finish(exit_code=exit_code), lambda: wandb.teardown(exit_code)):
            try:
                finish()
            except Exception as e:
                failed = failed or e
        if failed is not None:
            self._log(f"wandb: its service had already stopped ({failed.__class__.__name__}); "
                      "the metrics JSONL and the files under RUN_DIR/wandb are kept")
