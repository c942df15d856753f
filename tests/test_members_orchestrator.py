"""The orchestrator program (``python -m slurmrl.runtime.orchestrator``) over two server processes on loopback
(tests/support/rollout_double.py) with a stand-in trainer (the file protocol only): one server is SIGKILLed while
a step's requests are in flight and restarted in place two steps later. Every batch is whole, the killed
server's requests are re-sent, it is reloaded with the newest weights before it gets a rollout, and the
metrics and events say so. With ``min_servers`` above what is live for longer than the deadline, the
orchestrator exits 1 with the dead servers and their causes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from member_servers import GROUPS, Double, N, doubles, orchestrate, prepare, until  # noqa: F401 - doubles: the fixture

from slurmrl.contract import events
from slurmrl.rundir.paths import RunDir

ROOT = Path(__file__).resolve().parent.parent


def publish(run_dir: Path, step: int) -> Path:
    out = run_dir / "weights" / f"step-{step:06d}"
    out.mkdir(parents=True)
    (out / "READY").write_text("")  # the doubles load nothing: the path is what they record
    return out


def completions(d: Double) -> list[dict]:
    return [x for x in d.seen() if x["route"] == "/v1/completions"]


def test_a_server_killed_mid_step_and_restarted_in_place(doubles, job_secret, tmp_path):  # noqa: F811
    run_dir, config = prepare(tmp_path, max_steps=4, max_off_policy_steps=0)
    a, b = doubles("a", delay=0.3), doubles("b", delay=1.0)
    back: list[Double] = []
    problems: list[str] = []

    def trainer() -> None:  # stand-in: publishes weights/step-N after batch N, kills and restarts b on the way
        try:
            for n in range(1, 4):
                until(lambda: (run_dir / "rollouts" / f"step-{n:06d}.json").exists(), f"batch {n}", 120)
                if n == 3:  # dead through the update to weights 2: it comes back missing them
                    back.append(doubles("b-again", port=b.port))
                    time.sleep(5)  # the probes (every 2 s) see it answering before step 4 starts
                publish(run_dir, n)
                if n == 1:  # step 2's requests in flight on b (weights of step 1): killed mid-request
                    until(lambda: any(x["weights"] and x["weights"].endswith("step-000001")
                                      for x in completions(b)), "b serving step 2", 60)
                    b.kill()
        except AssertionError as e:
            problems.append(str(e))

    t = threading.Thread(target=trainer, daemon=True)
    t.start()
    p = orchestrate(run_dir, config, [a.url, b.url], 300)
    t.join(30)
    assert p.returncode == 0 and not problems, (problems, p.stdout[-3000:], p.stderr[-3000:])
    batches = [json.loads((run_dir / "rollouts" / f"step-{n:06d}.json").read_text()) for n in range(1, 5)]
    assert [len(x["samples"]) for x in batches] == [GROUPS * N] * 4  # every group whole, every step
    rows = [json.loads(x) for x in (run_dir / "metrics" / "orchestrator.jsonl").read_text().splitlines()]
    served = [{k[len("served/"):]: v for k, v in r.items() if k.startswith("served/")} for r in rows]
    assert [sum(x.values()) for x in served] == [GROUPS * N] * 4  # none lost, none counted twice
    assert rows[1]["resent"] >= 1 and rows[2]["servers_live"] == 1 and set(served[2]) == {a.url}
    assert rows[3]["servers_live"] == 2 and served[3].get(b.url, 0) > 0  # readmitted: it takes rollouts
    assert [x["policy_step"] for x in batches] == [0, 1, 2, 3] and [r["off_policy_lag"] for r in rows] == [0] * 4
    seen = back[0].seen()
    first = next(i for i, x in enumerate(seen) if x["route"] == "/v1/completions")
    assert [x["route"] for x in seen[:first]] == ["/pause", "/collective_rpc", "/reset_prefix_cache", "/resume"]
    assert {x["weights"] for x in seen[first:]} == {str(run_dir / "weights" / "step-000003")}
    got = events.read(RunDir(run_dir).events)
    assert [(e.kind, e.component, e.task) for e in got] == [("dead", "inference", 1), ("readmitted", "inference", 1)]
    assert f"server {b.url} (task 1) is dead: " in p.stdout and f"server {b.url} (task 1) readmitted" in p.stdout


def test_fewer_than_min_servers_for_longer_than_the_deadline_fails_naming_them(doubles, job_secret,  # noqa: F811
                                                                               tmp_path):
    run_dir, config = prepare(tmp_path, max_steps=3, max_off_policy_steps=1, min_servers=2, servers_grace_s=3.0)
    a, b = doubles("a"), doubles("b")
    b.kill()
    p = orchestrate(run_dir, config, [a.url, b.url], 120)
    assert p.returncode == 1, (p.stdout[-3000:], p.stderr[-3000:])
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("slurmrl: orchestrator: fewer than inference.min_servers = 2 servers live for 3s: ")
    assert f"{b.url} (task 1) dead: /health: " in last and a.url not in last
    assert [e.kind for e in events.read(RunDir(run_dir).events)] == ["dead"]
