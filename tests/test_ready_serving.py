"""Ready means serving (issue 17 item 5): a front is ready once the expected workers are registered
behind it and one real completion through it returns a token.

Real processes on loopback: the task supervisor, real vllm-router, and two test doubles for a vLLM
server: tests/support/ok_server.py (answers every completion with one token) and tests/support/no_tokens_server.py
(passes /health, fails every completion: HTTP 500, or 200 with 0 tokens). A server that passes
/health but does not serve keeps the component from ready, and the reason the batch shell quotes
in FAILED names it. The planner's side: which supervisors get the check (every gallery recipe).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from supervised_processes import free_port, start, wait_for

from slurmrl.plan import plan
from slurmrl.recipe.load import load_recipe
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime.steps import ready_check

ROOT = Path(__file__).resolve().parent.parent
OK = [sys.executable, str(ROOT / "tests" / "support" / "ok_server.py")]
BROKEN = [sys.executable, str(ROOT / "tests" / "support" / "no_tokens_server.py")]
ROUTER = shutil.which("vllm-router", path=str(Path(sys.executable).parent))


def waiting(tmp_path: Path, name: str) -> str:
    f = RunDir(tmp_path).waiting_file(0, name)
    return f.read_text() if f.exists() else ""


def serve(*cmd: str) -> subprocess.Popen:
    return subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_port(port: int, timeout: float = 30) -> None:
    wait_for(lambda: ready_check._request(f"http://127.0.0.1:{port}/health", timeout=1)[0] == 200, timeout)


def stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.mark.parametrize("flag, says", [((), "HTTP 500: engine dead (test double)"),
                                        (("--zero-tokens",), "HTTP 200 with 0 completion tokens")])
def test_a_server_that_passes_health_but_does_not_serve_is_never_ready(tmp_path, flag, says):
    port = free_port()
    p = start(tmp_path, "inference", "--ready", f"http://127.0.0.1:{port}", "--ready-completion", "m", "--",
              *BROKEN, str(port), "127.0.0.1", *flag)
    try:
        text = wait_for(lambda: says in waiting(tmp_path, "inference") and waiting(tmp_path, "inference"))
        assert text.startswith("task 0: completion of 'm' through http://127.0.0.1:") and says in text
        time.sleep(3)  # several more polls: still not ready
        assert not RunDir(tmp_path).ready_file(0, "inference", 0).exists()
        assert not any("serving" in what for _, what in RunDir(tmp_path).read_phases(0))
    finally:
        p.terminate()
        out, _ = p.communicate(timeout=30)
    # each new reason logged once: several polls failed with this one (a poll cut short by the stop
    # above may add another reason, "Connection reset by peer", once)
    assert out.count(f"failed: {says}\n") == 1, out


def test_a_server_that_serves_is_ready_and_the_time_is_a_phase(tmp_path):
    port = free_port()
    p = start(tmp_path, "inference", "--ready", f"http://127.0.0.1:{port}", "--ready-completion", "m", "--",
              *OK, str(port), "127.0.0.1")
    try:
        wait_for(lambda: RunDir(tmp_path).ready_file(0, "inference", 0).exists())
        phases = [what for _, what in RunDir(tmp_path).read_phases(0)]
        assert any(w.startswith(f"inference serving: a completion through http://127.0.0.1:{port} returned 1 token(s) in ")
                   for w in phases), phases
        assert not RunDir(tmp_path).waiting_file(0, "inference").exists()
    finally:
        p.terminate()
        p.communicate(timeout=30)


@pytest.mark.skipif(ROUTER is None, reason="vllm-router is not installed beside this interpreter")
def test_through_vllm_router_workers_are_counted_and_a_failing_worker_is_named(tmp_path):
    bad, good, router = free_port(), free_port(), free_port()
    servers = [serve(*BROKEN, str(bad), "127.0.0.1"), serve(*OK, str(good), "127.0.0.1")]
    procs = []
    try:
        wait_port(bad)
        wait_port(good)
        argv = [ROUTER, "--host", "127.0.0.1", "--port", str(router), "--policy", "round_robin",
                "--health-check-interval-secs", "60", "--worker-urls"]
        # 1. the router has one worker that fails completions: never ready, and the reason names the worker
        procs.append(start(tmp_path, "router", "--ready", f"http://127.0.0.1:{router}", "--ready-workers", "1",
                           "--ready-completion", "m", "--", *argv, f"http://127.0.0.1:{bad}"))
        text = wait_for(lambda: "directly" in waiting(tmp_path, "router") and waiting(tmp_path, "router"), 60)
        assert "through http://127.0.0.1:%d/v1/completions failed: HTTP 5" % router in text, text
        assert f"directly, http://127.0.0.1:{bad}: HTTP 500: engine dead (test double)" in text, text
        phases = [what for _, what in RunDir(tmp_path).read_phases(0)]
        assert "router workers registered: 1 of 1 after" in " ".join(phases), phases
        assert not RunDir(tmp_path).ready_file(0, "router", 0).exists()
        stop(procs.pop())
        # 2. three workers expected, two given: it waits for the third
        procs.append(start(tmp_path, "router", "--ready", f"http://127.0.0.1:{router}", "--ready-workers", "3",
                           "--ready-completion", "m", "--", *argv, f"http://127.0.0.1:{good}",
                           f"http://127.0.0.1:{bad}"))
        wait_for(lambda: "2 of 3 workers registered" in waiting(tmp_path, "router"), 60)
        assert not RunDir(tmp_path).ready_file(0, "router", 0).exists()
        stop(procs.pop())
        # 3. the right count, and a worker that serves: ready
        procs.append(start(tmp_path, "router", "--ready", f"http://127.0.0.1:{router}", "--ready-workers", "1",
                           "--ready-completion", "m", "--", *argv, f"http://127.0.0.1:{good}"))
        wait_for(lambda: RunDir(tmp_path).ready_file(0, "router", 0).exists(), 60)
        assert any(w.startswith("router serving: a completion through") for _, w in RunDir(tmp_path).read_phases(0))
    finally:
        stop(*procs, *servers)


def test_the_reason_reaches_failed_through_the_batch_shell(tmp_path):
    """The script's still_starting quotes LOG_DIR/<name>.waiting in its abort line."""
    text = (ROOT / "sbatch" / "slurmrl-functions.sh").read_text()  # the helper file job.sbatch sources
    body = text[text.index("still_starting() {"):]
    body = body[: body.index("\n}\n") + 3]
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    (log_dir / "router.waiting").write_text("task 0: completion of 'm' failed: HTTP 500: engine dead\n")
    script = (f'LOG_DIR={log_dir}\ndeclare -A PID_OF=([router]=999999999)\n'
              'abort() { echo "FAILED: $1"; exit 1; }\n' + body + 'SECONDS=100\nstill_starting router 30 50 "0 of 1 task(s) ready"\n')
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert r.stdout.strip() == ("FAILED: router exited before it was ready (0 of 1 task(s) ready); task 0: completion "
                                "of 'm' failed: HTTP 500: engine dead"), r.stdout + r.stderr


