"""Real tests against the local Slurm cluster (fixture ``slurm_cluster``, tests/support/slurm_cluster.py)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

# A step that announces itself in $DIR, then waits up to 10 s for its partner: it prints
# "met" only if both steps ran at the same time (serialised steps print "alone").
MEET = r"""
touch "$DIR/$1"
for _ in $(seq 100); do
  if [ -e "$DIR/$2" ]; then echo "$1 met cvd=$CUDA_VISIBLE_DEVICES"; exit 0; fi
  sleep 0.1
done
echo "$1 alone cvd=$CUDA_VISIBLE_DEVICES"
"""


def ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


def two_steps(cluster, tmp_path, alloc: str, step: str) -> dict[str, tuple[str, str]]:
    """Run two steps `srun <step>` at once inside `sbatch <alloc>`: {name: (met|alone, cvd)}."""
    (tmp_path / "meet.sh").write_text(MEET)
    script = tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/bash\nexport DIR={tmp_path}\n"
        f"srun {step} bash {tmp_path}/meet.sh A B &\n"
        f"srun {step} bash {tmp_path}/meet.sh B A &\nwait\n"
    )
    ok(cluster.run(f"sbatch -W -o {tmp_path}/out.txt {alloc} {script}"))
    result = {}
    for line in (tmp_path / "out.txt").read_text().splitlines():
        if " cvd=" in line:
            name, status, cvd = line.split(" ")
            result[name] = (status, cvd.removeprefix("cvd="))
    assert set(result) == {"A", "B"}, (tmp_path / "out.txt").read_text()
    return result


def sacct_rows(cluster, job_id: str, want: set[str], timeout: float = 20) -> dict[str, str]:
    """Poll sacct (it lags slurmctld by ~1 s) until rows `want` are all COMPLETED."""
    deadline = time.monotonic() + timeout
    while True:
        out = ok(cluster.run(f"sacct -n -X -P -o JobID,State -j {job_id}"))
        rows = dict(line.split("|", 1) for line in out.splitlines() if "|" in line)
        if all(rows.get(k) == "COMPLETED" for k in want) or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def test_two_partitions_of_four_idle_nodes_with_four_gpus(slurm_cluster):
    # The cluster is machine-wide: nodes are idle unless some session has jobs queued.
    deadline = time.monotonic() + 30
    while True:
        rows = sorted(ok(slurm_cluster.run("sinfo -h -N -o '%N %t %G %c %m %P'")).split("\n")[:-1])
        busy = ok(slurm_cluster.run("squeue -h -o %i")).split()
        states = {r.split()[1] for r in rows}
        if states == {"idle"} or busy and states <= {"idle", "mix", "alloc"}:
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.5)
    assert [r.split()[::2] for r in rows] == [[f"n{i}", "gpu:4", "16000"] for i in range(1, 9)]
    assert [r.split()[3] for r in rows] == ["8"] * 8
    assert [r.split()[5] for r in rows] == ["debug*"] * 4 + ["debug2"] * 4  # debug: the default


def test_srun_on_n2_runs_on_n2(slurm_cluster):
    assert ok(slurm_cluster.run("srun -w n2 hostname")).strip() == "n2"


def test_a_name_the_hosts_file_cannot_answer_fails_instead_of_waiting_on_a_resolver(slurm_cluster):
    """A node's namespace reaches no name server: its resolv.conf names its own loopback, where
    nothing answers, so torchrun's reverse lookup of an IPv4-mapped client address fails at once
    (it waited 10 s on the machine's resolver, twice per trainer start)."""
    probe = ("import socket\ntry:\n    print(socket.getnameinfo(('::ffff:10.77.0.11', 1, 0, 0), 0))\n"
             "except socket.gaierror as e:\n    print('gaierror', e.errno)\nprint(socket.gethostbyname('n1'))")
    out = ok(slurm_cluster.run(["srun", "-w", "n2", sys.executable, "-c", probe])).split()
    assert out[-3:] == ["gaierror", "-3", "10.77.0.11"], out  # hosts-file names still resolve
    conf = ok(slurm_cluster.run("srun -w n2 cat /etc/resolv.conf"))
    assert conf.split("\n")[0] == "nameserver 127.0.0.1", conf


def test_the_second_stream_sends_a_scripts_het_groups_to_debug2(slurm_debug2, tmp_path):
    """slurm_debug2's jobs run on n5-n8 even where the script names partition debug, as every
    rendered job.sbatch does: SBATCH_PARTITION overrides each het group's #SBATCH --partition."""
    script = tmp_path / "het.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N1 --partition=debug\n#SBATCH hetjob\n#SBATCH -N1 --partition=debug\n"
                      "srun --het-group=0 hostname\nsrun --het-group=1 hostname\n")
    ok(slurm_debug2.run(f"sbatch -W --parsable -o {tmp_path}/out.txt {script}"))
    hosts = (tmp_path / "out.txt").read_text().split()
    assert len(hosts) == 2 and set(hosts) <= {"n5", "n6", "n7", "n8"}, hosts
    assert ok(slurm_debug2.run("srun hostname")).strip() in {"n5", "n6", "n7", "n8"}


