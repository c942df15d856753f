"""Issue 32 item 2: ``--json`` output is strict JSON everywhere. A number that is not finite (a NaN
reward, an infinite loss) is written as the string "NaN", "Infinity" or "-Infinity" by one helper
(slurmrl.rundir.strict_json) that every --json writer uses; the output parses with a parser that
refuses bare NaN/Infinity (as jq does).

The verbs with --json are found from the CLI's own parser, so a new one is covered without a change
here."""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmrl import cli
from slurmrl.app.build import render
from slurmrl.rundir import strict_json
from slurmrl.rundir.paths import RunDir

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "slurmrl" / "recipes" / "rl-debug.toml"


def strict_loads(text: str):
    """json.loads as jq reads JSON: NaN, Infinity and -Infinity are not JSON."""

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def verbs_with_json() -> list[str]:
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(name for name, p in sub.choices.items()
                  if any("--json" in a.option_strings for a in p._actions))


def test_the_verbs_with_json_are_found():
    assert {"plan", "status"} <= set(verbs_with_json())


def same(a, b) -> bool:
    """``b`` is ``a`` with non-finite floats spelled as strings (tuples as lists)."""
    if isinstance(a, float) and not math.isfinite(a):
        return b == ("NaN" if math.isnan(a) else "Infinity" if a > 0 else "-Infinity")
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(allow_nan=True, allow_infinity=True),
              st.text(max_size=8)),
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.tuples(kids, kids),
                           st.dictionaries(st.text(max_size=6), kids, max_size=4)),
    max_leaves=20)


@given(value=values)
@settings(max_examples=300, deadline=None)
def test_strict_dumps_is_json_that_any_parser_reads(value):
    text = strict_json.dumps(value)
    assert same(value, strict_loads(text))


# ---- every verb with --json, on runs whose metrics are at the limits ------------------------------------
@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("rendered")
    return render(RECIPE, [f"output_dir={out}"]).run_dir


odd = st.one_of(st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 5e-324, 0.0]),
                st.floats(allow_nan=True, allow_infinity=True), st.none(), st.integers(-(10**20), 10**20))
FIELDS = ["reward_mean", "reward_std", "reward_min", "reward_max", "off_policy_lag", "loss", "kl", "entropy",
          "clip_frac", "grad_norm", "mfu", "tokens_per_s", "cuda_mem_peak_gib", "pass@1"]


def write_metrics(d: Path, rows: list[dict]) -> None:
    for role in ("orchestrator", "trainer", "eval"):
        path = RunDir(d).metrics(role) if role != "eval" else RunDir(d).eval_metrics
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"step": i, **r}) + "\n" for i, r in enumerate(rows)))


def run_json(verb: str, d: Path, capsys) -> tuple[int, str]:
    args = {"plan": ["plan", str(RECIPE), "--json"], "status": ["status", str(d), "--json"]}[verb]
    code = cli.main(args)
    return code, capsys.readouterr().out


@given(rows=st.lists(st.fixed_dictionaries({}, optional={f: odd for f in FIELDS}), min_size=1, max_size=4))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_json_verb_prints_strict_json(rendered, tmp_path_factory, doubles, capsys, rows):
    d = tmp_path_factory.mktemp("run") / "x"
    shutil.copytree(rendered, d)
    (d / "jobs.json").write_text('[{"job_id": "5"}]')
    write_metrics(d, rows)
    for verb in verbs_with_json():
        code, out = run_json(verb, d, capsys)
        assert code in (0, 2), (verb, code)
        assert out.strip(), verb
        for chunk in out.strip().split("\n{"):  # status prints one object per report
            strict_loads(chunk if chunk.startswith("{") else "{" + chunk)


def test_status_json_spells_a_nan_reward(rendered, tmp_path, doubles, capsys):
    d = tmp_path / "x"
    shutil.copytree(rendered, d)
    (d / "jobs.json").write_text('[{"job_id": "5"}]')
    write_metrics(d, [{"reward_mean": float("nan"), "loss": float("-inf"), "kl": 1e308}])
    _, out = run_json("status", d, capsys)
    training = strict_loads(out)["training"]
    assert training["orchestrator"]["reward_mean"] == "NaN"
    assert training["trainer"]["loss"] == "-Infinity" and training["trainer"]["kl"] == 1e308


def test_sweep_status_json_is_strict(tmp_path, doubles, capsys):
    sweep_dir = tmp_path / "s-sweep"
    assert cli.main(["sweep", str(RECIPE), "--grid", "trainer.lr=1e-6,2e-6", "--render-only",
                     "--sweep-dir", str(sweep_dir)]) == 0
    capsys.readouterr()
    for i, d in enumerate(sorted(p for p in sweep_dir.iterdir() if p.is_dir())):
        (d / "jobs.json").write_text(f'[{{"job_id": "{5 + i}"}}]')
        write_metrics(d, [{"reward_mean": float("nan")}, {"reward_mean": float("inf"), "loss": -1e308}])
    assert cli.main(["status", str(sweep_dir), "--json"]) == 0
    out = capsys.readouterr().out
    assert "NaN" not in out.replace('"NaN"', "") and "Infinity" not in out.replace('"Infinity"', "")
    strict_loads(out)