def flags(p, name: str) -> tuple:
    return p.component(name).task.supervisor


@pytest.mark.parametrize("recipe", sorted(p.stem for p in (ROOT / "recipes").glob("*.toml")))
def test_every_front_and_no_fronted_server_gets_the_completion(recipe):
    r = load_recipe(ROOT / "recipes" / f"{recipe}.toml")
    p = plan(r, "/cluster/runs/x")
    names = {c.name for c in p.components}
    with_check = {c.name for c in p.components if "--ready-completion" in c.task.supervisor}
    if "router" in names:
        assert "router" in with_check
        sup = flags(p, "router")
        if "sglang_router.launch_router" in p.component("router").task.command:
            # sglang-router 0.3.2 lists its workers at /workers (/list_workers: 404): the completion is the check
            assert "--ready-workers" not in sup
        else:
            assert sup[sup.index("--ready-workers") + 1].sh in ("${#workers[@]}",
                                                                "$((${#prefill[@]} + ${#decode[@]}))")
        assert not with_check & {"inference", "prefill", "decode"}  # the router's completion reaches them
    elif "frontend" in names:
        assert with_check >= {"frontend"}
        sup = flags(p, "frontend")
        assert sup[sup.index("--ready-completion") + 1] == sup[sup.index("--ready-model") + 1]
    elif "inference" in names:
        assert "inference" in with_check
    if r.kind == "sft":
        assert not with_check
    preflight = plan(r, "/cluster/runs/x", preflight=True)
    assert not any("--ready-completion" in c.task.supervisor for c in preflight.components)


def test_the_ready_check_module_needs_no_engine():
    for path in ("steps/ready_check.py", "vllm/client.py"):
        src = (ROOT / "slurmrl" / "runtime" / path).read_text()
        for name in ("torch", "vllm", "transformers", "requests", "httpx"):
            assert f"import {name}" not in src, path
