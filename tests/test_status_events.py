"""What status and the report show of RUN_DIR/events.jsonl: each component's restarts in the shown attempt,
one line per event of every kind (those another part writes too), all of them in status --json, and the
report's sentence and phases that say a result was produced through restarts."""

from __future__ import annotations

from slurmrl.app import report_data, status_events
from slurmrl.app.status_report import ComponentStatus, StatusReport
from slurmrl.contract import events
from slurmrl.rundir.paths import RunDir
from slurmrl.slurm.watch import Snapshot


def write(run_dir, *rows: events.Event) -> None:
    for e in rows:
        events.append(RunDir(run_dir).events, e)


def sample(run_dir) -> None:
    write(run_dir,
          events.Event("died", "inference", 1, "n2", "exited with code 137 (SIGKILL)", 0, "42", 1000.0, {"restarts": 0}),
          events.Event("restarted", "inference", 1, "n2", "exited with code 137 (SIGKILL)", 0, "42", 1001.0,
                       {"restarts": 1}),
          events.Event("dead", "judge", 0, "n3", "vLLM's engine process died", 0, "42", 1002.0,
                       {"why": "restart = never"}),
          events.Event("excluded", "slurm", None, "n4", "slurmd stopped answering", 0, "42", 1003.0),
          events.Event("restarted", "inference", 0, "n2", "exited with code 1", 1, "42", 2000.0, {"restarts": 1}))


def test_restarts_per_component_of_the_shown_attempt_and_every_event_in_json(tmp_path):
    sample(tmp_path)
    rep = StatusReport(Snapshot("42", "RUNNING"), str(tmp_path), attempt=0,
                       components=[ComponentStatus(name, 0) for name in ("inference", "judge", "trainer")])
    status_events.add(rep, tmp_path)
    assert {c.name: c.restarts for c in rep.components} == {"inference": 1, "judge": 0, "trainer": 0}
    shown = rep.to_json()  # status --json
    assert [c["restarts"] for c in shown["components"]] == [1, 0, 0]
    assert [e["kind"] for e in shown["events"]] == ["died", "restarted", "dead", "excluded", "restarted"]
    assert shown["events"][0]["node"] == "n2" and shown["events"][0]["cause"] == "exited with code 137 (SIGKILL)"


def test_one_line_per_event_of_every_kind(tmp_path):
    sample(tmp_path)
    shown = status_events.lines(status_events.read(tmp_path))
    assert shown[0] == "  events (events.jsonl): 5"
    assert shown[2].startswith("  restarted: inference.1 on n2, attempt 0, job 42, ")
    assert shown[2].endswith(": exited with code 137 (SIGKILL) (restarts: 1)")
    assert shown[3].endswith(": vLLM's engine process died (why: restart = never)") and "dead: judge.0" in shown[3]
    assert shown[4].startswith("  excluded: slurm on n4")
    assert status_events.lines([]) == []


def test_many_events_show_the_newest(tmp_path):
    write(tmp_path, *(events.Event("died", "inference", k, "n1", f"cause {k}", 0) for k in range(30)))
    shown = status_events.lines(status_events.read(tmp_path))
    assert shown[0] == f"  events (events.jsonl): 30, the last {status_events.SHOWN} shown"
    assert len(shown) == 1 + status_events.SHOWN and shown[-1].endswith("cause 29")


def test_the_report_says_the_result_came_through_restarts(tmp_path):
    run = RunDir(tmp_path)
    run.phases_file(0).parent.mkdir(parents=True)
    run.phases_file(0).write_text("999 allocation\n1005 all components ready\n")
    sample(tmp_path)
    d = report_data.read_run(run)
    assert d.through() == ("Produced through 2 restart(s) in place and 1 task(s) that died for good (events.jsonl, "
                           "lock.toml's [[lock.restarts]]; in the phases below).")
    phases = dict(d.phases)[0]
    assert phases[1] == (1000.0, "died inference.1 on n2: exited with code 137 (SIGKILL)")
    assert phases[-1] == (1005.0, "all components ready")
    assert report_data.read_run(RunDir(tmp_path / "none")).through() is None
