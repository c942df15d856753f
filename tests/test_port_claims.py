"""Jobs sharing a node never collide on ports: each claims its block on every node it runs on.

Unit tests run the script's own claim_ports_here in bash (squeue replaced by a stub that says
which jobs run). The cluster test starts two jobs on one node whose job ids are equal modulo the
port table's slot count (so both first try the same block) and checks they serve side by side.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from script_edits import serve_with_ok_server
from worker_ports import worker_order

from slurmrl import ports
from slurmrl.app.build import build
from slurmrl.rundir.paths import RunDir
from slurmrl.rundir.ready import read_ready

ROOT = Path(__file__).resolve().parent.parent


def script_functions(pattern: str) -> str:
    script = build(ROOT / "recipes" / "inference-debug.toml", run_dir="/r").files["slurmrl-functions.sh"]
    return "\n".join(re.findall(rf"^((?:{pattern})\(\) \{{\n.*?^\}})", script, re.M | re.S))


def claim_functions() -> str:
    return script_functions("claim_ports_here|release_ports_here")


def claim(tmp: Path, job: int, base: int, running: str = "", offsets=(0, 1, 16)) -> subprocess.CompletedProcess:
    body = (f"hostname() {{ echo n9; }}\nsqueue() {{ [[ -n '{running}' ]] && echo '{running}'; }}\n"
            f"{claim_functions()}\nclaim_ports_here {base} {' '.join(map(str, offsets))}\n")
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": str(job), "PORT_CLAIMS": str(tmp)}
    return subprocess.run(["bash", "-c", body], env=env, capture_output=True, text=True)


def free_block() -> int:
    for base in worker_order(range(40000, 50000, 80)):
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 16))
            return base
        except OSError:
            continue
    raise RuntimeError("no free block")


def test_first_claim_wins_and_a_running_owner_keeps_it(tmp_path):
    base = free_block()
    assert claim(tmp_path, 5, base).returncode == 0
    assert (tmp_path / "n9" / str(base)).read_text().strip() == "5"
    assert claim(tmp_path, 5, base).returncode == 0  # the same job again (another group on the node)
    r = claim(tmp_path, 6, base, running="5")
    assert r.returncode == 1 and "held by running job 5" in r.stdout
    assert (tmp_path / "n9" / str(base)).read_text().strip() == "5"


def test_a_claim_of_a_job_that_ended_is_taken_over(tmp_path):
    base = free_block()
    assert claim(tmp_path, 5, base).returncode == 0
    assert claim(tmp_path, 6, base, running="").returncode == 0
    assert (tmp_path / "n9" / str(base)).read_text().strip() == "6"


def test_a_port_in_use_fails_the_claim_and_releases_it(tmp_path):
    base = free_block()
    with socket.socket() as s:
        s.bind(("127.0.0.1", base + 16))
        s.listen()
        r = claim(tmp_path, 5, base)
    assert r.returncode == 1 and f"port {base + 16} is in use" in r.stdout
    assert not (tmp_path / "n9" / str(base)).exists()


def blocks(tmp: Path, ranges: dict[str, str], *bases: int) -> subprocess.CompletedProcess:
    """The script's port_blocks_outside and no_port_block over the nodes' ``ranges`` (as
    /proc/sys/net/ipv4/ip_local_port_range holds them)."""
    tmp.mkdir(exist_ok=True)
    for node, text in ranges.items():
        (tmp / node).write_text(f"{node} {text}\n")
    args = " ".join(map(str, bases))
    body = (f"{script_functions('port_blocks_outside|no_port_block')}\n"
            f"cat {tmp}/* | port_blocks_outside {args}\necho \"$(no_port_block {args})\"\n")
    return subprocess.run(["bash", "-c", body], env={"PATH": "/usr/bin:/bin", "PORT_RANGES": str(tmp)},
                          capture_output=True, text=True)


def test_blocks_lie_outside_every_nodes_ephemeral_range(tmp_path):
    out = blocks(tmp_path, {"n1": "32768\t60999", "n2": "10000 20000"}).stdout.splitlines()
    bases = [int(b) for b in out if b.isdigit()]
    assert bases[0] == 20200  # from BASE_MIN up, past n2's range
    for b in bases:
        assert b + ports.STRIDE - 1 < 10000 or 20000 < b < 32768 - ports.STRIDE + 1 or b > 60999, b
        assert 1024 <= b and b + ports.STRIDE <= 65536
    assert 32400 in bases and 32600 not in bases and 61000 in bases and 9800 in bases


def test_no_block_outside_names_the_node_and_its_range(tmp_path):
    r = blocks(tmp_path, {"n1": "32768 60999", "n3": "1024 65535"})
    assert r.stdout.strip() == ("every block of 200 ports overlap the ephemeral range "
                                "(net.ipv4.ip_local_port_range) of n3 (ports 1024-65535)"), r.stdout
    r = blocks(tmp_path, {"n3": "10000 32767"}, 12000)  # placement.port_base inside it
    assert r.stdout.strip() == ("placement.port_base: ports 12000-12199 overlap the ephemeral range "
                                "(net.ipv4.ip_local_port_range) of n3 (ports 10000-32767)"), r.stdout
    assert blocks(tmp_path / "x", {"n3": "10000 32767"}, 33000).stdout.split()[0] == "33000"


def render_on_n3(cluster, tmp_path: Path, name: str) -> Path:
    run_dir = tmp_path / name
    r = cluster.slurmrl(
        "render", str(ROOT / "recipes" / "inference-debug.toml"), "--run-dir", str(run_dir),
        "--set", f'python.executable="{sys.executable}"', "--set", "inference.nodes=1",
        "--set", 'slurm.nodelist="n3"', "--set", "slurm.cpus_per_node=4", "--set", "slurm.grace_seconds=2",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    (run_dir / "job.sbatch").write_text(serve_with_ok_server((run_dir / "job.sbatch").read_text()))
    return run_dir


def sbatch(cluster, *args: str) -> int:
    r = cluster.run(["sbatch", "--parsable", *args])
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip().split(";")[0])


@pytest.mark.cluster
def test_two_jobs_whose_ids_share_a_slot_serve_side_by_side_on_one_node(slurm_cluster, tmp_path):
    run_dirs = [render_on_n3(slurm_cluster, tmp_path, "a"), render_on_n3(slurm_cluster, tmp_path, "b")]
    ids = [sbatch(slurm_cluster, str(run_dirs[0] / "job.sbatch"))]
    try:
        serve_side_by_side(slurm_cluster, run_dirs, ids)
    finally:  # whatever failed, no job of this test outlives it (one left running holds n3 for the next)
        slurm_cluster.run(["scancel", *map(str, ids)])
    for job_id in ids:
        assert not slurm_cluster.wait_no_job_processes(job_id)


def serve_side_by_side(slurm_cluster, run_dirs: list[Path], ids: list[int]) -> None:
    """Submit the second job with an id in the first one's slot (appended to ``ids`` as soon as it
    exists), and check both serve on n3 from different port blocks."""
    # Job ids are handed out in order, but other tests submit on the same cluster beside this one: use
    # up ids with held fillers until the slot is near, then submit the second job held until its own
    # id shares the first job's slot (each miss cancelled before it ran), and release it.
    fillers: list[int] = []
    last = ids[0]
    while (ids[0] - last - 1) % ports.SLOTS > 8:  # ids before the next one in the first job's slot
        last = sbatch(slurm_cluster, "--hold", "--wrap=true", "--output=/dev/null")
        fillers.append(last)
    for _ in range(3 * ports.SLOTS):  # a bound: each miss means another id was used, by us or by others
        second = sbatch(slurm_cluster, "--hold", str(run_dirs[1] / "job.sbatch"))
        if second % ports.SLOTS == ids[0] % ports.SLOTS:
            break
        fillers.append(second)
    slurm_cluster.run(["scancel", *map(str, fillers)])
    ids.append(second)  # cancelled with the first whatever happens next
    assert ports.base_for_job(ids[0]) == ports.base_for_job(second), (ids[0], second)
    assert slurm_cluster.run(["scontrol", "release", str(second)]).returncode == 0
    bases = []
    for run_dir in run_dirs:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not RunDir(run_dir).ready_file(0, "router", 0).exists():
            assert not RunDir(run_dir).failed_file(0).exists(), RunDir(run_dir).failed_file(0).read_text()
            time.sleep(1)
        assert RunDir(run_dir).ready_file(0, "router", 0).exists(), list(run_dir.rglob("*.log"))
        phases = [what for _, what in RunDir(run_dir).read_phases(0)]
        bases.append(int(next(p for p in phases if p.startswith("ports from ")).split()[2]))
    assert bases[0] != bases[1], bases
    assert ports.base_for_job(ids[0]) in bases  # one of them got the block its id points to
    urls = {read_ready(RunDir(d).ready_file(0, "inference", 0))[0] for d in run_dirs}
    assert len(urls) == 2 and all(u.startswith("http://n3:") for u in urls)


def render_waiting(cluster, tmp_path: Path, name: str) -> Path:
    """inference-debug on one node, its server the test double, and job.sbatch edited to wait for
    the file ``go`` in the run dir before it claims its ports (so the test can change the node first)."""
    run_dir = tmp_path / name
    r = cluster.slurmrl(
        "render", str(ROOT / "recipes" / "inference-debug.toml"), "--run-dir", str(run_dir),
        "--set", f'python.executable="{sys.executable}"', "--set", "inference.nodes=1",
        "--set", "slurm.cpus_per_node=4", "--set", "slurm.grace_seconds=2", cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    script = serve_with_ok_server((run_dir / "job.sbatch").read_text())
    mark = "# ---- ports: one table"
    assert mark in script
    script = script.replace(mark, f'until [[ -e {run_dir}/go ]]; do sleep 0.5; done\n{mark}')
    (run_dir / "job.sbatch").write_text(script)
    return run_dir


def node_of(cluster, job_id: int, deadline_s: float = 300) -> str:
    """The node of a running one-node job (jobs of others may hold the queue a while)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        state, node = (cluster.run(["squeue", "-h", "-j", str(job_id), "-o", "%T %N"]).stdout.split() + ["", ""])[:2]
        if state == "RUNNING" and node:
            return node
        time.sleep(1)
    raise AssertionError(f"job {job_id} did not start in {deadline_s}s")


