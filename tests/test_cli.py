"""The command line: help, init, plan (summary, --json, --salloc), templates eject, light imports."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from slurmrl import cli, ports
from slurmrl.app.build import build, render
from slurmrl.recipe.load import load_recipe

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
SHAPES = sorted(p.stem for p in RECIPES.glob("*.toml"))
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _subcommands() -> list[list[str]]:
    """Every subcommand path the parser knows, e.g. ["plan"], ["templates", "eject"]."""
    out = []

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    out.append(prefix + [name])
                    walk(sub, prefix + [name])

    walk(cli._parser(), [])
    return out


SUBCOMMANDS = _subcommands()


def run_main(argv, capsys) -> tuple[int, str, str]:
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse --help / usage errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


# ---- help --------------------------------------------------------------------------------------


def test_top_level_help(capsys):
    rc, out, _ = run_main(["--help"], capsys)
    assert rc == 0
    assert out.startswith("usage: slurmrl")
    for cmd in ("init", "validate", "plan", "render", "templates"):
        assert cmd in out


def test_known_subcommands_exist():
    names = {tuple(s) for s in SUBCOMMANDS}
    assert {("init",), ("validate",), ("plan",), ("render",), ("templates",), ("templates", "eject")} <= names


@pytest.mark.parametrize("path", SUBCOMMANDS, ids=[" ".join(s) for s in SUBCOMMANDS])
def test_subcommand_help(path, capsys):
    rc, out, err = run_main([*path, "--help"], capsys)
    assert rc == 0, err
    assert out.startswith(f"usage: slurmrl {' '.join(path)}")


def test_help_as_a_subprocess():
    p = subprocess.run([sys.executable, "-m", "slurmrl", "--help"], capture_output=True, text=True, env=ENV,
                       cwd=ROOT, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("usage: slurmrl") and p.stderr == ""


def test_no_command_is_a_usage_error(capsys):
    rc, _, err = run_main([], capsys)
    assert rc == 2 and "usage:" in err


# ---- init --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_init_prints_a_recipe_that_validates(shape, tmp_path, monkeypatch, capsys):
    rc, out, err = run_main(["init", shape], capsys)
    assert rc == 0, err
    assert out == (RECIPES / f"{shape}.toml").read_text()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.toml").write_text(out)
    rc, vout, err = run_main(["validate", "mine.toml"], capsys)
    assert rc == 0, err
    assert vout == ""  # a good recipe: nothing on stdout (README and --help say so), at most warnings on stderr
    assert all(line.startswith("slurmrl: warning: ") for line in err.splitlines()), err
    assert os.listdir(tmp_path) == ["mine.toml"]  # validate writes nothing


# Values that differ from one cluster to the next: a starter marks each with "# REPLACE: ..." on its line.
SITE_KEYS = {"account", "partition", "cpu_partition", "qos", "nodelist", "exclude", "constraint", "mail_user",
             "gpus_per_node", "cpus_per_node", "image", "mounts", "workdir", "venv", "uv_project", "modules",
             "dataset", "disk_path", "mooncake_device", "cpu_gb", "disk_gb", "mooncake_protocol"}


@pytest.mark.parametrize("shape", SHAPES)
def test_init_starter_explains_itself_and_marks_site_values(shape):
    import tomllib

    text = (RECIPES / f"{shape}.toml").read_text()
    lines = text.splitlines()
    head = []
    for line in lines:
        if not line.startswith("#"):
            break
        head.append(line)
    header = "\n".join(head)
    assert len(head) >= 12, header
    assert f"slurmrl init {shape}" in header and "REPLACE" in header
    for command in ("slurmrl validate my.toml", "slurmrl plan my.toml", "slurmrl render my.toml", "--set"):
        assert command in header, command
    name = tomllib.loads(text)["name"]
    assert f"runs/{name}/" in header  # where render writes: named after the recipe's name
    section = ""
    for line in lines[len(head):]:
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key = line.split("=")[0].strip()
        site = key in SITE_KEYS and section != "orchestrator" and not (key == "gpus_per_node" and section != "slurm")
        site = site or (section == "model" and key == "path" and "/" not in line.split("=")[1])  # a local folder
        if site:
            assert "# REPLACE: " in line, f"{shape}: mark {line!r} as a value to replace"
    assert all(len(line) <= 100 for line in lines)


def test_init_default_shape(capsys):
    rc, out, _ = run_main(["init"], capsys)
    assert rc == 0 and "kind = " in out


def test_init_output_file_then_refuses_to_overwrite(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run_main(["init", "rl-multinode", "-o", "r.toml"], capsys)
    assert rc == 0 and out.strip() == "r.toml"
    assert (tmp_path / "r.toml").read_text() == (RECIPES / "rl-multinode.toml").read_text()
    (tmp_path / "r.toml").write_text("# mine\n")
    rc, out, err = run_main(["init", "sft-1node", "-o", "r.toml"], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("slurmrl: error: r.toml: ") and len(err.splitlines()) == 1
    assert (tmp_path / "r.toml").read_text() == "# mine\n"


def test_init_unknown_shape(capsys):
    rc, out, err = run_main(["init", "rl-everything"], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("slurmrl: error: shape: ") and "rl-multinode" in err


# ---- plan --------------------------------------------------------------------------------------


def test_plan_summary_for_rl_multinode(capsys):
    rc, out, err = run_main(["plan", str(RECIPES / "rl-multinode.toml"), "--run-dir", "/runs/x"], capsys)
    assert rc == 0, err
    assert "Het groups" in out
    for line in ("0  trainer", "1  inference", "2  orchestrator"):
        assert line in out, line
    assert "GPU map" in out
    assert "group 0 trainer node 0-1: 0:trainer" in out
    assert "group 1 inference node 0-1: 0:inference.0 1:inference.0 2:inference.1" in out
    assert "Ports (PORT_BASE" in out
    base = ports.base_for_job(1234)
    for name in ("router", "torch_rdzv", "server_0", "server_3"):
        assert any(l.split()[:1] == [name] and l.split()[-1] == str(base + ports.offset(name))
                   for l in out.splitlines()), name
    assert "Head-node services: router (group 1, node 0)" in out
    assert "Done when: trainer, orchestrator exit 0" in out
    assert "run dir: /runs/x" in out


def test_plan_job_id_shows_that_jobs_ports(capsys):
    rc, out, _ = run_main(["plan", str(RECIPES / "rl-multinode.toml"), "--job-id", "5"], capsys)
    assert rc == 0
    assert f"for job 5: {ports.base_for_job(5)}" in out


@pytest.mark.parametrize("job_id", ["-5", "0", "1e3", "4294967296", "99999999999999999999"])
def test_plan_job_id_is_a_slurm_job_id(job_id, capsys):
    rc, out, err = run_main(["plan", str(RECIPES / "rl-multinode.toml"), "--job-id", job_id], capsys)
    assert rc == 2 and out == "" and "is not a Slurm job id" in err and "Traceback" not in err


def test_plan_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, _, _ = run_main(["plan", str(RECIPES / "rl-multinode.toml")], capsys)
    assert rc == 0 and os.listdir(tmp_path) == []


@pytest.mark.parametrize("shape", ["rl-multinode", "inference-pd", "sft-1node"])
def test_plan_json_equals_rendered_plan_json(shape, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    recipe = str(RECIPES / f"{shape}.toml")
    rc, out, err = run_main(["plan", recipe, "--json", "--set", "slurm.qos=high"], capsys)
    assert rc == 0, err
    planned = json.loads(out)
    assert planned["name"] == shape
    rc, rout, err = run_main(["render", recipe, "--set", "slurm.qos=high"], capsys)
    assert rc == 0, err
    run_dir = Path(rout.strip())
    assert run_dir == tmp_path / "runs" / shape
    written = (run_dir / "plan.json").read_text()
    assert out == written
    assert planned == json.loads(written)
    assert any(d["option"] == "--qos" and d["value"] == "high" for d in planned["groups"][0]["directives"])


def test_plan_salloc_for_a_het_recipe(capsys):
    rc, out, err = run_main(["plan", str(RECIPES / "rl-multinode.toml"), "--salloc", "--run-dir", "/x/my run"], capsys)
    assert rc == 0, err
    line = out.strip()
    assert "\n" not in line and line.startswith("salloc ")
    words = shlex.split(line)
    # the command salloc runs: the run dir's script (not rendered yet: stderr says what to do first)
    assert words[-2:] == ["bash", "/x/my run/job.sbatch"]
    assert "/x/my run/job.sbatch is not rendered yet" in err and "slurmrl render" in err
    words = words[:-2]
    parts, cur = [], []
    for w in words[1:]:
        if w == ":":
            parts.append(cur)
            cur = []
        else:
            cur.append(w)
    parts.append(cur)
    p = build(RECIPES / "rl-multinode.toml").plan
    assert len(parts) == len(p.groups) == 3
    for part, g in zip(parts, p.groups):
        assert f"--nodes={g.nodes}" in part
        assert f"--cpus-per-task={g.cpus_per_node}" in part
        assert (f"--gpus-per-node={g.gpus_per_node}" in part) == (g.gpus_per_node > 0)
        assert not any(w.startswith(("--output", "--signal", "--requeue", "--open-mode")) for w in part)
    assert "--partition=cpu" in parts[2]


def test_plan_salloc_single_group_has_no_separator(capsys, tmp_path):
    run_dir = tmp_path / "sft"
    render(RECIPES / "sft-1node.toml", run_dir=run_dir)
    rc, out, err = run_main(["plan", str(RECIPES / "sft-1node.toml"), "--salloc", "--run-dir", str(run_dir)], capsys)
    assert rc == 0 and " : " not in out and out.startswith("salloc ")
    assert out.strip().endswith(f" bash {run_dir}/job.sbatch") and err == ""  # rendered: one step from running


def test_render_stdout_prints_the_script_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run_main(["render", str(RECIPES / "sft-1node.toml"), "--stdout", "--run-dir", "/cluster/runs/sft-1node"],
                          capsys)
    assert rc == 0
    assert out == (ROOT / "sbatch" / "sft-1node.sbatch").read_text()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("override,expected", [
    ("slurm.time=02:00:00", "02:00:00"),  # TOML would read a local time here
    ("slurm.time=90", "90"),  # minutes, a documented form
    ('slurm.time="1-00:00:00"', "1-00:00:00"),
    ("slurm.time=1-00:00:00", "1-00:00:00"),
])
def test_set_slurm_time_the_way_users_type_it(override, expected, capsys):
    rc, out, err = run_main(["plan", str(RECIPES / "sft-1node.toml"), "--json", "--set", override], capsys)
    assert rc == 0, err
    time = [d["value"] for d in json.loads(out)["groups"][0]["directives"] if d["option"] == "--time"]
    assert time == [expected]


# ---- templates eject ---------------------------------------------------------------------------


def test_templates_eject_then_render_identically_then_edit(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_main(["templates", "eject", "tpl"], capsys)
    assert rc == 0, err
    ejected = sorted(p.name for p in (tmp_path / "tpl").glob("*.j2"))
    assert "job.sbatch.j2" in ejected
    assert ejected == sorted(p.name for p in (ROOT / "slurmrl" / "templates").glob("*.j2"))

    recipe = tmp_path / "rl-multinode.toml"
    recipe.write_text('templates_dir = "tpl"\n' + (RECIPES / "rl-multinode.toml").read_text())
    mine = build(recipe, run_dir="/cluster/runs/rl-multinode").script
    assert mine == (ROOT / "sbatch" / "rl-multinode.sbatch").read_text()

    tpl = tmp_path / "tpl" / "job.sbatch.j2"
    tpl.write_text(tpl.read_text().replace("set -euo pipefail\n", "set -euo pipefail\necho 'my site hook'\n", 1))
    edited = build(recipe, run_dir="/cluster/runs/rl-multinode").script
    assert "echo 'my site hook'" in edited
    assert edited != mine
    # the packaged templates are untouched
    assert "my site hook" not in build(RECIPES / "rl-multinode.toml", run_dir="/cluster/runs/x").script


def test_templates_dir_is_relative_to_the_recipe_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    assert run_main(["templates", "eject", "sub/tpl"], capsys)[0] == 0
    recipe = tmp_path / "sub" / "r.toml"
    recipe.write_text('templates_dir = "tpl"\n' + (RECIPES / "sft-1node.toml").read_text())
    monkeypatch.chdir(ROOT)  # a different working directory
    assert load_recipe(recipe).templates_dir == "tpl"
    build(recipe, run_dir="/x")


def test_templates_eject_refuses_a_non_empty_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "keep.txt").write_text("mine")
    rc, out, err = run_main(["templates", "eject", "tpl"], capsys)
    assert rc == 2 and err.startswith("slurmrl: error: tpl: ")
    assert os.listdir(tmp_path / "tpl") == ["keep.txt"]


# ---- light imports -----------------------------------------------------------------------------


def test_cli_does_not_import_heavy_runtimes():
    code = (
        "import sys, slurmrl.cli\n"
        "rc = slurmrl.cli.main(['plan', 'recipes/rl-multinode.toml'])\n"
        "rc2 = slurmrl.cli.main(['render', 'recipes/rl-multinode.toml', '--stdout'])\n"
        "heavy = {'torch', 'transformers', 'vllm'} & set(sys.modules)\n"
        "assert rc == 0 and rc2 == 0 and not heavy, (rc, rc2, heavy)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
