"""The container part of preflight, without a cluster: what a step observes of its Pyxis + enroot
container (slurmrl.runtime.steps.container) against what the plan's --container-* flags imply
(slurmrl.app.preflight.check_container). Observations below are made up in the shape a real
Pyxis step gives (see the module docstring of slurmrl.runtime.steps.container for the sources)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest

from slurmrl.app.preflight import Mount, check_container, container_plan
from slurmrl.contract.probe_report import ContainerObservation
from slurmrl.contract.reader import ContractError
from slurmrl.runtime.steps import container

RUN = "/cluster/runs/rl"
FLAGS = ("--container-image=nvcr.io#nvidia/pytorch:24.01-py3", f"--container-mounts={RUN}:{RUN},/data:/mnt/data:ro")


def real(**kw) -> ContainerObservation:
    """A step in a real enroot container: /.lock, rootfs pyxis_<job>.<step>, / read-only (read from JSON as
    the probe writes it)."""
    obs = {
        "errors": [], "enroot_lock": True, "rootfs": "/home/u/.local/share/enroot/pyxis_77.0",
        "rootfs_type": "ext4", "readonly_root": True, "cwd": "/workspace", "uid": 1000, "gid": 1000,
        "uid_map": "1000 1000 1", "job_uid": "1000", "home": "/home/u", "test_double": None,
        "mounts": {"/": "ro", "/.lock": "ro", "/proc": "rw", "/tmp": "rw", "/etc/hosts": "ro",
                   RUN: "rw", "/mnt/data": "ro"},
    }
    obs.update(kw)
    return ContainerObservation.from_json(obs, "real()")


def double(**kw) -> ContainerObservation:
    """A step under tests/support/pyxis_double: the host's root, no /.lock, the double's marker."""
    return real(enroot_lock=False, rootfs="/", test_double="tests/pyxis_double", readonly_root=False,
                uid=0, job_uid="0", uid_map="0 0 4294967295", **kw)


# ---- parsing the flags the way Pyxis does ------------------------------------------------------

def test_container_plan_parses_pyxis_flags():
    want = container_plan((
        "--container-image=img", "--container-mounts=/a:/b,/c,tmpfs:/t,rel:x/../y:ro+rprivate",
        "--container-workdir=/w", "--container-name=cache:no_exec", "--container-env=A,B",
        "--container-readonly", "--no-container-remap-root", "--container-mount-home",
    ))
    assert want.image == "img" and want.workdir == "/w" and want.name == "cache"
    assert want.mounts == (Mount("/a", "/b", ()), Mount("/c", "/c", ()), Mount("tmpfs", "/t", ()),
                           Mount("rel", "/y", ("ro", "rprivate")))
    assert (want.writable, want.remap_root, want.mount_home) == (False, False, True)
    assert container_plan(("--container-image=i", "--container-writable", "--container-remap-root")).writable is True
    assert container_plan(()).image is None


# ---- what a real container passes ----------------------------------------------------------------

def test_a_real_container_matching_the_flags_passes():
    cell, problems = check_container(FLAGS, real())
    assert problems == []
    assert cell == "enroot /:ro mounts 2/2"


def test_every_flag_a_real_container_shows():
    flags = FLAGS + ("--container-workdir=/workspace", "--container-readonly", "--container-remap-root",
                     "--container-mount-home", "--container-name=cache", "--container-env=HF_TOKEN",
                     "--no-container-entrypoint")
    obs = real(uid=0, uid_map="0 1000 1", home="/root", rootfs="/home/u/.local/share/enroot/pyxis_cache",
               mounts={**real().mounts, "/root": "rw"})
    assert check_container(flags, obs) == ("enroot /:ro mounts 2/2", [])
    # container_scope=job names it pyxis_<jobid>_<name>
    assert check_container(flags, replace(obs, rootfs="/var/enroot/pyxis_77_cache"))[1] == []
    writable = FLAGS + ("--container-writable", "--no-container-remap-root")
    assert check_container(writable, real(readonly_root=False)) == ("enroot /:rw mounts 2/2", [])


def test_no_plan_no_container_is_quiet():
    assert check_container((), real(enroot_lock=False, rootfs="/")) == ("-", [])
    assert check_container((), None) == ("-", [])
    # a named container without an image is a container too (Pyxis reuses pyxis_<name>)
    named = real(rootfs="/enroot/pyxis_cache")
    assert check_container(("--container-name=cache",), named) == ("enroot /:ro mounts 0/0", [])


# ---- each mismatch, named -------------------------------------------------------------------------

def test_a_step_outside_any_container_says_the_flags_are_missing():
    for obs in (None, real(enroot_lock=False), real(enroot_lock=None)):  # the last: /.lock could not be looked at
        cell, problems = check_container(FLAGS, obs)
        assert cell == "none" and len(problems) == 1
        assert problems[0].startswith("container flags missing"), problems
    with pytest.raises(ContractError, match="^old.json: key 'errors' is missing$"):  # a report of another shape
        ContainerObservation.from_json({"PYXIS_VERSION": "0.20"}, "old.json")


def test_a_container_the_plan_does_not_have():
    cell, problems = check_container((), real())
    assert cell == "container" and "plan does not have" in problems[0]


def test_missing_and_writable_mounts():
    mounts = {k: v for k, v in real().mounts.items() if k != RUN}
    _, problems = check_container(FLAGS, real(mounts={**mounts, "/mnt/data": "rw"}))
    assert problems == [f"nothing mounted at {RUN} (--container-mounts {RUN}:{RUN})",
                        "/mnt/data is mounted rw, the plan mounts it ro"]
    cell, _ = check_container(FLAGS, real(mounts={"/": "ro"}))
    assert cell.endswith("mounts 0/2")


def test_umount_entries_are_not_expected_to_be_mounts():
    flags = ("--container-image=i", "--container-mounts=umount:/opt/x")
    assert check_container(flags, real()) == ("enroot /:ro mounts 0/0", [])


def test_workdir_readonly_writable_uid_home_and_name():
    def one(flag, **obs):
        problems = check_container(FLAGS + (flag,), real(**obs))[1]
        assert len(problems) == 1, problems
        return problems[0]

    assert "working directory is /workspace, plan has --container-workdir=/srv" in one("--container-workdir=/srv")
    assert one("--container-readonly", readonly_root=False) == "/ is writable, plan has --container-readonly"
    assert one("--container-writable") == "/ is read-only, plan has --container-writable"
    assert one("--container-remap-root") == "uid is 1000, --container-remap-root makes it 0"
    assert one("--no-container-remap-root", uid=0) == "uid is 0, not the job's 1000 (--no-container-remap-root)"
    assert one("--container-mount-home") == "home /home/u is not mounted (--container-mount-home)"
    assert "pyxis_77.0, not pyxis_cache" in one("--container-name=cache")


def test_what_a_real_container_cannot_promise_is_not_checked():
    # no writable/readonly flag: enroot.conf decides; relative workdir; no job uid; --container-env
    flags = FLAGS + ("--container-workdir=rel", "--no-container-remap-root", "--no-container-mount-home",
                     "--container-env=HF_TOKEN", "--container-entrypoint")
    for obs in (real(readonly_root=False), real(), real(job_uid=None, uid=5)):
        assert check_container(flags, obs)[1] == []
    # a rootfs that is a filesystem's root ("/") says nothing about the container's name
    assert check_container(FLAGS + ("--container-name=c",), real(rootfs="/"))[1] == []


# ---- the Pyxis test double ------------------------------------------------------------------------

def test_the_test_double_stands_in_for_enroot_lock_and_skips_the_name():
    flags = FLAGS + ("--container-name=cache", "--container-remap-root")
    assert check_container(flags, double()) == ("test double /:rw mounts 2/2", [])
    # everything it imitates is still checked
    _, problems = check_container(FLAGS + ("--container-workdir=/srv", "--container-readonly"),
                                  double(mounts={"/": "rw"}))
    assert len(problems) == 4, problems


# ---- observe() and mountinfo ------------------------------------------------------------------------

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
23 22 0:5 / /proc rw,nosuid master:2 - proc proc rw
70 22 0:40 /enroot/pyxis_9.1 / ro,nosuid,nodev - ext4 /dev/sdb rw
71 70 8:1 /tmp/a\\040b /mnt/with\\040space rw - ext4 /dev/sda1 rw
72 70 8:1 /x /data rw - ext4 /dev/sda1 ro
bad line
"""