def set_range(node: str, text: str) -> None:
    """This node's ephemeral range (per network namespace: the local cluster's node only)."""
    subprocess.run(["nsenter", f"--net=/run/netns/srl-{node}", "sysctl", "-qw",
                    f"net.ipv4.ip_local_port_range={text}"], check=True)


def range_of(node: str) -> str:
    return subprocess.run(["nsenter", f"--net=/run/netns/srl-{node}", "cat", "/proc/sys/net/ipv4/ip_local_port_range"],
                          check=True, capture_output=True, text=True).stdout.split()


def run_with_range(cluster, run_dir: Path, ports_range: str, until) -> str:
    """Submit ``run_dir``'s job alone on its node (--exclusive: no other job sees the change), set
    that node's ephemeral range to ``ports_range`` once it runs, let it claim its ports and wait for
    ``until(run_dir)``; the range is restored and the job cancelled whatever happens. Its node."""
    job_id = sbatch(cluster, "--exclusive", str(run_dir / "job.sbatch"))
    node, before = "", None
    try:
        node = node_of(cluster, job_id)
        before = range_of(node)
        set_range(node, ports_range)
        (run_dir / "go").touch()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not until(run_dir):
            time.sleep(1)
        assert until(run_dir), list(run_dir.rglob("*.log"))
    finally:
        if before is not None:
            set_range(node, " ".join(before))
        cluster.run(["scancel", str(job_id)])
    assert not cluster.wait_no_job_processes(job_id)
    return node


