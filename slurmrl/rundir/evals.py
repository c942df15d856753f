"""RUN_DIR/metrics/eval.jsonl read back: one evaluation of the policy per line, ``step`` being the
trainer step whose weights were evaluated (0: the model before training). The orchestrator writes
them (``slurmrl.runtime.orchestrator.evaluate``); `slurmrl status` and `slurmrl plot` read them here.

The file is a metrics log like ``metrics/<role>.jsonl`` and is read by the same rules
(``slurmrl.rundir.metrics``): a line that is not a record is left out, a file that is not text is
one line naming it. An evaluation's row is ``slurmrl.contract.metrics.EvalRow``; its numbers for display are
the finite ones: the mean reward, and pass@k per k (fields ``pass@K``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slurmrl.contract.metrics import EvalRow, finite, whole
from slurmrl.rundir import metrics


@dataclass(frozen=True)
class Evaluation:
    """One evaluation: the step evaluated, its mean reward, pass@k by k (finite numbers only), and the row."""

    step: int
    reward_mean: float | None
    pass_at: dict[int, float]
    prompts: int | None
    samples_per_prompt: int | None
    row: EvalRow

    @classmethod
    def of(cls, row: metrics.Row) -> Evaluation:
        e = EvalRow.from_json(row.values, row.step)
        pass_at = {k: v for k, x in e.pass_at.items() if (v := finite(x)) is not None}
        return cls(row.step, finite(e.reward_mean), pass_at, whole(e.prompts), whole(e.samples_per_prompt), e)

    def summary(self) -> str:
        """``step 4: reward 0.625, pass@1 0.500, pass@4 0.750 (16 prompts x 4)``."""
        words = [f"reward {self.reward_mean:.3f}" if self.reward_mean is not None else "reward -"]
        words += [f"pass@{k} {v:.3f}" for k, v in self.pass_at.items()]
        size = f" ({self.prompts} prompts x {self.samples_per_prompt})" if self.prompts and self.samples_per_prompt else ""
        return f"step {self.step}: " + ", ".join(words) + size


def read_evals(path: Path) -> list[Evaluation]:
    """Every evaluation by step (a step evaluated again after a requeue: the later line), oldest first."""
    return [Evaluation.of(row) for _, row in sorted(metrics.by_step(path).items())]


def last_eval(path: Path) -> Evaluation | None:
    """The newest evaluation, reading only the file's end (status polls it)."""
    row = metrics.last_row(path)
    return Evaluation.of(row) if row else None
