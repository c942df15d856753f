"""What a step can see of the Pyxis + enroot container it runs in (standard library only).

``observe()`` is called by the preflight probe inside each step; ``slurmrl.app.preflight``
compares the result with the plan's ``--container-*`` flags. Everything recorded here is what a
real Pyxis step makes observable (sources: github.com/NVIDIA/pyxis, github.com/NVIDIA/enroot):

- ``enroot_lock``: enroot opens ``<rootfs>/.lock`` while it configures every container and then
  bind-mounts it read-only at ``/.lock`` (enroot ``src/runtime.sh``, ``lock_file="/.lock"``);
  ``enroot list --fancy`` itself finds container processes by ``/proc/<pid>/root/.lock``.
  Pyxis clears the environment it hands enroot and enroot's switchroot starts the container from
  an env file only, so no ``PYXIS_*``/``ENROOT_*`` variable marks a container step.
- ``rootfs``: the ``root`` field of the ``/`` mount in /proc/self/mountinfo. enroot bind-mounts
  the container directory ``$ENROOT_DATA_PATH/<name>`` and pivots into it, so its basename is the
  container name (``enroot list --fancy`` reads it the same way); Pyxis names containers
  ``pyxis_<name>`` / ``pyxis_<jobid>_<name>`` (``--container-name``) or ``pyxis_<jobid>.<stepid>``.
- ``mounts``: every mount point (as seen from inside) with ``ro``/``rw``. ``--container-mounts``
  entries become enroot fstab lines (Pyxis ``pyxis_slurmstepd.c`` ``enroot_create_start_config``)
  mounted at DST inside the rootfs; ``--container-mount-home`` makes enroot's ``10-home.sh`` hook
  bind the home directory at ``$HOME`` (``/root`` with ``--container-remap-root``).
- ``readonly_root``: enroot remounts the rootfs read-only unless ``ENROOT_ROOTFS_WRITABLE``, which
  Pyxis sets from ``--container-writable`` (y) / ``--container-readonly`` (n).
- ``cwd``: Pyxis ``chdir``s to ``--container-workdir``, else to the container's own working
  directory (the image's WorkingDir, ``/`` without one).
- ``uid``/``uid_map``: unprivileged enroot runs in a user namespace; ``--container-remap-root``
  maps the job's uid to 0 (``uid_map`` ``0 <uid> 1``), ``--no-container-remap-root`` keeps it.
- ``test_double``: set only by the Pyxis TEST DOUBLE (tests/support/pyxis_double), which runs no image:
  the checks that need a real enroot rootfs (``/.lock``, the container name) are skipped there.
"""

from __future__ import annotations

import os
import re

from slurmrl.contract import job_env
from slurmrl.contract.probe_report import ContainerObservation

MOUNTINFO = "/proc/self/mountinfo"
ENROOT_LOCK = "/.lock"
TEST_DOUBLE_ENV = job_env.PYXIS_TEST_DOUBLE

_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[dict]:
    """Lines of /proc/<pid>/mountinfo (proc(5)) -> [{point, root, fstype, ro}] in kernel order."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 10 or "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        post = fields[sep + 1:]
        options = fields[5].split(",") + (post[2].split(",") if len(post) > 2 else [])
        out.append({
            "point": _unescape(fields[4]), "root": _unescape(fields[3]),
            "fstype": post[0] if post else "?", "ro": "ro" in options,
        })
    return out


def observe() -> ContainerObservation:
    """What this process sees of its container. Never raises: a failed look is None and an ``errors`` line."""
    errors: list[str] = []

    def look(key, fn):
        try:
            return fn()
        except (OSError, ValueError) as e:
            errors.append(f"{key}: {e}")
            return None

    enroot_lock = look("enroot_lock", lambda: os.path.exists(ENROOT_LOCK))
    try:
        with open(MOUNTINFO) as f:
            entries = parse_mountinfo(f.read())
    except OSError as e:
        entries = []
        errors.append(f"{MOUNTINFO}: {e}")
    top = {e["point"]: e for e in entries}  # the last mount listed at a point is the visible one
    root = top.get("/")
    mounts = {p: "ro" if e["ro"] else "rw" for p, e in sorted(top.items())}
    readonly_root = look("readonly_root", lambda: bool(os.statvfs("/").f_flag & os.ST_RDONLY))
    cwd = look("cwd", os.getcwd)

    def uid_map():
        with open("/proc/self/uid_map") as f:
            return " ".join(f.readline().split())

    mapped = look("uid_map", uid_map)
    return ContainerObservation(
        enroot_lock=enroot_lock, rootfs=root["root"] if root else None, rootfs_type=root["fstype"] if root else None,
        mounts=mounts, readonly_root=readonly_root, cwd=cwd, uid=os.getuid(), gid=os.getgid(),
        uid_map=mapped, job_uid=os.environ.get("SLURM_JOB_UID"), home=os.environ.get("HOME"),
        test_double=os.environ.get(TEST_DOUBLE_ENV), errors=tuple(errors))
