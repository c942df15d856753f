"""Dynamo workers with data parallelism on the local Slurm cluster: recipes/inference-dynamo-debug.toml
with ``inference.dp = 2`` runs two `dynamo.mocker` workers (one per node, each simulating its two
data-parallel ranks in one process, `--data-parallel-size 2`, on tp x dp = 2 of the node's fake
GPUs) behind etcd and Dynamo's frontend; the frontend lists the model with both workers and serves
chat completions through them; `slurmrl cancel` leaves no process behind.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from dynamo_jobs import DYNAMO_PY, READY_S, Job, chat

from slurmrl.runtime.fixtures.tiny_model import build_no_weights

pytestmark = pytest.mark.cluster


def test_mocker_workers_with_two_data_parallel_ranks_serve(slurm_cluster, tmp_path):
    if not DYNAMO_PY.exists():
        pytest.fail(f"{DYNAMO_PY} is missing: run scripts/install.sh", pytrace=False)
    model = build_no_weights(tmp_path / "tiny-mocker")
    job = Job(slurm_cluster, tmp_path, [f'model.path="{model}"', f'python.executable="{DYNAMO_PY}"',
                                        'name="inference-dynamo-dp-debug"', "inference.gpus_per_node=2",
                                        "inference.dp=2"])
    try:
        job.wait_ready(time.monotonic() + READY_S)
        with urllib.request.urlopen(f"{job.base}/health", timeout=10) as r:
            health = json.loads(r.read())
        generate = {i["instance_id"] for i in health["instances"] if i["endpoint"] == "generate"
                    and i.get("namespace") == f"job{job.job_id}"}
        assert len(generate) == 2  # one Dynamo instance per mocker process, its two ranks inside
        replies = [chat(job.base) for _ in range(8)]
        assert all(r["usage"]["completion_tokens"] == 8 for r in replies)
        assert all(r["choices"][0]["message"]["content"].strip() for r in replies)
        logs = [job.log("inference.0"), job.log("inference.1")]
        for log in logs:  # each worker simulates two ranks, each with its own KV manager and query endpoint
            assert "dp_size: 2" in log and "dp_rank 0 routed by instance" in log and "dp_rank 1 routed by instance" in log
        script = "".join(f.read_text() for f in job.run_dir.glob("*.sbatch"))
        assert "-m dynamo.mocker" in script and "--data-parallel-size 2" in script  # what ran
        ids = [r["id"].removeprefix("chatcmpl-") for r in replies]
        assert all(any(i in log for log in logs) for i in ids)  # each request served by a worker
        assert all(any(i in log for i in ids) for log in logs)  # both workers served
    finally:
        r = job.cancel()
    assert r.returncode == 0 and "CANCELLED" in r.stdout, r.stdout + r.stderr
    left = slurm_cluster.wait_no_job_processes(job.job_id)
    assert not left, f"job {job.job_id} left:\n" + "\n".join(left)
