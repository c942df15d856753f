"""`--cluster NAME` (slurmrl.remote): submit, status, logs -f, attach and cancel from a "laptop"
through a real OpenSSH server on loopback in front of the local Slurm.

The server is Debian's OpenSSH sshd (package openssh-server, installed by scripts/install.sh),
started by the `sshd` fixture on 127.0.0.1 only, with a host key, a user key and authorized_keys
made in tmp, key authentication only. It runs each command through the user's login shell with
the local cluster's client variables (sshd_config's SetEnv SLURM_CONF=...), as a login node's
shell would have them. The laptop is a folder and an environment without them: a Slurm command
that ran here instead of over ssh would fail. The job is the sft-debug gallery recipe on the
tiny model, told to run far longer than the test, which cancels it.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
from polling import wait_for

from slurmrl import cli
from slurmrl.runtime.fixtures.tiny_model import build as build_tiny

ROOT = Path(__file__).resolve().parent.parent
SSHD = Path("/usr/sbin/sshd")
WANDB_KEY = "wandb-test-key-7f3a9c1e5b"  # what the laptop forwards; must reach the job and nothing else


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


class Sshd:
    """OpenSSH's sshd on 127.0.0.1:port; `stop()` ends it and what it started (by pid)."""

    def __init__(self, where: Path, env: dict[str, str]):
        if not SSHD.exists():
            pytest.fail(f"{SSHD} is missing: `bash scripts/install.sh` installs Debian's openssh-server", pytrace=False)
        self.where, self.port, self.user = where, free_port(), getpass.getuser()
        host_pub = keygen(where / "host_key")
        (where / "authorized_keys").write_text(keygen(where / "user_key") + "\n")
        setenv = " ".join(f"{k}={v}" for k, v in env.items())
        (where / "sshd_config").write_text(f"""\
ListenAddress 127.0.0.1
Port {self.port}
HostKey {where}/host_key
AuthorizedKeysFile {where}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
PidFile {where}/sshd.pid
SetEnv {setenv}
""")
        # the client's side: which key, and the server's host key (no trust on first use)
        (where / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_pub}\n[localhost]:{self.port} {host_pub}\n")
        (where / "ssh_config").write_text(f"""\
Host *
  IdentityFile {where}/user_key
  IdentitiesOnly yes
  UserKnownHostsFile {where}/known_hosts
  StrictHostKeyChecking yes
""")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        self.log = open(where / "sshd.log", "w")
        self.proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(where / "sshd_config")],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert self.proc.poll() is None, (where / "sshd.log").read_text()
                time.sleep(0.1)
        raise AssertionError("sshd did not listen: " + (where / "sshd.log").read_text())

    def stop(self) -> None:
        try:
            tree = [self.proc, *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for p in tree:
            try:
                p.terminate()
            except (psutil.NoSuchProcess, ProcessLookupError):
                pass
        self.proc.wait(timeout=10)
        self.log.close()


def runtime_dir() -> Path:
    """An XDG_RUNTIME_DIR for the ssh control sockets: short (a socket's path has at most 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix="srl-", dir="/tmp"))


def close_masters(control: Path) -> None:
    """End the ssh masters the commands left persisting (ssh -O exit on each socket)."""
    for sock in control.glob("slurmrl-ssh/*"):
        subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "x"], capture_output=True, timeout=15)


@pytest.fixture
def laptop(tmp_path, monkeypatch):
    """A clusters file and an environment with no Slurm in it (for in-process CLI calls)."""
    for k in list(os.environ):
        if k.startswith("SLURM"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("SLURMRL_CLUSTERS", str(tmp_path / "clusters.toml"))
    run = runtime_dir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    close_masters(run)
    shutil.rmtree(run, ignore_errors=True)


def one_line_error(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("slurmrl: error: "), err
    return err.removeprefix("slurmrl: error: ").strip()


def test_clusters_file_and_dead_host_errors(laptop, capsys):
    """Every mistake in the clusters file, an unknown cluster and a host nobody answers on:
    one line naming what is wrong, exit 2, no traceback."""
    clusters = laptop / "clusters.toml"
    status = ["status", "123", "--cluster", "c"]
    assert "no clusters file" in one_line_error(capsys, status)
    cases = {
        'host = "h"': "c.workdir: is required",
        'host = "h"\nworkdir = "runs"': "c.workdir: 'runs' is not an absolute path",
        'host = "h"\nworkdir = "/w"\nport = 70000': "c.port: should be a whole number from 1 to 65535",
        'host = "h"\nworkdir = "/w"\nhots = 1': "c.hots: unknown key; allowed:",
        'host = "-oProxyCommand=x"\nworkdir = "/w"': "c.host: '-oProxyCommand=x' is not a host name",
        'host = "h"\nworkdir = "/w"\nssh_config = "nope"': "c.ssh_config:",
        'host = "h"\nworkdir = "/w"\nforward_env = ["A B"]': "c.forward_env.0: 'A B' is not an environment variable",
        'host = "h"\nworkdir = "/w"\npersist_s = -1': "c.persist_s: should be a whole number from 0",
        'host = "h"\nworkdir = "/w" x': "not valid TOML",
    }
    for body, expected in cases.items():
        clusters.write_text(f"[c]\n{body}\n")
        assert expected in one_line_error(capsys, status), body
    clusters.write_text('[other]\nhost = "h"\nworkdir = "/w"\n')
    assert one_line_error(capsys, status) == f"--cluster: no cluster 'c' in {clusters} (it has: other)"
    # nothing listens on this loopback port: ssh's own words, in one line
    port = free_port()
    clusters.write_text(f'[c]\nhost = "127.0.0.1"\nport = {port}\nworkdir = "/w"\n')
    err = one_line_error(capsys, status)
    assert err.startswith("cluster c (127.0.0.1): cannot connect:") and "Connection refused" in err, err


def processes_with(text: str) -> list[str]:
    """``pid cmdline`` of every process whose command line holds ``text``."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if text.encode() in cmd:
            found.append(f"{p.name} {cmd[:200].decode(errors='replace')}")
    return found


def files_with(text: str, *roots: Path) -> list[str]:
    hits = []
    for root in roots:
        for f in root.rglob("*"):
            try:
                if f.is_file() and not f.is_socket() and text.encode() in f.read_bytes():
                    hits.append(str(f))
            except OSError:
                continue
    return hits


def job_environ_has(job_id: str, entry: str) -> bool:
    for p in Path("/proc").iterdir():
        try:
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in env and entry.encode() in env:
            return True
    return False


def log_tails(run_dir: Path) -> str:
    logs = sorted((run_dir / "logs").rglob("*.log")) + sorted((run_dir / "logs").glob("batch-*"))
    return "\n".join(f"== {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:]) for p in logs[-6:])


@pytest.mark.cluster
def test_submit_status_logs_attach_cancel_over_ssh(slurm_cluster, tmp_path):
    sshd = Sshd(tmp_path, slurm_cluster.cluster_vars)
    work = tmp_path / "cluster-work"  # the cluster's side: run dirs go to WORK/<name>
    home = tmp_path / "laptop"  # the laptop's side: runs/<name>
    home.mkdir()
    run = runtime_dir()  # XDG_RUNTIME_DIR: the ssh control sockets
    cfg = tmp_path / "ssh_config"
    (tmp_path / "clusters.toml").write_text(f"""\
[loop]
host = "127.0.0.1"
port = {sshd.port}
user = "{sshd.user}"
workdir = "{work}"
ssh_config = "{cfg}"

[loop-jump]   # the same server, reached through itself as the jump host
host = "localhost"
port = {sshd.port}
user = "{sshd.user}"
jump = "{sshd.user}@127.0.0.1:{sshd.port}"
workdir = "{work}"
ssh_config = "{cfg}"

[loop-once]   # persist_s = 0: the command that opens the connection closes it
host = "127.0.0.1"
port = {sshd.port}
workdir = "{work}"
ssh_config = "{cfg}"
persist_s = 0
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(SLURMRL_CLUSTERS=str(tmp_path / "clusters.toml"), XDG_RUNTIME_DIR=str(run), WANDB_API_KEY=WANDB_KEY)

    def slurmrl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "slurmrl", *args], cwd=home, env=env, capture_output=True,
                              text=True, timeout=timeout)

    tiny = build_tiny(tmp_path / "tiny")
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say {w}:", "completion": f" {w}\n"}) + "\n"
                            for w in ["abc", "bca", "cab"] * 20))
    local_run = home / "runs" / "sft-debug"
    remote_run = work / "sft-debug"
    job_ids = []
    follower = None
    t0 = time.monotonic()

    def mark(what: str) -> None:  # where the test's time goes (pytest -s shows it)
        print(f"test_remote: {time.monotonic() - t0:5.1f}s {what}", flush=True)

    try:
        # submit, watching every process's command line while it runs (the key must be in none)
        seen: list[str] = []
        stop = threading.Event()

        def watch_argv():
            while not stop.is_set():
                seen.extend(processes_with(WANDB_KEY))
                time.sleep(0.02)

        watcher = threading.Thread(target=watch_argv)
        watcher.start()
        try:
            r = slurmrl("submit", str(ROOT / "recipes" / "sft-debug.toml"), "--cluster", "loop",
                        "--set", f'model.path="{tiny}"', "--set", f'python.executable="{sys.executable}"',
                        "--set", f'trainer.dataset="{data}"', "--set", "trainer.max_steps=100000",
                        "--set", "trainer.checkpoint_every=100000", "--set", "slurm.grace_seconds=5",
                        "--set", "slurm.gpus_per_node=1", "--set", "slurm.cpus_per_node=2")  # a node's corner
        finally:
            stop.set()
            watcher.join()
        assert r.returncode == 0, r.stdout + r.stderr
        assert not seen, seen
        mark("submitted")
        job_id = json.loads((local_run / "jobs.json").read_text())[-1]["job_id"]
        job_ids.append(job_id)
        assert f"submitted job {job_id} to cluster loop (it runs in {remote_run})" in r.stdout
        # rendered here for the cluster's path, copied there, recorded here with the cluster's name
        assert re.search(rf"^RUN_DIR={re.escape(str(remote_run))}$", (local_run / "job.sbatch").read_text(), re.M)
        assert (remote_run / "job.sbatch").read_bytes() == (local_run / "job.sbatch").read_bytes()
        assert json.loads((local_run / "jobs.json").read_text())[-1]["cluster"] == "loop"
        assert json.loads((remote_run / "jobs.json").read_text())[-1]["job_id"] == job_id

        follower = subprocess.Popen([sys.executable, "-m", "slurmrl", "logs", str(local_run), "-f", "--cluster", "loop"],
                                    cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        last = {}

        def trainer_runs():
            r = slurmrl("status", str(local_run), "--json", "--cluster", "loop")
            assert r.returncode == 0, r.stderr
            rep = last["status"] = json.loads(r.stdout)
            trainer = next(c for c in rep["components"] if c["name"] == "trainer")
            ok = rep["state"] == "RUNNING" and (trainer["step"] or {}).get("state") == "RUNNING"
            # metrics come back with the logs: the trainer is past its first steps
            return rep if ok and (local_run / "metrics" / "trainer.jsonl").exists() else None

        rep = wait_for(trainer_runs, "the trainer to run and its metrics to come back", 150, poll=1,
                       detail=lambda: f"{json.dumps(last.get('status'))[:3000]}\n{log_tails(remote_run)}")
        node = rep["parts"][0]["nodes"]
        mark("the trainer runs and its metrics came back")
        # the WANDB key reached the job (sbatch's environment), over ssh's stdin
        assert job_environ_has(job_id, f"WANDB_API_KEY={WANDB_KEY}")
        # the job's secret was made there and stays there
        assert (remote_run / "secret").is_file() and not (local_run / "secret").exists()
        job_secret = (remote_run / "secret").read_text().strip()

        # status without --cluster: the run dir remembers where its job went
        r = slurmrl("status", str(local_run))
        assert r.returncode == 0 and r.stdout.startswith(f"job {job_id}: RUNNING"), r.stdout + r.stderr
        # attach: srun --overlap on the cluster, through the same connection
        r = slurmrl("attach", str(local_run), "trainer", "--cluster", "loop", "--", "hostname")
        assert r.returncode == 0 and r.stdout.strip() == node, r.stdout + r.stderr
        # through a jump host, by job id
        r = slurmrl("status", job_id, "--cluster", "loop-jump")
        assert r.returncode == 0 and f"job {job_id}: RUNNING" in r.stdout, r.stdout + r.stderr
        # one master per cluster, left up for its persist_s
        masters = sorted((run / "slurmrl-ssh").iterdir())
        assert len(masters) == 2, masters
        assert all(subprocess.run(["ssh", "-S", str(m), "-O", "check", "x"], capture_output=True).returncode == 0
                   for m in masters)
        # persist_s = 0: the command closes the master it opened
        r = slurmrl("status", job_id, "--cluster", "loop-once")
        assert r.returncode == 0 and f"job {job_id}: RUNNING" in r.stdout, r.stdout + r.stderr
        assert len(list((run / "slurmrl-ssh").iterdir())) == 2
        mark("status, attach, jump host, persist_s = 0")

        r = slurmrl("cancel", str(local_run), "--cluster", "loop")
        assert r.returncode == 0 and f"job {job_id}: CANCELLED" in r.stdout, r.stdout + r.stderr
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 0, err
        assert "trainer.0.log: " in out and f"slurmrl: job {job_id} ended: CANCELLED" in err, (out[-2000:], err)
        mark("cancelled, logs -f ended")

        # submit the run dir again: the first job's outputs are set aside there too
        r = slurmrl("diff", str(local_run))  # re-rendered for the cluster's path: no edits
        assert r.returncode == 0 and "no changes" in r.stdout, r.stdout + r.stderr
        r = slurmrl("submit", str(local_run), "--cluster", "loop")
        assert r.returncode == 0 and "edited by hand" not in r.stdout, r.stdout + r.stderr
        second = json.loads((local_run / "jobs.json").read_text())[-1]["job_id"]
        job_ids.append(second)
        assert (remote_run / "logs" / f"job-{job_id}" / "attempt-0" / "trainer.0.log").is_file()
        assert (local_run / "logs" / f"job-{job_id}" / "attempt-0" / "trainer.0.log").is_file()
        r = slurmrl("cancel", str(local_run))
        assert r.returncode == 0 and f"job {second}" in r.stdout, r.stdout + r.stderr
        mark("submitted again and cancelled")

        # the secrets: in no file here or there (the job's secret in none but its own), on no command line
        assert not files_with(WANDB_KEY, home, work, run, tmp_path / "tiny"), "WANDB key written to a file"
        assert files_with(job_secret, home, work, run) == [str(remote_run / "secret")]
        assert not processes_with(WANDB_KEY) and not processes_with(job_secret)

        # the connection dies: one line, exit 2
        close_masters(run)
        sshd.stop()
        r = slurmrl("status", str(local_run))
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith("slurmrl: error: cluster loop (") and "cannot connect" in r.stderr, r.stderr
        mark("secrets checked, dead server")
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
        for j in job_ids:
            slurm_cluster.run(["scancel", str(j)])
        close_masters(run)
        shutil.rmtree(run, ignore_errors=True)
        if sshd.proc.poll() is None:
            sshd.stop()
