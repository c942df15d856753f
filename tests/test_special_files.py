"""Issue 32 item 1: every path slurmrl reads back goes through one reader (slurmrl.rundir.read), which
refuses what is not a regular file (a FIFO, a socket, a device, a folder, a symbolic link that loops or
leads nowhere) without opening it in a way that can block, reads with a size cap, parses JSON with a
nesting limit, and says in one line which file and what is wrong (exit 2 from the CLI).

Property tests: every reader x every kind of special file (in-process, many combinations), and the
verbs that read a run dir (status, diff, logs, report, plot) run as a user runs them, each under a
timeout that a blocking open would pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from special_files import make_special

from slurmrl.errors import UserError
from slurmrl.plan.stored import load_plan
from slurmrl.rundir import jobs, metrics, read
from slurmrl.rundir.benchmark import read_summary
from slurmrl.rundir.ended import read_all
from slurmrl.rundir.links import read_links
from slurmrl.rundir.lockfile import job_files, read_lock
from slurmrl.rundir.notes import read_note
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.phases import read_phases
from slurmrl.rundir.ready import read_ready
from slurmrl.rundir.scrape import read_scrapes
from slurmrl.rundir.sweep_index import read_index

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "slurmrl" / "recipes" / "rl-debug.toml"
MANY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# reader -> the file it reads, relative to the run dir
READERS = {
    "jobs.json": lambda d: jobs.history(d),
    "job.sbatch": lambda d: (jobs.run_dir_arg(str(d)), jobs.sha256(RunDir(d).script)),
    "links.json": lambda d: read_links(d),
    "lock.toml": lambda d: read_lock(d),
    "sweep.json": lambda d: read_index(d),
    "plan.json": lambda d: (load_plan(d), job_files(d)),
    "components/trainer.toml": lambda d: job_files(d),
    "benchmark/summary.json": lambda d: read_summary(d),
    "metrics/orchestrator.jsonl": lambda d: (metrics.read_rows(RunDir(d).metrics("orchestrator")),
                                             metrics.last_row(RunDir(d).metrics("orchestrator"))),
    "metrics/scrape/attempt-0/server.0.jsonl": lambda d: read_scrapes(RunDir(d).scrape_file(0, "server.0")),
    "logs/attempt-0/phases": lambda d: read_phases(RunDir(d).phases_file(0)),
    "logs/attempt-0/FAILED": lambda d: read_note(RunDir(d).failed_file(0)),
    "ready/attempt-0/server.0": lambda d: read_ready(RunDir(d).ready_file(0, "server", 0)),
    "ended/attempt-0/server.0": lambda d: read_all(RunDir(d).ended_dir(0)),
}


KINDS = ["fifo", "socket", "folder", "loop", "loop2", "device", "link-to-fifo"]


def fresh_run_dir(tmp: Path) -> Path:
    d = tmp / "run"
    d.mkdir()
    (d / "job.sbatch").write_text("#!/bin/bash\n")
    return d


def put_and_read(d: Path, rel: str, target: Path, kind: str, tmp: Path):
    if target.exists():
        target.unlink()
    make_special(target, kind, tmp)
    return READERS[rel](d)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rel", sorted(READERS))
def test_every_reader_refuses_what_is_not_a_regular_file(tmp_path, rel, kind):
    d = fresh_run_dir(tmp_path)
    target = d / rel
    try:
        put_and_read(d, rel, target, kind, tmp_path)
    except UserError as e:
        text = str(e)
        assert "\n" not in text and target.name in text, text
        assert any(w in text for w in ("folder", "pipe", "socket", "device", "loops", "regular file", "run dir")), text
    else:
        # a reader that globs its folder skips what is not a file of its own: it must not have read it
        assert rel.startswith(("ended/", "components/")) or kind == "folder" and rel.startswith("metrics/scrape"), rel


@given(kind=st.sampled_from(KINDS), rel=st.sampled_from(sorted(READERS)), depth=st.integers(0, 3))
@MANY
def test_special_files_deeper_in_the_tree(tmp_path_factory, kind, rel, depth):
    """The special file may stand for a folder on the way (logs/, metrics/): never a hang or a traceback."""
    tmp = tmp_path_factory.mktemp("deep")
    d = fresh_run_dir(tmp)
    parts = Path(rel).parts
    cut = min(depth, len(parts) - 1)
    target = d.joinpath(*parts[: len(parts) - cut])
    try:
        put_and_read(d, rel, target, kind, tmp)
    except UserError as e:
        assert "\n" not in str(e)


# ---- the reader itself --------------------------------------------------------------------------
@given(depth=st.integers(0, 300_000), opener=st.sampled_from(["[", "{\"a\":"]), inside_string=st.booleans())
@settings(max_examples=60, deadline=None)
def test_json_nesting_is_limited_before_parsing(depth, opener, inside_string):
    closer = "]" if opener == "[" else "}"
    text = opener * depth + "1" + closer * depth
    if inside_string:  # brackets inside a string are text, not nesting
        text = json.dumps({"s": text[:5000]})
    try:
        read.loads_json(text, "x.json")
    except UserError as e:
        assert not inside_string and depth > read.MAX_DEPTH and "nested" in str(e)
    else:
        assert inside_string or depth <= read.MAX_DEPTH


def test_a_scrape_line_nested_200000_deep(tmp_path):
    d = fresh_run_dir(tmp_path)
    path = RunDir(d).scrape_file(0, "server.0")
    path.parent.mkdir(parents=True)
    path.write_text('{"start": 1}\n' + "[" * 200_000 + "]" * 200_000 + "\n")
    with pytest.raises(UserError, match="nested"):
        read_scrapes(path)


@given(size=st.integers(0, 5000), limit=st.integers(0, 4000), cut=st.booleans())
@settings(max_examples=60, deadline=None)
def test_reads_stop_at_the_cap(tmp_path_factory, size, limit, cut):
    path = tmp_path_factory.mktemp("cap") / "f"
    path.write_bytes(b"x" * size)
    try:
        data = read.read_bytes(path, limit=limit, cut=cut)
    except UserError as e:
        assert not cut and size > limit and "larger" in str(e)
    else:
        assert data == b"x" * min(size, limit) and (cut or size <= limit)


def test_a_missing_file_is_the_missing_value_and_a_file_in_the_way_too(tmp_path):
    assert read.read_bytes(tmp_path / "none", missing=None) is None
    (tmp_path / "file").write_text("x")
    assert read.read_text(tmp_path / "file" / "below", missing="") == ""
    with pytest.raises(UserError, match="does not exist"):
        read.read_text(tmp_path / "none")


# ---- the verbs, as a user runs them ------------------------------------------------------------------
@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rendered") / "run"
    r = subprocess.run([sys.executable, "-m", "slurmrl", "render", str(RECIPE), "--run-dir", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (out / "jobs.json").write_text(json.dumps([{"job_id": "4242"}]))
    metrics_file = RunDir(out).metrics("orchestrator")
    metrics_file.parent.mkdir(parents=True, exist_ok=True)
    metrics_file.write_text('{"step": 0, "reward_mean": 0.5}\n{"step": 1, "reward_mean": 0.7}\n')
    (out / "logs" / "attempt-0").mkdir(parents=True, exist_ok=True)
    (out / "logs" / "attempt-0" / "trainer.0.log").write_text("hello\n")
    return out


TARGETS = ["jobs.json", "plan.json", "lock.toml", "job.sbatch", "recipe.toml", "components/trainer.toml",
           "logs/attempt-0/phases", "logs/attempt-0/trainer.0.log", "logs/attempt-0/FAILED",
           "metrics/orchestrator.jsonl", "metrics/trainer.jsonl", "links.json"]


@given(verb=st.sampled_from(["status", "diff", "logs", "report", "plot"]), rel=st.sampled_from(TARGETS),
       kind=st.sampled_from(["fifo", "loop", "folder", "link-to-fifo", "socket"]))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_verbs_never_hang_or_trace_on_special_files(rendered, tmp_path_factory, doubles, verb, rel, kind):
    tmp = tmp_path_factory.mktemp("verb")
    d = tmp / "run"
    subprocess.run(["cp", "-a", str(rendered), str(d)], check=True)
    target = d / rel
    if target.is_dir() and not target.is_symlink():
        subprocess.run(["rm", "-rf", str(target)], check=True)
    elif target.exists() or target.is_symlink():
        target.unlink()
    make_special(target, kind, tmp)
    r = subprocess.run([sys.executable, "-m", "slurmrl", verb, str(d)], capture_output=True, text=True, timeout=20,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode in (0, 1, 2), (r.returncode, r.stderr)
    if r.returncode == 2:
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# ---- sweep dirs that cannot be made, sweep indexes with no points; plots at a float's limits ---------
@pytest.mark.parametrize("where", ["/sys/slurmrl-x-sweep", "/sys/a/b/c-sweep", "/proc/1/x-sweep", "FILE/x-sweep",
                                   "FILE/a/b-sweep"])
def test_a_sweep_dir_where_nothing_can_be_created(tmp_path, where):
    (tmp_path / "FILE").write_text("a file, not a folder")
    before = sorted(p.name for p in tmp_path.iterdir())
    sweep_dir = where.replace("FILE", str(tmp_path / "FILE"))
    r = subprocess.run([sys.executable, "-m", "slurmrl", "sweep", str(RECIPE), "--grid", "trainer.lr=1e-6,2e-6",
                        "--render-only", "--sweep-dir", sweep_dir], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and sweep_dir in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("points", [[], {}, None, "x"])
def test_a_sweep_index_with_no_points(tmp_path, points):
    (tmp_path / "sweep.json").write_text(json.dumps({"format": 1, "name": "s", "points": points}))
    with pytest.raises(UserError, match="sweep.json"):
        read_index(tmp_path)


finite_or_not = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                          st.sampled_from([1e308, -1e308, 1.7976931348623157e308, -1.7976931348623157e308, 5e-324,
                                           -5e-324, 0.0, 1e300, 1e-300]))


@given(rewards=st.lists(finite_or_not, min_size=1, max_size=12), kl=st.lists(finite_or_not, max_size=12))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_plot_of_rewards_at_the_limits_of_a_float(tmp_path_factory, capsys, rewards, kl):
    from slurmrl.app.plot import plot

    d = fresh_run_dir(tmp_path_factory.mktemp("plot"))
    orch, trainer = RunDir(d).metrics("orchestrator"), RunDir(d).metrics("trainer")
    orch.parent.mkdir(parents=True)
    orch.write_text("".join(json.dumps({"step": i, "reward_mean": r}) + "\n" for i, r in enumerate(rewards)))
    trainer.write_text("".join(json.dumps({"step": i, "kl": v, "entropy": v, "clip_frac": v}) + "\n"
                               for i, v in enumerate(kl)))
    try:
        assert plot(str(d)) == 0
    except UserError as e:  # every reward NaN or infinite: no steps to draw
        assert "no steps" in str(e) and not any(abs(r) < float("inf") for r in rewards)
    out = capsys.readouterr().out
    assert all(len(line) < 200 for line in out.splitlines())
