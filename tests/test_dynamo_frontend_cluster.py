"""Dynamo's frontend options on the local Slurm cluster: the debug recipe's two `dynamo.mocker`
workers behind a frontend whose KV router predicts each worker's cache from its own routing
decisions (router_mode = "kv", kv_events = false) and which migrates requests (migration_limit).

Round robin spreads four requests over both workers (test_dynamo_cluster); with these options the
same long prompt, sent again and again, lands on one worker every time (the prefix it already holds),
each request id in that worker's log alone, and the frontend logs that migration is on.
"""

from __future__ import annotations

import json
import time

import pytest
from dynamo_jobs import READY_S, Job, mocker_setup, post

pytestmark = pytest.mark.cluster

OPTIONS = ['name="inference-dynamo-kv"', 'inference.dynamo.router_mode="kv"', "inference.dynamo.kv_events=false",
           "inference.dynamo.router_ttl_secs=300", "inference.dynamo.migration_limit=2"]
PROMPT = " ".join(f"word{i} of a long shared prefix" for i in range(60))  # several KV blocks


@pytest.fixture(scope="module")
def job(slurm_cluster, tmp_path_factory):
    cwd, common = mocker_setup(tmp_path_factory, "dynamo-kv")
    j = Job(slurm_cluster, cwd, [*common, *OPTIONS])
    try:
        j.wait_ready(time.monotonic() + READY_S)
        yield j
    finally:
        j.cancel()


def test_kv_router_keeps_a_prefix_on_one_worker_and_migration_is_on(job):
    ids = []
    for _ in range(6):
        body = {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
        code, text = post(f"{job.base}/v1/chat/completions", body)
        assert code == 200, text
        ids.append(json.loads(text)["id"].removeprefix("chatcmpl-"))
    logs = [job.log("inference.0"), job.log("inference.1")]
    served = [sum(i in log for i in ids) for log in logs]
    assert sorted(served) == [0, 6], served  # one worker got all six, the other none
    frontend = job.log("frontend.0")
    assert "--no-router-kv-events" in frontend and "--router-ttl-secs 300.0" in frontend
    assert "Request migration enabled (limit: 2)" in frontend, frontend[-3000:]
