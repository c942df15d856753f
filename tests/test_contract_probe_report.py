"""The preflight probe's report (``slurmrl.contract.probe_report``): one definition that the probe writes
(``slurmrl.runtime.steps.probe``) and ``submit --preflight`` reads (``slurmrl.app.preflight``); a round
trip through JSON, the file exactly as the probe wrote it before the contract, and a one-line error naming
the file and the key."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmrl.contract.probe_report import ContainerObservation, NodeFabric, ProbeReport, read
from slurmrl.contract.reader import ContractError
from slurmrl.runtime.steps import container

text = st.text(max_size=8)
names = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=8)
whole = st.integers(0, 1 << 31)

observations = st.builds(
    ContainerObservation, errors=st.lists(text, max_size=3).map(tuple), enroot_lock=st.none() | st.booleans(),
    rootfs=st.none() | text, rootfs_type=st.none() | text,
    mounts=st.dictionaries(names, st.sampled_from(("ro", "rw")), max_size=4), readonly_root=st.none() | st.booleans(),
    cwd=st.none() | text, uid=whole, gid=whole, uid_map=st.none() | text, job_uid=st.none() | text,
    home=st.none() | text, test_double=st.none() | text)
fabrics = st.none() | st.builds(NodeFabric, error=text) | st.builds(
    NodeFabric, gpus=st.lists(st.dictionaries(names, text, max_size=3), max_size=2).map(tuple),
    domains=st.lists(text, max_size=2).map(tuple))
reports = st.builds(
    ProbeReport, component=names, rank=whole, host=text, node=whole, local=whole,
    gpus_seen=st.lists(text, max_size=4).map(tuple), gpus=st.lists(text, max_size=4).map(tuple),
    gpu_positions=st.lists(st.integers(0, 7), max_size=4).map(tuple),
    ports=st.dictionaries(names, st.integers(1, 65535), max_size=3), container=observations,
    env=st.dictionaries(names, text, max_size=3), allocation=st.dictionaries(st.integers(0, 3).map(str), text),
    errors=st.lists(text, max_size=3).map(tuple), fabric=fabrics)


@given(reports)
def test_a_report_survives_json_and_back(r):
    assert ProbeReport.from_json(json.loads(r.dumps(indent=1)), "f.json") == r
    assert json.loads(json.dumps(r.to_json())) == r.to_json()


# a report as slurmrl.runtime.steps.probe wrote it before the contract (a probe of rl-debug's trainer on the
# local cluster, outside a container; write_json_atomic(..., indent=1)): the same bytes come back
WRITTEN = {
    "component": "trainer", "rank": 0, "host": "c2", "node": 0, "local": 0, "gpus_seen": ["0", "1"], "gpus": ["0"],
    "gpu_positions": [0], "ports": {"rdzv": 20016},
    "container": {"errors": [], "enroot_lock": False, "rootfs": "/", "rootfs_type": "overlay",
                  "mounts": {"/": "rw", "/proc": "rw", "/work": "rw"}, "readonly_root": False, "cwd": "/work/run",
                  "uid": 0, "gid": 0, "uid_map": "0 0 4294967295", "job_uid": "0", "home": "/root",
                  "test_double": None},
    "env": {"SLURM_JOB_ID": "41", "SLURM_NODEID": "0", "SLURM_LOCALID": "0", "SLURM_PROCID": "0",
            "SLURMRL_PORT_BASE": "20000", "SLURMRL_ATTEMPT": "1"},
    "allocation": {"0": "c[1-2]", "1": "c3"}, "errors": [], "fabric": None,
}


def test_the_file_is_byte_for_byte_what_the_probe_always_wrote():
    old = json.dumps(WRITTEN, indent=1)
    report = ProbeReport.from_json(json.loads(old), "f.json")
    assert report.dumps(indent=1) == old and json.dumps(report.to_json()) == json.dumps(WRITTEN)
    assert (report.task, report.job_id, report.port_base) == (("trainer", 0), "41", "20000")
    assert report.container.mounts["/work"] == "rw" and report.fabric is None


def test_a_fabric_is_written_as_the_probe_always_wrote_it():
    """Either the GPUs' blocks and the domains, or (nvidia-smi failed) only the error."""
    gpus = ({"gpu": "00000008:01:00.0", "state": "Completed", "status": "Success", "clique": "32766",
             "cluster_uuid": "u"},)
    written = {**WRITTEN, "fabric": {"gpus": list(gpus), "domains": ["u/32766"]}}
    report = ProbeReport.from_json(written, "f.json")
    assert report.fabric == NodeFabric(gpus=gpus, domains=("u/32766",))
    assert report.dumps(indent=1) == json.dumps(written, indent=1)
    assert NodeFabric(error="nvidia-smi -q: timed out").to_json() == {"error": "nvidia-smi -q: timed out"}


