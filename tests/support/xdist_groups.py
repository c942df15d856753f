"""Pytest plugin: under pytest-xdist (scripts/test.sh runs three workers) the heavy tests run in
three groups, each one test after another on a worker of its own, and the other tests beside them.

- ``cluster``: the tests marked ``cluster`` whose jobs go to the local cluster's partition debug
  (n1-n4; two jobs of one stream at once could wait for each other's nodes);
- ``cluster-debug2``: those marked ``debug2`` too (fixture ``slurm_debug2``): their jobs go to the
  second partition (n5-n8), so the two streams never wait for each other's nodes. Most of a cluster
  test's time is waiting (on vLLM's start, Slurm, a requeue's hold), so two streams finish well
  before one would, even on two cores;
- ``vllm``: the other tests marked ``vllm`` (real vLLM servers and parsers on loopback) and the other
  users of the session-built SmolLM2 (``smollm2_dir``, built once per worker that needs it).

xdist's load-by-scope scheduling gives each group (the largest first) to a worker, and a worker more
work only when at most two of its tests are left: with three workers each group has one, and every
other test goes to whichever worker is free (the vllm group's, mostly). With two workers, the third
group would wait for one of the first two to finish.

Why not xdist's own ``--dist loadgroup`` and ``xdist_group`` marks: pytest-xdist 3.8 groups by
rewriting ``item._nodeid``, which pytest 9.2 no longer reads, so every test ran on its own. Here each
worker writes the group of each test it collected to a file that the controller named for it, and the
controller's scheduler (xdist's load-by-scope scheduling) reads the groups from there.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

KEY = "slurmrl_xdist_groups"  # workerinput: the folder the workers write their groups to
FOLDER = pytest.StashKey[Path]()


def group_of(item: pytest.Item) -> str | None:
    if item.get_closest_marker("cluster"):
        return "cluster-debug2" if item.get_closest_marker("debug2") else "cluster"
    if item.get_closest_marker("vllm") or "smollm2_dir" in getattr(item, "fixturenames", ()):
        return "vllm"
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """Controller: tell each worker where to write its groups."""
    config = node.config
    if FOLDER not in config.stash:
        config.stash[FOLDER] = Path(tempfile.mkdtemp(prefix="slurmrl-xdist-groups-"))
    node.workerinput[KEY] = str(config.stash[FOLDER])


@pytest.hookimpl(trylast=True)  # after conftest's marks and -m's deselection: the items that will run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    folder = getattr(config, "workerinput", {}).get(KEY)
    if not folder:
        return
    groups = {item.nodeid: g for item in items if (g := group_of(item))}
    path = Path(folder) / f"{config.workerinput['workerid']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """Load-by-scope where a test's scope is its group, or the test itself."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # first asked once every worker has collected (and written its file)
                self.groups = {}
                for path in sorted(config.stash[FOLDER].glob("*.json")) if FOLDER in config.stash else ():
                    self.groups.update(json.loads(path.read_text()))
            group = self.groups.get(nodeid)
            return f"group:{group}" if group else nodeid

    return GroupScheduling(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    if FOLDER in config.stash:
        shutil.rmtree(config.stash[FOLDER], ignore_errors=True)
