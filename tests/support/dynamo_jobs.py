"""A Dynamo job on the local cluster (the mocker engine), and requests to it; shared by the Dynamo
cluster tests."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready
from slurmrl.runtime.fixtures.tiny_model import build_no_weights

ROOT = Path(__file__).resolve().parents[2]


RECIPE = ROOT / "recipes" / "inference-dynamo-debug.toml"


DYNAMO_PY = ROOT / ".venv-dynamo" / "bin" / "python"


READY_S = 240  # a cold start takes ~11 s here; the machine is shared with other tests


def addresses(cluster) -> dict[str, str]:
    """n1..n4 -> their addresses inside the cluster's network namespaces (its hosts file)."""
    out = {}
    for line in (cluster.state_dir / "etc" / "hosts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2:
            out.update({name: parts[0] for name in parts[1:]})
    return out


def reachable(cluster, url: str) -> str:
    host, _, port = url.removeprefix("http://").partition(":")
    return f"http://{addresses(cluster)[host]}:{port}"


def post(url: str, body: dict, timeout: float = 60) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


def chat(base: str, stream: bool = False) -> dict | list[dict]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": stream}
    code, text = post(f"{base}/v1/chat/completions", body)
    assert code == 200, text
    if not stream:
        return json.loads(text)
    events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", text[-500:]
    return [json.loads(e) for e in events[:-1]]


class Job:
    def __init__(self, cluster, cwd: Path, overrides: list[str], recipe: Path = RECIPE):
        self.cluster, self.cwd = cluster, cwd
        r = cluster.slurmrl("submit", str(recipe), *[a for o in overrides for a in ("--set", o)], cwd=cwd)
        assert r.returncode == 0, r.stdout + r.stderr
        name = next(o.split("=", 1)[1].strip('"') for o in overrides + ['name="inference-dynamo-debug"']
                    if o.startswith("name="))
        self.run_dir = cwd / "runs" / name
        self.job_id = str(json.loads((self.run_dir / "jobs.json").read_text())[-1]["job_id"])
        self.base: str | None = None

    def ready_dir(self) -> Path:
        return RunDir(self.run_dir).ready_dir(0)

    def wait_ready(self, deadline: float) -> None:
        failed = RunDir(self.run_dir).failed_file(0)
        while not (self.ready_dir() / "frontend.0").exists():
            assert not failed.exists(), failed.read_text()
            assert time.monotonic() < deadline, f"job {self.job_id} not ready: {sorted(os.listdir(self.ready_dir()))}"
            time.sleep(1)
        url, _, _ = read_ready(self.ready_dir() / "frontend.0")
        self.base = reachable(self.cluster, url)

    def log(self, name: str) -> str:
        return (RunDir(self.run_dir).log_dir(0) / f"{name}.log").read_text(errors="replace")

    def cancel(self):
        return self.cluster.slurmrl("cancel", str(self.run_dir), cwd=self.cwd, timeout=180)


def mocker_setup(tmp_path_factory, name: str) -> tuple[Path, list[str]]:
    """A folder for the jobs and the overrides every mocker job takes: the tiny model without weights,
    .venv-dynamo's Python."""
    if not DYNAMO_PY.exists():
        pytest.fail(f"{DYNAMO_PY} is missing: run scripts/install.sh", pytrace=False)
    cwd = tmp_path_factory.mktemp(name)
    model = build_no_weights(cwd / "tiny-mocker")
    return cwd, [f'model.path="{model}"', f'python.executable="{DYNAMO_PY}"']
