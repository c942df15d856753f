"""The run-dir readers through the commands that use them: a rendered RL run dir, one of its files
replaced by what a hand edit, a truncation or a stray binary can leave, and every command that
reads it back (status, status --json, logs, diff, plot, submit --again) either works or says one
line naming what is wrong (exit 2): no traceback, no Slurm command with an option read from a
file, no new run dir left behind. Slurm's client commands are test doubles first on PATH that
record their argv and print nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slurmrl import cli
from slurmrl.app.build import render

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {
    "jobs.json": [b'[{"job_id": "--me"}]', b'{"a": 1}', b"[1]", b"\xff\xfe", b'[{"job_id": "5", "cluster": 3}]',
                  b'[{"job_id": "5", "edited": "x"}]', b'[{"job_id": "5"}'],
    "links.json": [b'{"again_as": 5}', b"[", b"\x00", b'{"sweep": ["x"]}'],
    "lock.toml": [b"[lock", b'[lock]\nrecipe_file = "a\\necho pwned"\n', b"\xff", b"lock = 1"],
    "plan.json": [b"{", b"[]", b"\xff", b'{"name": 1}'],
    "metrics/orchestrator.jsonl": [b"\xff\xfe", b'{"step": 1, "reward_mean": null}\n',
                                   b'{"step":1,"reward_mean":NaN}\n{"step":2,"reward_mean":Infinity}\n{"st'],
    "metrics/trainer.jsonl": [b'{"step": 1, "cuda_mem_peak_gib": 2, "cuda_mem_reserved_gib": null}\n',
                              b'{"step": 1, "loss": "x", "mfu": "y", "tokens_per_s": [1]}\n'],
    "benchmark/summary.json": [b'{"status": "done", "points": [{"concurrency": "a"}]}', b"[]", b"{"],
    "logs/attempt-0/phases": [b"\xff\xfe\n", b"999999999999999999999 x\n", b"abc\n"],
    "logs/attempt-0/FAILED": [b"\x00\x01", b"\x1b[31mred\n"],
    "ready/attempt-0/inference.0": [b"a b\n2\n", b"\xff\n", b"http://x\n99999999999999999999\n"],
    "allocations": [b"--me\n", b"\xff"],
    "job.sbatch": [b"\xff\xfe\x00"],
    "recipe.toml": [b"\xff", b"[x"],
    "components/trainer.toml": [b"\xff"],
}
CASES = [(rel, v) for rel, vs in VARIANTS.items() for v in vs]
VERBS = [["status"], ["status", "--json"], ["logs"], ["diff"], ["plot"], ["submit", "--again"]]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("rendered")
    return render(ROOT / "recipes" / "rl-debug.toml", [f"output_dir={out}"]).run_dir


@pytest.mark.parametrize(("rel", "data"), CASES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(CASES)])
def test_commands_on_a_run_dir_with_one_odd_file(rendered, tmp_path, doubles, capsys, rel, data):
    d = tmp_path / "runs" / "x"
    shutil.copytree(rendered, d)
    (d / "jobs.json").write_text('[{"job_id": "5"}]')
    path = d / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    for verb in VERBS:
        args = [*verb, str(d)] if verb[0] != "submit" else ["submit", "--again", str(d)]
        code = cli.main(args)
        err = capsys.readouterr().err
        assert code in (0, 1, 2), (args, err)
        assert "Traceback" not in err and len([ln for ln in err.splitlines() if ln.startswith("slurmrl: error")]) <= 1
        if code == 2:
            assert len(err.strip().splitlines()) == 1, err
        sent = [json.loads(ln) for ln in doubles.read_text().splitlines()] if doubles.exists() else []
        assert not any(w.startswith("-") and "me" in w or "pwned" in w for argv in sent for w in argv), sent
        if verb[0] == "submit":
            for again in d.parent.glob("x-again-*"):
                # a refusal of the odd file leaves nothing; (a failed submission of a good new run
                # dir still leaves it: issue 27 item 5, not this layer)
                assert not (code == 2 and Path(rel).name in err), (again, err)
                shutil.rmtree(again)
