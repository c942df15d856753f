"""The job's environment variable names (``slurmrl.contract.job_env``): the templates export only names
the contract defines, the contract's exported names are exported by the templates, and no module
spells a ``SLURMRL_*`` name of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from slurmrl.contract import job_env

PACKAGE = Path(__file__).resolve().parent.parent / "slurmrl"
WORD = re.compile(r"SLURMRL_[A-Z0-9_]*[A-Z0-9]")
# names that are no job's: the CLI's cluster list, the local test cluster's own settings
NOT_THE_JOBS = {"remote/clusters.py": {"SLURMRL_CLUSTERS"}, "recipe/fields.py": {"SLURMRL_"}}


def template_words() -> set[str]:
    return {w for p in (PACKAGE / "templates").glob("*.j2") for w in WORD.findall(p.read_text())}


def test_the_templates_export_only_the_contracts_names():
    words = template_words()
    strange = {w for w in words if w not in job_env.NAMES and not w.startswith(job_env.NODES_PREFIX)}
    assert not strange, f"job script variables the contract does not name: {sorted(strange)}"
    assert set(job_env.EXPORTED) - {job_env.METRICS_PORT} <= words  # METRICS_PORT: a component's env, from plan/


def code_strings(path: Path) -> list[tuple[int, str]]:
    """String constants of ``path`` that are code (docstrings and comments left out)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_no_module_spells_a_job_variable_of_its_own():
    spelled = []
    for p in sorted(PACKAGE.rglob("*.py")):
        rel = str(p.relative_to(PACKAGE))
        if rel.startswith(("contract/", "localcluster/")):
            continue
        for line, text in code_strings(p):
            for w in set(WORD.findall(text)) - NOT_THE_JOBS.get(rel, set()):
                spelled.append(f"{rel}:{line}: {w}")
    assert not spelled, "use slurmrl.contract.job_env:\n" + "\n".join(spelled)


def test_readers():
    assert job_env.run_dir_from_env({job_env.RUN_DIR: "/r"}) == "/r"
    with pytest.raises(SystemExit, match="SLURMRL_RUN_DIR is not set; run this inside the job script"):
        job_env.run_dir_from_env({})
    assert job_env.attempt_from_env({}) == "0" and job_env.attempt_from_env({job_env.ATTEMPT: "2"}) == "2"
    assert job_env.hosts_of_group(1, {"SLURMRL_NODES_G1": "a b"}) == ["a", "b"]
    with pytest.raises(SystemExit, match="SLURMRL_NODES_G3 is not set"):
        job_env.hosts_of_group(3, {})
    assert job_env.job_end({job_env.JOB_END: " 12.5 "}) == 12.5
    assert job_env.job_end({job_env.JOB_END: "x"}) is None and job_env.job_end({}) is None
    assert job_env.port_base({job_env.PORT_BASE: "4000"}) == 4000 and job_env.port_base({}) is None
    assert job_env.in_job({job_env.RUN_DIR: "/r"}) and not job_env.in_job({job_env.RUN_DIR: ""})
    assert job_env.trainer_on_cpu({job_env.TRAINER_DEVICE: "cpu"}) and not job_env.trainer_on_cpu({})
