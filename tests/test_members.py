"""The orchestrator's live set of servers (slurmrl.runtime.orchestrator.members) against real processes on
loopback (tests/support/rollout_double.py, killed by pid mid-request: a real fault) and, in front of them, the real
vllm-router: a server killed mid-step has its requests sent again and every group stays whole; one that
comes back is loaded with the current weights before any rollout request reaches it; fewer than
``min_servers`` for longer than the deadline ends the sampling with the dead servers and their causes."""

from __future__ import annotations

import random
import signal
import subprocess
import threading

import pytest
from member_servers import DEADLINE_S, ROUTER, TASKS, Tokens, doubles, members, settings, until  # noqa: F401 - doubles: the fixture
from supervised_processes import free_port

from slurmrl import envs
from slurmrl.contract import events
from slurmrl.contract.metrics import OrchestratorRow
from slurmrl.rundir.ended import MAX_CAUSE
from slurmrl.runtime.orchestrator import weights
from slurmrl.runtime.orchestrator.members import Quorum
from slurmrl.runtime.orchestrator.rollout_chat import ChatSampler
from slurmrl.runtime.orchestrator.rollout_text import Sampler
from slurmrl.runtime.vllm.client import Server


def test_a_server_killed_mid_step_has_its_requests_sent_again_and_every_group_stays_whole(doubles, job_secret,
                                                                                            tmp_path):
    a, b = doubles("a"), doubles("b", delay=3.0)
    said: list[str] = []
    live = members([a.url, b.url], [a.url, b.url], tmp_path, said)
    sampler = Sampler([a.url, b.url], Tokens(), settings(tmp_path), live)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(groups=sampler.sample(TASKS, 1)))
    t.start()
    until(lambda: len([x for x in b.seen() if x["route"] == "/v1/completions"]) == 3, "b holding its 3 requests")
    b.kill()  # its three requests are in flight
    t.join(DEADLINE_S)
    assert not t.is_alive()
    assert [len(g) for g in out["groups"]] == [4] * 6  # every group whole
    served, resent, n_live = live.take()
    assert served == {a.url: 24} and resent == 3 and n_live == 1  # none lost, none counted twice
    assert live.admitted() == [a.url]
    dead = events.read(tmp_path / "events.jsonl")
    assert [(e.kind, e.task, e.node) for e in dead] == [("dead", 1, "127.0.0.1")] and "/health" in dead[0].cause
    assert any(f"server {b.url} (task 1) is dead" in x for x in said)
    row = OrchestratorRow(step=1, servers_live=n_live, resent=resent, served=served).to_json()
    assert OrchestratorRow.from_json(row, 1).served == {a.url: 24} and row["served/" + a.url] == 24


def test_a_server_that_comes_back_gets_the_current_weights_before_any_rollout(doubles, job_secret, tmp_path):
    a, b = doubles("a"), doubles("b")
    said: list[str] = []
    live = members([a.url, b.url], [a.url, b.url], tmp_path, said)
    sampler = Sampler([a.url, b.url], Tokens(), settings(tmp_path), live)
    update = weights.pick(settings(tmp_path), live, [sampler], said.append)
    live.admit = update.admit
    port = b.port
    b.kill()
    live.watch()
    live.watch()  # two probes missed: dead
    assert live.admitted() == [a.url]
    update.take(3, tmp_path / "step-000003")  # the weight update skips the dead server, never waits on it
    update.take(4, tmp_path / "step-000004")  # it missed two steps
    assert [x["weights"] for x in a.seen() if x["route"] == "/resume"][-1] == str(tmp_path / "step-000004")
    back = doubles("b-again", port=port)  # restarted in place: the same URL
    live.watch()
    assert live.admitted() == [a.url]  # answering is not enough: no rollout before the weights
    assert live.readmit() == [back.url] and live.admitted() == [a.url, back.url]
    sampler.sample(TASKS, 5)
    seen = back.seen()
    first = next(i for i, x in enumerate(seen) if x["route"] == "/v1/completions")
    assert {x["weights"] for x in seen[first:]} == {str(tmp_path / "step-000004")}  # every rollout on step 4
    assert [x["route"] for x in seen[:first]] == ["/pause", "/collective_rpc", "/reset_prefix_cache", "/resume"]
    assert [e.kind for e in events.read(tmp_path / "events.jsonl")] == ["dead", "readmitted"]


