"""The clusters file: what ``--cluster NAME`` connects to. Standard library only.

Where it is: ``$SLURMRL_CLUSTERS``, else ``$XDG_CONFIG_HOME/slurmrl/clusters.toml``, else
``~/.config/slurmrl/clusters.toml``. One table per cluster::

    [eos]
    host = "login.eos.example.com"        # required: a host name, or a Host alias of your ssh config
    workdir = "/lustre/me/slurmrl-runs"   # required: run dirs go to WORKDIR/<name> on the cluster
    user = "me"                           # default: ssh's (your ssh config, else your login name)
    port = 22                             # default: ssh's
    jump = "me@bastion.example.com"       # ProxyJump: [user@]host[:port][,...]
    ssh_config = "~/.ssh/eos.config"      # ssh -F FILE instead of ~/.ssh/config (jump hosts read it too)
    forward_env = ["WANDB_API_KEY", "HF_TOKEN"]  # the default: secrets sbatch hands the job, sent over ssh's stdin
    persist_s = 300                       # the connection's life after the last command (0: closed at its end)

Every mistake is one line naming the file and the field (exit 2).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from slurmrl import toml_errors
from slurmrl.errors import UserError
from slurmrl.rundir.read import read_text

ENV = "SLURMRL_CLUSTERS"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
HOST = re.compile(r"[A-Za-z0-9_.\[\]:%][A-Za-z0-9_.\[\]:%-]*")  # a name, an address, an ssh Host alias
USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
JUMP = re.compile(r"[A-Za-z0-9_.\[\]@:%][A-Za-z0-9_.\[\]@:%,-]*")
# goes into job.sbatch, rsync and ssh command lines; ',' and ':' would break Pyxis' mount list
WORKDIR = re.compile(r"/[A-Za-z0-9_./+@-]*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FORWARD_ENV = ("WANDB_API_KEY", "HF_TOKEN")
PERSIST_S = 300
MAX_PERSIST_S = 86400


@dataclass(frozen=True)
class Cluster:
    name: str
    host: str
    workdir: str
    source: Path  # the clusters file it came from
    user: str | None = None
    port: int | None = None
    jump: str | None = None
    ssh_config: str | None = None
    forward_env: tuple[str, ...] = FORWARD_ENV
    persist_s: int = PERSIST_S

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    def ssh_options(self) -> list[str]:
        """The ``ssh`` options every connection to this cluster takes."""
        opts = ["-F", self.ssh_config] if self.ssh_config else []
        if self.port is not None:
            opts += ["-p", str(self.port)]
        if self.jump:
            opts += ["-J", self.jump]
        return opts


def path() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "slurmrl" / "clusters.toml"


def read(source: Path) -> dict:
    text = read_text(source, missing=None)
    if text is None:
        how = f"set ${ENV} or write it" if not os.environ.get(ENV) else "write it"
        raise UserError(str(source), f"no clusters file; {how} (one [NAME] table with host and workdir, "
                                     "see docs/slurm.md 'From a laptop')")
    try:
        return toml_errors.loads(text)
    except ValueError as e:
        raise UserError(str(source), f"not valid TOML: {e}") from None


def _string(where: str, value, pattern: re.Pattern, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise UserError(where, f"should be a non-empty string (got {value!r})")
    if not pattern.fullmatch(value):
        raise UserError(where, f"{value!r} is not {what}")
    return value


def _int(where: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UserError(where, f"should be a whole number from {low} to {high} (got {value!r})")
    return value


def _file(where: str, value, source: Path) -> str:
    if not isinstance(value, str) or not value:
        raise UserError(where, f"should be a path (got {value!r})")
    found = Path(value).expanduser()
    found = found if found.is_absolute() else source.parent / found
    if not found.is_file():
        raise UserError(where, f"{found} is not a file")
    return str(found)


def _names(where: str, names) -> tuple[str, ...]:
    if not isinstance(names, list):
        raise UserError(where, f"should be a list of environment variable names (got {names!r})")
    for i, n in enumerate(names):
        _string(f"{where}.{i}", n, ENV_NAME, "an environment variable name")
    return tuple(names)


def parse(name: str, table, source: Path) -> Cluster:
    """One cluster's table, checked field by field."""
    at = f"{source}: {name}"
    if not isinstance(table, dict):
        raise UserError(at, "should be a table: [NAME] with host = ... and workdir = ...")
    allowed = {"host", "workdir", "user", "port", "jump", "ssh_config", "forward_env", "persist_s"}
    for key in table:
        if key not in allowed:
            raise UserError(f"{at}.{key}", f"unknown key; allowed: {', '.join(sorted(allowed))}")
    for key in ("host", "workdir"):
        if key not in table:
            raise UserError(f"{at}.{key}", "is required")
    fields: dict = {
        "host": _string(f"{at}.host", table["host"], HOST, "a host name or address (user and port have their own keys)"),
        "workdir": _string(f"{at}.workdir", table["workdir"], WORKDIR,
                           "an absolute path of letters, digits and _ . - + @ / (it goes into job.sbatch and "
                           "ssh and rsync command lines)"),
    }
    optional = {
        "user": lambda w, v: _string(w, v, USER, "a user name"),
        "port": lambda w, v: _int(w, v, 1, 65535),
        "jump": lambda w, v: _string(w, v, JUMP, "[user@]host[:port] (ssh's ProxyJump)"),
        "ssh_config": lambda w, v: _file(w, v, source),
        "forward_env": _names,
        "persist_s": lambda w, v: _int(w, v, 0, MAX_PERSIST_S),
    }
    for key, check in optional.items():
        if key in table:
            fields[key] = check(f"{at}.{key}", table[key])
    return Cluster(name=name, source=source, **fields)


def load(name: str, source: Path | None = None) -> Cluster:
    """The cluster ``name`` of the clusters file (every table of it is checked)."""
    source = source or path()
    data = read(source)
    clusters = {}
    for key, table in data.items():
        if not NAME.fullmatch(key):
            raise UserError(f"{source}: {key}", "is not a cluster name (letters, digits, _ . -)")
        clusters[key] = parse(key, table, source)
    if name not in clusters:
        have = ", ".join(sorted(clusters)) or "none"
        raise UserError("--cluster", f"no cluster {name!r} in {source} (it has: {have})")
    return clusters[name]