def test_what_observe_writes_is_what_the_reader_reads():
    """The writer (``container.observe`` in the step) into the reader, keys in the order they always were."""
    obs = container.observe()
    data = json.loads(json.dumps(obs.to_json()))
    assert list(data) == list(WRITTEN["container"])
    assert ContainerObservation.from_json(data, "obs") == obs and obs.uid == os.getuid()


@pytest.mark.parametrize("change, words", [
    (lambda d: d.pop("host"), "f.json: key 'host' is missing"),
    (lambda d: d.update(rank="0"), "f.json: key 'rank' must be a whole number, got str"),
    (lambda d: d.update(rank=True), "f.json: key 'rank' must be a whole number, got bool"),
    (lambda d: d.update(gpus=[0]), "f.json: key 'gpus[0]' must be a string, got int"),
    (lambda d: d.update(gpus="0,1"), "f.json: key 'gpus' must be a list, got str"),
    (lambda d: d.update(ports={"http": "8000"}), "f.json: key 'ports.http' must be a whole number, got str"),
    (lambda d: d.update(env=[]), "f.json: key 'env' must be an object, got list"),
    (lambda d: d.update(errors=None), "f.json: key 'errors' must be a list, got null"),
    (lambda d: d.update(fabric=[]), "f.json: key 'fabric' must be an object, got list"),
    (lambda d: d.update(fabric={"gpus": []}), "f.json: key 'fabric.domains' is missing"),
    (lambda d: d.update(fabric={"error": 9}), "f.json: key 'fabric.error' must be a string, got int"),
    (lambda d: d.update(fabric={"gpus": [{"gpu": 1}], "domains": []}),
     "f.json: key 'fabric.gpus[0].gpu' must be a string, got int"),
    (lambda d: d.update(container=None), "f.json: key 'container' must be an object, got null"),
    (lambda d: d["container"].pop("uid_map"), "f.json: key 'container.uid_map' is missing"),
    (lambda d: d["container"].update(enroot_lock="yes"),
     "f.json: key 'container.enroot_lock' must be true or false, got str"),
    (lambda d: d["container"].update(uid=None), "f.json: key 'container.uid' must be a whole number, got null"),
    (lambda d: d["container"]["mounts"].update({"/work": "rx"}),
     "f.json: key 'container.mounts./work' must be \"ro\" or \"rw\", got 'rx'"),
])
def test_a_report_that_breaks_the_contract_is_one_line_naming_the_file_and_key(change, words):
    data = json.loads(json.dumps(WRITTEN))
    change(data)
    with pytest.raises(ContractError) as e:
        ProbeReport.from_json(data, "f.json")
    assert str(e.value) == words
    assert ProbeReport.from_json(WRITTEN, "f.json").container.cwd == "/work/run"


def test_reading_a_file(tmp_path):
    path = tmp_path / "trainer.0.json"
    path.write_text(json.dumps(WRITTEN, indent=1))
    assert read(path).to_json() == WRITTEN
    path.write_text('{"component": ')
    with pytest.raises(ContractError) as e:
        read(path)
    assert str(e.value).startswith(f"{path}: not JSON: Expecting value") and "\n" not in str(e.value)
    path.write_text("[]")
    with pytest.raises(ContractError, match=r"key '\(top\)' must be an object, got list$"):
        read(path)
