"""slurmrl/rundir/ is the one home of the run dir on disk: one object, RunDir, names every path
(submitit's JobPaths is the model), and the package is a leaf (the standard library and errors)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from slurmrl.rundir.paths import RunDir

PACKAGE = Path(__file__).resolve().parent.parent / "slurmrl"
NAMES = ("job.sbatch", "plan.json", "recipe.toml", "lock.toml", "links.json", "jobs.json", "sweep.json",
         "sweep.sbatch", "summary.json", "orchestrator.jsonl", "trainer.jsonl", "eval.jsonl", "allocations", "benchmark.png",
         "reward.png")


def test_paths_of_a_run_dir(tmp_path):
    r = RunDir(tmp_path)
    assert r.script == tmp_path / "job.sbatch" and r.lock == tmp_path / "lock.toml"
    assert r.jobs == tmp_path / "jobs.json" and r.links == tmp_path / "links.json"
    assert r.component_config("trainer") == tmp_path / "components" / "trainer.toml"
    assert r.ready_file(2, "server", 3) == tmp_path / "ready" / "attempt-2" / "server.3"
    assert r.failed_file(0) == tmp_path / "logs" / "attempt-0" / "FAILED"
    assert r.phases_file(1) == tmp_path / "logs" / "attempt-1" / "phases"
    assert r.metrics("trainer") == tmp_path / "metrics" / "trainer.jsonl"
    assert r.eval_metrics == tmp_path / "metrics" / "eval.jsonl"
    assert r.batch_log("12") == tmp_path / "logs" / "batch-12.out"
    assert r.batch_log_pattern() == f"{tmp_path}/logs/batch-%j.out"
    assert r.benchmark_summary() == tmp_path / "benchmark" / "summary.json"
    assert r.dynamo_data_dir(0, "etcd") == tmp_path / "dynamo" / "etcd-attempt-0"
    assert r.job_outputs() == [tmp_path / "ready", tmp_path / "preflight", tmp_path / "benchmark"]


def test_attempts_and_ready_tasks(tmp_path):
    r = RunDir(tmp_path)
    for d in ("logs/attempt-0", "ready/attempt-2", "logs/attempt-x", "logs/attempt-10"):
        (tmp_path / d).mkdir(parents=True)
    assert r.attempts() == [0, 2, 10]
    for name in ("server.0", "server.2", "server.x", "server-b.1"):
        (r.ready_dir(2) / name).write_text("-\n1\n-\n")
    assert list(r.ready_tasks(2, "server")) == [0, 2]


def test_inside_a_job_step(tmp_path):
    assert RunDir.from_env({"SLURMRL_RUN_DIR": str(tmp_path)}).path == tmp_path
    assert RunDir.attempt_from_env({"SLURMRL_ATTEMPT": "3"}) == "3" and RunDir.attempt_from_env({}) == "0"
    with pytest.raises(SystemExit, match="SLURMRL_RUN_DIR"):
        RunDir.from_env({})


def test_phases_are_one_line_each(tmp_path):
    r = RunDir(tmp_path)
    r.add_phase(0, "server ready\necho injected")
    r.add_phase(0, "router ready")
    assert [what for _, what in r.read_phases(0)] == ["server ready echo injected", "router ready"]


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_rundir_is_a_leaf():
    for path in sorted((PACKAGE / "rundir").glob("*.py")):
        first_party = {m for m in imports(path) if m.split(".")[0] == "slurmrl"}
        assert all(m in ("slurmrl.errors", "slurmrl.contract") or m.startswith(("slurmrl.rundir", "slurmrl.contract."))
                   for m in first_party), (path, first_party)


def test_no_module_outside_rundir_spells_a_run_dir_file_name():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "rundir" in path.relative_to(PACKAGE).parts:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                if " " in node.value:  # a sentence (help, an error) may name a file for the user
                    continue
                if node.value in NAMES or node.value.endswith(tuple("/" + n for n in NAMES)):
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}")
    assert not offenders, offenders
