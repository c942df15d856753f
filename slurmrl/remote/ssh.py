"""One multiplexed OpenSSH connection per cluster: a master (ControlMaster) that every ssh and
rsync of slurmrl's commands to that cluster goes through.

The master is opened by the first command that needs the cluster (``ssh -M -N -f``; it asks
for a passphrase or a one-time code on the terminal when there is one, and never otherwise:
BatchMode), on a socket in ``$XDG_RUNTIME_DIR/slurmrl-ssh/`` (else, or when that path is too
long for a socket, ``/tmp/slurmrl-ssh-<uid>/``; mode 0700) named after the cluster's settings.
It stays up for the cluster's ``persist_s`` after the last command that used it (ssh's
ControlPersist), so a ``status`` a minute later reuses it, and then exits by itself; with ``persist_s = 0`` the command that opened it closes it
(``ssh -O exit``) when it ends. Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

from slurmrl.errors import UserError
from slurmrl.remote.clusters import Cluster

CONNECT_TIMEOUT_S = 15
OPEN_TIMEOUT_S = 60  # the master's whole start (connect, authenticate) without a terminal
OPEN_INTERACTIVE_TIMEOUT_S = 300  # with one: someone types a passphrase or a code
SAFETY_PERSIST_S = 60  # persist_s = 0: the master still ends by itself should this process die first
# a socket's path has at most 103 bytes (macOS; Linux 107), and ssh first binds NAME + 17 characters
MAX_DIR_CHARS = 103 - 1 - 12 - 17


def control_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "slurmrl-ssh" if base else None
    if path is None or len(str(path)) > MAX_DIR_CHARS:  # (macOS' $TMPDIR is long too)
        path = Path("/tmp") / f"slurmrl-ssh-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError as e:
        raise UserError(str(path), f"cannot make the ssh control folder: {e.strerror or e}") from None
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise UserError(str(path), "the ssh control folder must be yours and private (mode 0700)")
    return path


def launch(argv: list[str], why: str, late: str, timeout: float, **kw) -> subprocess.CompletedProcess:
    """subprocess.run, with a missing program (``why``: what it is for) and a time-out as one-line errors."""
    try:
        return subprocess.run(argv, text=True, timeout=timeout, **kw)
    except FileNotFoundError:
        raise UserError(None, f"{argv[0]} not found on PATH; {why}") from None
    except subprocess.TimeoutExpired:
        raise UserError(None, late) from None


def last_line(text: str | None, default: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else default


class Connection:
    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        key = "\0".join([cluster.name, cluster.destination, *cluster.ssh_options()])
        self.control = control_dir() / hashlib.sha256(key.encode()).hexdigest()[:12]
        self.opened = False  # a master is up for this process
        self.started = False  # and this process started it

    @property
    def label(self) -> str:
        return f"cluster {self.cluster.name} ({self.cluster.destination})"

    def env(self) -> dict[str, str]:
        """ssh's environment: ours without the forwarded secrets (they go over stdin, once, to sbatch;
        a master that lives on should not carry them)."""
        return {k: v for k, v in os.environ.items() if k not in self.cluster.forward_env}

    def ssh(self, *extra: str) -> list[str]:
        return ["ssh", *self.cluster.ssh_options(), "-o", f"ControlPath={self.control}",
                "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", "ServerAliveInterval=15",
                "-o", "ServerAliveCountMax=4", *extra]

    def alive(self) -> bool:
        if not self.control.exists():
            return False
        r = subprocess.run(self.ssh("-O", "check", self.cluster.destination), stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=CONNECT_TIMEOUT_S, env=self.env())
        return r.returncode == 0

    def open(self) -> None:
        if self.opened:
            return
        if not self.alive():
            self.control.unlink(missing_ok=True)  # a master that died leaves its socket behind
            interactive = sys.stdin.isatty() and sys.stderr.isatty()
            persist = self.cluster.persist_s or SAFETY_PERSIST_S
            argv = self.ssh("-o", "ControlMaster=yes", "-o", f"ControlPersist={persist}", "-N", "-f")
            if not interactive:
                argv += ["-o", "BatchMode=yes"]
            timeout = OPEN_INTERACTIVE_TIMEOUT_S if interactive else OPEN_TIMEOUT_S
            r = launch(argv + [self.cluster.destination], "--cluster needs OpenSSH's client",
                       f"{self.label}: no connection within {timeout}s", timeout,
                       stdin=None if interactive else subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, env=self.env())
            if r.returncode != 0:
                raise UserError(None, f"{self.label}: cannot connect: {last_line(r.stderr, 'ssh failed')}")
            self.started = True
        self.opened = True

    def argv(self, command: str) -> list[str]:
        """The ssh command line that runs ``command`` (one shell line for the login shell) on the
        cluster through the master (opened first)."""
        self.open()
        return self.ssh("-o", "ControlMaster=no", "-o", "BatchMode=yes", "-T", self.cluster.destination, command)

    def run(self, command: str, input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run ``command`` on the cluster; ``input`` is its stdin."""
        argv = self.argv(command)
        stdin = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=self.env(), **stdin)
        if r.returncode == 255:
            raise UserError(None, f"{self.label}: lost the connection: {last_line(r.stderr, 'ssh exited 255')}")
        return r

    def rsync_ssh(self) -> str:
        """rsync's ``-e``: ssh through the master."""
        return shlex.join(self.ssh("-o", "ControlMaster=no", "-o", "BatchMode=yes"))

    def rsync(self, args: list[str], timeout: float = 600) -> None:
        self.open()
        r = launch(["rsync", "-e", self.rsync_ssh(), *args], "--cluster copies run dirs with it",
                   f"{self.label}: rsync did not finish within {timeout:.0f}s", timeout,
                   stdin=subprocess.DEVNULL, capture_output=True, env=self.env())
        if r.returncode != 0:
            first = next((ln.strip() for ln in (r.stderr or "").splitlines() if ln.strip()), "")
            raise UserError(None, f"{self.label}: {first or f'rsync exited with code {r.returncode}'}")

    def exec(self, command: str, pty: bool) -> None:
        """Replace this process with ssh running ``command`` on the cluster (a terminal with ``pty``)."""
        self.open()
        argv = self.ssh("-o", "ControlMaster=no", "-t" if pty else "-T", self.cluster.destination, command)
        os.execvpe(argv[0], argv, self.env())

    def close(self) -> None:
        """With ``persist_s = 0``: end the master this process started; else leave it to ControlPersist."""
        if self.started and self.cluster.persist_s == 0:
            subprocess.run(self.ssh("-O", "exit", self.cluster.destination), stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=CONNECT_TIMEOUT_S, env=self.env())
            self.started = self.opened = False
