"""The broadcast weight sync over the live set of servers, with two real vLLM (CPU build) servers on loopback
(slurmrl's gloo engine, loaded in them by the vLLM plugin), the orchestrator's real live set (``Members``,
probed by hand here: no monitor thread) and its broadcast strategy (``weights.Broadcast``), and the trainer's
real ``Broadcaster``:

1. the first group is asked over both servers and a third planned one that answers its init but never
   joins (tests/support/rollout_double.py, a test double of a server whose workers hang): after the join deadline
   the double is dropped (the trainer's record says why; the orchestrator declares it dead) and a group of 3
   (the trainer and both servers) forms and takes the update;
2. server 1 is SIGKILLed (its whole task: supervisor and vLLM); the orchestrator's probes declare it dead;
   the next update forms the group again over server 0 alone, within a deadline (a hang fails the test);
3. server 1 is started again in place (same port, the base model): the orchestrator sees it answer and
   does NOT admit it (the trainer's record says no update reached it yet);
4. the update after that forms the group over both again; server 1 now answers with exactly the trainer's
   weights (its logprobs are transformers' on them), and the orchestrator readmits it: events dead, readmitted;
5. server 1 is SIGKILLed again, at the moment the next update starts (after its pause; a hook on the trainer's
   client only times the real kill): nothing was sent yet, so the update starts again over server 0 alone
   (in CI the broadcast RL job failed so: "sending the weights of step 3 failed: ... Connection refused").
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from live_components import (
    LiveComponent,
    free_port_base,
    post_json,
    serve_recipe,
    transformers_logprobs,
    vllm_plugin_on_path,
)

from slurmrl.contract import events, live_set
from slurmrl.contract.weight_sync import Broadcast

pytestmark = pytest.mark.vllm
TESTS = Path(__file__).resolve().parent
SYNC_DEADLINE_S = 240.0  # one update, forming included, on a loaded 2-core machine; a hang fails the test


def logprobs(url: str) -> tuple[list[int], list[float]]:
    body = {"model": "tiny", "prompt": "reload check", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
            "logprobs": 0, "return_tokens_as_token_ids": True}
    lp = post_json(f"{url}/v1/completions", body)["choices"][0]["logprobs"]
    return [int(t.split(":")[1]) for t in lp["tokens"]], lp["token_logprobs"]


def kill_tree(component: LiveComponent) -> None:
    """SIGKILL the task and everything it started (this test's processes, by pid)."""
    root = psutil.Process(component.proc.pid)
    procs = [root, *root.children(recursive=True)]
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=60)
    component.stop()


def within(fn, seconds: float, what: str):
    """``fn()`` on a thread; fails the test if it has not returned within ``seconds``."""
    out: list = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - carried to the test's thread
            err.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{what} did not finish within {seconds:g}s"
    if err:
        raise err[0]
    return out[0]


