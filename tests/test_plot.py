"""`slurmrl plot RUN_DIR` without a cluster: terminal chart, reward.png with whole-number step ticks,
and metrics lines it cannot use are skipped."""

from __future__ import annotations

import json

import pytest

from slurmrl import cli
from slurmrl.plot import read_rewards, reward_figure


def write_metrics(run_dir, records):
    (run_dir / "metrics").mkdir(parents=True)
    (run_dir / "metrics" / "orchestrator.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.parametrize("steps", [2, 3, 5, 7, 16, 200])
def test_step_ticks_are_whole_numbers(steps):
    import matplotlib.pyplot as plt

    fig = reward_figure([(s, s / steps) for s in range(steps)], "run: reward")
    try:
        ax = fig.axes[0]
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
    finally:
        plt.close(fig)


def test_plot_writes_the_png_and_skips_bad_lines(tmp_path, capsys):
    run = tmp_path / "run"
    write_metrics(run, [{"step": 0, "reward_mean": 0.1}, {"step": 1, "reward_mean": 0.5},
                        {"step": 2, "reward_mean": 0.9}])
    with (run / "metrics" / "orchestrator.jsonl").open("a") as f:
        f.write('{"step": 3, "reward_mean": NaN}\n{"step": "x", "reward_mean": 1}\nnot json\n{"step": 4}\n')
    assert read_rewards(run) == [(0, 0.1), (1, 0.5), (2, 0.9)]
    assert cli.main(["plot", str(run)]) == 0
    out = capsys.readouterr().out
    assert "step 0 .. 2" in out and (run / "reward.png").stat().st_size > 0


def test_plot_without_metrics_is_one_line(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "has no metrics/orchestrator.jsonl" in err
