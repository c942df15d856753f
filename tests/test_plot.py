"""`slurmrl plot RUN_DIR` without a cluster: terminal chart, reward.png with whole-number step ticks,
and metrics lines it cannot use are skipped."""

from __future__ import annotations

import json

import pytest

from slurmrl import cli
from slurmrl.app.job_outputs import read_rewards
from slurmrl.charts import reward_figure
from slurmrl.contract.metrics import TrainerRow


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


def test_second_panel_and_status_row_from_the_trainer_metrics(tmp_path, capsys):
    import matplotlib.pyplot as plt

    from slurmrl.app.status_read import latest_training
    from slurmrl.app.status_text import training_lines

    run = tmp_path / "run"
    write_metrics(run, [{"step": s, "reward_mean": s / 4, "reward_std": 0.25, "reward_min": 0.0, "reward_max": 1.0,
                         "off_policy_lag": 1, "policy_step": s - 2} for s in (1, 2, 3)])
    trainer = [{"step": s, "loss": 0.5, "kl": 0.01 * s, "kl_max": 0.2, "kl_inference": 0.001, "entropy": 2.0 - s / 10,
                "clip_frac": 0.05, "grad_norm": 0.75, "cpu_rss_gib": 1.25, "mfu": None, "tokens_per_s": 321.0}
               for s in (1, 2, 3)]
    (run / "metrics" / "trainer.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trainer) + "not json\n")
    assert cli.main(["plot", str(run)]) == 0
    out = capsys.readouterr().out
    assert "latest: batch 3: reward 0.750 (std 0.250, min 0, max 1), lag 1" in out
    assert "trainer step 3: loss 0.5, kl 0.03, kl max 0.2, kl inf 0.001, entropy 1.7, clip 0.050, grad 0.75" in out
    assert "rss 1.2 GiB" in out and "321 tok/s" in out and "MFU" not in out  # no peak known: no MFU shown
    fig = reward_figure([(1, 0.25), (2, 0.5), (3, 0.75)], "run", {r["step"]: TrainerRow.from_json(r, r["step"])
                                                                 for r in trainer})
    try:
        reward_ax, drift = fig.axes[0], fig.axes[1]
        assert reward_ax.get_ylabel() == "mean reward"
        labels = [line.get_label() for line in drift.get_lines()]
        assert labels == ["KL to reference (mean)", "KL to inference (mean)", "clip fraction"]
        assert list(drift.get_lines()[0].get_ydata()) == pytest.approx([0.01, 0.02, 0.03])
        assert [line.get_label() for line in fig.axes[2].get_lines()] == ["entropy"]
    finally:
        plt.close(fig)
    lines = training_lines(latest_training(run))
    assert len(lines) == 2 and lines[1].startswith("  latest batch 3: reward 0.750") and "kl max 0.2" in lines[1]
    assert training_lines(latest_training(tmp_path / "nothing")) == []


def test_a_kl_spike_does_not_flatten_the_kl_panel():
    """A KL of 17 at step 2 among values near 0.01 (issue 36): the axis is cut above the usual range,
    the spike a triangle at the top with its number, and the legend says what the triangle is."""
    import matplotlib.pyplot as plt

    trainer = {s: TrainerRow.from_json({"kl": 17.0 if s == 2 else 0.01 + s / 1000, "clip_frac": 0.02}, s)
               for s in range(1, 17)}
    fig = reward_figure([(s, 0.1) for s in range(1, 17)], "run", trainer)
    try:
        drift = fig.axes[1]
        assert drift.get_ylim()[1] < 0.1  # the usual range fills the panel
        assert "17" in [t.get_text() for t in drift.texts]
        assert "past the top: its value written" in [t.get_text() for t in drift.get_legend().get_texts()]
    finally:
        plt.close(fig)
    calm = reward_figure([(s, 0.1) for s in range(1, 5)], "run",
                         {s: TrainerRow.from_json({"kl": 0.01 * s}, s) for s in range(1, 5)})
    try:
        assert len(calm.axes[1].texts) == 0 and calm.axes[1].get_ylim()[1] >= 0.04  # nothing stands out: no cut
    finally:
        plt.close(calm)