def test_a_server_that_hangs_mid_step_is_declared_dead_and_its_requests_are_not_waited_for(doubles, job_secret,
                                                                                           tmp_path):
    a, b = doubles("a"), doubles("b", delay=3.0)
    said: list[str] = []
    live = members([a.url, b.url], [a.url, b.url], tmp_path, said)
    live.start_monitor()
    sampler = Sampler([a.url, b.url], Tokens(), settings(tmp_path), live)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(groups=sampler.sample(TASKS, 1)))
    try:
        t.start()
        until(lambda: len([x for x in b.seen() if x["route"] == "/v1/completions"]) == 3, "b holding its 3 requests")
        assert b.proc is not None
        b.proc.send_signal(signal.SIGSTOP)  # hung: its sockets stay open, nothing answers (requests wait 600 s)
        t.join(DEADLINE_S)
        assert not t.is_alive()
    finally:
        live.stop.set()
    assert [len(g) for g in out["groups"]] == [4] * 6
    served, resent, _ = live.take()
    assert served == {a.url: 24} and resent == 3
    assert "2 probes in a row" in events.read(tmp_path / "events.jsonl")[0].cause


def test_a_conversation_on_a_killed_server_starts_over_whole_on_a_live_one(doubles, job_secret, tmp_path):
    a, b = doubles("a"), doubles("b", delay=3.0)
    said: list[str] = []
    live = members([a.url, b.url], [a.url, b.url], tmp_path, said)
    s = settings(tmp_path, environment="guess_number", max_turns=1)
    env = envs.load(s.environment, s.environment_args)
    sampler = ChatSampler([a.url, b.url], None, s, env, live)
    tasks = env.prompts(random.Random(0), 6)
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(groups=sampler.sample(tasks, 1)))
    t.start()
    until(lambda: len([x for x in b.seen() if x["route"] == "/v1/chat/completions"]) == 12, "b holding 12 rollouts")
    b.kill()
    t.join(DEADLINE_S)
    assert not t.is_alive()
    assert [len(g) for g in out["groups"]] == [4] * 6 and all(x["completion_ids"] == [5, 6] for g in out["groups"]
                                                                for x in g)
    served, resent, _ = live.take()
    assert served == {a.url: 24} and resent == 12  # every conversation once, the 12 cut ones from their start


def test_fewer_than_min_servers_for_longer_than_the_deadline_names_the_dead(doubles, job_secret, tmp_path):
    a, b = doubles("a"), doubles("b")
    said: list[str] = []
    live = members([a.url, b.url], [a.url, b.url], tmp_path, said, min_servers=2, grace_s=1.0)
    sampler = Sampler([a.url, b.url], Tokens(), settings(tmp_path), live)
    b.kill()
    sampler.sample(TASKS, 1)  # one server is enough to sample on: its requests went to the survivor
    with pytest.raises(Quorum) as e:
        live.wait_for_quorum()
    assert str(e.value).startswith("fewer than inference.min_servers = 2 servers live for 1s: ")
    assert f"{b.url} (task 1) dead: /health: " in str(e.value) and a.url not in str(e.value)
    a.kill()
    with pytest.raises(Quorum):  # no server at all: a request waits for one, up to the deadline
        sampler.sample(TASKS, 2)


