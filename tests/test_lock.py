"""RUN_DIR/lock.toml (issue 17 item 1): a complete recipe plus provenance; rendering it gives the
same job.sbatch byte for byte (every gallery recipe); the job appends its interpreter's versions;
`submit --again` makes a new run dir that runs the same (or the hand-edited) job, linked both ways.
(`submit --again` on the local Slurm: tests/test_sweep_cluster.py.)"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from slurmrl.app import diff
from slurmrl.app.again import again
from slurmrl.app.build import build, render
from slurmrl.errors import UserError
from slurmrl.rundir import lockfile as lock
from slurmrl.rundir.links import read_links
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.steps import provenance

ROOT = Path(__file__).resolve().parent.parent
GALLERY = sorted((ROOT / "slurmrl" / "recipes").glob("*.toml"))


def slurmrl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurmrl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def rerender(run_dir: Path) -> dict[str, str]:
    """What the lock renders, for the run dir and mode it records."""
    m = lock.meta(run_dir)
    return build(RunDir(run_dir).lock, run_dir=m["run_dir"], preflight=m["preflight"]).files


@pytest.mark.parametrize("recipe", GALLERY, ids=[p.stem for p in GALLERY])
def test_the_lock_renders_every_gallery_recipe_byte_for_byte(recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for preflight in (False, True):
        out = render(recipe, preflight=preflight)
        run_dir = out.run_dir
        again = rerender(run_dir)
        for rel, text in out.files.items():
            if rel not in (RunDir.RECIPE, RunDir.LOCK):  # the source itself: the lock's output_dir is absolute
                assert again[rel] == text, f"{recipe.name} preflight={preflight}: {rel} differs"
        assert (RunDir(run_dir).script).read_bytes() == again[RunDir.SCRIPT].encode()
        # `slurmrl render lock.toml` (no --run-dir) finds the same run dir: the lock's output_dir is absolute
        assert build(RunDir(run_dir).lock, preflight=preflight).run_dir == run_dir
        m = lock.meta(run_dir)
        assert m["recipe_file"] == recipe.name and m["preflight"] == preflight
        assert m["slurmrl"]["version"] == version("slurmrl")
        assert len(m["recipe_repo"]["commit"]) == 40 and isinstance(m["recipe_repo"]["dirty"], bool)
        assert m["files"][RunDir.SCRIPT] == hashlib.sha256((RunDir(run_dir).script).read_bytes()).hexdigest()
        assert set(m["files"]) == {rel for rel in out.files if rel not in (RunDir.RECIPE, RunDir.LOCK)}
        data = tomllib.loads((RunDir(run_dir).lock).read_text())
        if data.get("container"):
            assert m["container"]["image"] == data["container"]["image"] and m["container"]["digest"]


def test_the_job_appends_its_versions_and_the_lock_still_renders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = render(ROOT / "recipes" / "rl-debug.toml")
    env = {"SLURMRL_RUN_DIR": str(out.run_dir), "SLURMRL_ATTEMPT": "1", "SLURM_JOB_ID": "77", "SLURM_PROCID": "0",
           "ENROOT_VERSION": "3.5.0", "NVIDIA_BUILD_ID": "nv-1", "HOME": "/root"}
    assert provenance.record("inference", env)
    assert provenance.record("trainer", env)
    assert not provenance.record("trainer", {**env, "SLURM_PROCID": "1"})  # only a component's first task
    runtime = lock.meta(out.run_dir)["runtime"]
    assert [r["component"] for r in runtime] == ["inference", "trainer"]
    first = runtime[0]
    assert (first["attempt"], first["job_id"]) == (1, "77")
    assert first["torch"] == version("torch") and first["transformers"] == version("transformers")
    assert first["vllm"] == provenance.installed(provenance.PACKAGES["vllm"]) != "not installed"
    assert first["python"] == ".".join(map(str, sys.version_info[:3])) and first["executable"] == sys.executable
    assert first["container_env"] == {"ENROOT_VERSION": "3.5.0", "NVIDIA_BUILD_ID": "nv-1"}
    assert rerender(out.run_dir)[RunDir.SCRIPT] == out.script
    # the command line renders the lock the same (its header still names rl-debug.toml)
    r = slurmrl("render", str(RunDir(out.run_dir).lock), "--run-dir", str(out.run_dir), "--stdout", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == out.script


def test_a_lock_table_that_slurmrl_did_not_write_is_refused(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text((ROOT / "recipes" / "sft-debug.toml").read_text() + '\n[lock]\nrun_dir = "/x"\n')
    r = slurmrl("plan", str(recipe), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("slurmrl: error: lock: is the provenance table") and len(r.stderr.splitlines()) == 1


def test_again_carries_hand_edits_to_a_new_linked_run_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = render(ROOT / "recipes" / "sft-debug.toml")
    old = out.run_dir
    script = RunDir(old).script
    edited = script.read_text().replace("#SBATCH --time=00:20:00", "#SBATCH --time=00:07:00")
    edited = edited.replace("set -euo pipefail\n", f"set -euo pipefail\necho 'hand edit in {old}'\n", 1)
    script.write_text(edited)
    new = again(str(old))
    assert new == old.parent / "sft-debug-again-1"
    assert (RunDir(new).script).read_text() == edited.replace(str(old), str(new))
    assert f"echo 'hand edit in {new}'" in (RunDir(new).script).read_text()
    assert [e.path for e in diff.edits(new)] == [RunDir.SCRIPT]  # the new run dir shows the same edit
    assert (RunDir(new).recipe).read_text() == (RunDir(old).recipe).read_text()
    assert read_links(new).to_json() == {"again_of": str(old)}
    assert read_links(old).to_json() == {"again_as": [str(new)]}
    assert lock.meta(new)["again_of"] == str(old) and lock.meta(new)["run_dir"] == str(new)
    # an unedited run dir again: exactly what its lock renders for the new path
    third = again(str(new))
    assert third.name == "sft-debug-again-1-again-1"
    fresh = build(RunDir(old).recipe, run_dir=third, source_name="sft-debug.toml").files
    assert (RunDir(third).script).read_text() != fresh[RunDir.SCRIPT]  # the edit came along
    assert read_links(new).to_json()["again_as"] == [str(third)]
    with pytest.raises(UserError, match="exists; choose another run dir"):  # nothing written over it
        again(str(old), str(new))


def test_submit_refreshes_the_lock_with_the_hashes_as_submitted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = render(ROOT / "recipes" / "sft-debug.toml")
    script = RunDir(out.run_dir).script
    script.write_text(script.read_text() + "# edited\n")
    env = {"SLURMRL_RUN_DIR": str(out.run_dir), "SLURM_PROCID": "0"}
    provenance.record("trainer", env)
    (RunDir(out.run_dir).jobs).write_text(json.dumps([{"job_id": "41"}]))
    lock.refresh(out.run_dir, edited=True)
    m = lock.meta(out.run_dir)
    assert m["edited"] is True and "runtime" not in m
    assert m["files"][RunDir.SCRIPT] == hashlib.sha256(script.read_bytes()).hexdigest()
    assert m["recipe_file"] == "sft-debug.toml" and m["recipe_repo"]["commit"]  # kept from the render
    kept = lock.read(RunDir(out.run_dir).set_aside_dir("41") / RunDir.LOCK)
    assert kept["lock"]["runtime"][0]["component"] == "trainer"  # the earlier job's versions, with its logs
