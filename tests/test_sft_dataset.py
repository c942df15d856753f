"""The SFT dataset is a local JSONL file: the plan refuses a hub id or a URL with a sentence saying so,
takes any local path, and the trainer and the preflight probe look for the file where the job starts,
then in the run dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmrl.app.plan import planned
from slurmrl.errors import UserError
from slurmrl.plan.model import dump_settings
from slurmrl.rundir import tomlw
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.steps import probe
from slurmrl.runtime.trainer import dataset

ROOT = Path(__file__).resolve().parent.parent
RUN_DIR = "/cluster/runs/knobs"  # planning is pure: the run dir is only a name here


def override(path: str, value) -> str:
    """``--set PATH=VALUE`` with VALUE as TOML."""
    return f"{path}={tomlw._value(value)}"


SFT = ROOT / "recipes" / "sft-1node.toml"


@pytest.mark.parametrize("dataset", ["HuggingFaceH4/ultrachat_200k", "tatsu-lab/alpaca", "org/data-v1.5"])
def test_plan_refuses_a_hub_id_as_the_dataset(dataset):
    with pytest.raises(UserError) as e:
        planned(SFT, [override("trainer.dataset", dataset)], run_dir=RUN_DIR)
    assert e.value.field == "trainer.dataset"
    assert "looks like a hub id" in e.value.message and "local JSONL file" in e.value.message, e.value
    assert f"'./{dataset}'" in e.value.message  # how to say it is a local path after all


def test_plan_refuses_a_url_as_the_dataset():
    with pytest.raises(UserError, match=r"trainer.dataset: 'https://example.org/d.jsonl' is a URL; the trainer reads"):
        planned(SFT, [override("trainer.dataset", "https://example.org/d.jsonl")], run_dir=RUN_DIR)


@pytest.mark.parametrize("dataset", ["/data/sft.jsonl", "sft.jsonl", "data/sft.jsonl", "./org/name", "../data/x",
                                     "~/data/sft.jsonl", "train", "data/part-1.json.gz"])
def test_plan_takes_local_dataset_paths(dataset):
    r, p, _ = planned(SFT, [override("trainer.dataset", dataset)], run_dir=RUN_DIR)
    assert p.component("trainer").settings.dataset == dataset


def test_the_trainer_and_the_preflight_probe_look_for_the_dataset_file(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    r, p, _ = planned(SFT, [override("trainer.dataset", "sft.jsonl")], run_dir=run_dir)
    config = RunDir(run_dir).component_config("trainer")
    config.parent.mkdir(parents=True)
    config.write_text(tomlw.dumps(dump_settings(p.component("trainer").settings)))
    [why] = probe.dataset_problems(run_dir)
    assert why.startswith("dataset 'sft.jsonl' not found (looked for ") and "local JSONL file" in why, why
    (tmp_path / "sft.jsonl").mkdir()
    assert "is " + str(tmp_path / "sft.jsonl") + ", not a file" in probe.dataset_problems(run_dir)[0]
    (tmp_path / "sft.jsonl").rmdir()
    (run_dir / "sft.jsonl").write_text("{}\n")  # relative to the run dir
    assert probe.dataset_problems(run_dir) == [] and dataset.locate("sft.jsonl", run_dir) == run_dir / "sft.jsonl"
    (tmp_path / "sft.jsonl").write_text("{}\n")  # relative to where the job starts: that one first
    assert dataset.locate("sft.jsonl", run_dir) == tmp_path / "sft.jsonl"