@pytest.mark.cluster
def test_ports_move_outside_a_lowered_ephemeral_range(slurm_cluster, tmp_path):
    run_dir = render_waiting(slurm_cluster, tmp_path, "moved")
    node = run_with_range(slurm_cluster, run_dir, "10000 32767",
                          lambda d: RunDir(d).ready_file(0, "router", 0).exists() or RunDir(d).failed_file(0).exists())
    assert not RunDir(run_dir).failed_file(0).exists(), RunDir(run_dir).failed_file(0).read_text()
    phases = [what for _, what in RunDir(run_dir).read_phases(0)]
    base = int(next(p for p in phases if p.startswith("ports from ")).split()[2])
    assert not 10000 - ports.STRIDE < base <= 32767, base  # the whole block outside the node's range
    assert (RunDir(run_dir).log_dir(0) / "ephemeral-ranges" / node).read_text().split() == [node, "10000", "32767"]
    url = read_ready(RunDir(run_dir).ready_file(0, "inference", 0))[0]
    assert url == f"http://{node}:{base + ports.offset('server_0')}"


@pytest.mark.cluster
def test_no_block_outside_the_ephemeral_range_stops_the_job_naming_node_and_range(slurm_cluster, tmp_path):
    run_dir = render_waiting(slurm_cluster, tmp_path, "stopped")
    node = run_with_range(slurm_cluster, run_dir, "1024 65535", lambda d: RunDir(d).failed_file(0).exists())
    why = RunDir(run_dir).failed_file(0).read_text()
    assert f"overlap the ephemeral range (net.ipv4.ip_local_port_range) of {node} (ports 1024-65535)" in why, why
    assert not RunDir(run_dir).ready_file(0, "inference", 0).exists()
