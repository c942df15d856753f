"""Where slurmrl writes (issue 43): every writer (``report`` of a run dir and of a sweep dir, ``plot`` of
an RL run, of a benchmark and of a sweep) goes through slurmrl.rundir.atomic. Whatever stands where a
file or a folder of its output goes (a folder, a FIFO, a socket, a device, a link that loops, a link
to a FIFO, a file where a folder should be) is refused in one line naming the path, exit 2, before
anything is drawn or printed, and the folder is as it was, byte for byte. A FIFO, a link or a folder
where a temporary file could be named is never opened nor followed: the write goes on, and never
blocks. The inputs are read before the chart is drawn: a FIFO in their place is the same one line."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from special_files import make_special

from slurmrl import cli
from slurmrl.errors import UserError
from slurmrl.rundir import atomic

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "support" / "fixtures" / "report-rl"
SOME = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
KINDS = ["fifo", "socket", "folder", "loop", "loop2", "device", "link-to-fifo", "file-above"]
SUMMARY = {"status": "done", "target": "http://n1:8000", "planned_points": 2, "points": [
    {"concurrency": c, "input_len": 64, "output_len": 16, "completed": 8, "failed": 0, "output_throughput": 100.0 * c,
     "mean_ttft_ms": 10.0 * c, "mean_tpot_ms": 2.0, "errors": []} for c in (1, 4)]}


# ---- the run dirs each writer writes into ------------------------------------------------------------
def rl_run(tmp: Path) -> Path:
    d = tmp / "rl-run"
    shutil.copytree(FIXTURE, d)
    return d


def bench_run(tmp: Path) -> Path:
    d = tmp / "bench-run"
    (d / "benchmark").mkdir(parents=True)
    (d / "job.sbatch").write_text("#!/bin/bash\n")
    (d / "benchmark" / "summary.json").write_text(json.dumps(SUMMARY))
    return d


def sweep(tmp: Path) -> Path:
    s = tmp / "sw"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert cli.main(["sweep", str(ROOT / "recipes" / "rl-debug.toml"), "--grid", "orchestrator.temperature=0.7,1.0",
                         "--render-only", "--sweep-dir", str(s)]) == 0, err.getvalue()
    for p in s.iterdir():
        if (p / "job.sbatch").is_file():
            shutil.copytree(FIXTURE / "metrics", p / "metrics")
    return s


# writer -> (how its dir is made, the verb, the paths it writes relative to that dir)
WRITERS = {
    "report": (rl_run, "report", ["report", "report/index.html", "report/phases.png", "report/curves.png",
                                  "report/gpus.png", "report/benchmark.png"]),
    "plot": (rl_run, "plot", ["reward.png"]),
    "plot-benchmark": (bench_run, "plot", ["benchmark/benchmark.png"]),
    "report-sweep": (sweep, "report", ["report", "report/index.html"]),
    "plot-sweep": (sweep, "plot", ["reward.png"]),
}


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """Each writer's dir, made once and copied for each example."""
    return {name: make(tmp_path_factory.mktemp(name)) for name, (make, _, _) in WRITERS.items()}


def copy_of(src: Path, tmp: Path) -> Path:
    dst = tmp / src.name
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    for p in dst.rglob("*"):  # a sweep's index names its points' folders: keep them beside it
        if p.name == "sweep.json":
            p.write_text(p.read_text().replace(str(src), str(dst)))
    return dst


def tree(d: Path) -> dict[str, object]:
    """Every entry under ``d``: its kind, and a regular file's bytes' digest (a FIFO is never opened)."""
    out: dict[str, object] = {}
    for p in sorted(d.rglob("*")):
        try:
            st_ = os.lstat(p)
        except OSError:
            continue
        kind = stat.S_IFMT(st_.st_mode)
        out[str(p.relative_to(d))] = hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(kind) else kind
    return out


def run(argv: list[str]) -> tuple[int, str, str]:
    """``slurmrl ARGV`` in process, stopped after 60 s (a write that blocks would hang here)."""
    out, err = io.StringIO(), io.StringIO()
    signal.alarm(60)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(argv)
    finally:
        signal.alarm(0)
    return rc, out.getvalue(), err.getvalue()


def obstruct(target: Path, kind: str, tmp: Path) -> None:
    """Put what is not a regular file at ``target`` (``file-above``: a regular file, where a folder goes)."""
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
    if kind == "file-above":
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("a file, where the output's folder goes\n")
    else:
        make_special(target, kind, tmp)


@SOME
@given(writer=st.sampled_from(sorted(WRITERS)), data=st.data(), kind=st.sampled_from(KINDS))
def test_what_stands_where_a_writer_writes_is_one_line_and_nothing_changes(made, tmp_path_factory, writer, data,
                                                                           kind):
    _, verb, rels = WRITERS[writer]
    rel = data.draw(st.sampled_from(rels))
    tmp = tmp_path_factory.mktemp("w")
    d = copy_of(made[writer], tmp)
    target = d / rel
    if kind == "file-above":  # a file where the output's folder goes
        assume(len(Path(rel).parts) > 1 or rel == "report")
        target = d / Path(rel).parts[0]
    assume(not (rel == "report" and kind == "folder"))  # a folder is what belongs there
    obstruct(target, kind, tmp)
    before = tree(d)
    rc, out, err = run([verb, str(d)])
    assert rc == 2 and out == "" and "Traceback" not in err, (rc, out, err)
    line = err.strip()
    assert "\n" not in line and line.startswith("slurmrl: error: "), err
    assert str(target) in line or str(target.parent) in line, (target, line)
    assert tree(d) == before


