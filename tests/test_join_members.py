"""Servers that join (slurmrl.runtime.orchestrator.joiners): a server of another job registers in the run dir
(slurmrl.rundir.joined), the live set finds it with its monitor, loads the current weights into it before any
rollout reaches it (event ``joined``), counts the rollouts it serves, and when its process is killed (its job
cancelled or preempted) it has ``left``: an event, not a dead server; the step's groups stay whole. Real
processes on loopback (tests/support/rollout_double.py) and, in front of them, the real vllm-router."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest
from member_servers import ROUTER, TASKS, Tokens, doubles, members, settings, until  # noqa: F401 - fixture
from supervised_processes import free_port

from slurmrl.contract import events, job_env
from slurmrl.rundir import joined
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.orchestrator import joiners, weights
from slurmrl.runtime.orchestrator.rollout_text import Sampler
from slurmrl.runtime.vllm.client import Server


def register(run_dir, url: str, job_id: str, task: int = 0) -> None:
    """What a joiner's supervisor does once its server is ready (slurmrl.runtime.steps.supervise)."""
    env = {job_env.JOIN_RUN_DIR: str(run_dir), "SLURM_JOB_ID": job_id}
    assert joined.register_from_env(url, task, env) == RunDir(run_dir).joined_file(job_id, task)


def test_a_joined_server_gets_the_current_weights_takes_rollouts_and_leaves(doubles, job_secret, tmp_path):  # noqa: F811
    a = doubles("a")
    said: list[str] = []
    live = members([a.url], [a.url], tmp_path, said)
    sampler = Sampler([a.url], Tokens(), settings(tmp_path), live)
    update = weights.pick(settings(tmp_path), live, [sampler], said.append)
    live.admit = update.admit
    found = joiners.attach(live, tmp_path)
    update.take(3, tmp_path / "step-000003")

    register(tmp_path, "http://127.0.0.1:9", "77", 1)  # an old joiner's file: nothing answers there
    j = doubles("joiner")
    register(tmp_path, j.url, "88")
    assert found.poll() == [j.url] and found.poll() == []  # taken once; the silent one is not
    assert live.admitted() == [a.url]  # answering is not enough: no rollout before the weights
    assert live.readmit() == [j.url] and live.admitted() == [a.url, j.url]
    sampler.sample(TASKS, 4)
    seen = j.seen()
    first = next(i for i, x in enumerate(seen) if x["route"] == "/v1/completions")
    assert [x["route"] for x in seen[:first]] == ["/pause", "/collective_rpc", "/reset_prefix_cache", "/resume"]
    assert {x["weights"] for x in seen[first:]} == {str(tmp_path / "step-000003")}
    served, _, n_live = live.take()
    assert served[j.url] > 0 and sum(served.values()) == 24 and n_live == 2  # rollouts counted per server

    update.take(4, tmp_path / "step-000004")  # the weight update reaches the joined server too
    assert [x["weights"] for x in j.seen() if x["route"] == "/resume"][-1] == str(tmp_path / "step-000004")
    j.kill()  # its job was cancelled
    live.watch()
    live.watch()
    assert live.admitted() == [a.url] and j.url not in live.members  # left, and forgotten
    assert found.poll() == []  # its file is still there: not taken again
    sampler.sample(TASKS, 5)
    assert live.take()[0] == {a.url: 24}
    rows = events.read(tmp_path / "events.jsonl")
    assert [(e.kind, e.job_id, e.task) for e in rows] == [("joined", "88", 0), ("left", "88", 0)]
    assert "2 probes in a row" in rows[1].cause
    assert any(f"server {j.url} (task 0) has left" in x for x in said)
    back = doubles("joiner-requeued", port=j.port)  # Slurm requeued its job: the same job id, registered again
    register(tmp_path, back.url, "88")
    assert found.poll() == [back.url] and live.readmit() == [back.url]
    assert [x["weights"] for x in back.seen() if x["route"] == "/resume"] == [str(tmp_path / "step-000004")]


def test_the_monitor_finds_joiners_and_min_servers_counts_them(doubles, job_secret, tmp_path):  # noqa: F811
    a = doubles("a")
    said: list[str] = []
    live = members([a.url], [a.url], tmp_path, said, min_servers=2, grace_s=30.0)
    live.admit = lambda url: True  # no weights published yet: every server serves the base model
    joiners.attach(live, tmp_path)
    live.start_monitor()
    try:
        j = doubles("joiner")
        register(tmp_path, j.url, "91")
        until(lambda: j.url in live.members, "the monitor to find the joiner")
        live.wait_for_quorum()  # one server of the job and one that joined: two
        assert live.admitted() == [a.url, j.url]
    finally:
        live.stop.set()


def test_through_the_router_a_joined_server_is_added_then_removed(doubles, job_secret, tmp_path):  # noqa: F811
    if not ROUTER.exists():
        pytest.skip("vllm-router is not installed in .venv")
    a = doubles("a")
    port = free_port()
    router = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(ROUTER), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", a.url,
                             "--policy", "round_robin", "--prometheus-port", str(free_port())],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    said: list[str] = []
    live = members([a.url], [router], tmp_path, said)
    try:
        until(lambda: Server(router).list_workers() == [a.url], "the router to list its server", 60.0)
        sampler = Sampler([router], Tokens(), settings(tmp_path), live)
        update = weights.pick(settings(tmp_path), live, [sampler], said.append)
        live.admit = update.admit
        update.take(2, tmp_path / "step-000002")
        found = joiners.attach(live, tmp_path)
        j = doubles("joiner")
        register(tmp_path, j.url, "93")
        assert found.poll() == [j.url] and Server(router).list_workers() == [a.url]
        assert live.readmit() == [j.url]
        assert sorted(Server(router).list_workers() or []) == sorted([a.url, j.url])
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(groups=sampler.sample(TASKS, 3)))
        t.start()
        t.join(30)
        assert [len(g) for g in out["groups"]] == [4] * 6
        assert {x["weights"] for x in j.seen() if x["route"] == "/v1/completions"} == {str(tmp_path / "step-000002")}
        j.kill()
        live.watch()
        live.watch()
        until(lambda: Server(router).list_workers() == [a.url], "the router to drop the joiner")
        assert [e.kind for e in events.read(tmp_path / "events.jsonl")] == ["joined", "left"]
    finally:
        live.stop.set()
        proc.kill()
        proc.wait(10)


def test_a_joined_file_is_whole_or_absent_and_a_bad_one_is_skipped(tmp_path):
    assert joined.register_from_env("http://n5:10016", 0, {"SLURM_JOB_ID": "5"}) is None  # not a joiner job
    register(tmp_path, "http://n5:10016", "5", 0)
    (RunDir(tmp_path).joined_dir / "6.0.json").write_text('{"url": "http://n6:1"}')  # not ours
    (RunDir(tmp_path).joined_dir / ".7.0.json.123").write_text("{")  # a write in progress
    got = joined.read_all(tmp_path)
    assert [(j.url, j.job_id, j.task, j.node) for j in got] == [("http://n5:10016", "5", 0, os.uname().nodename)]
    assert oct(RunDir(tmp_path).joined_file("5", 0).stat().st_mode & 0o777) == "0o644"