def test_parse_mountinfo():
    entries = container.parse_mountinfo(MOUNTINFO)
    assert [e["point"] for e in entries] == ["/", "/proc", "/", "/mnt/with space", "/data"]
    assert entries[2] == {"point": "/", "root": "/enroot/pyxis_9.1", "fstype": "ext4", "ro": True}
    assert entries[3]["root"] == "/tmp/a b" and entries[3]["ro"] is False
    assert entries[4]["ro"] is True  # read-only superblock


def test_observe_reads_the_last_mount_at_each_point(monkeypatch, tmp_path):
    (tmp_path / "mountinfo").write_text(MOUNTINFO)
    monkeypatch.setattr(container, "MOUNTINFO", str(tmp_path / "mountinfo"))
    monkeypatch.setenv(container.TEST_DOUBLE_ENV, "x")
    obs = container.observe()
    assert obs.rootfs == "/enroot/pyxis_9.1" and obs.rootfs_type == "ext4"
    assert obs.mounts == {"/": "ro", "/data": "ro", "/mnt/with space": "rw", "/proc": "rw"}
    assert obs.test_double == "x" and obs.cwd == os.getcwd() and obs.uid == os.getuid()
    assert ContainerObservation.from_json(json.loads(json.dumps(obs.to_json())), "obs") == obs


def test_observe_never_raises(monkeypatch):
    monkeypatch.setattr(container, "MOUNTINFO", "/nonexistent/mountinfo")
    obs = container.observe()
    assert obs.mounts == {} and obs.errors and obs.rootfs is None
    assert obs.errors[0].startswith("/nonexistent/mountinfo: ")


OBSERVE = "import json; from slurmrl.runtime.steps import container; print(json.dumps(container.observe().to_json()))"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
def test_observe_sees_real_mounts_in_a_private_mount_namespace(tmp_path):
    """Real kernel mounts (what Pyxis' bind mounts are): a read-only bind at DST, cwd = workdir."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    script = (f"mount --bind {src} {dst} && mount -o remount,bind,ro {dst} && cd {dst} && "
              f"exec {sys.executable} -c '{OBSERVE}'")
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, container.TEST_DOUBLE_ENV: "unit test"})
    assert r.returncode == 0, r.stderr
    obs = ContainerObservation.from_json(json.loads(r.stdout), "stdout")
    assert obs.mounts[str(dst)] == "ro" and obs.cwd == str(dst)
    flags = ("--container-image=i", f"--container-mounts={src}:{dst}:ro", f"--container-workdir={dst}")
    assert check_container(flags, obs) == ("test double /:rw mounts 1/1", [])
    # the same flags against this process, which has no such mount
    here = replace(container.observe(), test_double="unit test")
    assert check_container(flags, here)[1][0] == f"nothing mounted at {dst} (--container-mounts {src}:{dst})"