def test_through_the_router_a_dead_server_is_taken_off_and_given_back_once_loaded(doubles, job_secret, tmp_path):
    if not ROUTER.exists():
        pytest.skip("vllm-router is not installed in .venv")
    a, b = doubles("a"), doubles("b", delay=2.0)
    port = free_port()
    router = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(ROUTER), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", a.url, b.url,
                             "--policy", "round_robin", "--prometheus-port", str(free_port()),
                             "--health-check-interval-secs", "5", "--health-failure-threshold", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    said: list[str] = []
    live = members([a.url, b.url], [router], tmp_path, said)
    try:
        until(lambda: sorted(Server(router).list_workers() or []) == sorted([a.url, b.url]), "the router to list both",
              60.0)  # (in no fixed order)
        sampler = Sampler([router], Tokens(), settings(tmp_path), live)
        update = weights.pick(settings(tmp_path), live, [sampler], said.append)
        live.admit = update.admit
        live.start_monitor()  # the router retries a refused request on a survivor itself: the probes see the dead
        out: dict = {}
        t = threading.Thread(target=lambda: out.update(groups=sampler.sample(TASKS, 1)))
        t.start()
        until(lambda: any(x["route"] == "/v1/completions" for x in b.seen()), "b holding a request")
        b.kill()
        t.join(DEADLINE_S)
        assert [len(g) for g in out["groups"]] == [4] * 6
        until(lambda: Server(router).list_workers() == [a.url], "the router to drop the dead server")
        update.take(2, tmp_path / "step-000002")
        back = doubles("b-again", port=b.port)
        until(lambda: live.members[back.url].state == "restarting", "the monitor to see it back")
        assert Server(router).list_workers() == [a.url] and live.readmit() == [back.url]
        assert sorted(Server(router).list_workers() or []) == sorted([a.url, back.url])
        sampler.sample(TASKS, 2)
        seen = back.seen()
        assert seen and {x["weights"] for x in seen if x["route"] == "/v1/completions"} == {str(tmp_path / "step-000002")}
        assert seen[0]["route"] == "/pause"  # the weights came before any request the router passed on
        assert [e.kind for e in events.read(tmp_path / "events.jsonl")] == ["dead", "readmitted"]
    finally:
        live.stop.set()
        proc.kill()
        proc.wait(10)


def test_with_a_broadcast_a_server_that_comes_back_waits_for_an_update_that_reached_it(doubles, job_secret, tmp_path):
    """The orchestrator's side of a broadcast over the live set: every change rewrites the live set the trainer
    reads (a restarted server is ``waiting``, a new incarnation); it is admitted only once the trainer's record
    lists it for the step the others serve; a server the trainer dropped is declared dead."""
    from slurmrl.contract import live_set

    a, b = doubles("a"), doubles("b")
    said: list[str] = []
    path, synced = tmp_path / "servers-live.json", tmp_path / "servers-synced.json"
    live = members([a.url, b.url], [a.url, b.url], tmp_path, said, live=path)
    update = weights.Broadcast("gloo", live, synced, said.append)
    live.admit = update.admit
    assert [(m.state, m.incarnation) for m in live_set.read_live(path).members] == [("admitted", 0)] * 2
    port = b.port
    b.kill()
    live.watch()
    live.watch()
    assert [m.state for m in live_set.read_live(path).members] == ["admitted", "dead"]
    live_set.write(synced, live_set.Reached(3, (a.url,), {}))
    update.take(3, None)
    back = doubles("b-again", port=port)
    live.watch()
    assert [(m.state, m.incarnation) for m in live_set.read_live(path).members] == [("admitted", 0), ("waiting", 1)]
    assert live.readmit() == [] and live.admitted() == [a.url]  # no update has reached it: it waits, not dead
    assert [m.state for m in live_set.read_live(path).members] == ["admitted", "waiting"]
    live_set.write(synced, live_set.Reached(4, (a.url, back.url), {}))
    update.take(4, None)
    assert live.readmit() == [back.url] and live.admitted() == [a.url, back.url]
    assert [m.state for m in live_set.read_live(path).members] == ["admitted", "admitted"]
    assert not [x for x in back.seen() if x["route"] == "/v1/completions"]
    live_set.write(synced, live_set.Reached(5, (back.url,), {a.url: "did not join the group: refused"}))
    update.take(5, None)  # the trainer dropped a: it is dead (and, answering again, waits for the next update)
    assert live.admitted() == [back.url]
    assert [(e.kind, e.task) for e in events.read(tmp_path / "events.jsonl")] == [("dead", 1), ("readmitted", 1),
                                                                                   ("dead", 0)]
    assert "dropped from the broadcast of step 5: did not join the group: refused" in \
        events.read(tmp_path / "events.jsonl")[-1].cause


def test_the_quorums_line_names_every_dead_server_whatever_their_causes(tmp_path):
    """FAILED keeps 300 characters of the line: one server's long cause (an engine's HTTP 500 body) must not push
    the other out of it (on the local Slurm the never test's job named only task 0)."""
    urls = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    live = members(urls, urls, tmp_path, [], min_servers=1, grace_s=1.0)
    for url in urls:
        live.declare_dead(url, "/health: [Errno 104] Connection reset by peer (during the weight update: "
                               + "HTTP 500: " + "x" * 500 + ")")
    line = "orchestrator: " + live.reason()
    assert len(line) <= MAX_CAUSE and "(task 0) dead" in line and "(task 1) dead" in line, line