@SOME
@given(writer=st.sampled_from(["plot", "plot-benchmark", "plot-sweep"]),
       kind=st.sampled_from(["fifo", "loop", "folder", "link-to-fifo"]))
def test_a_temporary_name_taken_by_anything_does_not_stop_the_write(made, tmp_path_factory, writer, kind):
    """The temporary file's name is fresh each time; what stands at names like it is left as it is."""
    _, verb, rels = WRITERS[writer]
    tmp = tmp_path_factory.mktemp("t")
    d = copy_of(made[writer], tmp)
    target = d / rels[0]
    for name in (f".{target.name}.tmp", f".{target.name}.{os.getpid()}", f".{target.name}.{os.getpid()}.tmp"):
        make_special(target.with_name(name), kind, tmp)
    rc, out, err = run([verb, str(d)])
    assert rc == 0, err
    assert target.is_file() and target.read_bytes().startswith(b"\x89PNG")
    assert not [p for p in target.parent.iterdir() if p.name.endswith(".tmp") and p.is_file() and not p.is_symlink()
                and p.name != f".{target.name}.tmp"]


@pytest.mark.parametrize("kind", ["fifo", "folder", "loop"])
@pytest.mark.parametrize("rel", ["metrics/eval.jsonl", "metrics/trainer.jsonl"])
def test_plot_reads_everything_before_it_draws(made, tmp_path, rel, kind):
    d = copy_of(made["plot"], tmp_path)
    obstruct(d / rel, kind, tmp_path)
    rc, out, err = run(["plot", str(d)])
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and str(d / rel) in err, (out, err)
    assert not (d / "reward.png").exists()


def test_a_fifo_at_the_sweep_page_does_not_block(made, tmp_path):
    """As the user runs it: a process, stopped by the test if it blocked."""
    d = copy_of(made["report-sweep"], tmp_path)
    (d / "report").mkdir()
    os.mkfifo(d / "report" / "index.html")
    r = subprocess.run([sys.executable, "-m", "slurmrl", "report", str(d)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and str(d / "report" / "index.html") in r.stderr and "FIFO" in r.stderr, r.stderr
    assert not list(d.glob("*/report/index.html"))  # no point's report was written either


# ---- the one home, on its own ------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=4096), umask=st.sampled_from([None, 0o077, 0o022]), exists=st.booleans())
def test_a_write_is_all_or_nothing_with_its_permissions(tmp_path_factory, data, umask, exists):
    d = tmp_path_factory.mktemp("a")
    path = d / "sub" / "out.bin"
    if exists:
        path.parent.mkdir()
        path.write_bytes(b"old")
    atomic.write_bytes(path, data, umask=umask)
    assert path.read_bytes() == data and sorted(p.name for p in path.parent.iterdir()) == ["out.bin"]
    if umask is not None:
        assert stat.S_IMODE(path.stat().st_mode) & umask == 0


@pytest.mark.parametrize("kind", KINDS)
def test_check_target_names_what_is_in_the_way(tmp_path, kind):
    target = tmp_path / "out" / "page.html"
    obstruct(target if kind != "file-above" else target.parent, kind, tmp_path)
    with pytest.raises(UserError) as e:
        atomic.write_text(target, "x")
    assert not list(tmp_path.rglob(".*"))  # no temporary file left
    assert e.value.field in (str(target), str(target.parent)), e.value
    assert "\n" not in str(e.value)


def test_a_link_to_a_regular_file_is_replaced_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("keep")
    link = tmp_path / "out.txt"
    link.symlink_to(elsewhere)
    atomic.write_text(link, "new")
    assert elsewhere.read_text() == "keep" and link.read_text() == "new" and not link.is_symlink()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a folder whatever its mode")
def test_a_folder_that_cannot_be_written_is_named(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(UserError) as e:
        atomic.write_text(locked / "x", "x")
    assert e.value.field == str(locked) and "permission denied" in e.value.message


@pytest.mark.parametrize("kind", [*KINDS, "dangling-link"])
def test_init_writes_only_a_new_regular_file(tmp_path, kind):
    """`slurmrl init SHAPE -o FILE`: a file the user names; whatever stands there (a link to nothing too:
    it would be followed) is refused in one line, and a file where its folder goes is named."""
    out = tmp_path / "d" / "r.toml"
    if kind == "dangling-link":
        out.parent.mkdir()
        out.symlink_to(tmp_path / "elsewhere.toml")
    else:
        obstruct(out if kind != "file-above" else out.parent, kind, tmp_path)
    before = tree(tmp_path)
    rc, stdout, err = run(["init", "rl-debug", "-o", str(out)])
    assert rc == 2 and stdout == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert str(out) in err or str(out.parent) in err
    assert tree(tmp_path) == before and not (tmp_path / "elsewhere.toml").exists()


def test_the_sweep_array_script_is_executable_by_its_owner_only(tmp_path):
    path = tmp_path / "sweep.sbatch"
    atomic.write_text(path, "#!/bin/bash\n", executable=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