def test_het_job_two_components_on_different_nodes(slurm_cluster, tmp_path):
    script = tmp_path / "het.sh"
    script.write_text(
        "#!/bin/bash\n#SBATCH -N1 -w n1\n#SBATCH hetjob\n#SBATCH -N1 -w n2\n"
        "srun --het-group=0 hostname\nsrun --het-group=1 hostname\n"
    )
    job_id = ok(slurm_cluster.run(f"sbatch -W --parsable -o {tmp_path}/out.txt {script}")).strip()
    assert (tmp_path / "out.txt").read_text().split() == ["n1", "n2"]
    rows = sacct_rows(slurm_cluster, job_id, {f"{job_id}+0", f"{job_id}+1"})
    assert rows.get(f"{job_id}+0") == "COMPLETED" and rows.get(f"{job_id}+1") == "COMPLETED", rows


def test_exact_steps_get_disjoint_gpus(slurm_cluster, tmp_path):
    # --exact steps run side by side only if the allocation has a CPU for each (-n2).
    got = two_steps(slurm_cluster, tmp_path, "-N1 -n2 --gres=gpu:4", "--exact -n1 --gres=gpu:2")
    assert got["A"][0] == got["B"][0] == "met", got
    gpus_a, gpus_b = (set(got[k][1].split(",")) for k in "AB")
    assert len(gpus_a) == len(gpus_b) == 2 and not gpus_a & gpus_b, got


@pytest.mark.parametrize(
    ("alloc", "step", "gpus"),
    [
        ("-N1 --gres=gpu:1", "--overlap --gres=gpu:1", "0"),
        ("-N1 --gres=gpu:4", "--exact --overlap --gres=gpu:4", "0,1,2,3"),
    ],
)
def test_overlap_steps_share_gpus(slurm_cluster, tmp_path, alloc, step, gpus):
    """Colocated components: --overlap steps run at once and both see the same GPUs."""
    got = two_steps(slurm_cluster, tmp_path, alloc, step)
    assert got == {"A": ("met", gpus), "B": ("met", gpus)}


def test_tcp_between_nodes_by_hostname(slurm_cluster):
    """n1 and n2 both bind the same port (own network namespaces); n1 reaches each by name."""
    port = 18000
    server = (
        "import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"
        " s.bind(('0.0.0.0', %d)); s.listen();"
        " print('ready', flush=True); c, _ = s.accept(); c.sendall(socket.gethostname().encode())"
    ) % port
    client = (
        "import socket\nfor h in ('n2', 'n1'):\n"
        "    print(socket.create_connection((h, %d), timeout=10).recv(100).decode())"
    ) % port
    servers = [
        subprocess.Popen(["srun", "-w", node, sys.executable, "-c", server],
                         env=slurm_cluster.env, stdout=subprocess.PIPE, text=True)
        for node in ("n2", "n1")
    ]
    try:
        for proc in servers:
            assert proc.stdout.readline().strip() == "ready"
        out = ok(slurm_cluster.run(["srun", "-w", "n1", sys.executable, "-c", client], timeout=60))
        assert out.split() == ["n2", "n1"]
        assert [proc.wait(timeout=30) for proc in servers] == [0, 0]
    finally:
        for proc in servers:
            if proc.poll() is None:
                proc.kill()
            proc.stdout.close()


def test_pyxis_double_applies_container_flags_like_pyxis(slurm_cluster, tmp_path):
    """The Pyxis test double (tests/support/pyxis_double) applies what Pyxis + enroot make observable, as far
    as it can without an image: mounts in the task's own mount namespace (read-only with :ro), the
    workdir as cwd (else /), / read-only with --container-readonly (/tmp stays writable), no LANG;
    its marker stands in for enroot's /.lock. It applies nothing to steps without the flags."""
    image = f"img-{uuid.uuid4().hex[:8]}"
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "f").write_text("from src\n")
    step = (f"srun -w n3 --container-image={image}:srun --container-readonly --container-mounts={src}:{dst}:ro "
            f"--container-workdir={dst} sh -c 'echo $SLURMRL_PYXIS_TEST_DOUBLE; pwd; cat f; "
            f"findmnt -n -o OPTIONS {dst} | cut -d, -f1; findmnt -n -o OPTIONS / | cut -d, -f1; "
            f"echo LANG=${{LANG-unset}}; touch {tmp_path}/written && echo tmp writable'")
    out = ok(slurm_cluster.run(step, env={"LANG": "C.UTF-8"})).splitlines()
    assert out == ["tests/pyxis_double: Pyxis options applied without an image", str(dst), "from src", "ro", "ro",
                   "LANG=unset", "tmp writable"]
    plain = ok(slurm_cluster.run(f"srun -w n3 sh -c 'echo ${{SLURMRL_PYXIS_TEST_DOUBLE-none}}; "
                                 f"findmnt {dst} >/dev/null || echo not mounted'"))
    assert plain.split() == ["none", "not", "mounted"]
    ok(slurm_cluster.run(
        f"sbatch -W -o {tmp_path}/out.txt --container-image={image}:sbatch "
        "--wrap 'echo ${SLURMRL_PYXIS_TEST_DOUBLE:+marker}; pwd'"
    ))
    assert (tmp_path / "out.txt").read_text().split() == ["marker", "/"]
    log = (slurm_cluster.state_dir / "log" / "pyxis_double.log").read_text()
    assert "ctx=remote host=n3" in log and f"--container-image={image}:srun" in log
    assert f"--container-image={image}:sbatch" in log


@pytest.mark.parametrize("cmd", ["srun --container-foo=x true", "sbatch --container-foo=x --wrap true"])
def test_unknown_container_flag_fails(slurm_cluster, cmd):
    r = slurm_cluster.run(cmd)
    assert r.returncode != 0 and "unrecognized option" in r.stderr, r
