"""Issue 27 item 1: every run-dir file slurmrl reads back is parsed at one place (slurmrl/rundir/)
into a typed model; anything a hand edit, a truncation or a stray binary can leave there is one
UserError naming the file, never another exception. Values the runtime itself writes (null, NaN,
inf, huge numbers, a partial last line) are accepted."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmrl.errors import UserError
from slurmrl.plan.stored import load_plan
from slurmrl.rundir import jobs, metrics
from slurmrl.rundir.benchmark import read_summary
from slurmrl.rundir.links import add_link, read_links
from slurmrl.rundir.lockfile import read_lock
from slurmrl.rundir.notes import read_note
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.phases import read_phases
from slurmrl.rundir.ready import read_ready
from slurmrl.rundir.sweep_index import read_index

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# JSON as any editor or program could leave it: every type, nulls, huge ints, NaN and infinities
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
json_values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                           st.dictionaries(st.text(max_size=10), kids, max_size=4)),
                           max_leaves=12)

HOSTILE_IDS = ["-1", "--me", "1;rm -rf ~", "1\n2", "--user=root", "-u", "", " 1", "1 ", "0", "1_", "1+", "a1",
               "1,2", "$(id)", "1\r", "１２", "1２", "1_[", True, None, 1.5, [1], {"a": 1}]

# readers, each with the file it reads (relative to the run dir)
READERS = {
    "jobs.json": lambda d: jobs.history(d),
    "links.json": lambda d: read_links(d),
    "lock.toml": lambda d: read_lock(d),
    "sweep.json": lambda d: read_index(d),
    "benchmark/summary.json": lambda d: read_summary(d),
    "metrics/orchestrator.jsonl": lambda d: (metrics.read_rows(RunDir(d).metrics("orchestrator")),
                                             metrics.last_row(RunDir(d).metrics("orchestrator"))),
    "logs/attempt-0/phases": lambda d: read_phases(RunDir(d).phases_file(0)),
    "ready/attempt-0/server.0": lambda d: read_ready(RunDir(d).ready_file(0, "server", 0)),
    "logs/attempt-0/FAILED": lambda d: read_note(RunDir(d).failed_file(0)),
    "plan.json": lambda d: load_plan(d),
}


def valid_contents(rel: str) -> bytes:
    """What slurmrl itself writes there."""
    text = {
        "jobs.json": json.dumps([{"job_id": "12", "submitted_at": "2026-01-01T00:00:00+00:00",
                                  "script_sha256": "ab", "edited": False}]),
        "links.json": json.dumps({"again_of": "/runs/a", "again_as": ["/runs/a-again-1"]}),
        "lock.toml": '[lock]\nformat = 1\nrecipe_file = "rl.toml"\nrun_dir = "/runs/a"\npreflight = false\n',
        "sweep.json": json.dumps({"name": "s", "points": [{"index": 0, "name": "s-p0", "values": {"a": 1}}],
                                  "grid": {"a": [1]}, "submissions": [{"mode": "array", "array_job": "7",
                                                                       "job_ids": ["7_0"]}]}),
        "benchmark/summary.json": json.dumps({"status": "done", "target": "http://n1:8000", "planned_points": 1,
                                              "points": [{"concurrency": 1, "input_len": 8, "output_len": 8,
                                                          "ttft_p50_ms": None, "failed": 0}], "error": None}),
        "metrics/orchestrator.jsonl": '{"step": 0, "reward_mean": 0.5}\n{"step": 1, "reward_mean": NaN}\n',
        "logs/attempt-0/phases": "1700000000 allocation\n1700000005 server ready\n",
        "ready/attempt-0/server.0": "http://n1:8000\n2\n123\n",
        "logs/attempt-0/FAILED": "server exited with code 1\n",
        "plan.json": "{}",
    }[rel]
    return text.encode()


def call(rel: str, run_dir: Path):
    """Run the reader; the only exception allowed is a UserError that names the file."""
    try:
        return READERS[rel](run_dir)
    except UserError as e:
        text = str(e)
        assert "\n" not in text
        name = Path(rel).name if rel != "sweep.json" else "sweep"
        assert name in text or str(run_dir) in text, text
        return e


def put(run_dir: Path, rel: str, data: bytes) -> None:
    path = run_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        path.rmdir()
    path.write_bytes(data)


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    return d


@pytest.mark.parametrize("rel", sorted(READERS))
def test_what_slurmrl_writes_reads_back(run_dir, rel):
    put(run_dir, rel, valid_contents(rel))
    out = call(rel, run_dir)
    assert not isinstance(out, UserError) or rel == "plan.json"  # an empty plan is not a plan


@pytest.mark.parametrize("rel", sorted(READERS))
@FAST
@given(cut=st.integers(min_value=0, max_value=400), junk=st.binary(max_size=40))
def test_truncated_or_binary_contents_are_one_line_naming_the_file(run_dir, rel, cut, junk):
    good = valid_contents(rel)
    put(run_dir, rel, good[: cut % (len(good) + 1)] + junk)
    call(rel, run_dir)


@pytest.mark.parametrize("rel", sorted(READERS))
@FAST
@given(value=json_values)
def test_any_json_value_is_read_or_refused_in_one_line(run_dir, rel, value):
    put(run_dir, rel, json.dumps(value).encode())
    call(rel, run_dir)


@pytest.mark.parametrize("rel", sorted(READERS))
def test_a_folder_where_the_file_should_be(run_dir, rel):
    (run_dir / rel).mkdir(parents=True)
    out = call(rel, run_dir)
    assert isinstance(out, UserError)


@pytest.mark.parametrize("rel", sorted(READERS))
@pytest.mark.parametrize("data", [b"", b"\n", b"\xff\xfe\x00\x01" * 8, b"\x00" * 64, b"\x1b[31mred\x1b[0m",
                                  "\u2028".encode(), b"[" * 5000, b"{" * 5000])
def test_odd_bytes(run_dir, rel, data):
    put(run_dir, rel, data)
    call(rel, run_dir)


# ---- job ids: refused where they are read ---------------------------------------------------
@pytest.mark.parametrize("job_id", HOSTILE_IDS)
def test_jobs_json_with_a_job_id_that_is_not_one(run_dir, job_id):
    put(run_dir, "jobs.json", json.dumps([{"job_id": job_id}]).encode())
    with pytest.raises(UserError, match="jobs.json"):
        jobs.history(run_dir)


@pytest.mark.parametrize("job_id", ["1", "123", "123_4", "123_[1-3,5]", "123_[0-9%2]", "123+1", 4567])
def test_jobs_json_takes_slurm_job_ids(run_dir, job_id):
    put(run_dir, "jobs.json", json.dumps([{"job_id": job_id}]).encode())
    assert jobs.last_job(run_dir) == str(job_id)


@pytest.mark.parametrize("words", ["--me", "1 -1", "1;2", "x"])
def test_allocations_take_only_job_ids(run_dir, words):
    put(run_dir, "allocations", f"{words}\n".encode())
    assert all(w.isdigit() for w in jobs.allocations(run_dir))


@pytest.mark.parametrize("job_id", HOSTILE_IDS)
def test_sweep_json_with_a_job_id_that_is_not_one(tmp_path, job_id):
    index = {"name": "s", "points": [{"index": 0, "name": "s-p0", "values": {}}],
             "submissions": [{"mode": "jobs", "job_ids": [job_id]}]}
    put(tmp_path, "sweep.json", json.dumps(index).encode())
    with pytest.raises(UserError, match="sweep.json"):
        read_index(tmp_path)


@pytest.mark.parametrize("name", ["../../etc", "a/b", "..", "-rf", "a\nb", "", "a b", None, 3])
def test_sweep_points_stay_inside_the_sweep_dir(tmp_path, name):
    index = {"name": "s", "points": [{"index": 0, "name": name, "values": {}}]}
    put(tmp_path, "sweep.json", json.dumps(index).encode())
    with pytest.raises(UserError, match="sweep.json"):
        read_index(tmp_path)


@pytest.mark.parametrize("value", ["a\nb", "x\r", "a\u2028b", "", 3, None, ["a"]])
def test_lock_strings_that_reach_job_sbatch_are_one_line(run_dir, value):
    line = f"recipe_file = {json.dumps(value)}\n" if value is not None else "recipe_file = []\n"
    put(run_dir, "lock.toml", f"[lock]\nformat = 1\n{line}".encode())
    with pytest.raises(UserError, match="lock.toml"):
        read_lock(run_dir)


@pytest.mark.parametrize("value", [["a\nb"], [3], "x", {"a": 1}])
def test_links_with_wrong_types(run_dir, value):
    put(run_dir, "links.json", json.dumps({"again_as": value}).encode())
    with pytest.raises(UserError, match="links.json"):
        read_links(run_dir)


def test_add_link_refuses_a_bad_links_file_before_writing(run_dir):
    put(run_dir, "links.json", b'{"again_as": 5}')
    with pytest.raises(UserError, match="links.json"):
        add_link(run_dir, "again_as", "/runs/x")
    assert (run_dir / "links.json").read_bytes() == b'{"again_as": 5}'


# ---- what the runtime writes is accepted -------------------------------------------------------
def test_metrics_rows_with_null_nan_inf_and_huge_values(run_dir):
    rows = [{"step": 0, "reward_mean": float("nan"), "cuda_mem_peak_gib": None},
            {"step": 1, "reward_mean": float("inf"), "loss": -float("inf")},
            {"step": 2, "reward_mean": 10**40, "kl": 1e308}]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "rew'  # a partial last line
    put(run_dir, "metrics/orchestrator.jsonl", text.encode())
    got = metrics.read_rows(RunDir(run_dir).metrics("orchestrator"))
    assert [r.step for r in got] == [0, 1, 2]
    assert math.isnan(got[0].values["reward_mean"]) and got[0].values["cuda_mem_peak_gib"] is None
    assert got[0].number("reward_mean") is None and got[2].number("reward_mean") == 1e40
    assert metrics.last_row(RunDir(run_dir).metrics("orchestrator")).step == 2


def test_an_empty_metrics_file_has_no_rows(run_dir):
    put(run_dir, "metrics/trainer.jsonl", b"")
    assert metrics.read_rows(RunDir(run_dir).metrics("trainer")) == []
    assert metrics.last_row(RunDir(run_dir).metrics("trainer")) is None


def test_last_row_reads_only_the_end_even_mid_character(run_dir):
    big = "".join(json.dumps({"step": i, "note": "é" * 50}) + "\n" for i in range(3000))
    put(run_dir, "metrics/trainer.jsonl", big.encode())
    assert metrics.last_row(RunDir(run_dir).metrics("trainer"), tail=1001).step == 2999


@given(st.lists(st.tuples(st.integers(0, 2**40), st.text(max_size=30)), max_size=8))
@settings(max_examples=50, deadline=None)
def test_phases_round_trip_one_line_each(entries):
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "phases"
        path.write_text("".join(f"{t} {w}\n" for t, w in entries))
        for p in read_phases(path):
            assert "\n" not in p.what and p.time >= 0