def test_the_group_is_formed_again_over_the_survivor_and_then_the_restarted_server(tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slurmrl.app.build import render
    from slurmrl.runtime.fixtures.tiny_model import build as build_tiny
    from slurmrl.runtime.orchestrator.members import MISSES, Members
    from slurmrl.runtime.orchestrator.weights import Broadcast as BroadcastUpdates
    from slurmrl.runtime.trainer.transfer_group import Forming
    from slurmrl.runtime.trainer.weight_sync import Broadcaster, Target

    models = build_tiny(tmp_path / "seed0", seed=0), build_tiny(tmp_path / "seed1", seed=1)
    vllm_plugin_on_path(tmp_path / "plugin")
    recipe = tmp_path / "serve.toml"
    recipe.write_text(serve_recipe(models[0], weight_transfer="gloo"))
    run_dir = render(recipe, run_dir=tmp_path / "run").run_dir
    base = free_port_base()
    urls = [f"http://127.0.0.1:{base + 16 + i}" for i in range(2)]
    servers = [LiveComponent(run_dir, "inference", base, local=i, tasks=2) for i in range(2)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        hang_port = s.getsockname()[1]
    hangs = f"http://127.0.0.1:{hang_port}"  # answers every route 200, joins no group
    double = subprocess.Popen([sys.executable, str(TESTS / "support" / "rollout_double.py"), str(hang_port),
                               str(tmp_path / "double.jsonl")], cwd=TESTS)
    live, synced = tmp_path / "servers-live.json", tmp_path / "servers-synced.json"
    said: list[str] = []
    members = Members([*urls, hangs], [*urls, hangs], min_servers=1, grace_s=600, events=tmp_path / "events.jsonl", log=said.append,
                      live=live)
    updates = BroadcastUpdates("gloo", members, synced, said.append)
    members.admit = updates.admit
    prompt_ids = AutoTokenizer.from_pretrained(models[0])("reload check")["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(models[1], dtype=torch.float32)

    def serves(url: str, weights) -> None:
        ids, served = logprobs(url)
        assert served == pytest.approx(transformers_logprobs(weights, prompt_ids, ids), abs=2e-3), url

    try:
        for s, url in zip(servers, urls):
            s.wait_http(f"{url}/health", timeout=900)
        target = Target(Broadcast("gloo", 120), [*urls, hangs], [1, 1, 1], "127.0.0.1", base + 7, world_size=4,
                        live=live, synced=synced)
        sender = within(lambda: Broadcaster(target, model, rank=0, dtype=torch.float32), SYNC_DEADLINE_S, "opening")
        within(lambda: sender.sync(1), SYNC_DEADLINE_S, "update 1")
        updates.take(1, None)
        reached = live_set.read_reached(synced)
        assert reached is not None and (reached.step, reached.urls) == (1, tuple(urls)), reached
        # dropped, never waited on: by its init (it answered, never joined) or, on a loaded machine, by the
        # health check before the group (the double's one thread busy with the init it never finishes)
        assert set(reached.dropped) == {hangs}, reached
        assert reached.dropped[hangs] in ("its init answered, but it never joined the group",
                                          "/health did not answer 200 within 5s"), reached
        assert members.admitted() == urls  # the orchestrator declared the one dropped dead
        double.kill()
        double.wait(30)
        for url in urls:
            serves(url, models[1])

        kill_tree(servers[1])  # the server dies between two updates
        for _ in range(MISSES):
            members.watch()
        assert members.admitted() == [urls[0]]
        assert [m.state for m in live_set.read_live(live).members] == ["admitted", "dead", "dead"]
        with torch.no_grad():
            model.load_state_dict(AutoModelForCausalLM.from_pretrained(models[0], dtype=torch.float32).state_dict())
        t = time.monotonic()
        within(lambda: sender.sync(2), SYNC_DEADLINE_S, "update 2, over the survivor")
        assert time.monotonic() - t < SYNC_DEADLINE_S
        updates.take(2, None)
        assert live_set.read_reached(synced) == live_set.Reached(2, (urls[0],), {})
        serves(urls[0], models[0])

        servers[1] = LiveComponent(run_dir, "inference", base, local=1, tasks=2)  # restarted in place: base model
        servers[1].wait_http(f"{urls[1]}/health", timeout=900)
        members.watch()
        assert [(m.state, m.incarnation) for m in live_set.read_live(live).members][:2] == [("admitted", 0),
                                                                                            ("waiting", 1)]
        assert members.readmit() == [] and members.admitted() == [urls[0]]  # no update has reached it yet
        with torch.no_grad():
            model.load_state_dict(AutoModelForCausalLM.from_pretrained(models[1], dtype=torch.float32).state_dict())
        within(lambda: sender.sync(3), SYNC_DEADLINE_S, "update 3, with the restarted server")
        updates.take(3, None)
        assert live_set.read_reached(synced) == live_set.Reached(3, tuple(urls), {})
        assert members.readmit() == [urls[1]] and members.admitted() == urls
        for url in urls:
            serves(url, models[1])  # the trainer's weights, also on the restarted server

        start, killed = Forming.start_weight_update, []

        def dies_as_the_update_starts(client) -> None:
            if not killed:
                killed.append(kill_tree(servers[1]))
            start(client)

        monkeypatch.setattr(Forming, "start_weight_update", dies_as_the_update_starts)
        with torch.no_grad():
            model.load_state_dict(AutoModelForCausalLM.from_pretrained(models[0], dtype=torch.float32).state_dict())
        within(lambda: sender.sync(4), SYNC_DEADLINE_S, "update 4, a server dead as it starts")
        assert killed
        reached = live_set.read_reached(synced)
        assert reached is not None and (reached.step, reached.urls, set(reached.dropped)) == (4, (urls[0],), {urls[1]})
        updates.take(4, None)
        assert members.admitted() == [urls[0]]  # the orchestrator declared the dropped one dead
        serves(urls[0], models[0])
    finally:
        double.kill()
        double.wait(30)
        for s in servers:
            s.stop()
    got = [(e.kind, e.task) for e in events.read(tmp_path / "events.jsonl")]
    assert got == [("dead", 2), ("dead", 1), ("readmitted", 1), ("dead", 1)], got
