"""The restart policy from the recipe to each serving task's supervisor line: inference servers, the
router, the judge, Dynamo's workers and frontend take theirs (defaults: on-failure, 5, 10 s); a vLLM server
spanning several nodes takes it with its tasks per worker (it restarts as a whole), Dynamo's and SGLang's
take none (SGLang's refuses a restart field set); an RL job's servers serve on without a dead sibling
(--kill-on-bad-exit=0) and are launched --orchestrated; bad values are refused naming the field."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from slurmrl.app.build import build
from slurmrl.contract.restart_policy import Policy
from slurmrl.errors import UserError

ROOT = Path(__file__).resolve().parent.parent


def plan(tmp_path: Path, recipe: str, *sets: str):
    run_dir = Path(tempfile.mkdtemp(dir=tmp_path))
    return build(ROOT / "recipes" / f"{recipe}.toml", list(sets), run_dir=str(run_dir))


def policy(component) -> Policy | None:
    """The policy on the component's supervisor line (None without --restart)."""
    words = [str(w) for w in component.task.supervisor]
    if "--restart" not in words:
        return None
    after = {w: words[k + 1] for k, w in enumerate(words[:-1]) if w.startswith("--")}
    return Policy(after["--restart"], int(after["--max-restarts"]), int(after["--restart-backoff"]))


def test_defaults_reach_every_serving_task_and_no_other(tmp_path):
    p = plan(tmp_path, "rl-judge").plan
    assert {c.name: policy(c) for c in p.components} == {
        "inference": Policy("on-failure", 5, 10), "judge": Policy("on-failure", 5, 10),
        "router": Policy("on-failure", 5, 10), "trainer": None, "orchestrator": None}


def test_each_section_sets_its_own(tmp_path):
    out = plan(tmp_path, "inference-debug", 'inference.restart="always"', "inference.max_restarts=2",
               "inference.restart_backoff_s=0", 'inference.router.restart="never"')
    assert policy(out.plan.component("inference")) == Policy("always", 2, 0)
    assert policy(out.plan.component("router")) == Policy("never", 5, 10)
    assert "--restart always --max-restarts 2 --restart-backoff 0 --" in out.script


def test_an_rl_jobs_servers_serve_on_and_are_the_orchestrators(tmp_path):
    out = plan(tmp_path, "rl-debug", "inference.gpus_per_node=2")
    inference = out.plan.component("inference")
    assert inference.orchestrated and "--kill-on-bad-exit=0" in inference.srun
    assert "launch --orchestrated inference srun" in out.script
    served = plan(tmp_path, "inference-debug").plan.component("inference")
    assert not served.orchestrated and "launch inference srun" in plan(tmp_path, "inference-debug").script


def test_dynamo_workers_and_frontend_take_inferences_policy(tmp_path):
    p = plan(tmp_path, "inference-dynamo-debug", "inference.max_restarts=3").plan
    assert {c.name: policy(c) for c in p.components if c.name in ("inference", "frontend")} == {
        "inference": Policy("on-failure", 3, 10), "frontend": Policy("on-failure", 3, 10)}
    assert policy(p.component("etcd")) is None


def test_a_server_over_several_nodes_is_not_restarted(tmp_path):
    """Dynamo's DP16 worker over two nodes: one dead rank ends the step; no rank restarts alone."""
    worker = plan(tmp_path, "inference-dynamo-dp").plan.component("inference")
    assert "--kill-on-bad-exit=1" in worker.srun and policy(worker) is None


PD_SPANNING = ("slurm.gpus_per_node=1", "slurm.cpus_per_node=8", "inference.prefill={replicas=1, tp=1}",
               "inference.decode={replicas=2, tp=1, dp=2}", "inference.max_restarts=2")


def test_a_vllm_worker_over_several_nodes_restarts_as_a_whole(tmp_path):
    """P/D whose decode workers each span two nodes (dp=2 on nodes of one GPU): each task of decode is one of
    2 tasks of its worker; prefill's one-node servers are tasks alone."""
    out = plan(tmp_path, "inference-pd", *PD_SPANNING)
    decode, prefill = out.plan.component("decode"), out.plan.component("prefill")
    assert policy(decode) == policy(prefill) == Policy("on-failure", 2, 10)
    words = [str(w) for w in decode.task.supervisor]
    assert words[words.index("--worker-tasks") + 1] == "2" and "--worker-tasks" not in map(str, prefill.task.supervisor)
    assert len(decode.instances) == 4 and decode.health.nodes_per_server == 2


def test_an_sglang_server_over_several_nodes_refuses_a_restart_field(tmp_path):
    with pytest.raises(UserError) as e:
        plan(tmp_path, "inference-sglang", "inference.max_restarts=2")
    assert e.value.field == "inference.max_restarts" and "vLLM only" in str(e.value), e.value
    assert policy(plan(tmp_path, "inference-sglang").plan.component("inference")) is None


@pytest.mark.parametrize(("key", "value"), [("inference.restart", '"sometimes"'), ("inference.max_restarts", "-1"),
                                            ("judge.restart_backoff_s", "100000")])
def test_bad_values_name_the_field(tmp_path, key, value):
    with pytest.raises(UserError) as e:
        plan(tmp_path, "rl-judge", f"{key}={value}")
    assert key in str(e.value)
